"""``train_one_epoch``, the inner loop of the official train_dual.py: per loader batch the schedule's settings, then
``step.train_step``; around it the deferred read-back of the losses, the stops (interrupts, non-finite losses)
and the errors they raise. ``fit`` wraps it with set-up, validation and checkpoints.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from yolo9kit.config import TrainConfig
from yolo9kit.models.inference import max_stride
from yolo9kit.train.inputs import multi_scale_rng, multi_scale_shape
from yolo9kit.train.optim import apply_settings, step_settings
from yolo9kit.train.records import BatchRecord, bar_text, device_memory_bytes, read_peak_allocated, reset_peak_memory
from yolo9kit.train.state import Progress
from yolo9kit.train.step import BatchNormSnapshot, Trainer, train_step, train_step_with_backoff, unwrap

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


def train_one_epoch(trainer: Trainer, loader: Iterable, config: TrainConfig, progress: Progress, *,
                    batches_per_epoch: int, warmup: int, start_batch: int = 0,
                    on_batch: Callable[[BatchRecord], None] | None = None, progress_bar: bool = True,
                    interrupt: Callable[[], str | None] | None = None) -> EpochStats:
    """Train ``progress.epoch`` over ``loader`` batches ``(images uint8 (B, 3, H, W), targets (N, 6), ...)``.

    Gradients are zeroed at the start (a partial window of the previous epoch is dropped, as officially); batches
    before ``start_batch`` are read, not trained (a resume inside the epoch keeps the data order exact).

    Args:
        trainer, config, progress: the run's trainer, settings and counters (``progress.last_opt_step`` is kept).
        batches_per_epoch: loader batches per epoch (nb); warmup: warmup batches (official nw).
        on_batch: receives a ``BatchRecord`` per trained batch, in groups at each read-back of the losses.
        progress_bar: a tqdm bar.
        interrupt: asked before each batch; a reason (e.g. "SIGTERM") stops the epoch with ``Interrupted``.

    Raises:
        NonFiniteLossError: ``config.run.max_nonfinite_batches`` non-finite losses in a row, or an epoch of them.
        Interrupted: ``interrupt`` gave a reason (on any KeyboardInterrupt the BatchNorm statistics are put back
            to the start of the unfinished accumulation window, where a resume continues).
    """
    trainer.model.train()
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.last_opt_step = progress.last_opt_step
    reset_peak_memory(trainer.device)
    epoch, nb = progress.epoch, batches_per_epoch
    bar = tqdm(loader, total=nb, desc=f"epoch {epoch + 1}/{config.epochs}", disable=not progress_bar, leave=True)
    log = _ReadBack(trainer, config, progress, bar if progress_bar else None, on_batch)
    window = BatchNormSnapshot(trainer.model)
    stride = max_stride(unwrap(trainer.model))  # official gs
    try:
        for i, (images, targets, *_) in enumerate(bar):
            reason = interrupt() if interrupt is not None else None
            if reason is not None:
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
            if config.run.oom_backoff:
                items = train_step_with_backoff(trainer, images, targets, window, ni=ni,
                                                accumulate=settings.accumulate, imgsz=size)
            else:
                items = train_step(trainer, images, targets, ni=ni, accumulate=settings.accumulate, imgsz=size)
            progress.last_opt_step = trainer.last_opt_step
            if trainer.last_opt_step == ni:
                window.take()
            log.add(items, i, ni, images.shape[0], len(targets), settings, size or tuple(images.shape[2:]))
        log.finish()
    except KeyboardInterrupt:
        window.restore()
        raise
    bar.close()
    progress.oom_events = trainer.oom_events
    lrs = tuple(float(g["lr"]) for g in trainer.optimizer.param_groups)
    return EpochStats(log.mean_items, log.images_seen, time.perf_counter() - log.start,
                      read_peak_allocated(trainer.device), lrs)


class _ReadBack:
    """The batches' loss items, left on the device by the step, read back every ``config.run.log_interval``
    batches and at the epoch's end in one transfer: running means, the bar, ``on_batch``, non-finite counts."""

    def __init__(self, trainer: Trainer, config: TrainConfig, progress: Progress, bar,
                 on_batch: Callable[[BatchRecord], None] | None) -> None:
        self.trainer, self.config, self.progress, self.bar, self.on_batch = trainer, config, progress, bar, on_batch
        self.mean_items, self.trained, self.images_seen = torch.zeros(3), 0, 0
        self.start, self.skipped_before = time.perf_counter(), progress.nonfinite_total
        self.pending: list[tuple] = []
        self.unmatched: list[tuple[int, int]] = []  # sizes of batches with boxes of which none held an anchor

    def add(self, items: torch.Tensor, *batch) -> None:
        self.pending.append((items, self.trainer.micro_batch_size or batch[2], *batch))
        if len(self.pending) >= self.config.run.log_interval:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        rows = torch.stack([p[0] for p in pending]).float().cpu()  # waits for the device, once
        for row, (_, micro, i, ni, images, boxes, settings, size) in zip(rows, pending):
            if not bool(torch.isfinite(row).all()):  # the scaler has skipped its window's step on the device
                _count_nonfinite(self.progress, self.config, i, ni)
                continue
            self.progress.nonfinite_in_row = 0
            if boxes and float(row[0]) == 0.0:
                self.unmatched.append(size)
            self.mean_items = (self.mean_items * self.trained + row) / (self.trained + 1)
            self.trained, self.images_seen = self.trained + 1, self.images_seen + images
            speed = self.images_seen * self.trainer.world_size / max(time.perf_counter() - self.start, 1e-9)
            mean, device = self.mean_items, self.trainer.device
            if self.bar is not None:
                text = bar_text(mean, device_memory_bytes(device), speed, settings.accumulate, micro)
                self.bar.set_postfix_str(text, refresh=False)
            if self.on_batch is not None:
                self.on_batch(BatchRecord(
                    epoch=self.progress.epoch, batch_index=i, ni=ni, optimizer_steps=self.trainer.optimizer_steps,
                    box_loss=float(mean[0]), cls_loss=float(mean[1]), dfl_loss=float(mean[2]),
                    lr_bias=float(settings.lrs[0]), lr_weight=float(settings.lrs[1]),
                    lr_norm_weight=float(settings.lrs[2]), momentum=float(settings.momentum),
                    accumulate_steps=settings.accumulate, micro_batch_size=micro,
                    peak_allocated=read_peak_allocated(device), images_per_s=speed))

    def finish(self) -> None:
        """The last read-back; an epoch of skipped steps did not train (an error), unmatched boxes a warning."""
        self.flush()
        progress = self.progress
        if self.trained == 0 and progress.nonfinite_total > self.skipped_before:
            raise NonFiniteLossError(progress.nonfinite_in_row, progress.epoch + 1, progress.ni + 1, whole_epoch=True,
                                     from_start=progress.nonfinite_in_row > progress.ni)
        if self.unmatched:
            sizes = sorted(set(self.unmatched))[:4]
            LOGGER.warning("epoch %d: %d of %d batches had boxes but none of them held an anchor (at %s px): those "
                           "batches trained on background only (box loss 0). The images are too small for their "
                           "boxes (a larger imgsz, or a smaller multi-scale range)", progress.epoch + 1,
                           len(self.unmatched), self.trained, ", ".join(f"{h}x{w}" for h, w in sizes))


