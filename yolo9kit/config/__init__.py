"""Settings with the official defaults: training (``train``, ``step``, ``recipe``); here NMS, saving, loader."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from yolo9kit.config.step import AMP_MODES, API_ONLY, FAST_SWITCHES, Settings, StepConfig, declare
from yolo9kit.config.train import (
    CACHE_MODES,
    DEFAULT_AUGMENT_HYP,
    DEFAULT_MARGIN,
    LossConfig,
    OptimConfig,
    PipelineConfig,
    RunConfig,
    TrainConfig,
)

__all__ = [
    "AMP_MODES", "CACHE_MODES", "DEFAULT_AUGMENT_HYP", "DEFAULT_MARGIN", "FAST_SWITCHES", "PREDICT_NMS", "VAL_NMS",
    "LoaderConfig", "LossConfig", "NMSConfig", "OptimConfig", "PipelineConfig", "RunConfig",
    "SaveConfig", "StepConfig", "TrainConfig",
]


@dataclass(frozen=True)
class NMSConfig(Settings):
    """Which boxes survive NMS; a None field takes the official value: PREDICT_NMS in predict, VAL_NMS in evaluate."""

    conf: float | None = declare(None, "a box needs a class score above this", flag="--conf-thres", low=0, high=1)
    iou: float | None = declare(None, "a box overlapping a higher-scored one by more is dropped", flag="--iou-thres",
                                low=0, high=1)
    max_det: int | None = declare(None, "at most this many boxes per image, the highest scored", flag="--max-det",
                                  integer=True, low=1)
    classes: tuple[int, ...] | None = declare(None, "keep only these class ids (a tuple: hashable)", flag="--classes")
    agnostic: bool = declare(False, "suppress across classes, not only within one", flag="--agnostic-nms")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.classes is not None:
            object.__setattr__(self, "classes", tuple(int(c) for c in self.classes))

    def filled(self, defaults: NMSConfig) -> NMSConfig:
        """This config with its None fields taken from ``defaults``."""
        return self.replace(**{name: getattr(defaults, name) for name in ("conf", "iou", "max_det")
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
class LoaderConfig(Settings):
    """Process plumbing of ``create_dataloader``: it changes speed and memory, never the batches."""

    pin_memory: bool | None = declare(None, "page-locked batches: the copy to the GPU overlaps compute (None: on "
                                      "with CUDA)", no_flag=API_ONLY)
    prefetch_factor: int = declare(4, "batches each worker prepares ahead (torch: 2; deeper absorbs the slow ones, "
                                   "mosaic, for RAM)", no_flag=API_ONLY, integer=True, low=1)
    cache_budget: float = declare(0.5, "cache='auto' fills RAM only when the images need less than this share of it",
                                  no_flag=API_ONLY, low=0, low_open=True, high=1)
