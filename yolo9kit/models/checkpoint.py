"""yolo9kit's own checkpoints: plain dicts of state_dicts and a ``model_config``, never pickled modules, written
atomically with a checksum of the weights (docs/models.md, "yolo9kit checkpoints"); and the model the kit ships.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import torch

from yolo9kit.files import write_file
from yolo9kit.models.model import DetectionModel
from yolo9kit.models.weights import OFFICIAL_PREFIXES, CheckpointError, check_model, load_weights_only, pickled_globals

LOGGER = logging.getLogger(__name__)

FORMAT = "yolo9kit"
VERSION = 1
RESERVED_KEYS = frozenset({"format", "version", "model", "model_config", "checksum"})  # written by save_checkpoint
_CHECKSUMMED = ("model", "ema")  # the weights; the optimizer state is not what a damaged file would mislead with
# What a torch.save zip adds to the tensor bytes: a header and a directory entry per tensor (~200 B), the
# pickled structure, and the plain entries (results rows, random states): 1 MiB covers a long run's rows.
_PER_TENSOR_BYTES = 512
_FIXED_BYTES = 1 << 20

# The shipped model: yolov9-t trained on make_shapes(num_classes=3) images at 160 px, in fp16 (docs/validation.md;
# made by benchmarks/make_shapes_model.py). Predict and evaluate it at SHAPES_IMGSZ: at other sizes the shapes
# reach the network at scales it has not seen.
SHAPES_MODEL = "yolov9-t-shapes"  # its name for create_model
SHAPES_WEIGHTS = Path(__file__).with_name("yolov9-t-shapes.pt")  # package data
SHAPES_IMGSZ = 160
SHAPES_CLASSES = ("rectangle", "ellipse", "triangle")


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
    """Save ``model`` (a DetectionModel) and ``extra`` entries atomically, with a checksum of the weights.

    Args:
        path: destination file (returned); its folder is created.
        model: the model whose state_dict and config are stored.
        inputs: files the command read (the checkpoint is never written over one of them).
        **extra: further plain entries (e.g. ``ema=...state_dict()``, ``epoch=3``); not ``RESERVED_KEYS``.

    Raises:
        DiskFullError: less free space than the checkpoint needs (checked first; the old file is intact).
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


def read_checkpoint(path: str | Path) -> dict:
    """A yolo9kit checkpoint's dict (weights_only: no code from the file runs), its weights verified against
    the checksum written with them.

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: a truncated, corrupted or damaged file, or not a yolo9kit checkpoint.
    """
    if any(g.startswith(OFFICIAL_PREFIXES) for g in pickled_globals(path)):
        raise CheckpointError(f"{path}: an official YOLOv9 checkpoint, not a yolo9kit one: load it with "
                              "create_model(path)")
    ckpt = load_weights_only(path)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path}: a PyTorch file but not a yolo9kit checkpoint (no 'format': 'yolo9kit'); a "
                              "bare state_dict loads into its model: create_model(name).load_state_dict(...)")
    if ckpt.get("version", 0) > VERSION:
        raise CheckpointError(f"{path}: checkpoint version {ckpt['version']} is newer than this yolo9kit "
                              f"understands ({VERSION}); upgrade yolo9kit")
    checksum = ckpt.get("checksum")
    digests = checksum.get("sha256") if isinstance(checksum, dict) else None
    for name in _CHECKSUMMED:
        if name in ckpt and weights_digest(ckpt[name]) != (digests or {}).get(name):
            raise CheckpointError(f"{path}: the {name!r} weights do not match the checksum written with them (or it "
                                  "has none): the file is damaged (changed on disk or in a copy) or not written by "
                                  "save_checkpoint; use another copy or checkpoint (e.g. last.pt, best.pt or an "
                                  "epoch<n>.pt of the run)")
    return ckpt


def check_model_config(ckpt: dict, path: str | Path, weights: dict, max_model_bytes: int | None = None) -> dict:
    """The checkpoint's ``model_config`` once it is known to build a model within the bounds whose tensors have
    the names and shapes of ``weights`` (:func:`~yolo9kit.models.weights.check_model`: nothing is allocated).

    Raises:
        CheckpointError: a config that is missing, past the bounds, or does not match the weights.
    """
    cfg = ckpt.get("model_config")
    if not (isinstance(cfg, dict) and isinstance(cfg.get("yaml"), dict) and isinstance(cfg.get("names"), list)
            and isinstance(weights, dict)):
        raise CheckpointError(f"{path}: model_config (a 'yaml' layer table and a list of 'names') or the weights are "
                              "missing; the file is damaged or not a model this kit builds: use another checkpoint")
    check_model(cfg["yaml"], cfg.get("nc"), f"{path}: model_config", max_model_bytes, names=cfg["names"],
                weights=weights, fused=bool(cfg.get("fused")))
    return cfg


def kit_model(path: str | Path, max_model_bytes: int | None = None) -> DetectionModel:
    """The model of a yolo9kit checkpoint in eval mode, with its EMA weights when it has them;
    ``checkpoint_meta`` holds the path, the entry used and the epoch. Raises as :func:`read_checkpoint` and
    :func:`check_model_config`."""
    ckpt = read_checkpoint(path)
    ema = ckpt.get("ema") if isinstance(ckpt.get("ema"), dict) and ckpt.get("ema") else None
    weights = ema if ema is not None else ckpt.get("model")
    cfg = check_model_config(ckpt, path, weights, max_model_bytes)
    model = DetectionModel(cfg["yaml"], nc=cfg["nc"], names=cfg["names"], name=cfg.get("name"),
                           source=f"{path} (model_config)")
    if cfg.get("fused"):
        model.fuse()
    model.load_state_dict(weights)
    model.checkpoint_meta = {"path": str(path), "entry": "ema" if ema is not None else "model",
                             "epoch": ckpt.get("epoch")}
    return model.eval()
