"""One training step, :func:`train_step` (docs/training.md, the loop), its :class:`Trainer`, EMA and OOM back-off."""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from yolo9kit.config import StepConfig, TrainConfig
from yolo9kit.config.train import GRAD_CLIP
from yolo9kit.env import free_cuda_memory, resolve_device
from yolo9kit.loss import DetectionLoss
from yolo9kit.models.layers import set_lean
from yolo9kit.models.model import freeze_layers
from yolo9kit.train.guards import DistributedOutOfMemoryError, OutOfMemoryAtMinimumError
from yolo9kit.train.optim import build_optimizer

LOGGER = logging.getLogger(__name__)

LossFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
AMP_DTYPES: dict[str, torch.dtype | None] = {"fp16": torch.float16, "bf16": torch.bfloat16, "off": None}


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside a DistributedDataParallel / DataParallel wrapper."""
    return model.module if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)) else model


@dataclass
class Trainer:
    """Everything one step touches, made by :func:`build_trainer`. ``model`` may be a DDP wrapper; ``step`` is the
    resolved step (:func:`describe_step`); ``micro_batch_size`` the live micro-batch (None: the whole batch)."""

    model: nn.Module
    loss_fn: LossFn
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    ema: ModelEMA | None
    device: torch.device
    step: StepConfig
    amp_dtype: torch.dtype | None
    autocast_device: str  # the device type autocast is entered for ("cpu" on meta, where the tracer emulates it)
    world_size: int = 1
    compiled: nn.Module | None = None  # torch.compile of ``model`` for the forward, when asked
    micro_batch_size: int | None = None
    last_opt_step: int = -1  # ni of the last optimizer step (official; Progress keeps it in checkpoints)
    optimizer_steps: int = 0
    oom_events: int = 0

    @property
    def channels_last(self) -> bool:
        return bool(self.step.channels_last)


def scaler_kind(amp_dtype: torch.dtype | None) -> str:
    """What the GradScaler does: "dynamic" fp16 loss scaling, else "fixed" at 1 (it only skips a non-finite step)."""
    return "dynamic" if amp_dtype == torch.float16 else "fixed"


def describe_step(config: TrainConfig, model: nn.Module, device: torch.device, world_size: int = 1) -> StepConfig:
    """``config.step`` with ``model`` and each rank's micro-batch filled in, resolved for ``device``: the step
    :func:`build_trainer` runs and the memory tools describe (a ValueError while ``config.batch_size`` is "auto")."""
    batch = config.step.batch_size
    if batch is None:
        if config.batch_size == "auto":
            raise ValueError("TrainConfig.batch_size is 'auto': size it first (memory.autobatch.choose_batch)")
        batch = max(1, config.batch_size // world_size)
    module = unwrap(model)
    return config.step.replace(model=module, batch_size=batch, num_classes=getattr(module, "nc", None)).resolve(device)


def place_model(model: nn.Module, step: StepConfig, device: torch.device) -> None:
    """Freeze ``step.freeze`` and move ``model`` to ``device`` in the step's layout, before DDP wraps it."""
    module = unwrap(model)
    freeze_layers(module, step.freeze)
    fmt = torch.channels_last if step.channels_last else torch.contiguous_format
    placed = all(p.device == device and (p.dim() != 4 or p.is_contiguous(memory_format=fmt))
                 for p in module.parameters()) and all(b.device == device for b in module.buffers())
    if not placed:
        module.to(device, memory_format=fmt) if step.channels_last else module.to(device)


def build_trainer(model: nn.Module, config: TrainConfig, *, loss_fn: LossFn | None = None,
                  device: torch.device | None = None, world_size: int = 1, step: StepConfig | None = None) -> Trainer:
    """The :class:`Trainer` of ``model`` (placed on ``device`` here; DDP-wrapped for multi-GPU) for ``config``:
    optimizer (official groups), GradScaler, EMA, loss (default ``DetectionLoss``). ``step``: the resolved step if
    the caller has it (the memory tracer), else ``describe_step`` for ``device`` (default ``config.run.device``)."""
    device = device or resolve_device(config.run.device)
    step = step or describe_step(config, model, device, world_size)
    place_model(model, step, device)
    set_lean(unwrap(model), step.lean_activations)
    if step.activation_checkpointing is not None:
        unwrap(model).set_activation_checkpointing(step.activation_checkpointing)
    amp_dtype = AMP_DTYPES[step.amp]
    # always on: fp16 scales the loss; otherwise a fixed scale of 1, never grown, skips a non-finite step on the device
    fixed = {} if scaler_kind(amp_dtype) == "dynamic" else {"init_scale": 1.0, "growth_interval": 2**30}
    scaler = torch.amp.GradScaler(device.type, **fixed)
    mode = step.compile if isinstance(step.compile, str) else None
    compiled = torch.compile(model, mode=mode) if step.compile else None
    loss_fn = loss_fn if loss_fn is not None else DetectionLoss(unwrap(model), config.optim.loss)
    ema = ModelEMA(model) if step.ema else None  # the official decay 0.9999, ramped over 2000 updates
    optimizer = build_optimizer(unwrap(model), config, fused_optimizer=step.fused_optimizer)
    return Trainer(model=model, loss_fn=loss_fn, optimizer=optimizer, scaler=scaler, ema=ema, device=device, step=step,
                   amp_dtype=amp_dtype, autocast_device=device.type, world_size=world_size, compiled=compiled,
                   micro_batch_size=config.step.batch_size)


