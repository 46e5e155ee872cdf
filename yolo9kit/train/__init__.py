"""Training. The step is ``yolo9kit/train/step.py`` ``train_step`` (one page: forward, loss, backward, optimizer
step, EMA); the epoch loop around it is ``yolo9kit/train/loop.py`` ``train_one_epoch``; the run (set-up,
validation, checkpoints) is ``yolo9kit/train/fit.py`` ``fit``. Names below are imported on first use, so that
the memory tools can import the step without loading the run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> module that defines it
_EXPORTS = {
    "TrainConfig": "yolo9kit.config",
    "ModelEMA": "yolo9kit.train.step",
    "FitResult": "yolo9kit.train.fit",
    "fit": "yolo9kit.train.fit",
    "SeedSpread": "yolo9kit.train.seeds",
    "fit_seeds": "yolo9kit.train.seeds",
    "TuneResult": "yolo9kit.train.tuning",
    "tune": "yolo9kit.train.tuning",
    "DiskFullError": "yolo9kit.files",
    "NonFiniteLossError": "yolo9kit.train.guards",
    "OutOfMemoryAtMinimumError": "yolo9kit.train.guards",
    "EpochStats": "yolo9kit.train.loop",
    "train_one_epoch": "yolo9kit.train.loop",
    "base_accumulate": "yolo9kit.train.optim",
    "build_optimizer": "yolo9kit.train.optim",
    "lr_factor": "yolo9kit.train.optim",
    "param_groups": "yolo9kit.train.optim",
    "scaled_weight_decay": "yolo9kit.train.optim",
    "step_settings": "yolo9kit.train.optim",
    "warmup_batches": "yolo9kit.train.optim",
    "read_results": "yolo9kit.train.records",
    "BatchRecord": "yolo9kit.train.records",
    "EpochRecord": "yolo9kit.train.records",
    "Trainer": "yolo9kit.train.step",
    "build_trainer": "yolo9kit.train.step",
    "describe_step": "yolo9kit.train.step",
    "train_step": "yolo9kit.train.step",
    "class_names": "yolo9kit.train.inputs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'yolo9kit.train' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from yolo9kit.config import TrainConfig
    from yolo9kit.files import DiskFullError
    from yolo9kit.train.fit import FitResult, fit
    from yolo9kit.train.guards import NonFiniteLossError, OutOfMemoryAtMinimumError
    from yolo9kit.train.inputs import class_names
    from yolo9kit.train.loop import EpochStats, train_one_epoch
    from yolo9kit.train.optim import (
        base_accumulate,
        build_optimizer,
        lr_factor,
        param_groups,
        scaled_weight_decay,
        step_settings,
        warmup_batches,
    )
    from yolo9kit.train.records import BatchRecord, EpochRecord, read_results
    from yolo9kit.train.seeds import SeedSpread, fit_seeds
    from yolo9kit.train.step import (
        ModelEMA,
        Trainer,
        build_trainer,
        describe_step,
        train_step,
    )
    from yolo9kit.train.tuning import TuneResult, tune
