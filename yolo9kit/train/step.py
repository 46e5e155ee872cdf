"""One training step, reusable on its own: micro-steps (forward, loss, backward), the optimizer step, the EMA.

``fit`` drives these functions; memory profiling calls ``train_step`` to measure exactly the kit's step::

    trainer = build_trainer(model, TrainConfig(batch_size=16, amp="fp16"))
    trainer.step                                       # what it runs: config.step resolved, as the memory tools see it
    out = train_step(trainer, images_uint8, targets)   # one optimizer update over the whole batch
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from yolo9kit.config import StepConfig, TrainConfig
from yolo9kit.config.train import GRAD_CLIP, OOM_BACKOFF
from yolo9kit.env import free_cuda_memory, resolve_device
from yolo9kit.models.layers import set_lean
from yolo9kit.models.model import freeze_layers
from yolo9kit.train.ema import ModelEMA, unwrap
from yolo9kit.train.guards import DistributedOutOfMemoryError, halve_micro_batch, is_out_of_memory
from yolo9kit.train.optim import build_optimizer

LOGGER = logging.getLogger(__name__)

LossFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Trainer:
    """Everything one step touches. ``model`` may be a DistributedDataParallel wrapper; ``step`` is the resolved
    step it runs (``describe_step``), whose switches it reads.

    ``micro_batch_size`` is the live micro-batch (None: the whole batch); the OOM back-off halves it.
    """

    model: nn.Module
    loss_fn: LossFn
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    ema: ModelEMA | None
    device: torch.device
    step: StepConfig
    amp_dtype: torch.dtype | None = None
    grad_clip: float = 10.0
    world_size: int = 1
    compiled: nn.Module | None = None  # torch.compile of ``model`` used for the forward pass, when asked
    micro_batch_size: int | None = None
    oom_backoff: bool = True
    optimizer_steps: int = 0
    oom_events: int = 0
    phase: str = "idle"  # "forward", "loss" or "backward" while a micro-step runs (the OOM back-off reads it)
    # Called with each phase a micro-step enters: the memory tracer marks the storages it records with it.
    on_phase: Callable[[str], None] | None = field(default=None, repr=False)
    buffer_backup: list[torch.Tensor] = field(default_factory=list, repr=False)  # BN stats before a micro-step

    @property
    def channels_last(self) -> bool:
        """Inputs (and 4-D weights) in channels_last."""
        return bool(self.step.channels_last)

    @property
    def sync_free(self) -> bool:
        """No host-device synchronisation inside the step: loss values stay on the device (``BatchResult``
        holds tensors), a non-finite step is skipped on the device by the scaler."""
        return bool(self.step.sync_free)

    @property
    def fixed_scale(self) -> bool:
        """The scaler runs at a fixed scale of 1 (``scaler_kind`` "fixed")."""
        return scaler_kind(self.amp_dtype, self.sync_free) == "fixed"


# autocast dtype of each resolved ``amp`` mode
AMP_DTYPES: dict[str, torch.dtype | None] = {"fp16": torch.float16, "bf16": torch.bfloat16, "off": None}


# A fixed-scale scaler never grows (and optimizer_step sets its scale back to 1 after every update).
FIXED_SCALE_GROWTH_INTERVAL = 2**30


def scaler_kind(amp_dtype: torch.dtype | None, sync_free: bool) -> str:
    """What the GradScaler of a step does: "dynamic" (fp16 loss scaling), "fixed" (scale 1: only the
    device-side skip of a non-finite step, for the sync-free step without fp16) or "off"."""
    if amp_dtype == torch.float16:
        return "dynamic"
    return "fixed" if sync_free else "off"


def make_scaler(kind: str, device: torch.device) -> torch.amp.GradScaler:
    """The GradScaler of a ``scaler_kind``."""
    if kind == "dynamic":
        return torch.amp.GradScaler(device.type)
    if kind == "fixed":
        return torch.amp.GradScaler(device.type, init_scale=1.0, growth_interval=FIXED_SCALE_GROWTH_INTERVAL)
    return torch.amp.GradScaler(device.type, enabled=False)


def describe_step(config: TrainConfig, model: nn.Module, device: torch.device, world_size: int = 1) -> StepConfig:
    """The step ``build_trainer`` runs for ``config`` on ``device``: ``config.step`` with ``model`` (its classes)
    and the micro-batch of each rank filled in (``step.batch_size``, else the batch per rank), resolved there
    ("auto" AMP and the ``None`` switches decided by ``StepConfig.resolve``). The memory tools take the same
    object, so an estimate and a run agree on what the step is.

    Raises:
        ValueError: ``config.batch_size`` is still "auto" and no micro-batch is set (``fit`` sizes it first).
    """
    batch = config.step.batch_size
    if batch is None:
        if config.batch_size == "auto":
            raise ValueError("TrainConfig.batch_size is 'auto': size it first (memory.autobatch.choose_batch)")
        batch = max(1, config.batch_size // world_size)
    module = unwrap(model)
    return config.step.replace(model=module, batch_size=batch, num_classes=getattr(module, "nc", None)).resolve(device)


def place_model(model: nn.Module, step: StepConfig, device: torch.device) -> None:
    """Freeze ``step.freeze`` and move ``model`` to ``device`` in the step's layout (channels_last 4-D weights),
    in one pass; nothing happens to parameters already there in that layout.

    Call it before a DistributedDataParallel wrapper is made (``fit`` does): DDP lays out its gradient
    buckets from the parameters' strides at construction, and parameters switched to channels_last after it
    make every gradient a copy (and a warning that the strides do not match its buckets).
    """
    module = unwrap(model)
    freeze_layers(module, step.freeze)
    fmt = torch.channels_last if step.channels_last else torch.contiguous_format

    def placed(p: torch.Tensor) -> bool:
        return p.device == device and (p.dim() != 4 or p.is_contiguous(memory_format=fmt))

    if all(placed(p) for p in module.parameters()) and all(b.device == device for b in module.buffers()):
        return
    if step.channels_last:
        module.to(device, memory_format=torch.channels_last)
    else:
        module.to(device)


def build_trainer(model: nn.Module, config: TrainConfig, *, loss_fn: LossFn | None = None,
                  device: torch.device | None = None, world_size: int = 1, step: StepConfig | None = None) -> Trainer:
    """Optimizer (official groups), GradScaler and EMA for ``model`` on ``device``, for the step
    :func:`describe_step` gives (kept as ``trainer.step``).

    ``model`` is moved to the device (``place_model``); pass an already DDP-wrapped model for multi-GPU (the
    EMA copies the module inside; place it before wrapping it, as ``fit`` does). The layers of
    ``config.step.freeze`` are frozen first, so the optimizer and the EMA leave them out. ``loss_fn`` defaults
    to ``yolo9kit.loss.DetectionLoss(model, config.optim.loss)``.

    On CUDA the defaults are the fast ones: channels_last weights and inputs, a fused optimizer, a step
    without host-device synchronisation, and the lean BatchNorm+SiLU (``yolo9kit.models.layers``: about a
    quarter less activation memory); ``fit`` also switches cuDNN autotuning on for the run
    (``cudnn_autotune``). The scaler is on for fp16 (loss
    scaling); in a sync-free step without fp16 it runs at a fixed scale of 1, only to skip a non-finite
    step on the device (``scaler_kind``).

    The memory tracer assembles its trainer here too (``yolo9kit.memory.step.build_meta_trainer``): ``step``
    is then the resolved step it describes and ``device`` is ``meta``, where autocast is emulated by the
    tracer (no autocast dtype, no scaler), the optimizer runs its foreach kernels and nothing is compiled.
    """
    device = device or resolve_device(config.run.device)
    step = step or describe_step(config, model, device, world_size)
    meta = device.type == "meta"
    place_model(model, step, device)
    set_lean(unwrap(model), step.lean_activations)
    if step.activation_checkpointing is not None:
        unwrap(model).set_activation_checkpointing(step.activation_checkpointing)
    if loss_fn is None:
        from yolo9kit.loss import DetectionLoss

        loss_fn = DetectionLoss(unwrap(model), config.optim.loss, dense=step.sync_free)
    amp_dtype = None if meta else AMP_DTYPES[step.amp]
    scaler = make_scaler("none" if meta else scaler_kind(amp_dtype, step.sync_free), torch.device("cpu") if meta
                         else device)
    ema = ModelEMA(model) if step.ema else None  # the official decay 0.9999, ramped over 2000 updates
    optimizer = build_optimizer(unwrap(model), config, fused_optimizer=step.fused_optimizer and not meta)
    compiled = None
    if config.step.compile and not meta:
        mode = config.step.compile if isinstance(config.step.compile, str) else None
        compiled = torch.compile(model, mode=mode)
    return Trainer(model=model, loss_fn=loss_fn, optimizer=optimizer, scaler=scaler, ema=ema, device=device,
                   step=step, amp_dtype=amp_dtype, grad_clip=GRAD_CLIP, world_size=world_size,
                   compiled=compiled, micro_batch_size=config.step.batch_size, oom_backoff=OOM_BACKOFF)


@contextlib.contextmanager
def cudnn_autotune(device: torch.device, enabled: bool = True) -> Iterator[None]:
    """cuDNN autotuning (``torch.backends.cudnn.benchmark``) on CUDA for the block, the previous setting back
    after it: it pays for fixed training shapes, and a global switch left on would also autotune the
    caller's own later work (a notebook's other cells)."""
    previous = torch.backends.cudnn.benchmark
    if device.type == "cuda" and enabled:
        torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = previous


def to_input(images: torch.Tensor, device: torch.device, channels_last: bool = False) -> torch.Tensor:
    """uint8 (B, 3, H, W) RGB -> float32 in [0, 1] on ``device`` (the copy to the GPU is asynchronous)."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format  # loaders may hand channels_last
    return images.to(device, non_blocking=True).to(dtype=torch.float32, memory_format=fmt).div_(255)


