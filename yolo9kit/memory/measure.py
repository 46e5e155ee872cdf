"""``measure``: run the kit's real training step on a CUDA device and report its memory and speed."""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any

import torch
from torch import nn

from yolo9kit.config import StepConfig
from yolo9kit.env import free_cuda_memory, resolve_device
from yolo9kit.memory.extrapolate import _live_matrix
from yolo9kit.memory.gpus import gpu_from_device
from yolo9kit.memory.report import MemoryReport
from yolo9kit.memory.step import (
    as_step,
    build_real_trainer,
    num_classes_of,
    resolve_model,
    synthetic_batch,
)
from yolo9kit.memory.tracker import CATEGORIES
from yolo9kit.train.step import cudnn_autotune

LOGGER = logging.getLogger(__name__)


def require_cuda(device: str | torch.device) -> torch.device:
    """``device`` with its index (``"cuda"``: the current device) when it is a usable CUDA device, else a
    RuntimeError pointing to estimate()."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(
            f"measure() runs real training steps on a CUDA device, but device={str(device)!r} and "
            f"torch.cuda.is_available() is {torch.cuda.is_available()}. On this machine use "
            "yolo9kit.memory.estimate(step, gpu='RTX 4090') to predict the same report on any machine, "
            "trace(step) for the real step on the CPU, or sweep(...), which falls back to the estimate.")
    return resolve_device(dev)


def measure(step: StepConfig | str | nn.Module, batch_size: int | None = None, *,
            device: str | torch.device | None = None, repeats: int = 3, warmup_repeats: int = 1,
            breakdown: bool = True, **changes: Any) -> MemoryReport:
    """Measure ``warmup_repeats + repeats`` real training steps of ``step`` on a CUDA device
    (``yolo9kit.train.train_step``: forward, loss with ``num_targets`` boxes per image, backward, clip,
    optimizer, EMA), the step resolved for that device as ``fit`` would run it there.

    Each call is isolated: it works on its own copy of the model, collects garbage and empties the
    cache first, subtracts what earlier cells still hold, resets the peak counters after the warm-up
    and frees everything before returning, so calling it twice gives the same answer.

    Args:
        step: a ``StepConfig``, or a model name / module (then its default step); ``changes`` are
            ``StepConfig`` fields to change (``measure("yolov9-s", 32, amp="fp16")``).
        batch_size: images per forward/backward (default: the step's).
        device: the CUDA device (None: the first one).
        breakdown: run one more step under the storage tracker to split the peak into categories
            (costs one slow step; the difference to the CUDA counter goes to ``workspace_other``).

    Returns:
        MemoryReport with ``method="measured"``: peaks of ``torch.cuda.max_memory_allocated`` /
        ``max_memory_reserved`` over the timed steps (minus what was held before), median step time.

    Raises:
        RuntimeError: without CUDA (use ``estimate``). torch.cuda.OutOfMemoryError propagates after
        everything was freed, so the caller can go on.
    """
    step = as_step(step, batch_size, changes, caller="measure", needs_batch=True)
    dev = require_cuda("cuda" if device is None else device)
    step = step.resolve(dev)
    free_cuda_memory()
    held_allocated = torch.cuda.memory_allocated(dev)
    held_reserved = torch.cuda.memory_reserved(dev)
    if held_allocated:
        LOGGER.info("%.2f GiB is still allocated by earlier work; it is subtracted from the peaks",
                    held_allocated / 2**30)
    module = resolve_model(step)
    trainer = None
    try:
        trainer = build_real_trainer(module, step, dev)
        trainer.oom_backoff = False  # an out-of-memory must surface, not halve the micro-batch
        images, targets = synthetic_batch(step.batch_size, step.peak_imgsz, step.num_targets,
                                          num_classes_of(step, module))
        with cudnn_autotune(dev):  # as fit runs the step
            times = _run_steps(trainer, images, targets, repeats, warmup_repeats, dev)
        peak_allocated = torch.cuda.max_memory_allocated(dev) - held_allocated
        peak_reserved = torch.cuda.max_memory_reserved(dev) - held_reserved
        parts = _tracked_breakdown(trainer, images, targets, peak_allocated) if breakdown else \
            {**dict.fromkeys(CATEGORIES, 0), "workspace_other": peak_allocated}
    finally:
        del trainer, module  # the model was moved to the GPU in place: drop it before emptying the cache
        free_cuda_memory()
    step_s = statistics.median(times)
    spec = gpu_from_device(dev.index)
    free, total = torch.cuda.mem_get_info(dev)
    # what the card holds beyond this process's cache: the CUDA context (and any other process)
    context = max(0, total - free - torch.cuda.memory_reserved(dev))
    return MemoryReport(step=step, method="measured", device=spec.name, peak_allocated=int(peak_allocated),
                        peak_reserved=int(peak_reserved), breakdown=parts, step_time_s=step_s,
                        images_per_s=step.batch_size / step_s, context_bytes=int(context),
                        gpu_total_bytes=spec.total_bytes,
                        notes=[f"torch {torch.__version__}, median of {repeats} steps after {warmup_repeats} "
                               "warm-up, cuDNN autotuning on"])


def trace(step: StepConfig | str | nn.Module, batch_size: int | None = None, **changes: Any) -> MemoryReport:
    """Run one real training step of ``step`` on the CPU under the storage tracker and report its peak.

    The step is resolved for the CPU (what ``fit`` runs there: fp32, the plain layout, unless the step
    sets a switch). This is the CPU counterpart of ``measure``: real tensors, real loss, the bytes every
    storage holds and when, but no CUDA allocator (``peak_reserved`` equals ``peak_allocated``). Works on
    a copy of the model; one warm-up step first creates the optimizer state, as in a running training.

    Returns:
        MemoryReport with ``method="traced"`` (the step's wall time on this CPU as ``step_time_s``).
    """
    from yolo9kit.memory.steptrace import trace_real_step
    from yolo9kit.train.step import train_step

    step = as_step(step, batch_size, changes, caller="trace", needs_batch=True).resolve("cpu")
    module = resolve_model(step)
    trainer = build_real_trainer(module, step, torch.device("cpu"))
    images, targets = synthetic_batch(step.batch_size, step.peak_imgsz, step.num_targets, num_classes_of(step, module))
    train_step(trainer, images, targets)  # steady state: momentum buffers exist, as from the second step on
    t0 = time.perf_counter()
    recorded = trace_real_step(trainer, images, targets, device_type="cpu")
    seconds = time.perf_counter() - t0
    live = _live_matrix(recorded)
    row = live[int(live.sum(1).argmax())]
    parts = {c: int(v) for c, v in zip(CATEGORIES, row)}
    peak = sum(parts.values())
    return MemoryReport(step=step, method="traced", device="CPU (traced)", peak_allocated=peak,
                        peak_reserved=peak, breakdown=parts, step_time_s=seconds,
                        images_per_s=step.batch_size / seconds,
                        notes=["the real step on the CPU under the storage tracker"])


def _run_steps(trainer, images, targets, repeats: int, warmup_repeats: int, dev: torch.device) -> list[float]:
    from yolo9kit.train.step import train_step

    for _ in range(warmup_repeats):
        train_step(trainer, images, targets)
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        train_step(trainer, images, targets)
        torch.cuda.synchronize(dev)  # CPU-GPU sync point: the step is over when the GPU is done
        times.append(time.perf_counter() - t0)
    return times


def _tracked_breakdown(trainer, images, targets, peak_allocated: int) -> dict[str, int]:
    """Categories at the tracked peak of one more step; the rest of the CUDA peak is workspace_other."""
    from yolo9kit.memory.steptrace import trace_real_step

    trace = trace_real_step(trainer, images, targets, device_type="cuda")
    live = _live_matrix(trace)
    row = live[int(live.sum(1).argmax())]
    parts = {c: int(v) for c, v in zip(CATEGORIES, row)}
    return fit_to_total(parts, int(peak_allocated))


def fit_to_total(parts: dict[str, int], total: int) -> dict[str, int]:
    """Make the breakdown sum to ``total``: the missing bytes go to workspace_other; if the tracker saw
    more than the counter (it can peak at another moment), all parts shrink in proportion."""
    parts = dict(parts)
    seen = sum(parts.values())
    if seen <= total:
        parts["workspace_other"] += total - seen
        return parts
    scaled = {c: int(v * total / seen) for c, v in parts.items()}
    scaled["workspace_other"] += total - sum(scaled.values())
    return scaled
