"""yolo9kit's own checkpoints: plain dicts of state_dicts and a config, never pickled modules.

Layout (``"format": "yolo9kit"``, ``"version": 1``)::

    {"format": "yolo9kit", "version": 1,
     "model": state_dict, "model_config": {"yaml": {...}, "nc": int, "names": [...], "name": str, "fused": bool},
     "checksum": {"sha256": {"model": hex, "ema": hex}},   # of the weights, verified on every read
     **extra}            # e.g. "ema": state_dict, "optimizer": optimizer.state_dict(), "epoch": int

Everything is tensors, dicts, lists, numbers and strings, so ``torch.load(weights_only=True)`` reads it
and loading never executes code from the file. Writes are atomic (temporary file, fsync, ``os.replace``):
an interrupted save leaves the previous file intact; a save checks the free space first and fails with
``DiskFullError`` before writing anything. Reading verifies the weights against the stored checksum (files
written before the checksum existed load without that check) and a model is rebuilt from ``model_config``
only after its size is bounded and its shapes, built on the meta device, match the stored weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import pickle
import zipfile
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import torch

from yolo9kit.files import write_file

LOGGER = logging.getLogger(__name__)

FORMAT = "yolo9kit"
VERSION = 1
RESERVED_KEYS = frozenset({"format", "version", "model", "model_config", "checksum"})  # written by save_checkpoint
_CHECKSUMMED = ("model", "ema")  # the weights; the optimizer state is not what a damaged file would mislead with
# What a torch.save zip adds to the tensor bytes: a header and a directory entry per tensor (~200 B), the
# pickled structure, and the plain entries (results rows, random states): 1 MiB covers a long run's rows.
_PER_TENSOR_BYTES = 512
_FIXED_BYTES = 1 << 20


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


def save_checkpoint(path: str | Path, model: torch.nn.Module, *, inputs: tuple = (), **extra: Any) -> Path:
    """Save ``model`` (a DetectionModel) and ``extra`` entries atomically.

    Args:
        path: destination file; its folder is created.
        model: the model whose state_dict and config are stored.
        **extra: further plain entries, e.g. ``ema=ema_model.state_dict()``, ``optimizer=opt.state_dict()``,
            ``epoch=3``. The keys in ``RESERVED_KEYS`` (format, version, model, model_config, checksum) are reserved.
        inputs: files the command read (the checkpoint is never written over one of them).

    Returns:
        The path written.

    Raises:
        DiskFullError: the folder has less free space than the checkpoint needs (checked before writing,
            and reported the same way when the disk fills during the write); the old file is intact.
        OwnInputError: ``path`` is one of ``inputs``.
    """
    clash = RESERVED_KEYS & extra.keys()
    if clash:
        raise ValueError(f"save_checkpoint: {sorted(clash)} are reserved keys")
    path = Path(path)
    config = {"yaml": model.yaml, "nc": int(model.nc), "names": list(model.names),
              "name": str(getattr(model, "name", "model")), "fused": bool(getattr(model, "fused", False))}
    payload = {"format": FORMAT, "version": VERSION, "model": model.state_dict(),
               "model_config": _plain(config, "model_config")}
    payload.update({k: _plain(v, k) for k, v in extra.items()})
    payload["checksum"] = {"sha256": {k: weights_digest(payload[k]) for k in _CHECKSUMMED if k in payload}}
    write_file(path, lambda tmp: torch.save(payload, tmp), needed=estimate_checkpoint_bytes(payload),
               what=f"saving {path.name}", inputs=inputs)
    LOGGER.debug("saved checkpoint %s", path)
    return path


def _tensors(value: Any, where: str = ""):
    """(key path, tensor) of every tensor in nested dicts/lists, dict keys in sorted order."""
    if isinstance(value, torch.Tensor):
        yield where, value
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            yield from _tensors(value[k], f"{where}/{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{where}/{i}")


def weights_digest(entry: Any) -> str:
    """SHA-256 of the names, dtypes, shapes and bytes of the tensors in ``entry`` (a state_dict)."""
    h = hashlib.sha256()
    for where, t in _tensors(entry):
        t = t.detach()
        h.update(f"{where}:{t.dtype}:{tuple(t.shape)};".encode())
        if t.numel():
            h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def estimate_checkpoint_bytes(payload: Any) -> int:
    """Bytes ``torch.save`` will need for ``payload``: its tensors plus the zip and pickle overhead."""
    tensors = [t for _, t in _tensors(payload)]
    return sum(t.numel() * t.element_size() for t in tensors) + _PER_TENSOR_BYTES * len(tensors) + _FIXED_BYTES


def _verify_checksum(ckpt: dict, path: Path) -> None:
    """Compare the weights with the checksum written with them (a file without one is not checked)."""
    stored = ckpt.get("checksum", {}).get("sha256", {}) if isinstance(ckpt.get("checksum"), dict) else {}
    for name, digest in stored.items():
        if name in ckpt and weights_digest(ckpt[name]) != digest:
            raise CheckpointError(f"{path}: the {name!r} weights do not match the checksum written with them: the "
                                  "file is damaged (changed on disk or in a copy); use another copy or checkpoint "
                                  "(e.g. last.pt, best.pt or an epoch<n>.pt of the run)")


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
    from yolo9kit.models.bounds import ModelSizeError, check_archive

    try:
        check_archive(path)  # before any entry is read: a small file must not unpack to gigabytes
    except ModelSizeError as e:
        raise CheckpointError(str(e)) from e
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
    _verify_checksum(ckpt, path)
    return ckpt


def check_model_config(ckpt: dict, path: str | Path, weights: dict, max_model_bytes: int | None = None) -> dict:
    """The checkpoint's ``model_config``, once it is known to build a model of sane size whose tensors have the
    names and shapes of ``weights``; nothing is allocated before: the table is checked row by row, then built
    on the meta device and its bytes compared with ``max_model_bytes`` (``yolo9kit.models.bounds``).

    Raises:
        CheckpointError: a config past the bounds or the byte limit (``models.bounds``), or one whose model
            does not match the stored weights.
    """
    from yolo9kit.models.bounds import check_model_size
    from yolo9kit.models.model import DetectionModel

    cfg = ckpt.get("model_config")
    problem = _config_problem(cfg) or (None if isinstance(weights, dict) else "comes without a weights dict")
    if problem:
        raise CheckpointError(f"{path}: model_config {problem}; the file is damaged or not a model this kit "
                              "builds: use another checkpoint")
    try:
        check_model_size(cfg["yaml"], cfg["nc"], f"{path} (model_config)", max_model_bytes, names=cfg["names"])
        with torch.device("meta"):  # shapes only: no memory is allocated, whatever the config asks for
            shell = DetectionModel(cfg["yaml"], nc=cfg["nc"], names=cfg["names"], probe=False,
                                   source=f"{path} (model_config)")
            if cfg.get("fused"):
                shell.fuse()
    except Exception as e:  # noqa: BLE001 - a damaged config fails in many ways inside the builder
        raise CheckpointError(f"{path}: model_config cannot be used: {e}") from e
    expected = {k: tuple(v.shape) for k, v in shell.state_dict().items()}
    stored = {k: tuple(v.shape) for k, v in weights.items() if isinstance(v, torch.Tensor)}
    missing, unexpected = sorted(expected.keys() - stored.keys()), sorted(stored.keys() - expected.keys())
    reshaped = sorted(k for k in expected.keys() & stored.keys() if expected[k] != stored[k])
    if missing or unexpected or reshaped:
        example = ", ".join([*(f"{k} missing" for k in missing[:2]), *(f"{k} unexpected" for k in unexpected[:2]),
                             *(f"{k} {stored[k]} not {expected[k]}" for k in reshaped[:2])])
        raise CheckpointError(f"{path}: the weights do not match the stored model_config ({len(missing)} missing, "
                              f"{len(unexpected)} unexpected, {len(reshaped)} of another shape: {example}); the file "
                              "is damaged or was written by other code")
    return cfg


def _config_problem(cfg: Any) -> str | None:
    """What is wrong with a model_config before it is built (None: the table's bounds are checked next)."""
    from yolo9kit.models.bounds import table_problem

    if not isinstance(cfg, dict) or not isinstance(cfg.get("yaml"), dict):
        return "is missing or has no 'yaml' layer table"
    problem = table_problem(cfg["yaml"], cfg.get("nc"))
    if problem:
        return problem
    if not isinstance(cfg.get("names"), list) or len(cfg["names"]) != cfg["nc"]:
        return f"names: expected a list of {cfg['nc']} class names"
    return None


def _ema_state(entry: Any) -> dict | None:
    if isinstance(entry, dict) and isinstance(entry.get("state_dict"), dict):
        return entry["state_dict"]
    return entry if isinstance(entry, dict) and entry else None


def load_checkpoint(path: str | Path, map_location: Any = "cpu", use_ema: bool = True,
                    max_model_bytes: int | None = None):
    """Rebuild the model of a yolo9kit checkpoint; uses ``extra["ema"]`` when present and ``use_ema``.

    ``max_model_bytes``: the limit on the model the file describes (``yolo9kit.models.bounds``, default 4 GiB),
    checked on the meta device before anything is built.

    Returns:
        DetectionModel in eval mode on ``map_location``, with the saved names; ``model.checkpoint_meta``
        holds the path, which weights were used and the epoch when saved.
    """
    from yolo9kit.models.model import DetectionModel

    ckpt = read_checkpoint(path, map_location)
    ema = _ema_state(ckpt.get("ema")) if use_ema else None
    cfg = check_model_config(ckpt, path, ema if ema is not None else ckpt["model"], max_model_bytes)
    model = DetectionModel(cfg["yaml"], nc=cfg["nc"], names=cfg["names"], name=cfg.get("name"),
                           source=f"{path} (model_config)")
    if cfg.get("fused"):
        model.fuse()
    try:
        model.load_state_dict(ema if ema is not None else ckpt["model"], strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: weights do not match the stored model config: {e}") from e
    if map_location is not None and not callable(map_location) and not isinstance(map_location, dict):
        model.to(map_location)
    model.checkpoint_meta = {"path": str(path), "entry": "ema" if ema is not None else "model",
                             "epoch": ckpt.get("epoch")}
    return model.eval()
