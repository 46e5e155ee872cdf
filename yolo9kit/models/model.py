"""DetectionModel: an official-format layer table (a model yaml's ``backbone``/``head`` rows) built and run in
index order, with the official state_dict layout (docs/models.md); frozen layers (official ``--freeze``)."""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as activation_checkpoint

from yolo9kit.config.step import Freeze, check_layers
from yolo9kit.models import layers as L
from yolo9kit.models.heads import DDetect, DualDDetect, DualOutput

LOGGER = logging.getLogger(__name__)

# modules whose first yaml arg is the output width: c1 is prepended and c2 rounded by width_multiple
CHANNEL_MODULES = {L.Conv, L.AConv, L.ADown, L.ELAN1, L.RepNCSPELAN4, L.RepNCSP, L.RepNBottleneck, L.RepConvN,
                   L.SPPELAN}
HEADS = (DDetect, DualDDetect)
# yaml module name -> class (nothing in a yaml is eval-ed); Silence is the identity that lets rows read the image
MODULES: dict[str, Any] = {m.__name__: m for m in (*CHANNEL_MODULES, *HEADS, L.SP, L.CBLinear, L.CBFuse, L.Concat)}
MODULES.update({"Silence": nn.Identity, "nn.Upsample": nn.Upsample, "Upsample": nn.Upsample})
# blocks with a repeat count of their own: (its position in the constructor's args, its name)
BLOCK_REPEATS = {L.RepNCSPELAN4: (4, "c5 (RepNCSP depth)"), L.RepNCSP: (2, "n")}
# the top-level ``activation:`` values accepted (the official files take any Python expression)
ACTIVATIONS = {"nn.SiLU()": nn.SiLU, "nn.ReLU()": nn.ReLU, "nn.LeakyReLU(0.1)": lambda: nn.LeakyReLU(0.1),
               "nn.Hardswish()": nn.Hardswish, "nn.Identity()": nn.Identity}
PROBE_SIZE = 256  # side of the all-zero image the official build runs once to measure the strides
# bounds on a table, checked row by row before the row is built (docs/faults.md, docs/models.md)
MAX_LAYERS = 400
MAX_REPEATS = 64  # a row's repeats times depth_multiple, and a block's own repeat argument
MAX_MULTIPLE = 4.0  # depth_multiple and width_multiple
MAX_CHANNELS = 16384  # any integer argument of a row (widths, hidden widths, kernel sizes)
MAX_CLASSES = 100_000


class LayerTableError(ValueError):
    """A layer table that cannot be built, or is past the bounds; the message names the file and the row."""


def _ints(value: Any) -> list[int]:
    if isinstance(value, (list, tuple)):
        return [i for v in value for i in _ints(v)]
    return [value] if isinstance(value, int) and not isinstance(value, bool) else []


def _layer(cls: Any, n: int, f: Any, args: list, ch: list[int], gw: float, nc: int, label: str):
    """One row's module and output channels (the rules of the official ``parse_model``)."""
    if cls in CHANNEL_MODULES:
        c2 = int(math.ceil(args[0] * gw / 8) * 8)  # official make_divisible
        args = [ch[f], c2, *args[1:]]
    elif cls is L.Concat:
        c2 = sum(ch[x] for x in f)
    elif cls is L.CBLinear:
        args, c2 = [ch[f], list(args[0]), *args[1:]], list(args[0])
    elif cls is L.CBFuse:
        c2 = ch[f[-1]]
    elif cls in HEADS:
        args, c2 = [args[0] if args else nc, [ch[x] for x in f]], 0
    else:
        c2 = ch[f] if isinstance(f, int) else ch[f[-1]]
    if cls in BLOCK_REPEATS:  # before the block is made: a depth of thousands takes minutes and gigabytes
        at, name = BLOCK_REPEATS[cls]
        value = args[at] if len(args) > at else 1
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPEATS:
            raise LayerTableError(f"{label}: {name}={value!r}: expected 1 to {MAX_REPEATS}")
    return (nn.Sequential(*(cls(*args) for _ in range(n))) if n > 1 else cls(*args)), c2