def _count_nonfinite(progress: Progress, config: TrainConfig, batch: int, ni: int) -> None:
    progress.nonfinite_in_row += 1
    progress.nonfinite_total += 1
    LOGGER.warning("non-finite loss in epoch %d at batch %d: step skipped (%d in a row, stop at %d)",
                   progress.epoch + 1, batch + 1, progress.nonfinite_in_row, config.run.max_nonfinite_batches)
    if progress.nonfinite_in_row >= config.run.max_nonfinite_batches:
        raise NonFiniteLossError(progress.nonfinite_in_row, progress.epoch + 1, batch + 1,
                                 from_start=progress.nonfinite_in_row > ni)  # batches 0..ni all skipped


class NonFiniteLossError(RuntimeError):
    """``max_nonfinite_batches`` non-finite losses in a row, or an epoch whose every batch had one.

    Attributes:
        run_dir: the run folder (``fit`` sets it); its ``weights/last.pt``, if any, is the last good checkpoint.
        count: how many non-finite losses in a row were seen.
    """

    def __init__(self, count: int, epoch: int, batch: int, *, from_start: bool = False,
                 whole_epoch: bool = False) -> None:
        self.run_dir, self.count = None, count
        what = (f"every batch of epoch {epoch} had a non-finite loss ({count} in a row): nothing trained" if whole_epoch
                else f"{count} non-finite losses in a row (epoch {epoch}, batch {batch})")
        # a loss that is not finite before the first optimizer step owes nothing to the learning rate
        why = ("The loss was not finite from the run's first batch, before any optimizer step: check the loss gains "
               "(box, cls, dfl, cls_pw of --hyp), the labels (yolo9kit.data.check) or train with amp='off'."
               if from_start else
               "Lower lr0, check the labels (yolo9kit.data.check) or train with amp='off' or 'bf16'.")
        super().__init__(f"{what}: training stopped. {why}")

    def in_run(self, run_dir: Path | None) -> NonFiniteLossError:
        """This error with the run folder named: where the last good checkpoint is, when there is one."""
        self.run_dir = run_dir
        self.args = (self.args[0] + _last_good(run_dir),)
        return self


