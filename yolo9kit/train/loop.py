"""``train_one_epoch``: the inner loop of the official train_dual.py, reading top to bottom.

Per loader batch: warmup/schedule settings -> micro-steps (forward, loss, backward) -> when due, the
optimizer step and the EMA update. ``fit`` (in ``fit.py``) wraps it with set-up, validation and checkpoints.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from yolo9kit.config import TrainConfig
from yolo9kit.config.train import LOG_INTERVAL, MAX_NONFINITE_BATCHES
from yolo9kit.models.deploy import max_stride
from yolo9kit.train.ema import unwrap
from yolo9kit.train.guards import Interrupted, NonFiniteLossError
from yolo9kit.train.optim import StepSettings, apply_settings, multi_scale_rng, multi_scale_shape, step_settings
from yolo9kit.train.records import BatchRecord, bar_text, device_memory_bytes, read_peak_allocated, reset_peak_memory
from yolo9kit.train.state import Progress
from yolo9kit.train.step import Trainer, optimizer_step, run_batch

LOGGER = logging.getLogger(__name__)


@dataclass
class EpochStats:
    """Mean loss items [box, cls, dfl] over the epoch's batches, images seen (this rank), time, peak memory
    (CUDA bytes; None on other devices) and the learning rate of each parameter group at the end."""

    mean_items: torch.Tensor
    images: int
    seconds: float
    peak_allocated: int | None
    lrs: tuple[float, float, float]


@dataclass
class _Logged:
    """A trained batch waiting to be logged (sync-free: its values are still on the device)."""

    batch: int
    ni: int
    images: int
    items: torch.Tensor
    finite: torch.Tensor | bool
    settings: StepSettings
    micro: int
    boxes: int = 0  # targets in the batch
    size: tuple[int, int] | None = None  # (h, w) the batch trained at

class _EpochLog:
    """Running means, images/s, the progress bar and ``on_batch`` for the batches of one epoch."""

    def __init__(self, trainer: Trainer, config: TrainConfig, progress: Progress, bar,
                 on_batch: Callable[[BatchRecord], None] | None, progress_bar: bool):
        self.trainer, self.config, self.progress = trainer, config, progress
        self.bar, self.on_batch, self.progress_bar = bar, on_batch, progress_bar
        self.mean_items, self.trained, self.images_seen = torch.zeros(3), 0, 0
        self.start = time.perf_counter()
        self.pending: list[_Logged] = []
        self.unmatched: list[_Logged] = []  # batches with boxes whose box loss was 0: no box met an anchor

    def add(self, entry: _Logged) -> None:
        """Log now (values on the host) or, sync-free, every ``LOG_INTERVAL`` batches."""
        self.pending.append(entry)
        if not self.trainer.sync_free or len(self.pending) >= LOG_INTERVAL:
            self.flush()

    def warn_unmatched(self) -> None:
        """One line per epoch when batches with boxes trained on background only (no box held an anchor)."""
        if not self.unmatched:
            return
        sizes = sorted({e.size for e in self.unmatched if e.size is not None})
        at = f" (at {', '.join(f'{h}x{w}' for h, w in sizes[:4])} px)" if sizes else ""
        LOGGER.warning("epoch %d: %d of %d batches had boxes but none of them held an anchor%s: those batches "
                       "trained on background only (box loss 0). The images are too small for their boxes "
                       "(a larger imgsz, or a smaller multi-scale range)", self.progress.epoch + 1,
                       len(self.unmatched), self.trained, at)

    def flush(self) -> None:
        """Read the pending values back in one transfer and log them in order (non-finite ones counted)."""
        if not self.pending:
            return
        entries, self.pending = self.pending, []
        items = torch.stack([e.items for e in entries]).float().cpu()  # waits for the device, once
        finite = torch.stack([torch.as_tensor(e.finite, device=e.items.device) for e in entries]).cpu()  # ready now
        for entry, row, ok in zip(entries, items, finite.tolist()):
            if not ok:  # sync-free: the scaler has already skipped the step on the device
                _count_nonfinite(self.progress, self.config, entry.batch, entry.ni)
                continue
            self.progress.nonfinite_in_row = 0
            self._log(entry, row)

    def _log(self, entry: _Logged, row: torch.Tensor) -> None:
        trainer = self.trainer
        if entry.boxes and float(row[0]) == 0.0:  # read back anyway: costs nothing
            self.unmatched.append(entry)
        self.mean_items = (self.mean_items * self.trained + row) / (self.trained + 1)
        self.trained, self.images_seen = self.trained + 1, self.images_seen + entry.images
        speed = self.images_seen * trainer.world_size / max(time.perf_counter() - self.start, 1e-9)
        mean, settings = self.mean_items, entry.settings
        if self.progress_bar:
            memory = device_memory_bytes(trainer.device)
            self.bar.set_postfix_str(bar_text(mean, memory, speed, settings.accumulate, entry.micro), refresh=False)
        if self.on_batch is not None:
            lr_bias, lr_weight, lr_norm_weight = (float(lr) for lr in settings.lrs)
            self.on_batch(BatchRecord(
                epoch=self.progress.epoch, batch_index=entry.batch, ni=entry.ni,
                optimizer_steps=trainer.optimizer_steps, box_loss=float(mean[0]), cls_loss=float(mean[1]),
                dfl_loss=float(mean[2]), lr_bias=lr_bias, lr_weight=lr_weight, lr_norm_weight=lr_norm_weight,
                momentum=float(settings.momentum), accumulate_steps=settings.accumulate, micro_batch_size=entry.micro,
                peak_allocated=read_peak_allocated(trainer.device), images_per_s=speed))


class _WindowStart:
    """The model's buffers (BatchNorm running statistics) as they were when the accumulation window began.

    An interrupted epoch resumes at the start of its unfinished window and redoes its forward passes; putting
    these back first keeps them from counting twice, so a resume inside an epoch is exact with BatchNorm too.
    Copying them costs a few small kernels per optimizer step (about two floats per channel).
    """

    def __init__(self, trainer: Trainer) -> None:
        self.buffers = list(unwrap(trainer.model).buffers())
        self.saved = [b.clone() for b in self.buffers]

    def take(self) -> None:
        if self.buffers:
            torch._foreach_copy_(self.saved, self.buffers)

    def restore(self) -> None:
        if self.buffers:
            torch._foreach_copy_(self.buffers, self.saved)


def train_one_epoch(trainer: Trainer, loader: Iterable, config: TrainConfig, progress: Progress, *,
                    batches_per_epoch: int, warmup: int, start_batch: int = 0,
                    on_batch: Callable[[BatchRecord], None] | None = None, progress_bar: bool = True,
                    interrupt: Callable[[], str | None] | None = None) -> EpochStats:
    """Train ``progress.epoch`` over ``loader`` batches ``(images uint8 (B,3,H,W), targets (N,6), ...)``.

    Accumulation follows the official rule: an optimizer step happens at batch ``ni`` when
    ``ni - last_opt_step >= accumulate``; gradients are zeroed at the start of the epoch (a partial
    accumulation left from the previous epoch is dropped, as in train_dual.py). Batches before
    ``start_batch`` are read but not trained (resume inside an epoch keeps the data order exact).

    A sync-free trainer (the CUDA default) keeps each batch's losses on the device and reads them back
    every ``LOG_INTERVAL`` batches and at the end of the epoch; a non-finite batch is then
    counted and named in the log, its step having been skipped on the device (the accumulation window
    it belonged to is lost, as in the plain step).

    ``on_batch`` receives a ``BatchRecord`` for each trained batch (sync-free: in groups, at each read-back).
    With ``config.step.multi_scale`` each batch is resized to a random size (``optim.multi_scale_shape``).

    ``interrupt`` is asked before each batch; a reason (e.g. ``"SIGTERM"``) stops the epoch there with
    ``Interrupted``. On any ``KeyboardInterrupt`` the BatchNorm running statistics are put back to the start
    of the unfinished accumulation window, where a resume continues.

    Raises:
        NonFiniteLossError: after ``MAX_NONFINITE_BATCHES`` non-finite losses in a row, or at the end
            of an epoch whose every batch had one.
    """
    trainer.model.train()
    trainer.optimizer.zero_grad(set_to_none=True)
    reset_peak_memory(trainer.device)
    epoch, nb = progress.epoch, batches_per_epoch
    bar = tqdm(loader, total=nb, desc=f"epoch {epoch + 1}/{config.epochs}", disable=not progress_bar, leave=True)
    log = _EpochLog(trainer, config, progress, bar, on_batch, progress_bar)
    window = _WindowStart(trainer)
    skipped_before = progress.nonfinite_total
    stride = max_stride(unwrap(trainer.model))  # official gs
    try:
        for i, (images, targets, *_) in enumerate(bar):
            reason = interrupt() if interrupt is not None else None
            if reason is not None:
                raise Interrupted(reason)
            if i < start_batch:
                continue  # resumed inside this epoch: already trained
            progress.ni = ni = i + nb * epoch
            settings = step_settings(config, ni, epoch, warmup)
            apply_settings(trainer.optimizer, settings)
            step_due = ni - progress.last_opt_step >= settings.accumulate

            size = None
            if config.step.multi_scale:  # one random size per batch, all its micro-steps alike
                rng = multi_scale_rng(config.run.seed, ni)
                size = multi_scale_shape(tuple(images.shape[2:]), config.step.imgsz, stride, rng)
            result = run_batch(trainer, images, targets, sync=step_due, imgsz=size)  # forward, loss, backward
            if result.grads_lost:
                LOGGER.warning("out of memory during backward: gradients accumulated since the last step were "
                               "dropped")
            if not result.finite:
                log.flush()  # earlier batches first, so that the count of non-finite losses in a row is right
                _skip_nonfinite(trainer, progress, config, batch=i)
                window.take()
                continue
            if step_due:
                optimizer_step(trainer)  # unscale, clip 10, step, zero grads, EMA update
                progress.last_opt_step = ni
                window.take()
            finite = result.finite_flag if result.finite_flag is not None else True
            log.add(_Logged(i, ni, images.shape[0], result.loss_items, finite, settings,
                            trainer.micro_batch_size or images.shape[0], boxes=len(targets),
                            size=size or tuple(images.shape[2:])))
        log.flush()
        if log.trained == 0 and progress.nonfinite_total > skipped_before:  # an epoch of skipped steps: not done
            raise NonFiniteLossError(progress.nonfinite_in_row, epoch + 1, i + 1, whole_epoch=True,
                                     from_start=progress.nonfinite_in_row > progress.ni)
        log.warn_unmatched()
    except KeyboardInterrupt:
        window.restore()
        raise
    bar.close()
    progress.oom_events = trainer.oom_events
    lrs = tuple(float(g["lr"]) for g in trainer.optimizer.param_groups)
    return EpochStats(log.mean_items, log.images_seen, time.perf_counter() - log.start,
                      read_peak_allocated(trainer.device), lrs)


def _skip_nonfinite(trainer: Trainer, progress: Progress, config: TrainConfig, batch: int) -> None:
    """Drop the accumulated gradients, start a new accumulation window, count; raise after too many in a row."""
    trainer.optimizer.zero_grad(set_to_none=True)
    progress.last_opt_step = progress.ni  # the next window starts after this batch
    _count_nonfinite(progress, config, batch, progress.ni)


def _count_nonfinite(progress: Progress, config: TrainConfig, batch: int, ni: int) -> None:
    progress.nonfinite_in_row += 1
    progress.nonfinite_total += 1
    LOGGER.warning("non-finite loss in epoch %d at batch %d: step skipped (%d in a row, stop at %d)",
                   progress.epoch + 1, batch + 1, progress.nonfinite_in_row, MAX_NONFINITE_BATCHES)
    if progress.nonfinite_in_row >= MAX_NONFINITE_BATCHES:
        raise NonFiniteLossError(progress.nonfinite_in_row, progress.epoch + 1, batch + 1,
                                 from_start=progress.nonfinite_in_row > ni)  # batches 0..ni all skipped
