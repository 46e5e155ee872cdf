"""Load official YOLOv9 ``.pt`` checkpoints without the official code and without running pickled code.

Official files pickle whole modules (``models.yolo.DetectionModel`` and ``models.common.*``). We load
them with ``torch.load(weights_only=True)``: every official class name is allow-listed as an empty
``nn.Module`` stand-in under its dotted name (docs/models.md, "Official checkpoints, loaded safely"), with a
fixed list of torch layers and the numpy/pathlib globals training checkpoints contain. Unpickling then only restores
attributes (parameters, buffers, the ``yaml`` dict, ``names``); no class of the file's choosing runs.
Our own model is rebuilt from the pickled ``yaml`` and the tensors are loaded strictly.
"""

from __future__ import annotations

import importlib
import logging
import pathlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from yolo9kit.models.bounds import ModelSizeError, check_archive, check_model_size
from yolo9kit.models.builder import LayerTableError
from yolo9kit.models.model import DetectionModel

LOGGER = logging.getLogger(__name__)

OFFICIAL_PREFIXES = ("models.", "utils.")  # packages of the official repository
TORCH_CLASSES = (  # standard layers an official model pickles
    "torch.nn.modules.conv.Conv2d", "torch.nn.modules.batchnorm.BatchNorm2d", "torch.nn.modules.activation.SiLU",
    "torch.nn.modules.activation.ReLU", "torch.nn.modules.activation.LeakyReLU",
    "torch.nn.modules.activation.Hardswish", "torch.nn.modules.linear.Identity",
    "torch.nn.modules.container.Sequential", "torch.nn.modules.container.ModuleList",
    "torch.nn.modules.pooling.MaxPool2d", "torch.nn.modules.pooling.AvgPool2d",
    "torch.nn.modules.upsampling.Upsample",
)
NUMPY_GLOBALS = {  # best_fitness is a numpy array in training checkpoints
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype",
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar",
}
_STANDINS: dict[str, type] = {}


class OfficialCheckpointError(ValueError):
    """A file that is not a loadable official YOLOv9 checkpoint; the message says why and what to do."""


def _standin(dotted: str) -> type:
    """An empty nn.Module subclass standing in for an official class (one per dotted name)."""
    if dotted not in _STANDINS:
        _STANDINS[dotted] = type(dotted.rsplit(".", 1)[-1], (nn.Module,), {"__module__": "yolo9kit.models.official"})
    return _STANDINS[dotted]


