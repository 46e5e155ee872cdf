"""``train_one_epoch``, train_dual.py's inner loop: per batch the schedule and ``train_step`` (docs/training.md)."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from yolo9kit.config import TrainConfig
from yolo9kit.config.train import LOG_INTERVAL, MAX_NONFINITE_BATCHES, OOM_BACKOFF
from yolo9kit.env import process_memory_bytes
from yolo9kit.models.deploy import max_stride
from yolo9kit.train.guards import Interrupted, NonFiniteLossError
from yolo9kit.train.optim import apply_settings, multi_scale_rng, multi_scale_shape, step_settings
from yolo9kit.train.records import BatchRecord
from yolo9kit.train.state import Progress
from yolo9kit.train.step import BatchNormSnapshot, Trainer, train_step, train_step_with_backoff, unwrap

LOGGER = logging.getLogger(__name__)
DATA_WAIT_MIN_S = 10.0  # an epoch shorter than this says nothing of the loader: its start-up can be half of it


@dataclass
class EpochStats:
    """An epoch's mean loss items [box, cls, dfl], images (this rank), time, peak CUDA bytes (None off CUDA), LRs."""

    mean_items: torch.Tensor
    images: int
    seconds: float
    peak_allocated: int | None
    lrs: tuple[float, float, float]
    data_seconds: float = 0.0  # of ``seconds``, waiting for the loader's batches


def train_one_epoch(trainer: Trainer, loader: Iterable, config: TrainConfig, progress: Progress, *,
                    batches_per_epoch: int, warmup: int, start_batch: int = 0,
                    on_batch: Callable[[BatchRecord], None] | None = None, progress_bar: bool = True,
                    interrupt: Callable[[], str | None] | None = None) -> EpochStats:
    """Train ``progress.epoch`` over ``loader`` batches ``(images uint8 (B, 3, H, W), targets (N, 6), ...)``;
    gradients are zeroed first, as officially; batches before ``start_batch`` are read, not trained (a resume).

    Args:
        trainer, config, progress: the run's trainer, settings and counters (``progress.last_opt_step`` is kept).
        batches_per_epoch: loader batches per epoch (nb); warmup: warmup batches (official nw).
        on_batch: receives a ``BatchRecord`` per trained batch, in groups at each read-back; progress_bar: tqdm.
        interrupt: asked before each batch; a reason (e.g. "SIGTERM") stops the epoch with ``Interrupted``.

    Raises:
        NonFiniteLossError: ``MAX_NONFINITE_BATCHES`` non-finite losses in a row, or an epoch of them.
        Interrupted: ``interrupt`` gave a reason (on any KeyboardInterrupt the batches trained so far are reported
            and the BatchNorm statistics put back to the unfinished window's start, where a resume continues).
    """
    trainer.model.train()
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.last_opt_step = progress.last_opt_step
    if trainer.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(trainer.device)
    epoch, nb, stride = progress.epoch, batches_per_epoch, max_stride(unwrap(trainer.model))  # official gs
    bar = tqdm(loader, total=nb, desc=f"epoch {epoch + 1}/{config.epochs}", disable=not progress_bar, leave=True)
    log = _ReadBack(trainer, progress, bar if progress_bar else None, on_batch, nb, config.epochs)
    window = BatchNormSnapshot(trainer.model)
    step = functools.partial(train_step_with_backoff, snapshot=window) if OOM_BACKOFF else train_step
    try:
        for i, (images, targets, *_) in enumerate(bar):
            log.waited += time.perf_counter() - log.ready  # the loader's time that the steps did not hide
            if interrupt is not None and (reason := interrupt()) is not None:
                raise Interrupted(reason)
            if i < start_batch:
                continue
            progress.ni = ni = i + nb * epoch
            settings = step_settings(config, ni, epoch, warmup)
            apply_settings(trainer.optimizer, settings)
            size = None
            if config.step.multi_scale:  # one random size per batch, all its micro-steps alike
                size = multi_scale_shape(tuple(images.shape[2:]), config.step.imgsz, stride,
                                         multi_scale_rng(config.run.seed, ni))
            items = step(trainer, images, targets, ni=ni, accumulate_steps=settings.accumulate, imgsz=size)
            progress.last_opt_step = trainer.last_opt_step
            if trainer.last_opt_step == ni:
                window.take()
            log.add(items, i, ni, images.shape[0], len(targets), settings, size or tuple(images.shape[2:]))
            log.ready = time.perf_counter()
        log.finish()
    except KeyboardInterrupt:
        window.restore()
        if trainer.world_size == 1:  # the batches trained before the stop reported (ranks may not meet here)
            with contextlib.suppress(NonFiniteLossError):  # a stop stays a stop
                log.flush()
        raise
    bar.close()
    progress.oom_events = trainer.oom_events
    return EpochStats(log.mean_items, log.images_seen, time.perf_counter() - log.start, _peak_allocated(trainer.device),
                      tuple(float(g["lr"]) for g in trainer.optimizer.param_groups), log.waited)


