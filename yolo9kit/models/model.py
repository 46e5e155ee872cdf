"""DetectionModel: the layer table run in index order, with the official state_dict layout."""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
from collections.abc import Iterable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as activation_checkpoint

from yolo9kit.models.builder import ACTIVATIONS, PROBE_SIZE, LayerTableError, parse_model
from yolo9kit.models.heads import DDetect, DualOutput
from yolo9kit.models.layers import Conv, RepConvN, fuse_layers

LOGGER = logging.getLogger(__name__)

CheckpointLayers = None | str | Iterable[int]


class DetectionModel(nn.Module):
    """YOLOv9 / GELAN detector built from an official-format config dict.

    Attributes:
        model: ``nn.Sequential`` of the layers (state_dict keys ``model.<i>.…``, identical to official).
        yaml: the config dict (official format, with ``nc`` and ``ch`` filled in).
        nc, names: number of classes and their names. stride: (3,) float buffer [8, 16, 32].
        head: the last layer (DDetect or DualDDetect). is_dual: True for YOLOv9 (PGI auxiliary head).
        save: indices of layers whose outputs later layers read.
        fused: True after :meth:`fuse` (recorded in checkpoints).
    """

    fused = False

    def __init__(self, cfg: dict, *, nc: int | None = None, names: list[str] | None = None,
                 source: str = "model yaml", name: str | None = None, probe: bool = True):
        super().__init__()
        self.yaml = copy.deepcopy(cfg)
        self.yaml["nc"] = int(nc if nc is not None else self.yaml.get("nc", 80))
        self.yaml["ch"] = self.ch = int(self.yaml.get("ch", 3))
        self.nc = self.yaml["nc"]
        self.name = name or source
        self._source = source
        self.model, self.save = parse_model(self.yaml, self.ch, self.nc, source)
        self.names = list(names) if names is not None else [str(i) for i in range(self.nc)]
        if len(self.names) != self.nc:
            raise ValueError(f"{source}: {len(self.names)} class names for nc={self.nc}")
        self._set_activation(self.yaml.get("activation"), source)
        self.register_buffer("stride", torch.tensor([8.0, 16.0, 32.0]), persistent=False)
        self._max_stride = 32
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
        return bool(self.head.is_dual)

    def _set_activation(self, act: str | None, source: str) -> None:
        if act is None:
            return
        if act not in ACTIVATIONS:
            raise LayerTableError(f"{source}: activation {act!r} is not supported; use one of {sorted(ACTIVATIONS)}")
        for m in self.modules():
            if isinstance(m, (Conv, RepConvN)) and isinstance(m.act, nn.SiLU):
                m.act = ACTIVATIONS[act]()

    @torch.no_grad()
    def _probe_strides(self) -> None:
        """Official build step: one training-mode pass on zeros(1, ch, 256, 256); stride = 256 / map height.

        Like the official build it runs before BN eps/momentum are set, so running stats see one batch.
        """
        was_training = self.training
        self.train()
        out = self._run(torch.zeros(1, self.ch, PROBE_SIZE, PROBE_SIZE), raw=True, label_errors=True)
        maps = out.aux if out.aux is not None else out.main
        self.set_strides([PROBE_SIZE / m.shape[-2] for m in maps])
        self.train(was_training)

    def set_strides(self, strides) -> None:
        """The strides of the head's levels (floats, or a tensor on the host): the ``stride`` buffers of the
        model and of its head, and their host copies (``head.strides``, ``max_stride``), which the forward
        and the decode read without waiting for the device."""
        self.head.set_strides(strides)
        values = self.head.strides
        self.stride = torch.tensor(values, dtype=self.stride.dtype, device=self.stride.device)
        self._max_stride = int(max(values))

    @property
    def max_stride(self) -> int:
        """The largest stride (32), an int on the host: image sides must be multiples of it."""
        return self._max_stride

    # ----------------------------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor, raw: bool = False) -> DualOutput:
        """Run the detector.

        Args:
            x: images (B, ch, H, W), H and W multiples of the largest stride (32), values in [0, 1].
            raw: return the raw maps even in eval mode.

        Returns:
            DualOutput. Training mode or ``raw``: lists of 3 maps (B, 64+nc, H/s, W/s) per head.
            Eval mode: (B, 4+nc, A) per head, boxes (cx, cy, w, h) in input pixels and sigmoid scores.
            ``aux`` is None for GELAN models.
        """
        self._check_input(x)
        return self._run(x, raw)

    def _check_input(self, x: torch.Tensor) -> None:
        s = self._max_stride
        if x.ndim != 4 or x.shape[1] != self.ch or x.shape[2] % s or x.shape[3] % s:
            raise ValueError(
                f"{self.name}: expected an input of shape (B, {self.ch}, H, W) with H and W multiples of {s}, "
                f"got {tuple(x.shape)}; letterbox or pad images to a multiple of {s} (e.g. 640x640)")

    def _run(self, x: torch.Tensor, raw: bool, label_errors: bool = False) -> DualOutput:
        outputs: list = []
        use_ckpt = self.training and torch.is_grad_enabled() and bool(self._checkpoint_layers)
        head = self.model[-1]
        for m in self.model:
            if m.f != -1:
                x = outputs[m.f] if isinstance(m.f, int) else [x if j == -1 else outputs[j] for j in m.f]
            kwargs = {"raw": raw} if m is head else {}
            if use_ckpt and m.i in self._checkpoint_layers:
                x = activation_checkpoint(m, x, use_reentrant=False,
                                          context_fn=functools.partial(_recompute_contexts, m), **kwargs)
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

    # --------------------------------------------------------------------- activation checkpointing
    def set_activation_checkpointing(self, layers: CheckpointLayers) -> list[int]:
        """Recompute the activations of chosen layers in the backward pass instead of storing them.

        Args:
            layers: None (off), "all" (every layer with parameters), "backbone" (the yaml's backbone
                rows) or layer indices. Only active in training mode with gradients enabled; outputs and
                gradients are unchanged (BatchNorm statistics are not updated twice).

        Returns:
            The sorted layer indices now checkpointed.
        """
        with_params = [m.i for m in self.model if any(True for _ in m.parameters())]
        if layers is None or layers is False:
            chosen: list[int] = []
        elif layers == "all":
            chosen = with_params
        elif layers == "backbone":
            chosen = [i for i in with_params if i < len(self.yaml["backbone"])]
        elif isinstance(layers, str):
            raise ValueError(f"activation_checkpointing={layers!r}: expected None, 'all', 'backbone' or a list of "
                             "layer indices")
        else:
            chosen = sorted({int(i) for i in layers})
            bad = [i for i in chosen if not 0 <= i < len(self.model)]
            if bad:
                raise ValueError(f"activation_checkpointing layers {bad} out of range: "
                                 f"{self.name} has layers 0..{len(self.model) - 1}")
        self._checkpoint_layers = frozenset(chosen)
        return chosen

    @property
    def activation_checkpointing(self) -> list[int]:
        return sorted(self._checkpoint_layers)

    def fuse(self) -> DetectionModel:
        """Fold BatchNorm into convs and collapse RepConvN, in place (inference only); returns self."""
        fuse_layers(self)
        self.fused = True
        return self


def _recompute_contexts(module: nn.Module):
    """(forward, recompute) contexts for torch.utils.checkpoint: during the recompute BatchNorm must not
    update its running statistics a second time."""
    return contextlib.nullcontext(), _frozen_bn_stats(module)


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
