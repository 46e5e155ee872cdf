"""The training step the memory tools run: a ``StepConfig`` made into the kit's own ``Trainer``
(optimizer groups, GradScaler, gradient clipping, EMA) by ``yolo9kit.train.step.build_trainer``, for a real
device or for ``meta`` tensors, and a synthetic batch.

``measure`` runs ``yolo9kit.train.train_step`` itself; ``estimate`` runs the kit's ``micro_step`` and
``optimizer_step`` on ``meta`` tensors (``steptrace.traced_step``), with the loss, whose assigner picks
anchors by value, run for real on CPU tensors of the outputs' shapes.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from yolo9kit.config import StepConfig, TrainConfig

_STEP_FIELDS = frozenset(f.name for f in dataclasses.fields(StepConfig))


def as_step(step: StepConfig | str | nn.Module, batch_size: int | None = None,
            changes: Mapping[str, Any] | None = None, *, caller: str, needs_batch: bool = False) -> StepConfig:
    """The ``StepConfig`` a memory function describes: ``step`` itself (a ``TrainConfig``'s ``config.step``
    with its model, or any other), or the default step of a model name or module, with ``batch_size`` and
    the field ``changes`` (``imgsz=320, amp="fp16"``, ...) applied (``needs_batch``: the step must then have a
    batch). The memory tools run a multi-scale step at its largest size (``StepConfig.peak_imgsz``), the peak
    of the run."""
    changes = dict(changes or {})
    unknown = sorted(set(changes) - _STEP_FIELDS)
    if unknown:
        raise TypeError(f"{caller}() got unexpected keyword arguments {unknown}; the step's settings are the "
                        f"fields of yolo9kit.config.StepConfig: {sorted(_STEP_FIELDS - {'device_type'})}")
    if not isinstance(step, StepConfig):
        if not isinstance(step, (str, nn.Module)):
            raise TypeError(f"{caller}(): step must be a StepConfig, a registered model name (e.g. 'yolov9-s') "
                            f"or an nn.Module, got {type(step).__name__}")
        step = StepConfig(step)
    if batch_size is not None:
        changes["batch_size"] = batch_size
    step = dataclasses.replace(step, **changes) if changes else step
    if step.model is None:
        raise ValueError(f"{caller}(): the step has no model (a TrainConfig's step is fit's model's): "
                         "step.replace(model=...)")
    if needs_batch and step.batch_size is None:
        raise ValueError(f"{caller}(): the step of {step.model_name} has no batch_size: pass one")
    return step


@functools.lru_cache(maxsize=2)
def _built_model(name: str, num_classes: int | None) -> nn.Module:
    """A freshly initialised CPU model, kept for the next estimate (callers deep-copy it)."""
    from yolo9kit.models import create_model

    return create_model(name, num_classes)


def resolve_model(step: StepConfig, *, copy_model: bool = True) -> nn.Module:
    """The step's model in train mode (the caller's module is copied, never modified).

    ``copy_model=False`` returns the shared built model (or the caller's) untouched, for read-only use
    (``to_meta`` copies the structure).
    """
    module = _built_model(str(step.model), step.num_classes) if isinstance(step.model, str) else step.model
    if not isinstance(module, nn.Module):
        raise TypeError(f"StepConfig.model must be a registered name (e.g. 'yolov9-s') or an nn.Module, "
                        f"got {type(step.model).__name__}")
    return copy.deepcopy(module).train() if copy_model else module


def num_classes_of(step: StepConfig, model: nn.Module) -> int:
    return int(getattr(model, "nc", None) or step.num_classes or 80)


def synthetic_batch(batch_size: int, imgsz: int, num_targets: int, num_classes: int, *, seed: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (B, 3, imgsz, imgsz) and ``num_targets`` boxes per image as targets (N, 6)
    ``[image_index, class, cx, cy, w, h]`` normalised, reproducible from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (batch_size, 3, imgsz, imgsz), dtype=torch.uint8, generator=g)
    n = batch_size * num_targets
    index = torch.arange(batch_size, dtype=torch.float32).repeat_interleave(num_targets)
    cls = torch.randint(0, num_classes, (n,), generator=g).float()
    wh = 0.05 + 0.3 * torch.rand(n, 2, generator=g)
    cxcy = wh / 2 + (1 - wh) * torch.rand(n, 2, generator=g)
    return images, torch.cat([index[:, None], cls[:, None], cxcy, wh], 1)


def to_meta(model: nn.Module, channels_last: bool = False) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are uninitialised ``meta`` tensors: same shapes,
    dtypes, strides (channels_last for 4-D weights when asked), no data, no memory."""
    fmt = torch.channels_last if channels_last else torch.preserve_format

    def meta(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t, device="meta", memory_format=fmt if t.ndim == 4 else torch.preserve_format)

    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(meta(p.detach()), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = meta(b)
    stride = getattr(model, "stride", None)  # DetectionModel.stride: a plain tensor attribute
    if isinstance(stride, torch.Tensor) and id(stride) not in memo:
        memo[id(stride)] = meta(stride)
    return copy.deepcopy(model, memo)


def prime_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Use the ``foreach`` implementation (the CUDA default) and create the optimizer state now, with
    one step on zero gradients, so that a traced step is a steady-state step."""
    for group in optimizer.param_groups:
        group["foreach"] = True
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


class FusedStandIn:
    """A fused optimizer's step on ``meta`` tensors, where the fused kernels do not exist: it allocates
    nothing (one kernel per group updates weights and state in place), so the stand-in's step does nothing.
    The state it holds was made by the optimizer it wraps (``prime_optimizer``)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.param_groups, self.state = optimizer.param_groups, optimizer.state

    def step(self, closure: Any = None) -> None:
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)


def build_meta_trainer(real_model: nn.Module, step: StepConfig):
    """The trainer ``fit`` would assemble (``yolo9kit.train.step.build_trainer``: frozen layers, channels_last,
    lean activations, activation checkpointing, optimizer groups, EMA, clipping, the sync-free switch) for the
    resolved ``step``, over a ``meta`` copy of ``real_model``.

    ``real_model`` is only read. The loss (``step.loss_fn``, default ``DetectionLoss(real_model,
    dense=step.sync_free)``) stays on the real model: the trace runs it for real (see ``steptrace``). The
    optimizer state is made now with the ``foreach`` kernels; a fused optimizer (whose kernels do not run on
    ``meta`` tensors and keep no more state) steps as ``FusedStandIn``. Returns (trainer, loss_fn).
    """
    from yolo9kit.train.step import build_trainer

    loss_fn = step.loss_fn
    if loss_fn is None:
        from yolo9kit.loss import DetectionLoss

        loss_fn = DetectionLoss(real_model, dense=bool(step.sync_free))
    if step.activation_checkpointing is not None and not hasattr(real_model, "set_activation_checkpointing"):
        raise ValueError(f"activation_checkpointing={step.activation_checkpointing!r} needs a model with "
                         f"set_activation_checkpointing(); {step.model_name} has none")
    model = to_meta(real_model, bool(step.channels_last)).train()
    config = TrainConfig(step=step.replace(batch_size=None))  # the trace sets the batch; the rest is the step's
    trainer = build_trainer(model, config, loss_fn=loss_fn, device=torch.device("meta"), step=step)
    prime_optimizer(trainer.model, trainer.optimizer)
    if step.fused_optimizer:
        trainer.optimizer = FusedStandIn(trainer.optimizer)
    return trainer, loss_fn


def build_real_trainer(model: nn.Module, step: StepConfig, device: torch.device):
    """The kit's own ``build_trainer`` (what ``fit`` uses) for ``model`` and ``step`` on ``device``."""
    from yolo9kit.train.step import build_trainer

    config = TrainConfig(step=step.replace(batch_size=None), device=str(device))  # each batch whole, as given
    return build_trainer(model, config, loss_fn=step.loss_fn, device=device)