def parse_model(cfg: dict, ch: int, nc: int, source: str = "model yaml") -> tuple[nn.Sequential, list[int]]:
    """The layers of an official-format table (rows ``[from, repeats, module, args]``) and the sorted indices
    of the layers whose outputs later rows read; ``source`` names the table in errors. LayerTableError: a row that
    cannot be built or is past the bounds (the message names it)."""
    try:
        gd, gw = float(cfg.get("depth_multiple", 1.0)), float(cfg.get("width_multiple", 1.0))
        rows = list(cfg["backbone"]) + list(cfg["head"])
    except (KeyError, TypeError, ValueError) as e:
        raise LayerTableError(f"{source}: expected 'backbone' and 'head' row lists and numeric "
                              f"depth_multiple/width_multiple ({e})") from e
    if not 1 <= len(rows) <= MAX_LAYERS:
        raise LayerTableError(f"{source}: {len(rows)} layer rows: expected 1 to {MAX_LAYERS}")
    if not (0 < gd <= MAX_MULTIPLE and 0 < gw <= MAX_MULTIPLE):
        raise LayerTableError(f"{source}: depth_multiple={gd}, width_multiple={gw}: expected (0, {MAX_MULTIPLE}]")
    if not 1 <= nc <= MAX_CLASSES:
        raise LayerTableError(f"{source}: nc={nc}: expected 1 to {MAX_CLASSES} classes")
    layers, save, chs = [], [], [ch]
    for i, row in enumerate(rows):
        section, j = ("backbone", i) if i < len(cfg["backbone"]) else ("head", i - len(cfg["backbone"]))
        label = f"{source}: layer {i} ({section} row {j}) {row!r}"
        if not (isinstance(row, (list, tuple)) and len(row) == 4):
            raise LayerTableError(f"{label}: expected [from, repeats, module, args]")
        f, n, name, args = row
        if name not in MODULES:
            raise LayerTableError(f"{label}: unknown module {name!r}; known modules: {', '.join(sorted(MODULES))}")
        froms = [f] if isinstance(f, int) else list(f) if isinstance(f, (list, tuple)) else None
        if not froms or any(not isinstance(x, int) or not -i - 1 <= x < i for x in froms):
            raise LayerTableError(f"{label}: 'from' must be -1 or indices of earlier layers, got {f!r}")
        if not isinstance(n, int) or n < 1 or round(n * gd) > MAX_REPEATS:
            raise LayerTableError(f"{label}: {n!r} repeats (times depth_multiple {gd}): expected 1 to {MAX_REPEATS}")
        widths = [abs(v) for v in _ints(args)]
        if widths and max(widths) * max(gw, 1.0) > MAX_CHANNELS:
            raise LayerTableError(f"{label}: argument {max(widths)}: expected layer widths up to {MAX_CHANNELS}")
        n = max(round(n * gd), 1) if n > 1 else n
        args = [{"nc": nc, "None": None, "True": True, "False": False, "anchors": cfg.get("anchors")}.get(a, a)
                if isinstance(a, str) else a for a in (args or [])]
        try:
            module, c2 = _layer(MODULES[name], n, f, args, chs, gw, nc, label)
        except (TypeError, ValueError, IndexError, KeyError, AssertionError, RuntimeError) as e:
            raise LayerTableError(f"{label}: cannot build {name} with args {args!r}: {e}") from e
        module.i, module.f, module.type = i, f, name
        save.extend(x % i for x in froms if x != -1)
        layers.append(module)
        chs = [c2] if i == 0 else [*chs, c2]
    if not isinstance(layers[-1], HEADS):
        raise LayerTableError(f"{source}: the last row must be a DDetect or DualDDetect head")
    return nn.Sequential(*layers), sorted(set(save))


