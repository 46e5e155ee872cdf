"""Reading weights files safely: the model a file describes is bounded before anything is allocated
(docs/faults.md); official YOLOv9 ``.pt`` files are read without their code, their classes as empty stand-ins
(docs/models.md, "Official checkpoints, loaded safely").
"""

from __future__ import annotations

import importlib
import logging
import pathlib
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from yolo9kit.models.model import DetectionModel, LayerTableError

LOGGER = logging.getLogger(__name__)

MAX_MODEL_BYTES = 4 << 30  # parameters plus the probe's layer outputs, float32: 12 times yolov9-e
MAX_UNPACKED_EXTRA_BYTES = 64 << 20  # torch.save never compresses: what entries may unpack to beyond their size

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


class CheckpointError(ValueError):
    """A weights file (the kit's or an official one) that cannot be used; the message says why and what to do."""


def check_model(table: dict, nc: int, source: str, max_model_bytes: int | None = None, *,
                names: list | None = None, weights: dict | None = None, fused: bool = False) -> None:
    """Refuse a layer table before anything is allocated: built on the meta device, row by row within the
    bounds of :func:`~yolo9kit.models.model.parse_model`, its parameters and the stride probe's layer outputs
    must fit in ``max_model_bytes`` (default 4 GiB) and its tensors match ``weights`` (names and shapes).

    Args:
        table: the layer table. nc: its classes. source: names it in errors. max_model_bytes: the limit.
        names: its class names. weights: a state_dict. fused: the model is fused, as the weights are.

    Raises:
        CheckpointError: naming the bound, the figure and the limit, the row, or the tensors that differ.
    """
    outputs: list[int] = []

    def record(_module, _args, output) -> None:
        outputs.extend(t.numel() * 4 for t in (output if isinstance(output, (list, tuple)) else [output])
                       if isinstance(t, torch.Tensor))

    try:
        with torch.device("meta"):  # shapes only: no memory is allocated, whatever the table asks for
            shell = DetectionModel(table, nc=nc, names=names, probe=False, source=source)
            hooks = [layer.register_forward_hook(record) for layer in shell.model]
            try:
                shell._probe_strides()
            finally:
                for hook in hooks:
                    hook.remove()
            if fused:
                shell.fuse()
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
    if weights is not None:
        expected = {k: tuple(v.shape) for k, v in shell.state_dict().items()}
        stored = {k: tuple(v.shape) for k, v in weights.items() if isinstance(v, torch.Tensor)}
        missing, unexpected = sorted(expected.keys() - stored.keys()), sorted(stored.keys() - expected.keys())
        reshaped = sorted(k for k in expected.keys() & stored.keys() if expected[k] != stored[k])
        if missing or unexpected or reshaped:
            example = ", ".join([*(f"{k} missing" for k in missing[:2]), *(f"{k} unexpected" for k in unexpected[:2]),
                                 *(f"{k} {stored[k]} not {expected[k]}" for k in reshaped[:2])])
            raise CheckpointError(f"{source}: the weights do not match the model it describes ({len(missing)} "
                                  f"missing, {len(unexpected)} unexpected, {len(reshaped)} of another shape: "
                                  f"{example}); the file is damaged or was written by other code")


def check_archive(path: str | Path) -> None:
    """Refuse a zip archive whose entries unpack to more than ``MAX_UNPACKED_EXTRA_BYTES`` beyond their size in
    the file, read by its directory before any entry is; files that are not zip archives are left alone.

    Raises:
        CheckpointError: naming the entry, its size in the file and what it would unpack to.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (OSError, zipfile.BadZipFile):
        return
    extra = sum(max(e.file_size - e.compress_size, 0) for e in entries)
    if extra > MAX_UNPACKED_EXTRA_BYTES:
        worst = max(entries, key=lambda e: e.file_size - e.compress_size)
        raise CheckpointError(
            f"{path}: its entry {worst.filename} takes {worst.compress_size / 2**20:.1f} MiB in the file and would "
            f"unpack to {worst.file_size / 2**20:.1f} MiB ({extra / 2**20:.0f} MiB more than the file holds in all); "
            "torch.save writes entries uncompressed: the file was made by something else, refusing to read it")


def pickled_globals(path: str | Path) -> list[str]:
    """The classes and functions a torch.save file's pickle names (none in a kit checkpoint); [] if unreadable."""
    check_archive(path)  # before any entry is read
    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - garbage input fails in many ways inside torch
        return []


