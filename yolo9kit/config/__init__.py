"""Settings as frozen dataclasses with the official defaults: ``TrainConfig`` and its parts (``config.train``),
``StepConfig`` (``config.step``), the hyp files and the recipe (``config.recipe``), and here the settings of
prediction, validation, the loader and the ONNX export."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

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
    DEFAULT_AUGMENT_HYP,
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


@dataclass(frozen=True)
class NMSConfig:
    """Which boxes survive non-maximum suppression (``predict``, ``evaluate``, ``non_max_suppression``).

    A field left None takes the official value of the function it is passed to: :data:`PREDICT_NMS` in
    ``predict`` (detect_dual.py), :data:`VAL_NMS` in ``evaluate`` (val_dual.py).
    """

    conf: float | None = None  # a box needs a class score above this (official --conf-thres)
    iou: float | None = None  # a box overlapping a higher-scored one by more is dropped (--iou-thres)
    max_det: int | None = None  # at most this many boxes per image, the highest scored (--max-det)
    classes: tuple[int, ...] | None = None  # keep only these class ids (--classes); a tuple: hashable
    agnostic: bool = False  # suppress across classes, not only within one (--agnostic-nms)

    def __post_init__(self) -> None:
        for name in ("conf", "iou"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                raise ValueError(f"NMSConfig.{name}={value!r}: expected a number in [0, 1] or None")
        if self.max_det is not None and self.max_det < 1:
            raise ValueError(f"NMSConfig.max_det={self.max_det!r}: expected an integer >= 1 or None")
        if self.classes is not None:
            object.__setattr__(self, "classes", tuple(int(c) for c in self.classes))

    def filled(self, defaults: NMSConfig) -> NMSConfig:
        """This config with its None fields taken from ``defaults`` (``PREDICT_NMS`` or ``VAL_NMS``)."""
        return dataclasses.replace(self, **{name: getattr(defaults, name) for name in ("conf", "iou", "max_det")
                                            if getattr(self, name) is None})


PREDICT_NMS = NMSConfig(conf=0.25, iou=0.45, max_det=1000)  # detect_dual.py's defaults
# val_dual.py's: the low threshold keeps the whole precision-recall curve, which mAP integrates over
VAL_NMS = NMSConfig(conf=0.001, iou=0.7, max_det=300)


@dataclass(frozen=True)
class SaveConfig:
    """What ``predict`` writes and where (official ``detect_dual.py`` outputs). Nothing without ``save_dir``."""

    save_dir: str | Path | None = None  # the folder; None writes nothing (a notebook usually wants the objects)
    txt: bool = False  # labels/<stem>.txt lines "cls cx cy w h" normalised (official --save-txt)
    conf: bool = False  # add the confidence to each txt line (--save-conf)
    images: bool = True  # annotated images, on by default as the official script (off: --nosave)
    line_width: int | None = None  # box lines in pixels; None scales with the image (--line-thickness)


@dataclass(frozen=True)
class LoaderConfig:
    """Process plumbing of ``create_dataloader``: it changes speed and memory, never the batches."""

    pin_memory: bool | None = None  # page-locked batches overlap the copy to the GPU; None: on with CUDA
    # batches each worker prepares ahead (torch: 2); deeper absorbs slow batches (mosaic) for RAM per worker
    prefetch_factor: int = 4
    cache_budget: float = 0.5  # cache="auto" fills RAM only when the images need less than this share of it

    def __post_init__(self) -> None:
        if self.prefetch_factor < 1:
            raise ValueError(f"LoaderConfig.prefetch_factor={self.prefetch_factor!r}: expected an integer >= 1")
        if not 0 < self.cache_budget <= 1:
            raise ValueError(f"LoaderConfig.cache_budget={self.cache_budget!r}: expected a share in (0, 1]")


@dataclass(frozen=True)
class ExportConfig:
    """How :func:`yolo9kit.export` writes and checks an ONNX file (docs/export.md)."""

    opset: int = 17  # the newest the TorchScript exporter writes without warnings and ONNX Runtime >= 1.13 runs
    dynamic_batch: bool = True  # a symbolic batch axis; off: the traced batch of 1 (static-shape compilers)
    check: bool = True  # run the file in ONNX Runtime (when installed) and compare with PyTorch
    # largest |ONNX Runtime - PyTorch| (pixels, probabilities): flags a wrong graph, never rounding (docs/export.md)
    atol: float = 1e-2

    def __post_init__(self) -> None:
        if not 13 <= self.opset <= 20:  # 13: Unsqueeze with axes as an input (the NMS part); 20: the exporter's newest
            raise ValueError(f"ExportConfig.opset={self.opset!r}: expected an ONNX opset from 13 to 20 (17 default)")
        if not self.atol > 0:
            raise ValueError(f"ExportConfig.atol={self.atol!r}: expected a tolerance > 0")
