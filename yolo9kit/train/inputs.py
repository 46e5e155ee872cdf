"""What ``fit`` reads: the loaders of ``yolo9kit.data``, each epoch's data settings, the default validation of
the EMA, and the check that the model predicts the data's classes."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Mapping

import torch
from torch import nn

from yolo9kit.config import TrainConfig
from yolo9kit.config.step import multi_scale_side
from yolo9kit.train import ddp

LOGGER = logging.getLogger(__name__)

ValidateFn = Callable[[nn.Module], Mapping[str, float]]


def class_names(data, single_cls: bool = False) -> list[str]:
    """The classes a model trained on ``data`` predicts: the data.yaml's names, or one class with
    ``single_cls``, named "item" unless the data has a single name (official train_dual.py)."""
    from yolo9kit.data import load_data_config

    names = list(load_data_config(data).names)
    return (names if len(names) == 1 else ["item"]) if single_cls else names


def check_classes(model: nn.Module, data, single_cls: bool = False) -> None:
    """The model must predict as many classes as the data has (official: an assert on the largest label);
    one with ``single_cls``."""
    if data is None or not hasattr(model, "nc"):
        return
    from yolo9kit.data import load_data_config

    names = load_data_config(data).names
    if single_cls and int(model.nc) != 1:
        raise ValueError(f"single_cls: the model predicts {model.nc} classes, expected 1; build it with "
                         "create_model(name, names=class_names(data, single_cls=True)) or pass the model name to fit")
    if not single_cls and int(model.nc) != len(names):
        raise ValueError(f"the model predicts {model.nc} classes but {data} has {len(names)} ({names[:5]}...): "
                         f"build it with create_model(name, num_classes={len(names)}) or pass the model name to fit")


def make_loader(data, split: str, config: TrainConfig, dist: ddp.DistInfo, device: torch.device | None = None):
    """Loaders of ``yolo9kit.data``: train = augmented, shuffled, per-rank batch; val = rect, 2 x batch.

    The training loader applies the HSV colour jitter on ``device`` when ``config.pipeline.colour_on_device``
    (default: when it is a CUDA device). ``config.pipeline.rect`` makes its batches rectangular (aspect-ratio order,
    official shapes with pad 0, no mosaic, no shuffling); ``min_items`` drops training images with fewer
    boxes; ``single_cls`` makes every class 0 in both loaders (official train_dual.py)."""
    from yolo9kit.data import create_dataloader

    d = config.pipeline
    if split == "train":
        on_device = d.colour_on_device
        on_device = (device is not None and device.type == "cuda") if on_device is None else on_device
        return create_dataloader(data, "train", imgsz=config.step.imgsz,
                                 batch_size=config.batch_size // dist.world_size, augment=True, workers=d.workers,
                                 cache=d.cache, hyp=d.augment_hyp,
                                 seed=config.run.seed, distributed=dist.distributed,  # same seed: ranks split one order
                                 colour_device=device if on_device else None, allow_bad_labels=d.allow_bad_labels,
                                 rect=d.rect, min_items=d.min_items, single_cls=d.single_cls)
    return create_dataloader(data, split, imgsz=config.step.imgsz,
                             batch_size=2 * config.batch_size,  # official; rank 0 validates alone
                             augment=False, workers=d.workers, cache=d.cache, single_cls=d.single_cls)


def multi_scale_shape(shape_hw: tuple[int, int], imgsz: int, stride: int, rng: random.Random
                      ) -> tuple[int, int] | None:
    """The (h, w) a batch of ``shape_hw`` is resized to in multi-scale training, or None when it stays.

    Official train_dual.py ``--multi-scale``: ``sz = randrange(0.5 * imgsz, 1.5 * imgsz + gs) // gs * gs``,
    ``sf = sz / max(h, w)``, and when ``sf != 1`` the new shape ``ceil(x * sf / gs) * gs`` per side. The side
    is at least one stride (the official code refuses an imgsz below two strides instead).
    """
    size = multi_scale_side(imgsz, stride, rng)
    factor = size / max(shape_hw)
    if factor == 1:
        return None
    h, w = (math.ceil(x * factor / stride) * stride for x in shape_hw)
    return h, w


def multi_scale_rng(seed: int, ni: int) -> random.Random:
    """The generator of batch ``ni``'s size: a function of (seed, ni) only, so a resumed run draws the same
    sizes (the official code draws from the global ``random`` state)."""
    return random.Random(f"multi-scale {seed} {ni}")


def set_epoch_data(loader, config: TrainConfig, epoch: int) -> None:
    """DistributedSampler epoch; mosaic off for the last ``close_mosaic`` epochs (>= so a resumed run also closes)."""
    sampler = getattr(loader, "sampler", None)
    if hasattr(loader, "set_epoch"):  # yolo9kit loaders: order and augmentation depend on (seed, epoch) only
        loader.set_epoch(epoch)
    elif hasattr(sampler, "set_epoch"):  # a plain DataLoader with a DistributedSampler
        sampler.set_epoch(epoch)
    close = config.pipeline.close_mosaic
    if close and epoch >= config.epochs - close and hasattr(loader, "dataset"):
        from yolo9kit.data import set_mosaic

        if getattr(loader.dataset, "mosaic", True):
            LOGGER.info("closing mosaic for the last %d epochs", config.pipeline.close_mosaic)
        set_mosaic(loader, False)


class EMAValidation:
    """The default validation of a run: ``yolo9kit.validate.evaluate`` of the EMA on the val loader. Called
    with the model, it returns the metrics fit records; ``result`` keeps the last ``ValResult`` (the run
    folder's validation pictures are drawn from it)."""

    def __init__(self, data, loader, config: TrainConfig, device: torch.device, half: bool) -> None:
        self.data, self.loader, self.config, self.device, self.half = data, loader, config, device, half
        self.result = None

    def __call__(self, model: nn.Module) -> dict[str, float]:
        from yolo9kit.validate import evaluate

        config = self.config
        r = evaluate(model, self.data, dataloader=self.loader, imgsz=config.step.imgsz, half=self.half,
                     device=self.device, single_cls=config.pipeline.single_cls, progress_bar=config.run.progress_bar)
        self.result = r
        return {"precision": float(r.precision), "recall": float(r.recall), "map50": float(r.map50),
                "map50_95": float(r.map50_95),
                "fitness": float(r.fitness)}
