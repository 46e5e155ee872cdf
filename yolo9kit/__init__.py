"""yolo9kit: train YOLOv9 on one GPU and understand its memory and speed.

The public names below are imported on first use, so ``import yolo9kit`` stays cheap (no torch
import, no CUDA initialisation) until a function is actually called.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "checks": "yolo9kit.gpu_check",
    "create_model": "yolo9kit.models",
    "list_models": "yolo9kit.models",
    "model_table": "yolo9kit.models",
    "DualOutput": "yolo9kit.models",
    "to_deploy": "yolo9kit.models",
    "fuse": "yolo9kit.models",
    "save_checkpoint": "yolo9kit.models.checkpoint",
    "read_checkpoint": "yolo9kit.models.checkpoint",
    "make_shapes": "yolo9kit.data",
    "create_dataloader": "yolo9kit.data",
    "DetectionLoss": "yolo9kit.loss",
    "LossConfig": "yolo9kit.config",
    "TrainConfig": "yolo9kit.config",
    "StepConfig": "yolo9kit.config",
    "NMSConfig": "yolo9kit.config",
    "SaveConfig": "yolo9kit.config",
    "LoaderConfig": "yolo9kit.config",
    "ExportConfig": "yolo9kit.config",
    "fit": "yolo9kit.train.fit",
    "fit_seeds": "yolo9kit.train.seeds",
    "tune": "yolo9kit.train.tuning",
    "runs": "yolo9kit.experiments",
    "predict": "yolo9kit.prediction",
    "export": "yolo9kit.export_onnx",
    "evaluate": "yolo9kit.validate",
    "compare_heads": "yolo9kit.validate",
}

# sub-modules reachable as attributes: yolo9kit.data, yolo9kit.memory, ...
_SUBMODULES = {
    "assigner", "boxes", "cli", "config", "data", "env", "export_onnx", "loss", "memory", "metrics", "models",
    "plots", "prediction", "train", "validate", "widgets",
}

__all__ = sorted([*_EXPORTS, *_SUBMODULES, "__version__"])


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        module = importlib.import_module(f"yolo9kit.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'yolo9kit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from yolo9kit.config import (
        ExportConfig,
        LoaderConfig,
        LossConfig,
        NMSConfig,
        SaveConfig,
        StepConfig,
        TrainConfig,
    )
    from yolo9kit.data import create_dataloader, make_shapes
    from yolo9kit.experiments import runs
    from yolo9kit.export_onnx import export
    from yolo9kit.gpu_check import checks
    from yolo9kit.loss import DetectionLoss
    from yolo9kit.models import DualOutput, create_model, fuse, list_models, model_table, to_deploy
    from yolo9kit.models.checkpoint import read_checkpoint, save_checkpoint
    from yolo9kit.prediction import predict
    from yolo9kit.train.fit import fit
    from yolo9kit.train.seeds import fit_seeds
    from yolo9kit.train.tuning import tune
    from yolo9kit.validate import compare_heads, evaluate