class DetectionModel(nn.Module):
    """YOLOv9 / GELAN detector of an official-format table: ``model`` the layers (state_dict keys ``model.<i>.…``),
    ``yaml`` the table (``nc``, ``ch`` filled in), ``save`` the layers later ones read; ``stride``; ``fused``."""

    fused = False

    def __init__(self, cfg: dict, *, nc: int | None = None, names: list[str] | None = None,
                 source: str = "model yaml", name: str | None = None, probe: bool = True):
        super().__init__()
        self.yaml = copy.deepcopy(cfg)
        self.yaml["nc"] = self.nc = int(nc if nc is not None else self.yaml.get("nc", 80))
        self.yaml["ch"] = self.ch = int(self.yaml.get("ch", 3))
        self.name = name or source
        self._source = source
        self.model, self.save = parse_model(self.yaml, self.ch, self.nc, source)
        self.names = list(names) if names is not None else [str(i) for i in range(self.nc)]
        if len(self.names) != self.nc:
            raise ValueError(f"{source}: {len(self.names)} class names for nc={self.nc}")
        act = self.yaml.get("activation")
        if act is not None and act not in ACTIVATIONS:
            raise LayerTableError(f"{source}: activation {act!r} is not supported; use one of {sorted(ACTIVATIONS)}")
        for m in self.modules() if act is not None else ():
            if isinstance(m, (L.Conv, L.RepConvN)) and isinstance(m.act, nn.SiLU):
                m.act = ACTIVATIONS[act]()
        self.register_buffer("stride", torch.tensor([8.0, 16.0, 32.0]), persistent=False)
        self._checkpoint_layers: frozenset[int] = frozenset()
        if probe:
            self._probe_strides()
        else:  # strides of the standard three-level heads; loaders overwrite every tensor anyway
            self.set_strides((8.0, 16.0, 32.0)[: self.head.nl])
        self.head.initialize_biases()
        for m in self.modules():  # official initialize_weights: BN eps/momentum after the probe
            if isinstance(m, nn.BatchNorm2d):
                m.eps, m.momentum = 1e-3, 0.03

    @property
    def head(self) -> DDetect:
        return self.model[-1]

    @property
    def is_dual(self) -> bool:
        return self.head.is_dual

    @torch.no_grad()
    def _probe_strides(self) -> None:
        """The official build step on a new (training-mode) model: stride = 256 / map height of a pass on zeros."""
        out = self._run(torch.zeros(1, self.ch, PROBE_SIZE, PROBE_SIZE), raw=True, label_errors=True)
        self.set_strides([PROBE_SIZE / m.shape[-2] for m in (out.aux if out.aux is not None else out.main)])

    def set_strides(self, strides) -> None:
        """The strides of the head's levels (floats, or a host tensor): the ``stride`` buffers of the model and
        its head, and ``head.strides``, their host copy that forward and decode read."""
        self.head.set_strides(strides)
        self.stride = torch.tensor(self.head.strides, dtype=self.stride.dtype, device=self.stride.device)

    def forward(self, x: torch.Tensor, raw: bool = False) -> DualOutput:
        """The :class:`DualOutput` of images (B, ch, H, W) in [0, 1], H and W multiples of the largest stride: raw
        maps in training mode or with ``raw``, decoded (B, 4+nc, A) predictions in eval mode."""
        s = int(max(self.head.strides))
        if x.ndim != 4 or x.shape[1] != self.ch or x.shape[2] % s or x.shape[3] % s:
            raise ValueError(
                f"{self.name}: expected an input of shape (B, {self.ch}, H, W) with H and W multiples of {s}, "
                f"got {tuple(x.shape)}; letterbox or pad images to a multiple of {s} (e.g. 640x640)")
        return self._run(x, raw)

    def _run(self, x: torch.Tensor, raw: bool, label_errors: bool = False) -> DualOutput:
        outputs: list = []
        use_ckpt = self.training and torch.is_grad_enabled() and bool(self._checkpoint_layers)
        for m in self.model:
            if m.f != -1:
                x = outputs[m.f] if isinstance(m.f, int) else [x if j == -1 else outputs[j] for j in m.f]
            kwargs = {"raw": raw} if m is self.head else {}
            if use_ckpt and m.i in self._checkpoint_layers:  # the recompute leaves BatchNorm statistics alone
                x = activation_checkpoint(m, x, use_reentrant=False, **kwargs,
                                          context_fn=lambda m=m: (contextlib.nullcontext(), _frozen_bn_stats(m)))
            elif label_errors:  # build-time probe: say which yaml row does not fit its inputs
                try:
                    x = m(x, **kwargs)
                except (RuntimeError, ValueError, TypeError, IndexError) as e:
                    raise LayerTableError(f"{self._source}: layer {m.i} ({m.type}, from {m.f}) fails on its "
                                          f"inputs during the stride probe: {e}") from e
            else:
                x = m(x, **kwargs)
            outputs.append(x if m.i in self.save else None)
        return x

    def set_activation_checkpointing(self, layers: str | Iterable[int] | None) -> list[int]:
        """Recompute the activations of ``layers`` in backward instead of storing them (training mode with
        gradients only; outputs, gradients and BatchNorm statistics unchanged): None (off), "all" (every layer
        with parameters), "backbone" (the yaml's backbone rows) or layer indices. Returns the indices, sorted."""
        layers = check_layers(layers, "DetectionModel", "activation_checkpointing")
        with_params = [m.i for m in self.model if any(True for _ in m.parameters())]
        if layers in ("all", "backbone"):
            chosen = [i for i in with_params if layers == "all" or i < len(self.yaml["backbone"])]
        else:
            chosen = sorted(set(layers or ()))
            bad = [i for i in chosen if i >= len(self.model)]
            if bad:
                raise ValueError(f"activation_checkpointing layers {bad} out of range: "
                                 f"{self.name} has layers 0..{len(self.model) - 1}")
        self._checkpoint_layers = frozenset(chosen)
        return chosen

    @property
    def activation_checkpointing(self) -> list[int]:
        return sorted(self._checkpoint_layers)