def load_weights_only(path: str | Path, allowed: list | None = None) -> Any:
    """``torch.load(path, weights_only=True)`` to the CPU, with the ``allowed`` globals, after ``check_archive``.

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: a truncated, corrupted or foreign file, or one past ``check_archive``'s bound.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found")
    if not zipfile.is_zipfile(path):  # torch.save writes zip archives; a cut-off one loses its directory
        raise CheckpointError(f"{path}: cannot be read (truncated, corrupted or not a PyTorch checkpoint file); "
                              "save it again or pick an earlier checkpoint")
    check_archive(path)
    try:
        with torch.serialization.safe_globals(allowed or []):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path}: not a yolo9kit checkpoint; it holds objects other than tensors and plain "
                              f"containers ({e})") from e
    except Exception as e:  # noqa: BLE001 - garbage input fails in many ways inside torch.load
        raise CheckpointError(f"{path}: cannot be read (truncated, corrupted or not a PyTorch file): {e}") from e


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
        elif dotted in ("pathlib.PosixPath", "pathlib.PurePosixPath"):
            allowed.append((pathlib.PurePosixPath, dotted))
        elif dotted in ("pathlib.WindowsPath", "pathlib.PureWindowsPath"):
            allowed.append((pathlib.PureWindowsPath, dotted))  # loads on any OS
        else:
            refused.append(dotted)
    if refused:
        raise CheckpointError(f"{path}: refers to {sorted(refused)}, which neither a yolo9kit nor an official YOLOv9 "
                              "checkpoint contains; refusing to unpickle it")
    return allowed


def official_model(path: str | Path, max_model_bytes: int | None = None) -> DetectionModel:
    """Our model of an official YOLOv9 ``.pt`` (release or ``train_dual.py`` format): its EMA weights when
    present (as ``attempt_load``), cast to fp32, its names and classes; ``checkpoint_meta`` holds the path,
    entry, epoch, date and best_fitness.

    Raises:
        CheckpointError: not an official checkpoint, or past the bounds of :func:`check_model`.
    """
    path = Path(path)
    ckpt = load_weights_only(path, _official_allowed(path, pickled_globals(path)))
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path}: expected a dict with a pickled 'model', got {type(ckpt).__name__}")
    entry = next((key for key in ("ema", "model") if ckpt.get(key) is not None), None)  # official: EMA first
    if entry is None:
        raise CheckpointError(f"{path}: no 'ema' or 'model' entry (keys: {sorted(map(str, ckpt))}); not an "
                              "official YOLOv9 training or release checkpoint")
    pickled = ckpt[entry]
    if not isinstance(pickled, nn.Module) or not isinstance(getattr(pickled, "yaml", None), dict):
        raise CheckpointError(f"{path}: '{entry}' is a {type(pickled).__name__} without a 'yaml' model config; "
                              "expected the pickled official DetectionModel (a bare state_dict loads with "
                              "create_model(name).load_state_dict)")
    cfg, names = pickled.yaml, getattr(pickled, "names", None)
    names = [names[k] for k in sorted(names)] if isinstance(names, dict) else names
    nc = int(getattr(pickled, "nc", None) or cfg.get("nc", 80))
    yaml_file = getattr(pickled, "yaml_file", None)
    name = Path(str(yaml_file)).stem if yaml_file else path.stem
    state = {k: v.float() if v.is_floating_point() else v for k, v in pickled.state_dict().items()}
    check_model(cfg, nc, f"{path} (pickled yaml)", max_model_bytes, weights=state)
    model = DetectionModel(cfg, nc=nc, names=list(names) if names is not None else None,
                           source=f"{path} (pickled yaml)", name=name)
    model.load_state_dict(state)
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
