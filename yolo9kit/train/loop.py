"""``train_one_epoch``: the inner loop of the official train_dual.py, reading top to bottom.

Per loader batch: warmup/schedule settings -> micro-steps (forward, loss, backward) -> when due, the
optimizer step and the EMA update. ``fit`` (in ``fit.py``) wraps it with set-up, validation and checkpoints.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from yolo9kit.config import TrainConfig
from yolo9kit.train.guards import NonFiniteLossError
from yolo9kit.train.optim import apply_settings, step_settings
from yolo9kit.train.records import bar_text, device_memory_bytes, reset_peak_memory
from yolo9kit.train.state import Progress
from yolo9kit.train.step import Trainer, optimizer_step, run_batch

LOGGER = logging.getLogger(__name__)


@dataclass
class EpochStats:
    """Mean loss items [box, cls, dfl] over the epoch's batches, images seen (this rank), time, peak memory."""

    mean_items: torch.Tensor
    images: int
    seconds: float
    peak_memory_bytes: int
    lrs: tuple[float, float, float]


def train_one_epoch(trainer: Trainer, loader: Iterable, config: TrainConfig, progress: Progress, *,
                    batches_per_epoch: int, warmup: int, start_batch: int = 0,
                    on_step: Callable[[dict], None] | None = None, show: bool = True,
                    run_dir: Path | None = None) -> EpochStats:
    """Train ``progress.epoch`` over ``loader`` batches ``(images uint8 (B,3,H,W), targets (N,6), ...)``.

    Accumulation follows the official rule: an optimizer step happens at batch ``ni`` when
    ``ni - last_opt_step >= accumulate``; gradients are zeroed at the start of the epoch (a partial
    accumulation left from the previous epoch is dropped, as in train_dual.py). Batches before
    ``start_batch`` are read but not trained (resume inside an epoch keeps the data order exact).

    Raises:
        NonFiniteLossError: after ``config.max_nonfinite_steps`` non-finite losses in a row.
    """
    trainer.model.train()
    trainer.optimizer.zero_grad(set_to_none=True)
    reset_peak_memory(trainer.device)
    epoch, nb = progress.epoch, batches_per_epoch
    mean_items, trained, images_seen = torch.zeros(3), 0, 0
    start = time.perf_counter()
    bar = tqdm(loader, total=nb, desc=f"epoch {epoch + 1}/{config.epochs}", disable=not show, leave=True)
    for i, (images, targets, *_) in enumerate(bar):
        if i < start_batch:
            continue  # resumed inside this epoch: already trained
        progress.ni = ni = i + nb * epoch
        settings = step_settings(config, ni, epoch, warmup)
        apply_settings(trainer.optimizer, settings)
        step_due = ni - progress.last_opt_step >= settings.accumulate

        result = run_batch(trainer, images, targets, sync=step_due)  # micro-steps: forward, loss, backward
        if result.grads_lost:
            LOGGER.warning("out of memory during backward: gradients accumulated since the last step were dropped")
        if not result.finite:
            _skip_nonfinite(trainer, progress, config, run_dir, batch=i)
            continue
        progress.nonfinite_in_row = 0
        if step_due:
            optimizer_step(trainer)  # unscale, clip 10, step, zero grads, EMA update
            progress.last_opt_step = ni

        mean_items = (mean_items * trained + result.loss_items) / (trained + 1)
        trained, images_seen = trained + 1, images_seen + images.shape[0]
        speed = images_seen * trainer.world_size / max(time.perf_counter() - start, 1e-9)
        micro = trainer.micro_batch_size or images.shape[0]
        if show:
            memory = device_memory_bytes(trainer.device)
            bar.set_postfix_str(bar_text(mean_items, memory, speed, settings.accumulate, micro), refresh=False)
        if on_step is not None:
            on_step({"epoch": epoch, "batch": i, "ni": ni, "step": trainer.optimizer_steps,
                     "box_loss": float(mean_items[0]), "cls_loss": float(mean_items[1]),
                     "dfl_loss": float(mean_items[2]), "lr": settings.lrs, "momentum": settings.momentum,
                     "accumulate": settings.accumulate, "micro_batch_size": micro, "images_per_s": speed,
                     "memory_bytes": device_memory_bytes(trainer.device)})
    bar.close()
    progress.oom_events = trainer.oom_events
    lrs = tuple(float(g["lr"]) for g in trainer.optimizer.param_groups)
    return EpochStats(mean_items, images_seen, time.perf_counter() - start,
                      device_memory_bytes(trainer.device, peak=True), lrs)


def _skip_nonfinite(trainer: Trainer, progress: Progress, config: TrainConfig, run_dir: Path | None,
                    batch: int) -> None:
    """Drop the accumulated gradients, start a new accumulation window, count; raise after too many in a row."""
    trainer.optimizer.zero_grad(set_to_none=True)
    progress.last_opt_step = progress.ni  # the next window starts after this batch
    progress.nonfinite_in_row += 1
    progress.nonfinite_total += 1
    LOGGER.warning("non-finite loss at epoch %d batch %d: step skipped (%d in a row, stop at %d)",
                   progress.epoch, batch, progress.nonfinite_in_row, config.max_nonfinite_steps)
    if progress.nonfinite_in_row >= config.max_nonfinite_steps:
        raise NonFiniteLossError(run_dir, progress.nonfinite_in_row, progress.epoch, batch)