class NonFiniteWeightsError(RuntimeError):
    """The weights (or the EMA) hold NaN or Inf when a checkpoint is due: nothing is written.

    Attributes:
        run_dir: the run folder; its ``weights/last.pt`` is the last good checkpoint (not overwritten).
        names: the tensors that are not finite.
    """

    def __init__(self, run_dir: Path | None, what: str, names: list[str]) -> None:
        self.run_dir, self.names = run_dir, names
        super().__init__(f"{what}: the weights hold NaN or Inf ({len(names)} tensors, e.g. {', '.join(names[:3])}): "
                         "not saved. Lower lr0, or start afresh from a checkpoint whose optimizer state is finite."
                         + _last_good(run_dir))


def _last_good(run_dir: Path | None) -> str:
    """`` The last good checkpoint is .../last.pt.`` when the run folder has one, else nothing."""
    last = Path(run_dir) / "weights" / "last.pt" if run_dir else None
    return f" The last good checkpoint is {last}." if last is not None and last.is_file() else ""


class Interrupted(KeyboardInterrupt):
    """A ``KeyboardInterrupt`` raised for a stop signal; ``reason`` names it (``"SIGINT"``, ``"SIGTERM"``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason} received")
        self.reason = reason


def stopped_by(reason: str) -> str:
    """How a log line names what stopped a run (``FitResult.interrupted_by`` keeps the exception's name)."""
    return "stopped (Ctrl-C, Kernel > Interrupt or a callback's stop)" if reason == "KeyboardInterrupt" else reason


class StopSignals:
    """SIGTERM, and SIGINT where Python's own handler is in place, turned into a stop at a safe point: recorded in
    ``received`` for the loop to ask (``pending()``) before each batch, or raised as ``Interrupted`` inside
    ``raising()`` (validation). A second signal is logged and ignored, so the first one's checkpoint is written
    whole. Handlers are installed on the main thread only, where no other was set, and restored on exit."""

    def __init__(self, install: bool = True) -> None:
        self.received: str | None = None
        self.install = install  # False: leave the handlers alone (DDP: the ranks must stop at the same batch)
        self._raising = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if not self.install or threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be set there; Python delivers signals there anyway
        for sig, default in ((signal.SIGTERM, signal.SIG_DFL), (signal.SIGINT, signal.default_int_handler)):
            if signal.getsignal(sig) is default:  # a handler of the application's own stays in charge
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            LOGGER.warning("%s: already stopping for %s, saving first (SIGKILL ends the process at once)", name,
                           self.received)
            return
        self.received = name
        if self._raising:
            raise Interrupted(name)
        LOGGER.warning("%s received: stopping at the next batch (after the checkpoint being written)", name)

    def pending(self) -> str | None:
        """The signal received so far (None: carry on)."""
        return self.received

    @contextlib.contextmanager
    def raising(self) -> Iterator[None]:
        """A signal raises ``Interrupted`` right away inside this block (one received before raises on entry)."""
        if self.received is not None:
            raise Interrupted(self.received)
        self._raising = True
        try:
            yield
        finally:
            self._raising = False