class _ReadBack:
    """The loss items left on the device, read back every ``LOG_INTERVAL`` batches and at the epoch's end at once."""

    def __init__(self, trainer: Trainer, progress: Progress, bar, on_batch: Callable[[BatchRecord], None] | None,
                 batches: int, epochs: int):
        self.trainer, self.progress, self.bar, self.on_batch = trainer, progress, bar, on_batch
        self.batches, self.epochs = batches, epochs  # of this epoch, and of the run as they stand
        self.mean_items, self.trained, self.images_seen = torch.zeros(3), 0, 0
        self.start, self.skipped_before = time.perf_counter(), progress.nonfinite_total
        self.ready, self.waited = self.start, 0.0  # when the loop asked for a batch; seconds it waited for them
        self.pending: list[tuple] = []
        self.unmatched: list[tuple[int, int]] = []  # sizes of batches with boxes of which none held an anchor

    def add(self, items: torch.Tensor, *batch) -> None:
        self.pending.append((items, self.trainer.optimizer_steps, self.trainer.micro_batch_size or batch[2], *batch))
        if len(self.pending) >= LOG_INTERVAL or batch[0] + 1 == self.batches:  # the last before the bar closes
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        rows = torch.stack([p[0] for p in pending]).float()
        finite = torch.isfinite(rows).all(1, keepdim=True).float()
        if self.trainer.world_size > 1:  # a batch non-finite on any rank counts on all: they stop together
            torch.distributed.all_reduce(finite, op=torch.distributed.ReduceOp.MIN)
        rows = torch.cat([rows, finite], 1).cpu()  # waits for the device, once
        device, progress = self.trainer.device, self.progress  # the bar's memory, read once: off CUDA the resident set
        rss = None if device.type == "cuda" or self.bar is None else process_memory_bytes()
        memory = f"mem {torch.cuda.memory_allocated(device) / 1e9:.3g}G " if device.type == "cuda" else \
            "" if rss is None else f"rss {rss / 1e9:.3g}G "
        for (*row, ok), (_, steps, micro, i, ni, images, boxes, settings, size) in zip(rows.tolist(), pending):
            if not ok:  # the scaler has skipped its window's step on the device
                progress.nonfinite_in_row += 1
                progress.nonfinite_total += 1
                LOGGER.warning("non-finite loss in epoch %d at batch %d: step skipped (%d in a row, stop at %d)",
                               progress.epoch + 1, i + 1, progress.nonfinite_in_row, MAX_NONFINITE_BATCHES)
                if progress.nonfinite_in_row >= MAX_NONFINITE_BATCHES:
                    raise NonFiniteLossError(progress.nonfinite_in_row, progress.epoch + 1, i + 1,
                                             from_start=progress.nonfinite_in_row > ni)  # batches 0..ni all skipped
                continue
            progress.nonfinite_in_row = 0
            if boxes and row[0] == 0.0:
                self.unmatched.append(size)
            self.mean_items = (self.mean_items * self.trained + torch.tensor(row)) / (self.trained + 1)
            self.trained, self.images_seen = self.trained + 1, self.images_seen + images
            elapsed = max(time.perf_counter() - self.start, 1e-9)
            speed = self.images_seen * self.trainer.world_size / elapsed
            if self.bar is not None:  # box 1.23 cls 4.56 dfl 1.11 mem 3.2G 120 img/s data 4% acc 4x16
                box, cls, dfl = self.mean_items.tolist()
                self.bar.set_postfix_str(f"box {box:.3f} cls {cls:.3f} dfl {dfl:.3f} {memory}{speed:.1f} "
                                         f"img/s data {self.waited / elapsed:.0%} acc "
                                         f"{settings.accumulate}x{micro}", refresh=False)
            if self.on_batch is not None:
                self.on_batch(BatchRecord(progress.epoch, i, ni, steps, *map(float, self.mean_items.tolist()),
                                          *map(float, settings.lrs), float(settings.momentum), settings.accumulate,
                                          micro, _peak_allocated(device), speed, self.epochs))
        done = pending[-1][3] + 1  # this epoch's batches so far
        if progress.epoch == 0 and pending[0][3] == 0 and done < self.batches:  # a new run's first read-back: its pace
            epoch_s = (time.perf_counter() - self.start) / done * self.batches
            LOGGER.info("at the pace of its first %d batches an epoch trains in about %.0f s, the %d epochs in about "
                        "%.1f min (validation not counted)", done, epoch_s, self.epochs, epoch_s * self.epochs / 60)

    def finish(self) -> None:
        """The last read-back; an epoch of skipped steps did not train (an error), unmatched boxes a warning."""
        self.flush()
        progress = self.progress
        if self.trained == 0 and progress.nonfinite_total > self.skipped_before:
            raise NonFiniteLossError(progress.nonfinite_in_row, progress.epoch + 1, progress.ni + 1, whole_epoch=True,
                                     from_start=progress.nonfinite_in_row > progress.ni)
        seconds = time.perf_counter() - self.start
        if self.waited > seconds / 2 and seconds >= DATA_WAIT_MIN_S and not progress.data_warned:
            progress.data_warned = True
            LOGGER.warning("epoch %d waited for data %.0f%% of its %.1f s (the loader, not the model, set the pace): "
                           "more workers, cache='ram' or 'disk', or a smaller imgsz", progress.epoch + 1,
                           100 * self.waited / seconds, seconds)
        if self.unmatched:
            sizes = sorted(set(self.unmatched))[:4]
            LOGGER.warning("epoch %d: %d of %d batches had boxes but none of them held an anchor (at %s px): those "
                           "batches trained on background only (box loss 0). The images are too small for their "
                           "boxes (a larger imgsz, or a smaller multi-scale range)", progress.epoch + 1,
                           len(self.unmatched), self.trained, ", ".join(f"{h}x{w}" for h, w in sizes))


def _peak_allocated(device: torch.device) -> int | None:
    """Peak allocated CUDA bytes since the epoch started; None on other devices (not measured)."""
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