@contextlib.contextmanager
def _frozen_bn_stats(module: nn.Module):
    bns = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [(m.momentum, None if m.num_batches_tracked is None else m.num_batches_tracked.clone()) for m in bns]
    for m in bns:
        m.momentum = 0.0  # running = 1.0 * running + 0.0 * batch, i.e. unchanged
    try:
        yield
    finally:
        for m, (momentum, tracked) in zip(bns, saved):
            m.momentum = momentum
            if tracked is not None:
                m.num_batches_tracked.copy_(tracked)


def frozen_layer_indices(model: nn.Module, freeze: Freeze) -> list[int]:
    """The layer indices ``freeze`` names for a DetectionModel (a DDP wrapper unwrapped first): None or 0
    (nothing), N (layers 0..N-1, official ``--freeze N``), "backbone" (the yaml's ``backbone:`` rows) or a list
    of layer indices (official ``--freeze i j k``). ValueError: no layer list, or an index out of range."""
    freeze = check_layers(freeze, "TrainConfig", "freeze")
    if not freeze:
        return []
    layers = getattr(model, "model", None)
    name = getattr(model, "name", type(model).__name__)
    if not isinstance(layers, nn.Sequential):
        raise ValueError(f"freeze={freeze!r} needs a DetectionModel (layers in .model); got {type(model).__name__}; "
                         "set requires_grad=False on its parameters yourself and leave freeze=None")
    if freeze == "backbone":
        if "backbone" not in (getattr(model, "yaml", None) or {}):
            raise ValueError(f"freeze='backbone': {name} has no yaml with a 'backbone' section; give the number of "
                             "first layers instead")
        return list(range(min(len(model.yaml["backbone"]), len(layers))))
    indices = list(range(freeze)) if isinstance(freeze, int) else sorted(set(freeze))
    bad = [i for i in indices if i >= len(layers)]
    if bad:
        raise ValueError(f"freeze={freeze!r}: layers {bad} out of range; {name} has layers 0..{len(layers) - 1}")
    return indices


def freeze_layers(model: nn.Module, freeze: Freeze) -> list[str]:
    """Set ``requires_grad=False`` on the parameters of the layers ``freeze`` names (official ``--freeze``);
    nothing is unfrozen. Returns the names of the parameters frozen (``model.<i>.<rest>``). ValueError: as
    :func:`frozen_layer_indices`, or every layer would be frozen."""
    indices = frozen_layer_indices(model, freeze)
    prefixes = tuple(f"model.{i}." for i in indices)
    frozen = [(name, p) for name, p in model.named_parameters() if name.startswith(prefixes)]
    changed = any(p.requires_grad for _, p in frozen)
    for _, p in frozen:
        p.requires_grad_(False)
    if indices and not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"freeze={freeze!r} freezes every layer of {getattr(model, 'name', 'the model')} "
                         f"({len(model.model)} layers, 0..{len(model.model) - 1}): nothing would train; freeze "
                         "fewer (e.g. 'backbone', or the first N layers with N below the layer count)")
    if changed:  # a second call (fit, then the trainer) changes nothing and says nothing
        runs = [[i for _, i in g] for _, g in itertools.groupby(enumerate(indices), lambda t: t[1] - t[0])]
        spans = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)  # [0, 1, 2, 5] -> 0-2, 5
        LOGGER.info("freezing layers %s: %d parameter tensors, %d values", spans, len(frozen),
                    sum(p.numel() for _, p in frozen))
    return [name for name, _ in frozen]