def _resolve(dotted: str) -> Any:
    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def _numpy_dtype_classes() -> list[type]:
    # numpy dtypes are rebuilt as instances of per-type classes (numpy.dtypes.Float64DType, ...)
    return list({type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDGOUSV"})


def safe_globals_for(path: str | Path) -> list:
    """The allow-list for ``torch.load(path, weights_only=True)`` of an official checkpoint.

    Raises:
        OfficialCheckpointError: the file names a global outside the official classes, the standard
            layers, numpy arrays and paths (it is then not an official YOLOv9 checkpoint).
    """
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception as e:  # noqa: BLE001 - garbage input fails in many ways inside torch
        raise OfficialCheckpointError(
            f"{path}: not a readable PyTorch checkpoint (truncated or corrupted download?): {e}") from e
    allowed: list = [*_numpy_dtype_classes()]
    refused = []
    for dotted in names:
        if dotted.startswith(OFFICIAL_PREFIXES):
            allowed.append((_standin(dotted), dotted))
        elif dotted in TORCH_CLASSES or dotted in NUMPY_GLOBALS:
            allowed.append((_resolve(dotted), dotted))
        elif dotted in ("pathlib.PosixPath", "pathlib.PurePosixPath"):
            allowed.append((pathlib.PurePosixPath, dotted))
        elif dotted in ("pathlib.WindowsPath", "pathlib.PureWindowsPath"):
            allowed.append((pathlib.PureWindowsPath, dotted))  # loads on any OS
        else:
            refused.append(dotted)
    if refused:
        raise OfficialCheckpointError(
            f"{path}: refers to {sorted(refused)}, which an official YOLOv9 checkpoint does not contain; "
            "refusing to unpickle it. If it is a yolo9kit checkpoint use yolo9kit.load_checkpoint.")
    return allowed


def read_official_checkpoint(path: str | Path) -> dict:
    """``torch.load`` an official checkpoint safely (weights_only with stand-in classes) -> its dict."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"official checkpoint {path} not found")
    try:
        check_archive(path)  # before any entry is read: a small file must not unpack to gigabytes
    except ModelSizeError as e:
        raise OfficialCheckpointError(str(e)) from e
    allowed = safe_globals_for(path)
    try:
        with torch.serialization.safe_globals(allowed):
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - refused globals, truncated data, ...
        raise OfficialCheckpointError(f"{path}: cannot be read as an official YOLOv9 checkpoint: {e}") from e
    if not isinstance(ckpt, dict):
        raise OfficialCheckpointError(f"{path}: expected a dict with a pickled 'model', got {type(ckpt).__name__}")
    return ckpt


def _pickled_model(ckpt: dict, path: Path) -> tuple[nn.Module, str]:
    if ckpt.get("format") == "yolo9kit":
        raise OfficialCheckpointError(f"{path} is a yolo9kit checkpoint, not an official one: "
                                      "load it with yolo9kit.load_checkpoint(path)")
    for key in ("ema", "model"):  # official loaders prefer the EMA weights
        m = ckpt.get(key)
        if m is not None:
            break
    else:
        raise OfficialCheckpointError(f"{path}: no 'ema' or 'model' entry (keys: {sorted(map(str, ckpt))}); "
                                      "not an official YOLOv9 training or release checkpoint")
    if not isinstance(m, nn.Module) or not isinstance(getattr(m, "yaml", None), dict):
        raise OfficialCheckpointError(
            f"{path}: '{key}' is a {type(m).__name__} without a 'yaml' model config; expected the pickled "
            "official DetectionModel. A bare state_dict can be loaded with build_model(...).load_state_dict")
    return m, key


def load_official_checkpoint(path: str | Path, max_model_bytes: int | None = None) -> DetectionModel:
    """Build our model from an official YOLOv9 ``.pt`` file (release or mid-training format).

    The EMA weights are used when present (as the official ``attempt_load`` does), cast to fp32; class
    names and ``nc`` come from the file. No official code is needed and no pickled code runs.

    Args:
        path: official checkpoint (``yolov9-c.pt``, ``gelan-c.pt``, a ``last.pt`` from ``train_dual.py``).
        max_model_bytes: the limit on the model its pickled yaml describes (``models.bounds``; default 4 GiB),
            checked on the meta device before the model is built.

    Returns:
        DetectionModel in eval mode, fp32, on CPU. ``model.checkpoint_meta`` holds epoch, date, which entry
        was used, best_fitness.

    Raises:
        OfficialCheckpointError: not an official YOLOv9 checkpoint (with the reason and what to do), or one
            whose model is past the bounds of ``models.bounds``.
    """
    path = Path(path)
    ckpt = read_official_checkpoint(path)
    pickled, entry = _pickled_model(ckpt, path)
    cfg = pickled.yaml
    names = getattr(pickled, "names", None)
    if isinstance(names, dict):
        names = [names[k] for k in sorted(names)]
    nc = int(getattr(pickled, "nc", None) or cfg.get("nc", 80))
    yaml_file = getattr(pickled, "yaml_file", None)
    name = Path(str(yaml_file)).stem if yaml_file else path.stem
    try:
        check_model_size(cfg, nc, f"{path} (pickled yaml)", max_model_bytes)  # shapes only, nothing allocated
    except (ModelSizeError, LayerTableError) as e:
        raise OfficialCheckpointError(str(e)) from e
    state = {k: v.float() if v.is_floating_point() else v for k, v in pickled.state_dict().items()}
    model = DetectionModel(cfg, nc=nc, names=list(names) if names is not None else None,
                           source=f"{path} (pickled yaml)", name=name)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise OfficialCheckpointError(
            f"{path}: its tensors do not match the model its yaml describes ({len(result.missing_keys)} missing, "
            f"e.g. {result.missing_keys[:3]}; {len(result.unexpected_keys)} unexpected, e.g. "
            f"{result.unexpected_keys[:3]}); the file may be from a different code version")
    stride = getattr(pickled, "stride", None)
    if isinstance(stride, torch.Tensor) and stride.numel() == model.head.nl:
        model.set_strides(stride.float())
    fitness = ckpt.get("best_fitness")
    model.checkpoint_meta = {
        "path": str(path), "entry": entry, "epoch": ckpt.get("epoch"), "date": ckpt.get("date"),
        "best_fitness": None if fitness is None else float(np.asarray(fitness).reshape(-1)[0]),
    }
    LOGGER.info("loaded %s from %s ('%s' entry, %d classes)", name, path, entry, model.nc)
    return model.eval()
