"""Settings of prediction, validation and the data loader: which boxes survive NMS, what ``predict`` writes,
the loader's process plumbing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NMSConfig:
    """Which boxes survive non-maximum suppression (``predict``, ``evaluate``, ``non_max_suppression``).

    A field left None takes the official value of the function it is passed to: :data:`PREDICT_NMS` in
    ``predict`` (as ``detect_dual.py``), :data:`VAL_NMS` in ``evaluate`` (as ``val_dual.py``). So
    ``NMSConfig(conf=0.5)`` changes only the confidence threshold in both. Frozen: make a changed copy
    with ``dataclasses.replace(nms, iou=0.6)``.
    """

    conf: float | None = None  # a box needs a class score above this (official --conf-thres)
    iou: float | None = None  # a box overlapping a higher-scored one by more is dropped (--iou-thres)
    max_det: int | None = None  # at most this many boxes per image, the highest scored (--max-det)
    # Keep only these class ids (--classes); a tuple so that the frozen settings stay hashable.
    classes: tuple[int, ...] | None = None
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


# detect_dual.py's defaults: --conf-thres 0.25, --iou-thres 0.45, --max-det 1000 (one class per box).
PREDICT_NMS = NMSConfig(conf=0.25, iou=0.45, max_det=1000)
# val_dual.py's defaults: --conf-thres 0.001, --iou-thres 0.7, --max-det 300 (multi-label rows). The low
# threshold keeps the whole precision-recall curve, which mAP integrates over.
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

    # Page-locked batches let the copy to the GPU overlap compute; None: on when CUDA is available.
    pin_memory: bool | None = None
    # Batches each worker prepares ahead (torch's default is 2): a deeper queue absorbs the batches that take
    # longer than the rest (mosaic, mixup), at the price of that many batches of RAM per worker.
    prefetch_factor: int = 4
    # cache="auto" decodes all images into RAM only when they need less than this share of the available RAM.
    cache_budget: float = 0.5

    def __post_init__(self) -> None:
        if self.prefetch_factor < 1:
            raise ValueError(f"LoaderConfig.prefetch_factor={self.prefetch_factor!r}: expected an integer >= 1")
        if not 0 < self.cache_budget <= 1:
            raise ValueError(f"LoaderConfig.cache_budget={self.cache_budget!r}: expected a share in (0, 1]")
