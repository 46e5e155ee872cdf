"""Freezing layers for fine-tuning, as the official ``train_dual.py --freeze``.

The official flag takes one number N (the first N layers: ``--freeze 10`` is the backbone of the yolov9-c
yaml, whose ``backbone:`` section has 10 rows) or several layer indices (``--freeze 0 1 2``), and sets
``requires_grad = False`` on every parameter whose name contains ``model.{i}.``; for a DetectionModel's names
(``model.<i>.<rest>``) that is the parameters of layer ``i``. Its default, ``[0]``, freezes nothing. It never
sets ``requires_grad`` back to True, so the DFL head's fixed convolution (built with ``requires_grad=False``)
stays fixed whatever is frozen; the same holds here.

The kit adds the name ``"backbone"``: the rows of the model yaml's ``backbone:`` section, layers
``0 .. len(yaml["backbone"]) - 1``, everything before the first neck row (SPPELAN). Per model:

- yolov9-t, yolov9-s, gelan-t/s/m/c: layers 0-8, the feature extractor down to the stride-32 stage;
- yolov9-m, yolov9-c: layers 0-9 (row 0 is the ``Silence`` placeholder), the official ``--freeze 10``; their
  auxiliary (PGI) branch's own feature extractor (the ``CBLinear``/``CBFuse`` rows) is in ``head:`` and trains;
- yolov9-e, gelan-e: layers 0-28, both stacked feature extractors with their ``CBLinear``/``CBFuse`` links.

BatchNorm layers of frozen layers stay in training mode, as in the official code: their weights and biases
are fixed, their running statistics keep following the new data.
"""

from __future__ import annotations

import logging

from torch import nn

from yolo9kit.config.step import Freeze, check_freeze

LOGGER = logging.getLogger(__name__)


def frozen_layer_indices(model: nn.Module, freeze: Freeze) -> list[int]:
    """The layer indices ``freeze`` names for ``model`` (a DetectionModel: ``model.model`` holds the layers).

    Args:
        model: the detector (a DDP wrapper must be unwrapped first).
        freeze: None or 0 (nothing), N (layers 0..N-1, official ``--freeze N``), "backbone" (the yaml's
            ``backbone:`` rows) or a list of layer indices (official ``--freeze i j k``).

    Raises:
        ValueError: the model has no layer list, or an index is out of its range (the message names both).
    """
    freeze = check_freeze(freeze, "TrainConfig")
    if not freeze:
        return []
    layers = getattr(model, "model", None)
    if not isinstance(layers, nn.Sequential):
        raise ValueError(f"freeze={freeze!r} needs a DetectionModel (layers in .model); got {type(model).__name__}; "
                         "set requires_grad=False on its parameters yourself and leave freeze=None")
    n = len(layers)
    if freeze == "backbone":
        yaml = getattr(model, "yaml", None) or {}
        if "backbone" not in yaml:
            raise ValueError(f"freeze='backbone': {getattr(model, 'name', type(model).__name__)} has no yaml with a "
                             "'backbone' section; give the number of first layers instead")
        return list(range(min(len(yaml["backbone"]), n)))
    indices = list(range(freeze)) if isinstance(freeze, int) else sorted(set(freeze))
    bad = [i for i in indices if i >= n]
    if bad:
        raise ValueError(f"freeze={freeze!r}: layers {bad} out of range; "
                         f"{getattr(model, 'name', 'the model')} has layers 0..{n - 1}")
    return indices


def freeze_layers(model: nn.Module, freeze: Freeze) -> list[str]:
    """Set ``requires_grad=False`` on the parameters of the layers ``freeze`` names (official ``--freeze``).

    Returns the names of the parameters frozen (``model.<i>.<rest>``). Nothing is unfrozen: call it on a
    fresh model, or set ``requires_grad`` back yourself.
    """
    indices = frozen_layer_indices(model, freeze)
    if not indices:
        return []
    prefixes = tuple(f"model.{i}." for i in indices)
    names, values, changed = [], 0, False
    for name, p in model.named_parameters():
        if name.startswith(prefixes):
            changed |= p.requires_grad
            p.requires_grad_(False)
            names.append(name)
            values += p.numel()
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"freeze={freeze!r} freezes every layer of {getattr(model, 'name', 'the model')} "
                         f"({len(model.model)} layers, 0..{len(model.model) - 1}): nothing would train; freeze "
                         "fewer (e.g. 'backbone', or the first N layers with N below the layer count)")
    if changed:  # a second call (fit, then the trainer) changes nothing and says nothing
        LOGGER.info("freezing layers %s: %d parameter tensors, %d values", _ranges(indices), len(names), values)
    return names


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    out, start = [], None
    for k, i in enumerate(indices):
        if start is None:
            start = i
        if k + 1 == len(indices) or indices[k + 1] != i + 1:
            out.append(str(start) if start == i else f"{start}-{i}")
            start = None
    return ", ".join(out)
