"""Settings as data: frozen dataclasses with the official defaults and why they are what they are.

* ``TrainConfig`` (``config.train``): everything ``yolo9kit.train.fit`` needs besides the model and the data,
  with the official ``hyp.scratch-high.yaml`` defaults, made of the parts ``StepConfig`` (``step``),
  ``OptimConfig`` (``optim``, with the ``LossConfig``), ``PipelineConfig`` (``pipeline``) and ``RunConfig``
  (``run``).
* ``StepConfig`` (``config.step``): one training step, what the memory tools describe and ``fit`` runs.
* ``NMSConfig``, ``SaveConfig``, ``LoaderConfig`` (``config.inference``): prediction, validation, loading.
* ``ExportConfig`` (``config.export``): the ONNX export.
"""

from __future__ import annotations

from yolo9kit.config.export import ExportConfig
from yolo9kit.config.hyp import DEFAULT_AUGMENT_HYP
from yolo9kit.config.inference import PREDICT_NMS, VAL_NMS, LoaderConfig, NMSConfig, SaveConfig
from yolo9kit.config.step import (
    ACTIVATION_CHECKPOINTING,
    AMP_MODES,
    FAST_SWITCHES,
    OPTIMIZERS,
    StepConfig,
    amp_for,
    check_activation_checkpointing,
)
from yolo9kit.config.train import (
    CACHE_MODES,
    CALLBACK_NAMES,
    DEFAULT_MARGIN,
    SCHEDULES,
    LossConfig,
    OptimConfig,
    PipelineConfig,
    RunConfig,
    TrainConfig,
)

__all__ = [
    "ACTIVATION_CHECKPOINTING", "AMP_MODES", "CACHE_MODES", "CALLBACK_NAMES", "DEFAULT_AUGMENT_HYP",
    "DEFAULT_MARGIN", "FAST_SWITCHES", "OPTIMIZERS", "PREDICT_NMS", "SCHEDULES", "VAL_NMS", "PipelineConfig",
    "ExportConfig", "LoaderConfig", "LossConfig", "NMSConfig", "OptimConfig", "RunConfig", "SaveConfig",
    "StepConfig", "TrainConfig", "amp_for", "check_activation_checkpointing",
]
