"""yolo9kit's own checkpoints: plain dicts of state_dicts and a config, never pickled modules.

Layout (``"format": "yolo9kit"``, ``"version": 1``)::

    {"format": "yolo9kit", "version": 1,
     "model": state_dict, "model_config": {"yaml": {...}, "nc": int, "names": [...], "name": str, "fused": bool},
     **extra}            # e.g. "ema": state_dict, "optimizer": optimizer.state_dict(), "epoch": int

Everything is tensors, dicts, lists, numbers and strings, so ``torch.load(weights_only=True)`` reads it
and loading never executes code from the file. Writes are atomic (temporary file + ``os.replace``): an
interrupted save leaves the previous file intact.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import zipfile
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import torch

LOGGER = logging.getLogger(__name__)

FORMAT = "yolo9kit"
VERSION = 1
_RESERVED = {"format", "version", "model", "model_config"}


class CheckpointError(ValueError):
    """A file that is not a readable yolo9kit checkpoint; the message says why and what to do."""


def _plain(value: Any, where: str) -> Any:
    """Convert to types a weights_only load accepts (Path -> str, numpy -> tensor/number, dataclass -> dict)."""
    if isinstance(value, np.generic):  # before the float check: np.float64 subclasses float
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor, torch.dtype, torch.device)):
        return value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value), where)
    if isinstance(value, dict):
        return {k: _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out = [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return out if isinstance(value, list) else tuple(out)
    raise TypeError(f"checkpoint entry {where} is a {type(value).__name__}; store tensors, dicts, lists, numbers "
                    "or strings (e.g. a state_dict() instead of a module)")


def save_checkpoint(path: str | Path, model: torch.nn.Module, **extra: Any) -> Path:
    """Save ``model`` (a DetectionModel) and ``extra`` entries atomically.

    Args:
        path: destination file; its folder is created.
        model: the model whose state_dict and config are stored.
        **extra: further plain entries, e.g. ``ema=ema_model.state_dict()``, ``optimizer=opt.state_dict()``,
            ``epoch=3``. Keys format/version/model/model_config are reserved.

    Returns:
        The path written.
    """
    clash = _RESERVED & extra.keys()
    if clash:
        raise ValueError(f"save_checkpoint: {sorted(clash)} are reserved keys")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    config = {"yaml": model.yaml, "nc": int(model.nc), "names": list(model.names),
              "name": str(getattr(model, "name", "model")), "fused": bool(getattr(model, "fused", False))}
    payload = {"format": FORMAT, "version": VERSION, "model": model.state_dict(),
               "model_config": _plain(config, "model_config")}
    payload.update({k: _plain(v, k) for k, v in extra.items()})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)  # atomic on POSIX and Windows: readers see the old or the new file
    finally:
        if tmp.exists():
            tmp.unlink()
    LOGGER.debug("saved checkpoint %s", path)
    return path


def _looks_official(path: Path) -> bool:
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        return any(g.startswith(("models.", "utils.")) for g in names)
    except Exception:  # noqa: BLE001 - only used to choose a hint
        return False


def read_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict:
    """Load a yolo9kit checkpoint dict (weights_only: no code from the file runs).

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: truncated/corrupted file, or a file that is not a yolo9kit checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found")
    if not zipfile.is_zipfile(path):  # torch.save writes zip archives; a cut-off one loses its directory
        raise CheckpointError(f"{path}: cannot be read (truncated, corrupted or not a PyTorch checkpoint file); "
                              "save it again or pick an earlier checkpoint")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        hint = ("it is an official YOLOv9 checkpoint: use yolo9kit.models.load_official_checkpoint(path)"
                if _looks_official(path) else "it holds objects other than tensors and plain containers")
        raise CheckpointError(f"{path}: not a yolo9kit checkpoint; {hint}") from e
    except Exception as e:  # noqa: BLE001 - garbage input fails in many ways inside torch.load
        raise CheckpointError(f"{path}: cannot be read (truncated, corrupted or not a PyTorch file): {e}") from e
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path}: a PyTorch file but not a yolo9kit checkpoint (no 'format': 'yolo9kit'); "
                              "for official YOLOv9 files use yolo9kit.models.load_official_checkpoint")
    if ckpt.get("version", 0) > VERSION:
        raise CheckpointError(f"{path}: checkpoint version {ckpt['version']} is newer than this yolo9kit "
                              f"understands ({VERSION}); upgrade yolo9kit")
    return ckpt


def _ema_state(entry: Any) -> dict | None:
    if isinstance(entry, dict) and isinstance(entry.get("state_dict"), dict):
        return entry["state_dict"]
    return entry if isinstance(entry, dict) and entry else None


def load_checkpoint(path: str | Path, map_location: Any = "cpu", use_ema: bool = True):
    """Rebuild the model of a yolo9kit checkpoint; uses ``extra["ema"]`` when present and ``use_ema``.

    Returns:
        DetectionModel in eval mode on ``map_location``, with the saved names; ``model.checkpoint_meta``
        holds the path, which weights were used and the epoch when saved.
    """
    from yolo9kit.models.model import DetectionModel

    ckpt = read_checkpoint(path, map_location)
    cfg = ckpt["model_config"]
    model = DetectionModel(cfg["yaml"], nc=cfg["nc"], names=cfg["names"], name=cfg.get("name"),
                           source=f"{path} (model_config)")
    if cfg.get("fused"):
        model.fuse()
    ema = _ema_state(ckpt.get("ema")) if use_ema else None
    try:
        model.load_state_dict(ema if ema is not None else ckpt["model"], strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: weights do not match the stored model config: {e}") from e
    if map_location is not None and not callable(map_location) and not isinstance(map_location, dict):
        model.to(map_location)
    model.checkpoint_meta = {"path": str(path), "entry": "ema" if ema is not None else "model",
                             "epoch": ckpt.get("epoch")}
    return model.eval()


def load_model(model: Any) -> torch.nn.Module:
    """A DetectionModel from a model object, a kit checkpoint, an official .pt, or a model name.

    A kit checkpoint uses its EMA weights when present; an official file is loaded without its code.
    A registered model name (``yolov9-t``) builds a randomly initialised model, for smoke tests only.

    Args:
        model: a ``torch.nn.Module`` (returned as it is), a checkpoint path, or a registered model name.

    Raises:
        FileNotFoundError: neither an existing file nor a registered name.
        ValueError: a file that is neither a kit checkpoint nor an official one (both reasons given).
    """
    if isinstance(model, torch.nn.Module):
        return model
    from yolo9kit.models import create_model, list_models, load_official_checkpoint

    path = Path(str(model))
    if path.is_file():
        try:
            return load_checkpoint(path)
        except CheckpointError as kit_error:
            try:
                return load_official_checkpoint(path)
            except Exception as official_error:
                raise ValueError(f"{path}: neither a yolo9kit checkpoint ({kit_error}) nor an official YOLOv9 "
                                 f"checkpoint ({official_error})") from official_error
    if str(model) in list_models():
        LOGGER.warning("%s: no weights file given, using a randomly initialised model", model)
        return create_model(str(model))
    raise FileNotFoundError(f"weights {model} not found: pass a checkpoint path or one of {', '.join(list_models())}")
