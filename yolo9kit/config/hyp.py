"""Official hyp files (``data/hyps/hyp.scratch-high.yaml``): their keys, reading one, writing one.

A hyp file is ``name: number`` lines. Its keys go three ways in the kit: the optimizer's (``lr0`` ...
``warmup_bias_lr``) are ``TrainConfig`` settings of the same name, the augmentation's (``hsv_h`` ...
``copy_paste``) are ``TrainConfig.hyp``, the loss gains (``box``, ``cls``, ``dfl``, ``cls_pw``) are the
``LossConfig``'s. A few keys of YOLOv5's loss are in the official file and change nothing in YOLOv9's
(``IGNORED``): they are read without a word and written back with their official values, so that a file the kit
writes (``tune``'s best hyper-parameters) is a complete hyp file that train_dual.py takes too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from yolo9kit.files import RecordError, read_record

LOGGER = logging.getLogger(__name__)

# The optimizer's keys: TrainConfig settings of the same name.
OPTIM_KEYS = ("lr0", "lrf", "momentum", "weight_decay", "warmup_epochs", "warmup_momentum", "warmup_bias_lr")
# The loss gains: official key -> LossConfig field (the official loss hard-codes box, cls and dfl).
LOSS_KEYS = {"box": "box_gain", "cls": "cls_gain", "dfl": "dfl_gain", "cls_pw": "cls_pos_weight"}
# Augmentation hyper-parameters of the official hyp.scratch-high.yaml (passed to the data layer).
DEFAULT_AUGMENT_HYP: dict[str, float] = {
    "hsv_h": 0.015, "hsv_s": 0.7, "hsv_v": 0.4, "degrees": 0.0, "translate": 0.1, "scale": 0.9,
    "shear": 0.0, "perspective": 0.0, "flipud": 0.0, "fliplr": 0.5, "mosaic": 1.0, "mixup": 0.15,
    "copy_paste": 0.3,
}
# Keys of YOLOv5's loss and anchors, with their hyp.scratch-high values: no effect in YOLOv9 (nor here).
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
LEFT_OUT = {
    "box, cls": "--evolve mutates them in YOLOv5's ranges (box 0.02-0.2 where YOLOv9 trains with 7.5); the official "
                "YOLOv9 loss ignores them (it hard-codes its gains), the kit's applies them",
    "obj, obj_pw, anchor_t, anchors": "YOLOv5's objectness and anchors: YOLOv9 has neither",
    "iou_t, fl_gamma, perspective, fliplr": "gain 0 in --evolve's table: never mutated",
    "dfl": "not in --evolve's table",
}
LOG_SCALE = {"lr0"}  # four decades: sampled on a log scale, the others evenly
TUNABLE = (*OPTIM_KEYS, *LOSS_KEYS, *DEFAULT_AUGMENT_HYP)  # the keys a custom space of tune may hold
# TrainConfig settings a hyp file of the kit may also hold (tune's best_hyp.yaml: the recipe its trials trained, so
# that train --hyp trains it); train_dual.py ignores them
RECIPE_KEYS = ("recipe", "optimizer", "nominal_batch_size", "schedule", "warmup_min_batches", "close_mosaic")
# augmentation keys that are probabilities; the others are gains and ranges, >= 0
_AUGMENT_PROBABILITIES = ("flipud", "fliplr", "mosaic", "mixup", "copy_paste")
# the order of the official file
_ORDER = (*OPTIM_KEYS, "box", "cls", "cls_pw", "obj", "obj_pw", "dfl", "iou_t", "anchor_t", "fl_gamma",
          *DEFAULT_AUGMENT_HYP)


def check_augment_hyp(values: Mapping[str, float], owner: str) -> None:
    """Augmentation hyper-parameters in range (probabilities in [0, 1], gains finite and >= 0), else a ValueError
    naming ``owner`` and the key."""
    for key, value in values.items():
        if key not in DEFAULT_AUGMENT_HYP:
            continue
        probability = key in _AUGMENT_PROBABILITIES
        if not (0 <= value <= 1 if probability else 0 <= value < math.inf):  # nan fails both
            raise ValueError(f"{owner}[{key!r}]={value!r}: expected "
                             f"{'a probability in [0, 1]' if probability else 'a finite number >= 0'}")


def read_hyp(path: str | Path) -> dict[str, Any]:
    """The numbers of a hyp file, by official key, and the ``RECIPE_KEYS`` it holds (``label_smoothing`` and the
    ``IGNORED`` keys are read and dropped; an unknown key is a warning).

    Raises:
        ValueError: the file is not ``name: number`` lines (naming the file).
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
        numbers = {k: float(v) for k, v in values.items() if k in known}
    except (TypeError, ValueError) as e:
        raise ValueError(f"--hyp {path}: every value must be a number ({e})") from None
    recipe = {k: values[k] for k in RECIPE_KEYS if k in values}  # checked with the settings (cli.train)
    return {**numbers, **recipe}


def hyp_settings(values: Mapping[str, Any], loss: Any) -> dict[str, Any]:
    """The TrainConfig settings of hyp ``values`` (official keys, and ``RECIPE_KEYS``): the optimizer's and the
    recipe's by name, ``hyp`` (the augmentation, when the values hold any) and ``loss`` (``loss``, a LossConfig, with
    the gains the values hold)."""
    out: dict[str, Any] = {k: float(values[k]) for k in OPTIM_KEYS if k in values}
    out.update({k: values[k] for k in RECIPE_KEYS if k in values})
    augment = {k: float(values[k]) for k in DEFAULT_AUGMENT_HYP if k in values}
    if augment:
        out["hyp"] = augment
    gains = {field: float(values[k]) for k, field in LOSS_KEYS.items() if k in values}
    if gains:
        out["loss"] = loss.replace(**gains)
    return out


def hyp_of(config: Any) -> dict[str, Any]:
    """Every key of an official hyp file, in its order, then the ``RECIPE_KEYS``, with the values ``config`` (a
    TrainConfig) trains with."""
    optim = config.optim
    values = {k: getattr(optim, k) for k in OPTIM_KEYS}
    values.update({k: getattr(optim.loss, field) for k, field in LOSS_KEYS.items()})
    values.update(IGNORED)
    values.update(config.pipeline.augment_hyp)
    settings = config.to_dict()
    return {**{k: float(values[k]) for k in _ORDER}, **{k: settings[k] for k in RECIPE_KEYS}}


def write_hyp(path: str | Path, values: Mapping[str, Any], header: str = "") -> Path:
    """Write ``values`` as a hyp file (``header``: comment lines above them; a value that is not a float, such as a
    recipe key's, as it is), atomically."""
    from yolo9kit.files import write_text_atomically

    comments = "".join(f"# {line}\n" for line in header.splitlines())
    lines = "".join(f"{k}: {_number(v) if isinstance(v, float) else v}\n" for k, v in values.items())
    write_text_atomically(path, comments + lines)
    return Path(path)


def _number(value: float) -> str:
    """Every digit (a tuned value read back is the value trained), as a float YAML 1.1 reads back (``1.0e-05``:
    PyYAML takes ``1e-05`` for a string)."""
    text = repr(float(value))
    mantissa, _, exponent = text.partition("e")
    return f"{mantissa}.0e{exponent}" if exponent and "." not in mantissa else text
