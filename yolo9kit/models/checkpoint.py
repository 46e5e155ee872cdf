"""Weights files: yolo9kit checkpoints, official YOLOv9 ``.pt`` files read without their code, both bounded before
anything is allocated (docs/models.md, "yolo9kit checkpoints"; docs/faults.md), and the model the kit ships."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import logging
import pathlib
import pickle
import zipfile
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import torch
from torch import nn

from yolo9kit.files import write_file
from yolo9kit.models.layers import fuse
from yolo9kit.models.model import DetectionModel, LayerTableError

LOGGER = logging.getLogger(__name__)

FORMAT = "yolo9kit"
VERSION = 1
RESERVED_KEYS = frozenset({"format", "version", "model", "model_config", "checksum"})  # written by save_checkpoint
_CHECKSUMMED = ("model", "ema")  # the weights; the optimizer state is not what a damaged file would mislead with
_PER_TENSOR_BYTES = 512  # torch.save's bytes beyond the tensors': a header and directory entry per tensor (~200 B)
_FIXED_BYTES = 1 << 20  # the pickled structure and the plain entries (results rows, random states)
MAX_MODEL_BYTES = 4 << 30  # parameters plus the probe's layer outputs, float32: 12 times yolov9-e
MAX_UNPACKED_EXTRA_BYTES = 64 << 20  # torch.save never compresses: what entries may unpack to beyond their size

# The shipped model: yolov9-t trained on make_shapes(num_classes=3) images at 160 px, in fp16 (docs/validation.md;
# benchmarks/make_shapes_model.py); predict and evaluate it at SHAPES_IMGSZ, the scale it has seen.
SHAPES_MODEL = "yolov9-t-shapes"  # its name for create_model
SHAPES_WEIGHTS = Path(__file__).with_name("yolov9-t-shapes.pt")  # package data
SHAPES_IMGSZ = 160
SHAPES_CLASSES = ("rectangle", "ellipse", "triangle")

OFFICIAL_PREFIXES = ("models.", "utils.")  # packages of the official repository
TORCH_CLASSES = {f"torch.nn.modules.{name}" for name in (  # standard layers an official model pickles
    "conv.Conv2d", "batchnorm.BatchNorm2d", "activation.SiLU", "activation.ReLU", "activation.LeakyReLU",
    "activation.Hardswish", "linear.Identity", "container.Sequential", "container.ModuleList",
    "pooling.MaxPool2d", "pooling.AvgPool2d", "upsampling.Upsample")}
NUMPY_GLOBALS = {  # best_fitness is a numpy array in training checkpoints
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype",
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar"}
PATH_CLASSES = {f"pathlib.{pure}{os}Path": getattr(pathlib, f"Pure{os}Path")  # pure classes load on any OS
                for os in ("Posix", "Windows") for pure in ("", "Pure")}
_STANDINS: dict[str, type] = {}


class CheckpointError(ValueError):
    """A weights file (the kit's or an official one) that cannot be used; the message says why and what to do."""


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
        return (list if isinstance(value, list) else tuple)(_plain(v, f"{where}[{i}]") for i, v in enumerate(value))
    raise TypeError(f"checkpoint entry {where} is a {type(value).__name__}; store tensors, dicts, lists, numbers "
                    "or strings (e.g. a state_dict() instead of a module)")


def save_checkpoint(path: str | Path, model: torch.nn.Module, *, inputs: tuple = (), **extra: Any) -> Path:
    """Save ``model`` (a DetectionModel) and ``extra`` entries atomically, with a checksum of the weights.

    Args:
        path: destination file (returned); its folder is created.
        inputs: files the command read (the checkpoint is never written over one of them).
        **extra: further plain entries (e.g. ``ema=...state_dict()``, ``epoch=3``); not ``RESERVED_KEYS``.
    Raises: DiskFullError (less free space than it needs, checked first: the old file is intact); OwnInputError
        (``path`` is one of ``inputs``); ValueError (a reserved key); TypeError (an entry that is not plain).
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


def pickled_globals(path: str | Path) -> list[str]:
    """The classes and functions a torch.save file's pickle names (none in a kit checkpoint); [] if unreadable.
    CheckpointError: a zip archive whose entries unpack to more than ``MAX_UNPACKED_EXTRA_BYTES`` beyond their size
    in the file (read by its directory before any entry is), naming the worst entry."""
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (OSError, zipfile.BadZipFile):
        entries = []  # not a zip archive: left to the loader
    extra = sum(max(e.file_size - e.compress_size, 0) for e in entries)
    if extra > MAX_UNPACKED_EXTRA_BYTES:
        worst = max(entries, key=lambda e: e.file_size - e.compress_size)
        raise CheckpointError(
            f"{path}: its entry {worst.filename} takes {worst.compress_size / 2**20:.1f} MiB in the file and would "
            f"unpack to {worst.file_size / 2**20:.1f} MiB ({extra / 2**20:.0f} MiB more than the file holds in all); "
            "torch.save writes entries uncompressed: the file was made by something else, refusing to read it")
    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - garbage input fails in many ways inside torch
        return []


def _load(path: Path, allowed: list | None = None) -> Any:
    """``torch.load(path, weights_only=True)`` to the CPU with the ``allowed`` globals (after pickled_globals)."""
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found")
    if not zipfile.is_zipfile(path):  # torch.save writes zip archives; a cut-off one loses its directory
        raise CheckpointError(f"{path}: cannot be read (truncated, corrupted or not a PyTorch checkpoint file); "
                              "save it again or pick an earlier checkpoint")
    try:
        with torch.serialization.safe_globals(allowed or []):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path}: not a yolo9kit checkpoint; it holds objects other than tensors and plain "
                              f"containers ({e})") from e
    except Exception as e:  # noqa: BLE001 - garbage input fails in many ways inside torch.load
        raise CheckpointError(f"{path}: cannot be read (truncated, corrupted or not a PyTorch file): {e}") from e


def read_checkpoint(path: str | Path) -> dict:
    """A yolo9kit checkpoint's dict (weights_only: no code from the file runs), its weights verified against
    the checksum written with them. FileNotFoundError: no such file; CheckpointError: a truncated, corrupted or
    damaged file, or not a yolo9kit checkpoint."""
    if any(g.startswith(OFFICIAL_PREFIXES) for g in pickled_globals(path)):
        raise CheckpointError(f"{path}: an official YOLOv9 checkpoint, not a yolo9kit one: load it with "
                              "create_model(path)")
    ckpt = _load(Path(path))
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path}: a PyTorch file but not a yolo9kit checkpoint (no 'format': 'yolo9kit'); a "
                              "bare state_dict loads into its model: create_model(name).load_state_dict(...)")
    if ckpt.get("version", 0) > VERSION:
        raise CheckpointError(f"{path}: checkpoint version {ckpt['version']} is newer than this yolo9kit "
                              f"understands ({VERSION}); upgrade yolo9kit")
    digests = ckpt["checksum"].get("sha256") if isinstance(ckpt.get("checksum"), dict) else None
    for name in _CHECKSUMMED:
        if name in ckpt and weights_digest(ckpt[name]) != (digests or {}).get(name):
            raise CheckpointError(f"{path}: the {name!r} weights do not match the checksum written with them (or it "
                                  "has none): the file is damaged (changed on disk or in a copy) or not written by "
                                  "save_checkpoint; use another copy or checkpoint (e.g. last.pt, best.pt or an "
                                  "epoch<n>.pt of the run)")
    return ckpt


def check_model(table: dict, nc: int, source: str, max_model_bytes: int | None = None, *,
                names: list | None = None, weights: dict | None = None, fused: bool = False) -> None:
    """Refuse a layer table before anything is allocated (docs/models.md): built on the meta device within the row
    bounds of ``parse_model``, its parameters and the probe's layer outputs must fit in ``max_model_bytes`` (default
    ``MAX_MODEL_BYTES``) and its tensors (fused: the fused model's) have the names and shapes of the state_dict
    ``weights``; ``source`` names the table. CheckpointError: naming the bound, figure and limit, row or tensors."""
    outputs: list[int] = []  # bytes of each layer output of the probe
    try:
        with torch.device("meta"):  # shapes only: no memory is allocated, whatever the table asks for
            shell = DetectionModel(table, nc=nc, names=names, probe=False, source=source)
            for layer in shell.model:
                layer.register_forward_hook(lambda _m, _a, out: outputs.extend(
                    t.numel() * 4 for t in (out if isinstance(out, (list, tuple)) else [out]) if torch.is_tensor(t)))
            shell._probe_strides()
            if fused:
                fuse(shell)
    except Exception as e:  # noqa: BLE001 - a damaged table fails in many ways inside the builder
        raise CheckpointError(str(e) if isinstance(e, LayerTableError) else f"{source}: cannot be built: {e}") from e
    limit = MAX_MODEL_BYTES if max_model_bytes is None else int(max_model_bytes)
    parameters = sum(p.numel() * 4 for p in shell.parameters())
    if parameters + sum(outputs) > limit:
        raise CheckpointError(
            f"{source}: the model it describes takes {parameters / 2**30:.2f} GiB of parameters and "
            f"{sum(outputs) / 2**30:.2f} GiB of layer outputs for one 256 x 256 image, more than the limit of "
            f"{limit / 2**30:.2f} GiB (the largest official YOLOv9, yolov9-e, takes 0.33); if the file is yours and "
            "the model really is that large, raise it (max_model_bytes=, --max-model-gib)")
    if weights is None:
        return
    expected = {k: tuple(v.shape) for k, v in shell.state_dict().items()}
    stored = {k: tuple(v.shape) for k, v in weights.items() if isinstance(v, torch.Tensor)}
    missing, unexpected = sorted(expected.keys() - stored.keys()), sorted(stored.keys() - expected.keys())
    reshaped = sorted(k for k in expected.keys() & stored.keys() if expected[k] != stored[k])
    if missing or unexpected or reshaped:
        example = ", ".join([*(f"{k} missing" for k in missing[:2]), *(f"{k} unexpected" for k in unexpected[:2]),
                             *(f"{k} {stored[k]} not {expected[k]}" for k in reshaped[:2])])
        raise CheckpointError(f"{source}: the weights do not match the model it describes ({len(missing)} missing, "
                              f"{len(unexpected)} unexpected, {len(reshaped)} of another shape: {example}); the file "
                              "is damaged or was written by other code")


def _official_allowed(path: Path, names: list[str]) -> list:
    """The allow-list for an official file: stand-ins for the official classes, standard layers, numpy, paths."""
    allowed: list = list({type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDGOUSV"})  # numpy dtype classes
    refused = []
    for dotted in names:
        if dotted.startswith(OFFICIAL_PREFIXES):
            if dotted not in _STANDINS:  # an empty nn.Module subclass, one per dotted name
                _STANDINS[dotted] = type(dotted.rsplit(".", 1)[-1], (nn.Module,), {"__module__": __name__})
            allowed.append((_STANDINS[dotted], dotted))
        elif dotted in TORCH_CLASSES or dotted in NUMPY_GLOBALS:
            module, name = dotted.rsplit(".", 1)
            allowed.append((getattr(importlib.import_module(module), name), dotted))
        elif dotted in PATH_CLASSES:
            allowed.append((PATH_CLASSES[dotted], dotted))
        else:
            refused.append(dotted)
    if refused:
        raise CheckpointError(f"{path}: refers to {sorted(refused)}, which neither a yolo9kit nor an official YOLOv9 "
                              "checkpoint contains; refusing to unpickle it")
    return allowed


def read_model(source: str | Path, max_model_bytes: int | None = None) -> DetectionModel:
    """The model of a weights file (or ``SHAPES_MODEL``) in eval mode, its EMA weights when it has them (as
    ``attempt_load``): an official YOLOv9 ``.pt`` when its pickle names classes (release or ``train_dual.py``
    format; cast to fp32, with its names, classes and strides), else a yolo9kit checkpoint. ``checkpoint_meta``
    holds the path, the entry used and the epoch (and an official file's date and best_fitness).

    Raises:
        FileNotFoundError: no such file, or the shipped model's is missing from the installation.
        CheckpointError: as :func:`read_checkpoint`; not an official checkpoint; a model config that is missing,
            past the bounds of :func:`check_model` or not the weights' model.
    """
    path = SHAPES_WEIGHTS if str(source) == SHAPES_MODEL else Path(str(source))
    if not path.is_file() and path == SHAPES_WEIGHTS:
        raise FileNotFoundError(f"{SHAPES_WEIGHTS} is missing: reinstall yolo9kit (the file is package data), "
                                f"or make it with `python benchmarks/make_shapes_model.py --out {SHAPES_WEIGHTS}`")
    official = pickled_globals(path)  # a kit checkpoint names none
    ckpt = _load(path, _official_allowed(path, official)) if official else read_checkpoint(path)
    if official:
        entry = next((k for k in ("ema", "model") if isinstance(ckpt, dict) and ckpt.get(k) is not None), None)
        if entry is None:
            found = f"keys: {sorted(map(str, ckpt))}" if isinstance(ckpt, dict) else f"a {type(ckpt).__name__}"
            raise CheckpointError(f"{path}: no 'ema' or 'model' entry ({found}); not an official YOLOv9 training or "
                                  "release checkpoint (a dict with a pickled 'model')")
        pickled, fitness, fused = ckpt[entry], ckpt.get("best_fitness"), False
        if not isinstance(pickled, nn.Module) or not isinstance(getattr(pickled, "yaml", None), dict):
            raise CheckpointError(f"{path}: '{entry}' is a {type(pickled).__name__} without a 'yaml' model config; "
                                  "expected the pickled official DetectionModel (a bare state_dict loads with "
                                  "create_model(name).load_state_dict)")
        table, names, yaml_file = pickled.yaml, getattr(pickled, "names", None), getattr(pickled, "yaml_file", None)
        names = [names[k] for k in sorted(names)] if isinstance(names, dict) else names
        nc, name = int(getattr(pickled, "nc", None) or table.get("nc", 80)), Path(str(yaml_file or path)).stem
        weights = {k: v.float() if v.is_floating_point() else v for k, v in pickled.state_dict().items()}
        where = checked = f"{path} (pickled yaml)"
        extra = {"date": ckpt.get("date"),
                 "best_fitness": None if fitness is None else float(np.asarray(fitness).reshape(-1)[0])}
    else:
        entry = "ema" if isinstance(ckpt.get("ema"), dict) and ckpt["ema"] else "model"
        weights, cfg, extra = ckpt.get(entry), ckpt.get("model_config"), {}
        if not (isinstance(cfg, dict) and isinstance(cfg.get("yaml"), dict) and isinstance(cfg.get("names"), list)
                and isinstance(weights, dict)):
            raise CheckpointError(f"{path}: model_config (a 'yaml' layer table and a list of 'names') or the weights "
                                  "are missing; the file is damaged or not a model this kit builds: use another "
                                  "checkpoint")
        table, nc, names, name = cfg["yaml"], cfg.get("nc"), cfg["names"], cfg.get("name")
        where, checked, fused = f"{path} (model_config)", f"{path}: model_config", bool(cfg.get("fused"))
    check_model(table, nc, checked, max_model_bytes, names=None if official else names, weights=weights, fused=fused)
    model = DetectionModel(table, nc=nc, names=names, source=where, name=name)
    if fused:
        fuse(model)
    model.load_state_dict(weights)
    stride = getattr(ckpt[entry], "stride", None)  # an official model's; a kit checkpoint's entry is a state_dict
    if official and isinstance(stride, torch.Tensor) and stride.numel() == model.head.nl:
        model.set_strides(stride.float())
    model.checkpoint_meta = {"path": str(path), "entry": entry, "epoch": ckpt.get("epoch"), **extra}
    if official:
        LOGGER.info("loaded %s from %s ('%s' entry, %d classes)", name, path, entry, model.nc)
    return model.eval()
