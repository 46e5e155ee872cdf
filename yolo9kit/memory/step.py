"""The training step the memory tools run: the kit's own ``Trainer`` (optimizer groups, GradScaler,
gradient clipping, EMA), built for a real device or for ``meta`` tensors, and a synthetic batch.

``measure`` runs ``yolo9kit.train.train_step`` itself. ``estimate`` cannot: the step checks that the
loss is finite (a data-dependent branch) and slices targets with a boolean mask, neither of which a
tensor without data can answer. So ``traced_step`` repeats ``micro_step``'s few lines (input conversion,
forward and loss in the autocast region, backward) and then calls the kit's ``optimizer_step``
(unscale, clip, SGD step, zero_grad, EMA update) unchanged.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
from torch import nn

from yolo9kit.models.layers import set_lean

AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "off": None}


def normalise_amp(amp: str | bool | None) -> str:
    """"fp16" | "bf16" | "off" (None/False -> "off", True -> "fp16")."""
    if amp is None or amp is False:
        return "off"
    if amp is True:
        return "fp16"
    if amp not in AMP_DTYPES:
        raise ValueError(f"amp={amp!r}: expected 'fp16', 'bf16' or 'off'")
    return amp


@functools.lru_cache(maxsize=2)
def _built_model(name: str, num_classes: int) -> nn.Module:
    """A freshly initialised CPU model, kept for the next estimate (callers deep-copy it)."""
    from yolo9kit.models import create_model

    return create_model(name, num_classes)


def resolve_model(model: str | nn.Module, num_classes: int, checkpoint: Any, *, copy_model: bool = True
                  ) -> tuple[nn.Module, str]:
    """(a model in train mode with ``checkpoint`` applied, its display name).

    ``copy_model=False`` returns the shared built model (or the caller's) untouched: for read-only use
    (``to_meta`` copies the structure; ``apply_checkpoint`` is then applied to that copy).
    """
    if isinstance(model, str):
        module, name = _built_model(model, num_classes), model
    elif isinstance(model, nn.Module):
        module, name = model, getattr(model, "name", type(model).__name__)
    else:
        raise TypeError(f"model must be a registered name (e.g. 'yolov9-s') or an nn.Module, got {type(model)}")
    if not copy_model:
        return module, name
    module = copy.deepcopy(module)
    apply_checkpoint(module, checkpoint, name)
    return module.train(), name


def apply_checkpoint(module: nn.Module, checkpoint: Any, name: str) -> None:
    """``module.set_activation_checkpointing(checkpoint)``, with a clear error for models without it."""
    if checkpoint is None:
        return
    if not hasattr(module, "set_activation_checkpointing"):
        raise ValueError(f"checkpoint={checkpoint!r} needs a model with set_activation_checkpointing(); "
                         f"{name} has none")
    module.set_activation_checkpointing(checkpoint)


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


def train_config(amp: str, channels_last: bool, batch_size: int = 16, lean: bool = False, **overrides: Any):
    from yolo9kit.config import TrainConfig

    return TrainConfig(batch_size=batch_size, amp=amp, channels_last=channels_last, lean_activations=lean,
                       **overrides)


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


def build_meta_trainer(real_model: nn.Module, *, amp: str, channels_last: bool, loss_fn: Any = None,
                       optimizer: str = "SGD", checkpoint: Any = None, lean: bool = False):
    """The kit's Trainer (optimizer groups, EMA, clipping) over a ``meta`` copy of ``real_model``.

    ``real_model`` is only read. ``loss_fn`` (default ``DetectionLoss(real_model, dense=True)``) stays on the real
    model: the trace runs it for real (see ``trace``). Returns (trainer, loss_fn).
    """
    from yolo9kit.train.ema import ModelEMA
    from yolo9kit.train.optim import build_optimizer
    from yolo9kit.train.step import Trainer

    if loss_fn is None:
        from yolo9kit.loss import DetectionLoss

        loss_fn = DetectionLoss(real_model, dense=True)  # as the sync-free step on CUDA (fit's default)
    config = train_config(amp, channels_last, optimizer=optimizer)
    model = to_meta(real_model, channels_last).train()
    set_lean(model, lean)
    apply_checkpoint(model, checkpoint, getattr(real_model, "name", type(real_model).__name__))
    ema = ModelEMA(model, config.ema_decay, config.ema_tau)
    opt = build_optimizer(model, config)
    prime_optimizer(model, opt)
    trainer = Trainer(model=model, loss_fn=loss_fn, optimizer=opt,
                      scaler=torch.amp.GradScaler("cpu", enabled=False), ema=ema, device=torch.device("meta"),
                      amp_dtype=None, grad_clip=config.grad_clip, channels_last=channels_last)
    return trainer, loss_fn


def build_real_trainer(model: nn.Module, *, amp: str, channels_last: bool, device: torch.device,
                       loss_fn: Any = None, optimizer: str = "SGD", lean: bool = False):
    """The kit's own ``build_trainer`` (what ``fit`` uses) for ``model`` on ``device``."""
    from yolo9kit.train.step import build_trainer

    config = train_config(amp, channels_last, lean=lean, optimizer=optimizer, device=str(device))
    return build_trainer(model, config, loss_fn=loss_fn, device=device)
