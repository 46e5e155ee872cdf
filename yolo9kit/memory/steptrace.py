"""Trace one training step of the kit on ``meta`` tensors (or real ones) and record its storages.

``meta`` tensors carry shape, dtype and strides and run PyTorch's shape kernels, forward, backward and
optimizer alike, without data or memory. The loss is the one part that cannot run on them: the
task-aligned assigner picks anchors by value (top-k, masks, a branch on ``any()``). ``_LossBridge``
therefore runs the real loss on real CPU tensors shaped like the model's outputs (random logits, the
synthetic targets), under the same tracker so its tensors count as ``loss_assigner``; to the meta graph
it returns a meta scalar and, in backward, meta gradients of the outputs' shapes and dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from yolo9kit.memory.autocast_sim import AutocastEmulation
from yolo9kit.memory.tracker import StorageTracker, Trace


@dataclass
class _BridgeState:
    loss_fn: Any
    targets: torch.Tensor
    tracker: StorageTracker
    spec: Any = None
    positions: list[int] = field(default_factory=list)
    real: list[torch.Tensor] | None = None
    loss: torch.Tensor | None = None


class _LossBridge(torch.autograd.Function):
    @staticmethod
    def forward(ctx, state: _BridgeState, *outputs: torch.Tensor):
        ctx.state = state
        ctx.meta = [(o.shape, o.dtype) for o in outputs]
        # real CPU tensors standing for the outputs (already counted as activations: not tracked)
        state.tracker.paused = True
        g = torch.Generator().manual_seed(0)
        real = [torch.randn(o.shape, generator=g).to(o.dtype).requires_grad_(True) for o in outputs]
        state.tracker.paused = False
        leaves: list = [None] * state.spec.num_leaves
        for pos, r in zip(state.positions, real):
            leaves[pos] = r
        with torch.enable_grad():
            loss, _ = state.loss_fn(tree_unflatten(leaves, state.spec), state.targets)
        state.real, state.loss = real, loss
        first = outputs[0]
        return first.new_zeros((), dtype=torch.float32), first.new_zeros(3, dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad_loss, grad_items):
        state = ctx.state
        state.tracker.set_phase("loss_backward")
        grads = torch.autograd.grad(state.loss, state.real, allow_unused=True)
        del grads  # freed before the meta gradients exist, as the real step would hand them on
        state.loss = state.real = None
        state.tracker.set_phase("backward")
        return (None, *[grad_loss.new_empty(shape, dtype=dtype) for shape, dtype in ctx.meta])


def bridged_loss(loss_fn, real_targets: torch.Tensor, tracker: StorageTracker):
    """A loss callable for meta outputs that runs ``loss_fn`` for real (see the module docstring)."""

    def call(outputs, _targets):
        state = _BridgeState(loss_fn, real_targets, tracker)
        leaves, state.spec = tree_flatten(outputs)
        state.positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        return _LossBridge.apply(state, *[leaves[i] for i in state.positions])

    return call


def traced_step(trainer, images: torch.Tensor, targets: torch.Tensor, tracker: StorageTracker,
                emulation: AutocastEmulation | None, *, optimizer: bool = True) -> None:
    """The kit's own ``micro_step`` and ``optimizer_step`` (``yolo9kit.train.step``), the phases each enters
    marked in the tracker: input to float, forward and loss in the autocast region (emulated on ``meta``
    tensors), backward of the scaled loss, then unscale, clip to 10, step, zero_grad, EMA."""
    from yolo9kit.train.step import micro_step, optimizer_step

    if emulation is not None:
        emulation.set_enabled(True)  # until backward ends (AutocastEmulation: Tensor.backward)
    trainer.on_phase = tracker.set_phase
    try:
        micro_step(trainer, images, targets)
    finally:
        trainer.on_phase = None
    tracker.tag([p.grad for p in trainer.model.parameters() if p.grad is not None], "gradients")
    if optimizer:
        tracker.set_phase("optimizer")
        optimizer_step(trainer)
    tracker.set_phase("end")
    trainer.optimizer.zero_grad(set_to_none=True)


def register_persistent(tracker: StorageTracker, trainer) -> None:
    """Weights, EMA and optimizer state exist before the step: record them with their category."""
    model = trainer.model
    tracker.register(list(model.parameters()) + list(model.buffers()), "weights")
    if trainer.ema is not None:
        tracker.register(list(trainer.ema.ema.parameters()) + list(trainer.ema.ema.buffers()), "ema")
    state = [t for s in trainer.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    tracker.register(state, "optimizer_state")


def trace_meta_step(trainer, loss_fn, *, batch_size: int, imgsz: int, num_targets: int, num_classes: int,
                    amp_dtype: torch.dtype | None, optimizer: bool = True, autocast: str = "cuda"
                    ) -> tuple[Trace, float]:
    """Trace one steady-state step at ``batch_size`` on ``meta`` tensors -> (trace, forward GFLOPs per image).

    ``optimizer=False`` stops after backward (the optimizer and EMA do not depend on the batch, so a
    second trace can skip them); ``autocast`` is the device whose autocast policy the step follows."""
    from yolo9kit.memory.step import synthetic_batch

    _, targets = synthetic_batch(batch_size, 32, num_targets, num_classes)
    tracker = StorageTracker(device_type="cuda")
    emulation = AutocastEmulation(amp_dtype, autocast)
    images = torch.empty((batch_size, 3, imgsz, imgsz), dtype=torch.uint8, device="meta")
    register_persistent(tracker, trainer)
    trainer.loss_fn = bridged_loss(loss_fn, targets, tracker)  # the tracer's own trainer: the loss runs for real
    with emulation, tracker:
        traced_step(trainer, images, targets, tracker, emulation, optimizer=optimizer)
    return tracker.trace(), tracker.forward_flops / 1e9 / batch_size


def trace_real_step(trainer, images: torch.Tensor, targets: torch.Tensor, *, device_type: str | None = None
                    ) -> Trace:
    """The same step on real tensors (CPU or CUDA, with real autocast on CUDA) under the same tracker:
    the reference the meta trace must match, and the breakdown of a measured step."""
    tracker = StorageTracker(device_type=device_type or trainer.device.type)
    register_persistent(tracker, trainer)
    with tracker:
        traced_step(trainer, images, targets, tracker, None)
    return tracker.trace()
