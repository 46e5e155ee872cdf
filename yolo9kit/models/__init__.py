"""YOLOv9 and GELAN detectors in plain PyTorch, numerically equal to the official implementation.

``build_model("yolov9-t")`` builds a registered model (its layer table ships as a yaml file under
``yolo9kit/models/cfg/``); a path to a model yaml in the official format, or a dict of one, builds a
custom variant. State_dict keys and shapes equal the official ones, so official weights load strictly.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from yolo9kit.models.builder import MODULES, LayerTableError, make_divisible, parse_model
from yolo9kit.models.heads import DFL, DDetect, DualDDetect, DualOutput
from yolo9kit.models.model import DetectionModel

__all__ = [
    "DFL", "DDetect", "DetectionModel", "DualDDetect", "DualOutput", "LayerTableError", "MODULES",
    "build_model", "class_list", "fuse", "list_models", "load_model_config", "load_official_checkpoint",
    "make_divisible", "model_table", "count_flops", "parse_model", "to_deploy",
]

_FAMILIES = ("yolov9", "gelan")
_SIZES = ("t", "s", "m", "c", "e")


def list_models() -> list[str]:
    """Names of the registered models: yolov9-t/s/m/c/e (training, dual head), gelan-t/s/m/c/e."""
    return [f"{family}-{size}" for family in _FAMILIES for size in _SIZES]


def load_model_config(name_or_yaml: str | Path | dict) -> tuple[dict, str, str]:
    """Resolve a model name, yaml path or dict -> (config dict, display name, source for error messages)."""
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


def class_list(num_classes: int | None, names: list[str] | dict[int, str] | None
               ) -> tuple[int | None, list[str] | None]:
    """(num_classes, names) as a model takes them: a data yaml's dict of names as a list in id order, the number
    of classes ``len(names)`` when only names are given.

    Raises:
        ValueError: as many names as classes were not given.
    """
    if isinstance(names, dict):
        names = [names[k] for k in sorted(names)]
    if names is not None and num_classes is None:
        num_classes = len(names)
    if names is not None and len(names) != num_classes:
        raise ValueError(f"{len(names)} class names given for num_classes={num_classes}")
    return num_classes, names


def build_model(name_or_yaml: str | Path | dict, num_classes: int | None = None, *,
                 names: list[str] | dict[int, str] | None = None,
                 activation_checkpointing: Any = None, seed: int = 0) -> DetectionModel:
    """Build a freshly initialised YOLOv9 / GELAN model (training mode, fp32, CPU) from its layer table:
    what ``yolo9kit.create_model`` does for a name or a yaml (it also reads checkpoints).

    Args:
        name_or_yaml: a name from :func:`list_models`, a path to an official-format model yaml, or a dict.
        num_classes: number of classes; default ``len(names)`` when names are given, else the yaml's
            ``nc`` (80 for the registered models).
        names: class names (list, or dict index -> name as in data yamls).
        activation_checkpointing: None, "all", "backbone" or layer indices to recompute in backward
            (see :meth:`DetectionModel.set_activation_checkpointing`).
        seed: the seed of the initial weights: the same seed gives the same weights in every process, on
            every machine with the same torch (the official train_dual.py seeds before it builds the model).
            The caller's random state is left as it was.

    Returns:
        DetectionModel whose state_dict keys and shapes equal the official model's.
    """
    import torch

    cfg, display, source = load_model_config(name_or_yaml)
    num_classes, names = class_list(num_classes, names)
    with torch.random.fork_rng(devices=[]):  # the initial weights come from the CPU generator only
        torch.manual_seed(seed)
        model = DetectionModel(cfg, nc=num_classes, names=names, source=source, name=display)
    if activation_checkpointing is not None:
        model.set_activation_checkpointing(activation_checkpointing)
    return model


def model_table(names: list[str] | None = None, imgsz: int = 640, num_classes: int = 80):
    """The model zoo as a DataFrame: name, parameters, GFLOPs at ``imgsz`` and the deploy (fused gelan) model.

    Columns: ``name``, ``parameters``, ``gflops``, ``deploy_parameters``, ``deploy_gflops``. FLOPs are
    counted on a 64x64 input and scaled (see :mod:`yolo9kit.models.flops`). Builds every model on the CPU
    (a few seconds each for the large ones).
    """
    import pandas as pd

    from yolo9kit.models.deploy import to_deploy
    from yolo9kit.models.flops import count_flops

    rows = []
    for name in names or list_models():
        model = build_model(name, num_classes)
        deployed = to_deploy(model)
        rows.append({
            "name": name,
            "parameters": sum(p.numel() for p in model.parameters()),
            "gflops": round(count_flops(model, imgsz), 2),
            "deploy_parameters": sum(p.numel() for p in deployed.parameters()),
            "deploy_gflops": round(count_flops(deployed, imgsz), 2),
        })
    return pd.DataFrame(rows)


def __getattr__(name: str):  # heavier helpers import on first use
    if name in ("to_deploy", "fuse"):
        from yolo9kit.models import deploy

        return getattr(deploy, name)
    if name == "load_official_checkpoint":
        from yolo9kit.models.official import load_official_checkpoint

        return load_official_checkpoint
    if name == "count_flops":
        from yolo9kit.models.flops import count_flops

        return count_flops
    raise AttributeError(f"module 'yolo9kit.models' has no attribute {name!r}")