@contextlib.contextmanager
def cudnn_autotune(device: torch.device, enabled: bool = True, deterministic: bool = False) -> Iterator[None]:
    """cuDNN autotuning on CUDA for the block only; ``deterministic``: deterministic algorithms instead (torch's ops,
    cuDNN, cuBLAS's workspace), an op without one warns and runs, as officially. The previous settings come back."""
    cudnn = torch.backends.cudnn
    previous = (cudnn.benchmark, cudnn.deterministic, torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled())
    if device.type == "cuda" and enabled and not deterministic:
        cudnn.benchmark = True
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        cudnn.deterministic = True
    try:
        yield
    finally:
        cudnn.benchmark = previous[0]
        if deterministic:
            cudnn.deterministic = previous[1]
            torch.use_deterministic_algorithms(previous[2], warn_only=previous[3])


def to_input(images: torch.Tensor, trainer: Trainer, imgsz: tuple[int, int] | None = None) -> torch.Tensor:
    """uint8 (B, 3, H, W) -> float32 in [0, 1] on the device in the step's layout, bilinearly resized to ``imgsz``."""
    fmt = torch.channels_last if trainer.channels_last else torch.contiguous_format
    x = images.to(trainer.device, non_blocking=True).to(dtype=torch.float32, memory_format=fmt).div_(255)
    if imgsz is not None and tuple(x.shape[2:]) != tuple(imgsz):
        x = nn.functional.interpolate(x, size=tuple(imgsz), mode="bilinear", align_corners=False)
    return x


