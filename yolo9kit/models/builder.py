"""Build a model from an official-format layer table (the ``backbone``/``head`` rows of a model yaml).

Rows are ``[from, repeats, module, args]`` (official ``models/yolo.py`` parse_model). Modules come from
:data:`MODULES`, a plain registry of names; string arguments are resolved explicitly (``'nc'``, ``'None'``,
``'anchors'``), nothing is ``eval``-ed. Errors name the row that caused them.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from torch import nn

from yolo9kit.models import layers as L
from yolo9kit.models.heads import DDetect, DualDDetect

LOGGER = logging.getLogger(__name__)

# yaml module name -> class. nn.Upsample is spelled as in the official files.
MODULES: dict[str, type[nn.Module]] = {
    "Conv": L.Conv, "AConv": L.AConv, "ADown": L.ADown, "ELAN1": L.ELAN1, "RepNCSPELAN4": L.RepNCSPELAN4,
    "RepNCSP": L.RepNCSP, "RepNBottleneck": L.RepNBottleneck, "RepConvN": L.RepConvN, "SPPELAN": L.SPPELAN,
    "SP": L.SP, "CBLinear": L.CBLinear, "CBFuse": L.CBFuse, "Silence": L.Silence, "Concat": L.Concat,
    "nn.Upsample": nn.Upsample, "Upsample": nn.Upsample, "DDetect": DDetect, "DualDDetect": DualDDetect,
}
# modules whose first yaml arg is the output width: c1 is prepended and c2 rounded by width_multiple
CHANNEL_MODULES = {L.Conv, L.AConv, L.ADown, L.ELAN1, L.RepNCSPELAN4, L.RepNCSP, L.RepNBottleneck, L.RepConvN,
                   L.SPPELAN}
HEADS = (DDetect, DualDDetect)
# blocks whose constructor takes a repeat count of their own: (position in the constructor's args, its name)
BLOCK_REPEATS = {L.RepNCSPELAN4: (4, "c5 (RepNCSP depth)"), L.RepNCSP: (2, "n")}
MAX_BLOCK_REPEATS = 64  # yolo9kit.models.bounds.MAX_REPEATS: official blocks repeat 1 to 3 times
# optional top-level ``activation:`` values (the official files accept any Python expression; we accept these)
ACTIVATIONS = {"nn.SiLU()": nn.SiLU, "nn.ReLU()": nn.ReLU, "nn.LeakyReLU(0.1)": lambda: nn.LeakyReLU(0.1),
               "nn.Hardswish()": nn.Hardswish, "nn.Identity()": nn.Identity}
PROBE_SIZE = 256  # side of the all-zero image the official build runs once to measure the strides


class LayerTableError(ValueError):
    """A model yaml row that cannot be built; the message names the file and the row."""


def make_divisible(x: float, divisor: int = 8) -> int:
    """Smallest multiple of ``divisor`` >= x (official width rounding)."""
    return int(math.ceil(x / divisor) * divisor)


def _resolve_arg(a: Any, cfg: dict, nc: int) -> Any:
    if not isinstance(a, str):
        return a
    return {"nc": nc, "None": None, "True": True, "False": False, "anchors": cfg.get("anchors")}.get(a, a)


def _row_label(source: str, i: int, n_backbone: int, row: Any) -> str:
    section, j = ("backbone", i) if i < n_backbone else ("head", i - n_backbone)
    return f"{source}: layer {i} ({section} row {j}) {row!r}"


def _layer_args(cls: type, f: Any, args: list, ch: list[int], gw: float, nc: int) -> tuple[list, int | list]:
    """Constructor args and output channels of one row (the rules of the official ``models/yolo.py`` parse_model)."""
    if cls in CHANNEL_MODULES:
        c1, c2 = ch[f], make_divisible(args[0] * gw, 8)
        args = [c1, c2, *args[1:]]
        return args, c2
    if cls is L.Concat:
        return args, sum(ch[x] for x in f)
    if cls is L.CBLinear:
        return [ch[f], list(args[0]), *args[1:]], list(args[0])
    if cls is L.CBFuse:
        return args, ch[f[-1]]
    if cls in HEADS:
        return [args[0] if args else nc, [ch[x] for x in f]], 0
    return args, ch[f] if isinstance(f, int) else ch[f[-1]]


def _check_block_repeats(cls: type, ctor_args: list, label: str) -> None:
    """A block's own repeat argument within ``MAX_BLOCK_REPEATS``: checked before the block is made (a depth of
    thousands would take minutes and gigabytes to build, even on the meta device)."""
    if cls not in BLOCK_REPEATS:
        return
    at, name = BLOCK_REPEATS[cls]
    value = ctor_args[at] if len(ctor_args) > at else 1
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BLOCK_REPEATS:
        raise LayerTableError(f"{label}: {name}={value!r}: expected 1 to {MAX_BLOCK_REPEATS}")


def parse_model(cfg: dict, ch: int, nc: int, source: str = "model yaml") -> tuple[nn.Sequential, list[int]]:
    """Build the layers of an official-format model dict.

    Args:
        cfg: dict with ``backbone`` and ``head`` row lists, ``depth_multiple``, ``width_multiple``.
        ch: input channels. nc: number of classes. source: name used in error messages.

    Returns:
        (layers as ``nn.Sequential``, sorted indices whose outputs later rows read).
    """
    try:
        gd, gw = float(cfg.get("depth_multiple", 1.0)), float(cfg.get("width_multiple", 1.0))
        rows = list(cfg["backbone"]) + list(cfg["head"])
    except (KeyError, TypeError, ValueError) as e:
        raise LayerTableError(f"{source}: expected 'backbone' and 'head' row lists and numeric "
                              f"depth_multiple/width_multiple ({e})") from e
    n_backbone = len(cfg["backbone"])
    layers, save, chs = [], [], [ch]
    for i, row in enumerate(rows):
        label = _row_label(source, i, n_backbone, row)
        if not (isinstance(row, (list, tuple)) and len(row) == 4):
            raise LayerTableError(f"{label}: expected [from, repeats, module, args]")
        f, n, name, args = row
        cls = MODULES.get(name)
        if cls is None:
            raise LayerTableError(f"{label}: unknown module {name!r}; known modules: {', '.join(sorted(MODULES))}")
        froms = [f] if isinstance(f, int) else list(f) if isinstance(f, (list, tuple)) else None
        if not froms or any(not isinstance(x, int) or not -i - 1 <= x < i for x in froms):
            raise LayerTableError(f"{label}: 'from' must be -1 or indices of earlier layers, got {f!r}")
        if not isinstance(n, int) or n < 1:
            raise LayerTableError(f"{label}: repeats must be a positive integer, got {n!r}")
        n = max(round(n * gd), 1) if n > 1 else n
        args = [_resolve_arg(a, cfg, nc) for a in (args or [])]
        try:
            ctor_args, c2 = _layer_args(cls, f, args, chs, gw, nc)
            _check_block_repeats(cls, ctor_args, label)
            module = nn.Sequential(*(cls(*ctor_args) for _ in range(n))) if n > 1 else cls(*ctor_args)
        except (TypeError, ValueError, IndexError, KeyError, AssertionError, RuntimeError) as e:
            raise LayerTableError(f"{label}: cannot build {name} with args {args!r}: {e}") from e
        module.i, module.f, module.type = i, f, name
        module.np = sum(p.numel() for p in module.parameters())
        save.extend(x % i for x in froms if x != -1)
        layers.append(module)
        if i == 0:
            chs = []
        chs.append(c2)
    if not layers or not isinstance(layers[-1], HEADS):
        raise LayerTableError(f"{source}: the last row must be a DDetect or DualDDetect head")
    return nn.Sequential(*layers), sorted(set(save))
