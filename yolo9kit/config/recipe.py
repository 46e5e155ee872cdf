"""What a run trains with: official hyp files (``data/hyps/hyp.scratch-high.yaml``: reading, writing, their keys)
and the recipe, train_dual.py's or the kit's for runs too short for it (docs/training.md, the recipe)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from yolo9kit.config.step import settings
from yolo9kit.config.train import DEFAULT_AUGMENT_HYP, LossConfig, TrainConfig, named_settings
from yolo9kit.files import RecordError, read_record, write_text_atomically

LOGGER = logging.getLogger(__name__)

# The optimizer's keys: TrainConfig settings of the same name.
OPTIM_KEYS = ("lr0", "lrf", "momentum", "weight_decay", "warmup_epochs", "warmup_momentum", "warmup_bias_lr")
# The loss gains: official key -> LossConfig field (the official loss hard-codes box, cls and dfl).
LOSS_KEYS = {"box": "box_gain", "cls": "cls_gain", "dfl": "dfl_gain", "cls_pw": "cls_pos_weight"}
# Keys of YOLOv5's loss and anchors, with their hyp.scratch-high values: no effect in YOLOv9 (nor here); written
# back so that a file the kit writes is one train_dual.py takes too.
IGNORED = {"obj": 0.7, "obj_pw": 1.0, "iou_t": 0.2, "anchor_t": 5.0, "fl_gamma": 0.0}
# train_dual.py's --evolve limits (its ``meta``: gain, low, high) of the keys it mutates that YOLOv9 trains with:
# the search space of ``yolo9kit.train.tuning.tune``.
EVOLVE_SPACE: Mapping[str, tuple[float, float]] = MappingProxyType({
    "lr0": (1e-5, 1e-1), "lrf": (0.01, 1.0), "momentum": (0.6, 0.98), "weight_decay": (0.0, 0.001),
    "warmup_epochs": (0.0, 5.0), "warmup_momentum": (0.0, 0.95), "warmup_bias_lr": (0.0, 0.2), "cls_pw": (0.5, 2.0),
    "hsv_h": (0.0, 0.1), "hsv_s": (0.0, 0.9), "hsv_v": (0.0, 0.9), "degrees": (0.0, 45.0), "translate": (0.0, 0.9),
    "scale": (0.0, 0.9), "shear": (0.0, 10.0), "flipud": (0.0, 1.0), "mosaic": (0.0, 1.0), "mixup": (0.0, 1.0),
    "copy_paste": (0.0, 1.0),
})
LOG_SCALE = {"lr0"}  # four decades: sampled on a log scale, the others evenly
TUNABLE = (*OPTIM_KEYS, *LOSS_KEYS, *DEFAULT_AUGMENT_HYP)  # the keys a custom space of tune may hold
# TrainConfig settings a hyp file of the kit may also hold (tune's best_hyp.yaml: the recipe its trials trained, so
# that train --hyp trains it); train_dual.py ignores them
RECIPE_KEYS = ("recipe", "optimizer", "nominal_batch_size", "schedule", "warmup_min_batches", "close_mosaic")
_ORDER = (*OPTIM_KEYS, "box", "cls", "cls_pw", "obj", "obj_pw", "dfl", "iou_t", "anchor_t", "fl_gamma",
          *DEFAULT_AUGMENT_HYP)  # the order of the official file

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
SHORT_AUGMENT: Mapping[str, float] = MappingProxyType({"mosaic": 0.5, "mixup": 0.0, "copy_paste": 0.0,
                                                        "scale": 0.5})
SHORT_CLOSE_MOSAIC = 5  # mosaic off for the last epochs (at most this many): the model ends on whole images
_SETTINGS = settings(TrainConfig)


def read_hyp(path: str | Path) -> dict[str, Any]:
    """The values of a hyp file by official key, and the ``RECIPE_KEYS`` it holds (``label_smoothing`` and the
    ``IGNORED`` keys are dropped; an unknown key is a warning).

    Raises:
        ValueError: the file is not ``name: number`` lines, or a value is out of its range (naming file and key).
        FileNotFoundError: no such file.
    """
    try:
        values = read_record(path) or {}
    except RecordError as e:  # a syntax error, a tag such as !!python/..., an alias, a file over 1 MiB
        raise ValueError(f"--hyp {e}; the file holds 'name: number' lines (official hyp.*.yaml keys)") from None
    if not isinstance(values, dict):
        raise ValueError(f"--hyp {path}: expected 'name: number' lines, got a {type(values).__name__}")
    known = set(OPTIM_KEYS) | set(LOSS_KEYS) | set(DEFAULT_AUGMENT_HYP)
    unknown = set(values) - known - set(IGNORED) - {"label_smoothing", *RECIPE_KEYS}
    if unknown:
        LOGGER.warning("%s: ignoring unknown keys %s", path, sorted(unknown))
    try:
        out = {k: float(v) for k, v in values.items() if k in known}
    except (TypeError, ValueError) as e:
        raise ValueError(f"--hyp {path}: every value must be a number ({e})") from None
    out.update({k: values[k] for k in RECIPE_KEYS if k in values})
    for key, value in out.items():  # each alone, so that the error names the key
        try:
            TrainConfig(**hyp_settings({key: value}, LossConfig()))
        except ValueError as e:
            raise ValueError(f"--hyp {path}: {key}: {e}") from None
    return out


def hyp_settings(values: Mapping[str, Any], loss: LossConfig) -> dict[str, Any]:
    """The TrainConfig settings of hyp ``values``: the optimizer's and the recipe's by name, ``hyp`` (the
    augmentation, when the values hold any) and ``loss`` (``loss`` with the gains the values hold)."""
    out: dict[str, Any] = {k: float(values[k]) for k in OPTIM_KEYS if k in values}
    out.update({k: values[k] for k in RECIPE_KEYS if k in values})
    augment = {k: float(values[k]) for k in DEFAULT_AUGMENT_HYP if k in values}
    if augment:
        out["hyp"] = augment
    gains = {field: float(values[k]) for k, field in LOSS_KEYS.items() if k in values}
    if gains:
        out["loss"] = loss.replace(**gains)
    return out


def hyp_of(config: TrainConfig) -> dict[str, Any]:
    """Every key of an official hyp file, in its order, then the ``RECIPE_KEYS``, with the values ``config``
    trains with."""
    values = {k: getattr(config.optim, k) for k in OPTIM_KEYS}
    values.update({k: getattr(config.optim.loss, field) for k, field in LOSS_KEYS.items()})
    values.update({**IGNORED, **config.pipeline.augment_hyp})
    saved = config.to_dict()
    return {**{k: float(values[k]) for k in _ORDER}, **{k: saved[k] for k in RECIPE_KEYS}}


def write_hyp(path: str | Path, values: Mapping[str, Any], header: str = "") -> Path:
    """Write ``values`` as a hyp file, atomically (``header``: comment lines above them)."""
    comments = "".join(f"# {line}\n" for line in header.splitlines())
    lines = "".join(f"{k}: {_number(v) if isinstance(v, float) else v}\n" for k, v in values.items())
    write_text_atomically(path, comments + lines)
    return Path(path)


def _number(value: float) -> str:
    """Every digit, as a float YAML 1.1 reads back (``1.0e-05``: PyYAML takes ``1e-05`` for a string)."""
    text = repr(float(value))
    mantissa, _, exponent = text.partition("e")
    return f"{mantissa}.0e{exponent}" if exponent and "." not in mantissa else text


def choose_recipe(config: TrainConfig, images: int | None, saved: Mapping[str, Any] | None = None
                  ) -> tuple[TrainConfig, str]:
    """``config`` with its recipe decided ("official" or "short", the short one applied) and a line saying why.

    Args:
        config: the run's settings; ``config.recipe`` "auto" is decided here.
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
        short = updates <= SHORT_RUN_UPDATES
        recipe = "short" if short else "official"
        why = (f"{config.epochs} epochs of {images} images are {updates:,} optimizer steps of "
               f"{OFFICIAL_NOMINAL_BATCH} images, {'at most' if short else 'more than'} {SHORT_RUN_UPDATES:,}")
    if recipe == "official":
        return config.replace(recipe="official"), f"recipe official ({why}): train_dual.py's"
    config = apply_short_recipe(config)
    o, p = config.optim, config.pipeline
    hyp = p.augment_hyp
    epochs = f"{o.warmup_epochs:g} epoch" + ("" if o.warmup_epochs == 1 else "s")
    return config, (f"recipe short ({why}): {config.step.optimizer} lr0 {o.lr0:g}, {o.nominal_batch_size} images "
                    f"per optimizer step, warmup {epochs}, mosaic {hyp['mosaic']:g}, mixup {hyp['mixup']:g}, "
                    f"copy-paste {hyp['copy_paste']:g}, scale {hyp['scale']:g}, mosaic off for the last "
                    f"{p.close_mosaic} epochs; recipe='official' (--recipe official) trains as train_dual.py")


def apply_short_recipe(config: TrainConfig) -> TrainConfig:
    """The short recipe over the settings of ``config`` neither given by name (``named_settings``) nor changed
    from their default, and the augmentation keys its ``hyp`` does not name (idempotent)."""
    named = named_settings(config)
    free = {name for name in (*SHORT_SETTINGS, "close_mosaic") if name not in named
            and getattr(getattr(config, _SETTINGS[name][0]), _SETTINGS[name][1].name) == _SETTINGS[name][1].default}
    changes: dict[str, Any] = {name: value for name, value in SHORT_SETTINGS.items() if name in free}
    if "close_mosaic" in free:
        changes["close_mosaic"] = min(SHORT_CLOSE_MOSAIC, config.epochs)
    given = dict(config.pipeline.hyp or {})  # the augmentation keys given are kept, whatever their value
    changes["hyp"] = {**{k: v for k, v in SHORT_AUGMENT.items() if k not in given}, **given}
    return config.replace(recipe="short", **changes)
