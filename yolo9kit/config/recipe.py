"""What a run trains with: official hyp files (reading them, their keys) and the recipe (docs/training.md)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from yolo9kit.config.train import DEFAULT_AUGMENT_HYP, SETTINGS, LossConfig, TrainConfig, named_settings
from yolo9kit.files import RecordError, read_record

LOGGER = logging.getLogger(__name__)

OPTIM_KEYS = ("lr0", "lrf", "momentum", "weight_decay", "warmup_epochs", "warmup_momentum", "warmup_bias_lr")
LOSS_KEYS = {"box": "box_gain", "cls": "cls_gain", "dfl": "dfl_gain", "cls_pw": "cls_pos_weight"}  # LossConfig's
# Keys of YOLOv5's loss and anchors, with their hyp.scratch-high values: no effect in YOLOv9 (nor here); written
# back so that a file the kit writes is one train_dual.py takes too.
IGNORED = {"obj": 0.7, "obj_pw": 1.0, "iou_t": 0.2, "anchor_t": 5.0, "fl_gamma": 0.0}
# TrainConfig settings a hyp file of the kit may also hold (tune's best_hyp.yaml: the recipe its trials trained, so
# that train --hyp trains it); train_dual.py ignores them
RECIPE_KEYS = ("recipe", "optimizer", "nominal_batch_size", "schedule", "warmup_min_batches", "close_mosaic")
# Ultralytics' threshold for optimizer="auto" (its iterations: images / max(batch, 64) x epochs).
SHORT_RUN_UPDATES = 10_000
OFFICIAL_NOMINAL_BATCH = 64
# The short recipe, measured on the shapes data (benchmarks/demo_recipe.py, benchmarks/time_to_map.py):
SHORT_SETTINGS: Mapping[str, Any] = MappingProxyType({
    "optimizer": "AdamW",  # per-parameter steps need no long warmup: several times SGD's mAP after 10 epochs
    "lr0": 0.0015,  # about Ultralytics' auto rate for 3 classes (0.002 * 5 / (4 + nc))
    "nominal_batch_size": 16,  # one optimizer step per batch of 16: four times the official updates per image
    "warmup_epochs": 1.0,  # one warmup epoch, however short (100 batches would be a third of a small run)
    "warmup_min_batches": 0,
})
# Lighter augmentation: mixup and copy-paste slow a model that has few epochs to learn the objects at all.
SHORT_AUGMENT: Mapping[str, float] = MappingProxyType({"mosaic": 0.5, "mixup": 0.0, "copy_paste": 0.0, "scale": 0.5})
SHORT_CLOSE_MOSAIC = 5  # mosaic off for the last epochs (at most this many): the model ends on whole images


def read_hyp(path: str | Path) -> dict[str, Any]:
    """The values of a hyp file by official key, and the ``RECIPE_KEYS`` it holds (an unknown key is a warning).
    ValueError: the file is not ``name: number`` lines, or a value is out of its range (naming file and key)."""
    try:
        values = read_record(path) or {}
    except RecordError as e:  # a syntax error, a tag such as !!python/..., an alias, a file over 1 MiB
        raise ValueError(f"--hyp {e}; the file holds 'name: number' lines (official hyp.*.yaml keys)") from None
    if not isinstance(values, dict):
        raise ValueError(f"--hyp {path}: expected 'name: number' lines, got a {type(values).__name__}")
    numbers = {*OPTIM_KEYS, *LOSS_KEYS, *DEFAULT_AUGMENT_HYP}
    unknown = set(values) - numbers - set(IGNORED) - {"label_smoothing", *RECIPE_KEYS}
    if unknown:
        LOGGER.warning("%s: ignoring unknown keys %s", path, sorted(unknown))
    out = {k: v for k, v in values.items() if k in numbers or k in RECIPE_KEYS}
    for key, value in out.items():  # each alone, so that the error names the key
        try:
            TrainConfig(**hyp_settings({key: value}, LossConfig()))
        except (TypeError, ValueError) as e:  # float() of a word, a value out of its range
            raise ValueError(f"--hyp {path}: {key}: {e}") from None
    return {k: float(v) if k in numbers else v for k, v in out.items()}


def hyp_settings(values: Mapping[str, Any], loss: LossConfig) -> dict[str, Any]:
    """The TrainConfig settings in hyp ``values``: by name, ``hyp`` (augmentation) and ``loss`` with their gains."""
    out: dict[str, Any] = {k: float(values[k]) for k in OPTIM_KEYS if k in values}
    out.update({k: values[k] for k in RECIPE_KEYS if k in values})
    augment = {k: float(values[k]) for k in DEFAULT_AUGMENT_HYP if k in values}
    if augment:
        out["hyp"] = augment
    gains = {field: float(values[k]) for k, field in LOSS_KEYS.items() if k in values}
    if gains:
        out["loss"] = loss.replace(**gains)
    return out


def choose_recipe(config: TrainConfig, images: int | None, saved: Mapping[str, Any] | None = None
                  ) -> tuple[TrainConfig, str]:
    """``config`` with its recipe decided ("official" or "short", the short one applied) and a line saying why.

    Args:
        images: training images per epoch (None: unknown, the official recipe).
        saved: a resumed run's ``train_config``: its recipe is kept.
    """
    recipe = config.recipe
    if saved is not None:  # another recipe than the saved one is refused by the resume's check
        recipe = saved["recipe"] if recipe == "auto" else recipe
        recipe, why = "official" if recipe == "auto" else recipe, "the resumed run's"
    elif recipe != "auto":
        why = "as asked"
    elif images is None:
        recipe, why = "official", "the number of training images is unknown"
    else:
        updates = math.ceil(images / OFFICIAL_NOMINAL_BATCH) * config.epochs
        recipe = "short" if updates <= SHORT_RUN_UPDATES else "official"
        why = (f"{config.epochs} epochs of {images} images are {updates:,} optimizer steps of "
               f"{OFFICIAL_NOMINAL_BATCH} images, {'at most' if recipe == 'short' else 'more than'} "
               f"{SHORT_RUN_UPDATES:,}")
    if recipe == "official":
        return config.replace(recipe="official"), f"recipe official ({why}): train_dual.py's"
    config = apply_short_recipe(config)
    o, hyp, warmup = config.optim, config.pipeline.augment_hyp, config.optim.warmup_epochs
    return config, (f"recipe short ({why}): {config.step.optimizer} lr0 {o.lr0:g}, {o.nominal_batch_size} images "
                    f"per optimizer step, warmup {warmup:g} epoch{'' if warmup == 1 else 's'}, mosaic "
                    f"{hyp['mosaic']:g}, mixup {hyp['mixup']:g}, copy-paste {hyp['copy_paste']:g}, scale "
                    f"{hyp['scale']:g}, mosaic off for the last {config.pipeline.close_mosaic} epochs; "
                    "recipe='official' (--recipe official) trains as train_dual.py")


def apply_short_recipe(config: TrainConfig) -> TrainConfig:
    """The short recipe over the settings and augmentation keys of ``config`` neither named nor changed (idempotent)."""
    named, values = named_settings(config), config.to_dict()
    short = {**SHORT_SETTINGS, "close_mosaic": min(SHORT_CLOSE_MOSAIC, config.epochs)}
    changes: dict[str, Any] = {name: value for name, value in short.items()
                               if name not in named and values[name] == SETTINGS[name][1].default}
    given = dict(config.pipeline.hyp or {})  # the augmentation keys given are kept, whatever their value
    changes["hyp"] = {**{k: v for k, v in SHORT_AUGMENT.items() if k not in given}, **given}
    return config.replace(recipe="short", **changes)