def slice_batch(images: torch.Tensor, targets: torch.Tensor, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images ``start:end`` and their targets (N, 6) with image indices renumbered from 0."""
    keep = (targets[:, 0] >= start) & (targets[:, 0] < end)
    part = targets[keep].clone()
    part[:, 0] -= start
    return images[start:end], part


def micro_step(trainer: Trainer, images: torch.Tensor, targets: torch.Tensor, *, sync: bool = True,
               imgsz: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Forward, loss and backward of one micro-batch; gradients are added to ``.grad``.

    The loss is the sum-type loss of the loss function (mean over the micro-batch times its size), so
    gradients of consecutive micro-steps simply add up: no division by the number of micro-steps
    (official semantics). Under DDP the loss is multiplied by the world size because DDP averages
    gradients over ranks, and gradients are all-reduced only when ``sync`` (the last micro-step before
    an optimizer step). ``imgsz`` (h, w): the float images are resized there first (bilinear, the official
    multi-scale step; targets are normalised and stay as they are).

    Returns:
        (loss, loss_items) detached; None when the loss is not finite in a single process (then nothing
        was back-propagated). Under DDP a non-finite loss is back-propagated all the same, because every
        rank must join the gradient all-reduce; ``run_batch`` has the ranks agree to drop the step. A
        sync-free trainer never checks on the host: it always back-propagates and the scaler skips a
        non-finite step on the device.
    """
    model = trainer.model
    no_sync = (not sync) and isinstance(model, nn.parallel.DistributedDataParallel)
    # a step without autocast enters no region (the memory tracer's meta device has none)
    region = contextlib.nullcontext() if trainer.amp_dtype is None else \
        torch.autocast(trainer.device.type, dtype=trainer.amp_dtype)
    checked = trainer.world_size == 1 and not trainer.sync_free and trainer.device.type != "meta"  # meta: no values
    with model.no_sync() if no_sync else contextlib.nullcontext():
        _enter(trainer, "forward")
        x = to_input(images, trainer.device, trainer.channels_last)
        if imgsz is not None and tuple(x.shape[2:]) != tuple(imgsz):
            x = nn.functional.interpolate(x, size=tuple(imgsz), mode="bilinear", align_corners=False)
        with region:
            outputs = (model if trainer.compiled is None else trainer.compiled)(x)
            _enter(trainer, "loss")
            loss, loss_items = trainer.loss_fn(outputs, targets)  # targets stay on the CPU: see DetectionLoss
        # backward needs neither: the loss saved what it uses, so the head outputs (77 MB for yolov9-t at batch 16
        # and 640 px) are freed before the backward peak instead of being held through it
        del outputs, x
        loss = loss * trainer.world_size
        if checked and not torch.isfinite(loss.detach()):  # sync point
            _enter(trainer, "idle")
            return None
        _enter(trainer, "backward")
        trainer.scaler.scale(loss).backward()
    _enter(trainer, "idle")
    return loss.detach(), loss_items.detach()


def _enter(trainer: Trainer, phase: str) -> None:
    trainer.phase = phase
    if trainer.on_phase is not None:
        trainer.on_phase(phase)


def _finite_on_all_ranks(finite: bool, trainer: Trainer) -> bool:
    """Under DDP: is the batch finite on every rank? One tiny all-reduce per batch (all ranks must agree)."""
    if trainer.world_size == 1:
        return finite
    flag = torch.tensor([int(finite)], device=trainer.device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return bool(flag.item())


def optimizer_step(trainer: Trainer) -> None:
    """Unscale, clip the total gradient norm to ``grad_clip`` (10), step, update the scaler, zero, EMA.

    Matches the official order: scaler.unscale_, clip_grad_norm_(max_norm=10), scaler.step,
    scaler.update, zero_grad, ema.update.
    """
    trainer.scaler.unscale_(trainer.optimizer)
    if trainer.grad_clip > 0:
        nn.utils.clip_grad_norm_(trainer.model.parameters(), max_norm=trainer.grad_clip)
    trainer.scaler.step(trainer.optimizer)  # skipped by the scaler if fp16 gradients overflowed
    # A fixed scale stays 1: update() would halve it after every non-finite step and never grow it back.
    trainer.scaler.update(1.0 if trainer.fixed_scale else None)
    trainer.optimizer.zero_grad(set_to_none=True)
    if trainer.ema is not None:
        trainer.ema.update(trainer.model)
    trainer.optimizer_steps += 1


@dataclass
class BatchResult:
    """Outcome of one loader batch: mean loss items over its images, or ``finite=False``."""

    loss_items: torch.Tensor | None  # (3,) [box, cls, dfl], image-weighted mean over micro-batches
    finite: bool
    micro_steps: int
    grads_lost: bool = False  # an OOM during backward forced dropping the accumulated gradients
    # Sync-free step: ``loss_items`` is still on the device, ``finite`` is not known yet (True) and this
    # device bool says it; read both back when logging (``yolo9kit.train.loop`` does, every few batches).
    finite_flag: torch.Tensor | None = None


def run_batch(trainer: Trainer, images: torch.Tensor, targets: torch.Tensor, *, sync: bool = True,
              imgsz: tuple[int, int] | None = None) -> BatchResult:
    """Forward/backward one loader batch as micro-batches of ``trainer.micro_batch_size`` images (resized to
    ``imgsz`` (h, w) when given: multi-scale training).

    Out of memory (when ``oom_backoff``): the tensors are dropped, memory freed, the micro-batch halved
    (so the micro-steps per optimizer step double and the images per step stay the same) and the
    batch continues from the first image not yet back-propagated; BatchNorm running statistics are
    restored to their values before the failed micro-step. If the error came during backward,
    ``.grad`` may hold part of a backward pass, so all accumulated gradients are zeroed, the batch is
    redone from its first image and ``grads_lost`` tells the caller. Under DDP a rank backs off on its own
    only in the micro-steps that run under ``no_sync`` (no collective): an out-of-memory error in the
    synchronising one raises ``DistributedOutOfMemoryError``, since retrying it on one rank would hang the others.
    """
    size = images.shape[0]
    done, micro_steps, grads_lost, finite = 0, 0, False, True
    items_sum = torch.zeros(3, device=trainer.device if trainer.sync_free else "cpu")
    flag = torch.ones((), dtype=torch.bool, device=trainer.device) if trainer.sync_free else None
    buffers = list(unwrap(trainer.model).buffers()) if trainer.oom_backoff else []
    if buffers and len(trainer.buffer_backup) != len(buffers):
        trainer.buffer_backup = [b.clone() for b in buffers]
    while done < size:
        end = min(done + (trainer.micro_batch_size or size), size)
        part_images, part_targets = slice_batch(images, targets, done, end)
        oom_error = None
        if buffers:  # BatchNorm running stats before this micro-step, restored if it runs out of memory
            torch._foreach_copy_(trainer.buffer_backup, buffers)  # a few small kernels: ~2 floats per channel
        synchronising = sync and end == size
        try:
            out = micro_step(trainer, part_images, part_targets, sync=synchronising, imgsz=imgsz)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as error:
            if not (trainer.oom_backoff and is_out_of_memory(error)):
                raise
            if trainer.world_size > 1 and synchronising:
                raise DistributedOutOfMemoryError(end - done, error) from None
            oom_error = RuntimeError(str(error))  # keep the message, drop the traceback and its tensors
        if oom_error is not None:
            del part_images, part_targets
            if _recover_from_oom(trainer, buffers, end - done, oom_error):
                done, items_sum, grads_lost = 0, torch.zeros_like(items_sum), True
            continue
        done, micro_steps = end, micro_steps + 1
        if flag is not None:  # sync-free: accumulate on the device, decide nothing here
            flag &= torch.isfinite(out[0])
            items_sum += out[1].float() * part_images.shape[0]
            continue
        if out is None or not torch.isfinite(out[0]):
            finite = False
            if trainer.world_size == 1:
                break
            continue
        items_sum += out[1].float().cpu() * (part_images.shape[0])
    if flag is not None:  # under DDP the all-reduced gradients carry a NaN to every rank's scaler
        return BatchResult(items_sum / size, True, micro_steps, grads_lost, finite_flag=flag)
    if not _finite_on_all_ranks(finite, trainer):
        return BatchResult(None, False, micro_steps, grads_lost)
    return BatchResult(items_sum / size, True, micro_steps, grads_lost)


def _recover_from_oom(trainer: Trainer, buffers: list[torch.Tensor], attempted: int, error: BaseException) -> bool:
    """Free memory, restore BatchNorm stats, halve the micro-batch; True when gradients had to be zeroed."""
    in_backward = trainer.phase == "backward"
    trainer.phase = "idle"
    if buffers:
        torch._foreach_copy_(buffers, trainer.buffer_backup)  # undo the running-stat updates of the failed forward
    free_cuda_memory(trainer.device)
    trainer.micro_batch_size = halve_micro_batch(attempted, error)
    trainer.oom_events += 1
    if in_backward:
        trainer.optimizer.zero_grad(set_to_none=True)
    return in_backward


def train_step(trainer: Trainer, images: torch.Tensor, targets: torch.Tensor) -> BatchResult:
    """One optimizer update over ``images`` (uint8 (B, 3, H, W)) and ``targets`` (N, 6): all micro-steps,
    then the optimizer step and the EMA update. A non-finite loss zeroes the gradients and skips the step
    (in a sync-free step the scaler skips it on the device)."""
    result = run_batch(trainer, images, targets, sync=True)
    if result.finite:
        optimizer_step(trainer)
    else:
        trainer.optimizer.zero_grad(set_to_none=True)
    return result
