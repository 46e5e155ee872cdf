"""Which recipe a run trains with: train_dual.py's, or the kit's recipe for runs too short for it.

The official recipe (SGD lr0 0.01, 64 images per optimizer step reached by accumulation, three warmup
epochs of at least 100 batches, hyp.scratch-high's mosaic, mixup and copy-paste) is tuned for hundreds of
epochs on COCO. In a run of a few thousand optimizer steps it has barely left its warmup: on the shapes data
it reaches mAP50 0.03 in 10 epochs where AdamW with one step per batch reaches 0.46 (docs/benchmarks.md).
Ultralytics' ``optimizer="auto"`` makes the same choice, SGD above 10,000 iterations and AdamW below.

``recipe="auto"`` (the default) takes the short recipe when the run has at most ``SHORT_RUN_UPDATES``
optimizer steps of the official 64 images, ``"official"`` keeps train_dual.py's exactly, ``"short"`` always
takes the kit's. The short recipe sets only the settings not given (``TrainConfig(optimizer="SGD")`` keeps
SGD) and the augmentation keys a ``hyp`` does not name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from yolo9kit.config.declare import settings
from yolo9kit.config.train import TrainConfig, named_settings

# Ultralytics' threshold for optimizer="auto" (its iterations: images / max(batch, 64) x epochs).
SHORT_RUN_UPDATES = 10_000
OFFICIAL_NOMINAL_BATCH = 64

# The short recipe, measured on the shapes data (benchmarks/demo_recipe.py, benchmarks/time_to_map.py):
SHORT_SETTINGS: Mapping[str, Any] = MappingProxyType({
    # AdamW, whose per-parameter step sizes need no long warmup to settle: several times the mAP of SGD
    # after 10 epochs from scratch. lr0 0.0015: about Ultralytics' auto rate for 3 classes (0.002 * 5 / (4 + nc)).
    "optimizer": "AdamW",
    "lr0": 0.0015,
    # one optimizer step per batch of 16: four times the official number of updates per image
    "nominal_batch_size": 16,
    # one warmup epoch, however short (the official floor of 100 batches is a third of a small run)
    "warmup_epochs": 1.0,
    "warmup_min_batches": 0,
})
# Lighter augmentation: mixup and copy-paste slow a model that has few epochs to learn the objects at all.
SHORT_AUGMENT: Mapping[str, float] = MappingProxyType({"mosaic": 0.5, "mixup": 0.0, "copy_paste": 0.0,
                                                        "scale": 0.5})
# mosaic off for the last epochs (at most this many), so that the model ends on whole images
SHORT_CLOSE_MOSAIC = 5

_SETTINGS = settings(TrainConfig)


def choose_recipe(config: TrainConfig, images: int | None, saved: Mapping[str, Any] | None = None
                  ) -> tuple[TrainConfig, str]:
    """``config`` with its recipe decided ("official" or "short") and the short recipe applied, and a line
    saying which and why.

    Args:
        config: the run's settings; ``config.recipe`` "auto" is decided here.
        images: training images per epoch (None: unknown, the official recipe).
        saved: a resumed run's ``train_config``: its recipe is kept (runs saved before recipes existed
            trained the official one).
    """
    recipe = config.recipe
    if saved is not None:  # another recipe than the saved one is refused by the resume's check
        if recipe == "auto":
            recipe = saved.get("recipe", "official")
        recipe = "official" if recipe == "auto" else recipe
        why = "the resumed run's"
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
    from their default, and the augmentation keys its ``hyp`` does not name (idempotent: a resumed run's
    settings come back unchanged)."""
    named = named_settings(config)
    free = {name for name in (*SHORT_SETTINGS, "close_mosaic")
            if name not in named and _value(config, name) == _SETTINGS[name][1].default}
    changes: dict[str, Any] = {name: value for name, value in SHORT_SETTINGS.items() if name in free}
    if "close_mosaic" in free:
        changes["close_mosaic"] = min(SHORT_CLOSE_MOSAIC, config.epochs)
    given = dict(config.pipeline.hyp or {})  # the augmentation keys given are kept, whatever their value
    changes["hyp"] = {**{k: v for k, v in SHORT_AUGMENT.items() if k not in given}, **given}
    return config.replace(recipe="short", **changes)


def _value(config: TrainConfig, name: str) -> Any:
    holder, f, _ = _SETTINGS[name]
    return getattr(config if holder is None else getattr(config, holder), f.name)
