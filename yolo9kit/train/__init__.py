"""Training: ``fit`` (the whole run), ``train_one_epoch``, ``train_step`` (one optimizer update, reused by
memory profiling) and their building blocks (optimizer groups, schedules, warmup, EMA, checkpoints)."""

from __future__ import annotations

from yolo9kit.config import TrainConfig
from yolo9kit.train.ema import ModelEMA
from yolo9kit.train.fit import FitResult, fit
from yolo9kit.train.guards import NonFiniteLossError, OutOfMemoryAtMinimumError
from yolo9kit.train.loop import EpochStats, train_one_epoch
from yolo9kit.train.optim import (
                                  base_accumulate,
                                  build_optimizer,
                                  lr_factor,
                                  param_groups,
                                  scaled_weight_decay,
                                  step_settings,
                                  warmup_steps,
)
from yolo9kit.train.records import EpochRecord, StepRecord, read_results
from yolo9kit.train.step import Trainer, build_trainer, micro_step, optimizer_step, run_batch, train_step
from yolo9kit.train.weights import model_for_data, transfer_weights

__all__ = [
    "EpochRecord", "EpochStats", "FitResult", "ModelEMA", "NonFiniteLossError", "OutOfMemoryAtMinimumError",
    "StepRecord", "TrainConfig", "Trainer", "base_accumulate", "build_optimizer", "build_trainer", "fit",
    "lr_factor", "micro_step", "optimizer_step", "param_groups", "read_results", "run_batch",
    "scaled_weight_decay", "step_settings", "train_one_epoch", "train_step", "transfer_weights", "model_for_data",
    "warmup_steps",
]