def micro_batches(images: torch.Tensor, targets: torch.Tensor, micro: int | None
                  ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """(first image, images, targets with image indices from 0) of each micro-batch of ``micro`` images."""
    size = images.shape[0]
    if not micro or micro >= size:
        yield 0, images, targets
        return
    for start in range(0, size, micro):
        keep = (targets[:, 0] >= start) & (targets[:, 0] < start + micro)
        part = targets[keep].clone()
        part[:, 0] -= start
        yield start, images[start:start + micro], part


def train_step(trainer: Trainer, images: torch.Tensor, targets: torch.Tensor, *, ni: int, accumulate_steps: int,
               imgsz: tuple[int, int] | None = None) -> torch.Tensor:
    """Forward, loss and backward of one loader batch, micro-batch by micro-batch, then the optimizer step if due.

    Args:
        trainer: what the step touches (:func:`build_trainer`).
        images: uint8 (B, 3, H, W); targets: (N, 6) ``[image, class, cx, cy, w, h]`` normalised, on the CPU.
        ni: the batch's index since the run started; accumulate_steps: batches per optimizer step.
        imgsz: (h, w) to resize the batch to (multi-scale training), or None.

    Returns:
        The batch's mean loss items [box, cls, dfl] (3,), left on the device (no host-device synchronisation).
    """
    model, size = trainer.model, images.shape[0]
    forward = model if trainer.compiled is None else trainer.compiled
    step_due = ni - trainer.last_opt_step >= accumulate_steps  # official rule (last_opt_step starts at -1)
    items = torch.zeros(3, device=trainer.device)
    for start, part, part_targets in micro_batches(images, targets, trainer.micro_batch_size):
        if isinstance(model, nn.parallel.DistributedDataParallel):  # all-reduce gradients only before a step
            model.require_backward_grad_sync = step_due and start + part.shape[0] == size
        with torch.autocast(trainer.autocast_device, dtype=trainer.amp_dtype, enabled=trainer.amp_dtype is not None):
            # the head outputs are freed once the loss has what it needs, before the backward peak
            loss, part_items = trainer.loss_fn(forward(to_input(part, trainer, imgsz)), part_targets)
        # the loss is the micro-batch's mean x its images, so the micro-steps' gradients add up (no division by
        # the accumulation, official); x world_size, since DDP averages the gradients of the ranks
        trainer.scaler.scale(loss * trainer.world_size).backward()
        # + 0 * loss: a non-finite loss makes the items non-finite, for the loop to count when it reads them back
        items += part_items.detach() * part.shape[0] + 0 * loss.detach()
    if step_due:
        trainer.scaler.unscale_(trainer.optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=GRAD_CLIP)
        trainer.scaler.step(trainer.optimizer)  # skipped, on the device, when a gradient is not finite
        # a fixed scale stays 1: update() would halve it at every skipped step and never grow it back
        trainer.scaler.update(None if scaler_kind(trainer.amp_dtype) == "dynamic" else 1.0)
        trainer.optimizer.zero_grad(set_to_none=True)
        if trainer.ema is not None:
            trainer.ema.update(model)
        trainer.last_opt_step, trainer.optimizer_steps = ni, trainer.optimizer_steps + 1
    return items / size


class BatchNormSnapshot:
    """The buffers (BatchNorm statistics) at the accumulation window's start, put back on an interrupt or an OOM."""

    def __init__(self, model: nn.Module) -> None:
        self.buffers = list(unwrap(model).buffers())
        self.saved = [b.clone() for b in self.buffers]

    def take(self) -> None:
        if self.buffers:
            torch._foreach_copy_(self.saved, self.buffers)

    def restore(self) -> None:
        if self.buffers:
            torch._foreach_copy_(self.buffers, self.saved)


def train_step_with_backoff(trainer: Trainer, images: torch.Tensor, targets: torch.Tensor,
                            snapshot: BatchNormSnapshot, *, ni: int, accumulate_steps: int,
                            imgsz: tuple[int, int] | None = None) -> torch.Tensor:
    """:func:`train_step`, retried at half the micro-batch on out of memory (docs/training.md, failure handling);
    ``DistributedOutOfMemoryError`` in a micro-step that syncs the DDP ranks, ``OutOfMemoryAtMinimumError`` at 1."""
    while True:
        micro = min(trainer.micro_batch_size or images.shape[0], images.shape[0])
        try:
            return train_step(trainer, images, targets, ni=ni, accumulate_steps=accumulate_steps, imgsz=imgsz)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as error:  # the generic one too: "... out of memory ..."
            if not (isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()):
                raise
            if isinstance(trainer.model, nn.parallel.DistributedDataParallel) and \
                    trainer.model.require_backward_grad_sync:
                raise DistributedOutOfMemoryError(micro, error) from None
            message = str(error)  # not the error itself: its traceback holds the failed step's tensors
        snapshot.restore()
        trainer.optimizer.zero_grad(set_to_none=True)
        free_cuda_memory(trainer.device)
        if micro <= 1:
            raise OutOfMemoryAtMinimumError(
                "out of memory with a micro-batch of 1 image: use a smaller model or image size, amp='fp16'/'bf16', "
                f"or activation checkpointing (TrainConfig(activation_checkpointing='all')). {message[:200]}")
        LOGGER.warning("out of memory at micro-batch %d: the gradients accumulated since the last optimizer step are "
                       "dropped, and this batch runs again as micro-batches of %d", micro, micro // 2)
        trainer.micro_batch_size, trainer.oom_events = micro // 2, trainer.oom_events + 1
        if trainer.world_size == 1:  # a new window starts with this batch (DDP ranks keep one schedule: they sync)
            trainer.last_opt_step = ni - 1


class ModelEMA:
    """The official ``ModelEMA`` of ``model``'s floating-point state (its tensors must not be replaced) in two kernels
    (docs/training.md, EMA); a frozen parameter whose EMA equals the model's is left out (it stays bit-identical)."""

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000.0, updates: int = 0) -> None:
        self.ema = copy.deepcopy(unwrap(model)).eval().requires_grad_(False)
        self.decay, self.tau, self.updates = decay, tau, updates
        self._pairs_of = None  # the model the tensor lists were built for

    def _pairs(self, model: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if self._pairs_of is not model:
            ema_sd, model_sd = self.ema.state_dict(), unwrap(model).state_dict()
            fixed = {k for k, p in unwrap(model).named_parameters() if not p.requires_grad and _same(ema_sd[k], p)}
            keys = [k for k, v in ema_sd.items() if v.dtype.is_floating_point and k not in fixed]
            self._ema_tensors = [ema_sd[k] for k in keys]
            self._model_tensors = [model_sd[k].detach() for k in keys]
            self._pairs_of = model
        return self._ema_tensors, self._model_tensors

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """One EMA update from ``model`` (after every optimizer step)."""
        self.updates += 1
        d = self.decay * (1 - math.exp(-self.updates / self.tau))
        ema_tensors, model_tensors = self._pairs(model)
        torch._foreach_mul_(ema_tensors, d)
        torch._foreach_add_(ema_tensors, model_tensors, alpha=1 - d)

    def state_dict(self) -> dict:
        """Weights and update count, for checkpoints."""
        return {"model": self.ema.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.ema.load_state_dict(state["model"])
        self.updates = int(state["updates"])
        self._pairs_of = None  # which frozen tensors equal the model's is decided again


def _same(ema: torch.Tensor, param: torch.Tensor) -> bool:
    """Bit-identical values; on ``meta`` tensors (the memory trace) a copy counts as identical."""
    meta = ema.is_meta or param.is_meta
    return ema.shape == param.shape and (meta or torch.equal(ema, param.detach().to(ema.device)))
