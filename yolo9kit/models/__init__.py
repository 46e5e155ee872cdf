"""YOLOv9 and GELAN detectors in plain PyTorch, numerically equal to the official implementation;
``create_model(source)`` is the one way to get one (docs/models.md)."""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from yolo9kit.models.checkpoint import SHAPES_MODEL, read_model
from yolo9kit.models.deploy import to_deploy
from yolo9kit.models.heads import DualOutput
from yolo9kit.models.layers import fuse
from yolo9kit.models.model import DetectionModel, LayerTableError

__all__ = ["DetectionModel", "DualOutput", "LayerTableError", "count_flops", "create_model", "fuse", "list_models",
           "load_model", "load_model_config", "model_table", "to_deploy"]

LOGGER = logging.getLogger(__name__)


def list_models() -> list[str]:
    """Names of the registered models: yolov9-t/s/m/c/e (training, dual head), gelan-t/s/m/c/e."""
    return [f"{family}-{size}" for family in ("yolov9", "gelan") for size in "tsmce"]


def load_model_config(name_or_yaml: str | Path | dict) -> tuple[dict, str, str]:
    """(layer table, display name, source for error messages) of a registered name, a yaml path or a dict.
    ValueError: an unknown name; FileNotFoundError: no such yaml; LayerTableError: not a model yaml."""
    if isinstance(name_or_yaml, dict):
        return name_or_yaml, str(name_or_yaml.get("name", "custom")), "model config dict"
    text = str(name_or_yaml)
    if text in list_models():
        cfg_file = resources.files("yolo9kit.models") / "cfg" / f"{text}.yaml"
        return yaml.safe_load(cfg_file.read_text()), text, f"{text}.yaml"
    path = Path(text)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise FileNotFoundError(f"model yaml {path} not found")
        try:
            cfg = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise LayerTableError(f"{path}: not valid YAML ({e})") from e
        if not isinstance(cfg, dict):
            raise LayerTableError(f"{path}: expected a mapping with 'backbone' and 'head' rows")
        return cfg, path.stem, str(path)
    raise ValueError(f"unknown model {text!r}: use one of {', '.join(list_models())}, "
                     "a path to a model .yaml (official format) or a dict of one")


def create_model(source: str | Path | dict, num_classes: int | None = None, *,
                 names: list[str] | dict[int, str] | None = None, weights: str | Path | None = None,
                 activation_checkpointing: Any = None, max_model_bytes: int | None = None,
                 seed: int = 0) -> DetectionModel:
    """A YOLOv9 / GELAN model in training mode, fp32, on the CPU, whose state_dict is the official one.

    Args:
        source: a name from :func:`list_models` (fresh weights), a model yaml path or dict, a kit or official
            YOLOv9 checkpoint (its EMA weights when it has them), or ``"yolov9-t-shapes"`` (the shipped model).
        num_classes: default ``len(names)``, else the source's; a checkpoint of other classes is rebuilt for
            them, its tensors that still fit transferred.
        names: class names (a list, or a data yaml's dict of index -> name).
        weights: a checkpoint whose same-name, same-shape tensors are copied in (official ``--weights``).
        activation_checkpointing: see :meth:`DetectionModel.set_activation_checkpointing`.
        max_model_bytes: the limit on the model a file describes (``checkpoint.MAX_MODEL_BYTES``).
        seed: of the fresh tensors (the caller's random state is left as it was).
    Raises: ValueError (an unknown name, a bad layer table, or names that are not ``num_classes``), CheckpointError
        (a file that cannot be used; the message says why), FileNotFoundError (no such weights file, or the shipped
        model's is missing from the installation).
    """
    if names is not None:
        names = [names[k] for k in sorted(names)] if isinstance(names, dict) else list(names)
        num_classes = len(names) if num_classes is None else num_classes
        if len(names) != num_classes:
            raise ValueError(f"{len(names)} class names given for num_classes={num_classes}")
    if _is_file(source):
        model = read_model(source, max_model_bytes)
        if num_classes is not None and num_classes != model.nc:  # rebuilt, the class outputs start fresh
            built = create_model(model.yaml, num_classes, names=names, seed=seed)
            built.name = model.name  # the checkpoint's model ("yolov9-t"), not "custom" for a config dict
            _transfer(built, model.state_dict())
            model = built
        elif names is not None:
            model.names = list(names)
    elif isinstance(source, (str, Path)) and Path(str(source)).suffix not in ("", ".yaml", ".yml"):
        raise FileNotFoundError(f"weights {source} not found")
    else:
        cfg, display, where = load_model_config(source)
        with torch.random.fork_rng(devices=[]):  # the initial weights come from the CPU generator only
            torch.manual_seed(seed)
            model = DetectionModel(cfg, nc=num_classes, names=names, source=where, name=display)
    if weights:
        _transfer(model, read_model(weights, max_model_bytes).state_dict())
    if activation_checkpointing is not None:
        model.set_activation_checkpointing(activation_checkpointing)
    return model.train()


def load_model(model: Any, max_model_bytes: int | None = None) -> nn.Module:
    """What predict, evaluate and export take: a module as it is, else ``create_model(model)`` in eval mode (a
    registered name, random weights, is named in a warning). FileNotFoundError: neither a file nor a name."""
    if isinstance(model, nn.Module):
        return model
    if not _is_file(model):
        if str(model) not in list_models():
            raise FileNotFoundError(f"weights {model} not found: pass a checkpoint path or one of "
                                    f"{', '.join(list_models())}")
        LOGGER.warning("%s: no weights file given, using a randomly initialised model", model)
    return create_model(model, max_model_bytes=max_model_bytes).eval()


def _is_file(source: Any) -> bool:
    return source == SHAPES_MODEL or (isinstance(source, (str, Path)) and Path(str(source)).is_file()
                                      and Path(str(source)).suffix not in (".yaml", ".yml"))


def _transfer(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    own = model.state_dict()
    match = {k: v for k, v in state_dict.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(match, strict=False)
    LOGGER.info("Transferred %d/%d items from pretrained weights", len(match), len(own))


@torch.no_grad()
def count_flops(model: nn.Module, imgsz: int = 640, probe_size: int = 64) -> float:
    """GFLOPs (1e9 FLOPs, a multiply-add = 2) of one eval-mode forward on a (1, ch, imgsz, imgsz) image, counted
    at ``probe_size`` (a multiple of 32) and scaled by area (docs/models.md, "FLOP counting"); mode restored."""
    was_training = model.training
    param = next(model.parameters())
    x = torch.zeros(1, getattr(model, "ch", 3), probe_size, probe_size, device=param.device, dtype=param.dtype)
    model.eval()
    try:
        with FlopCounterMode(display=False) as counter:
            model(x)
    finally:
        model.train(was_training)
    return counter.get_total_flops() / 1e9 * (imgsz / probe_size) ** 2


def model_table(names: list[str] | None = None, imgsz: int = 640, num_classes: int = 80):
    """The model zoo as a DataFrame: ``name``, ``parameters``, ``gflops`` at ``imgsz``, ``deploy_parameters``,
    ``deploy_gflops`` (the fused gelan model), each built on the CPU."""
    import pandas as pd

    rows = []
    for name in names or list_models():
        rows.append({"name": name})
        model = create_model(name, num_classes)
        for prefix, m in (("", model), ("deploy_", to_deploy(model))):
            rows[-1].update({f"{prefix}parameters": sum(p.numel() for p in m.parameters()),
                             f"{prefix}gflops": round(count_flops(m, imgsz), 2)})
    return pd.DataFrame(rows)
