"""``measure``: run the kit's real training step on a CUDA device and report its memory and speed."""

from __future__ import annotations

import gc
import logging
import statistics
import time
from typing import Any

import torch
from torch import nn

from yolo9kit.memory.extrapolate import _live_matrix
from yolo9kit.memory.gpus import gpu_from_device
from yolo9kit.memory.report import MemoryReport
from yolo9kit.memory.step import build_real_trainer, normalise_amp, resolve_model, synthetic_batch
from yolo9kit.memory.tracker import CATEGORIES

LOGGER = logging.getLogger(__name__)


def require_cuda(device: str | torch.device) -> torch.device:
    """``torch.device(device)`` when it is a usable CUDA device, else a RuntimeError pointing to estimate()."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(
            f"measure() runs real training steps on a CUDA device, but device={str(device)!r} and "
            f"torch.cuda.is_available() is {torch.cuda.is_available()}. On this machine use "
            "yolo9kit.memory.estimate(model, batch_size, ..., gpu='RTX 4090') to predict the same report "
            "on the CPU, or sweep(...), which falls back to the estimate by itself.")
    return dev


def free_cuda() -> None:
    """Drop unreachable tensors and return cached blocks to the driver."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def measure(model: str | nn.Module, batch_size: int, imgsz: int = 640, amp: str = "fp16",
            checkpoint: Any = None, channels_last: bool = False, steps: int = 3, warmup: int = 1,
            device: str | torch.device = "cuda", num_targets: int = 8, *, num_classes: int = 80,
            loss_fn: Any = None, optimizer: str = "SGD", breakdown: bool = True, lean: bool = False) -> MemoryReport:
    """Measure ``warmup + steps`` real training steps (``yolo9kit.train.train_step``: forward, loss with
    ``num_targets`` boxes per image, backward, clip, optimizer, EMA) at ``batch_size`` on CUDA.

    Each call is isolated: it works on its own copy of the model, collects garbage and empties the
    cache first, subtracts what earlier cells still hold, resets the peak counters after the warm-up
    and frees everything before returning, so calling it twice gives the same answer.

    Args:
        model: a registered name ("yolov9-s") or a model (copied, never modified).
        lean: the lean BatchNorm+SiLU (``yolo9kit.models.lean``; on by default in ``fit`` on CUDA).
        breakdown: run one more step under the storage tracker to split the peak into categories
            (costs one slow step; the difference to the CUDA counter goes to ``workspace_other``).

    Returns:
        MemoryReport with ``source="measured"``: peaks of ``torch.cuda.max_memory_allocated`` /
        ``max_memory_reserved`` over the timed steps (minus what was held before), median step time.

    Raises:
        RuntimeError: without CUDA (use ``estimate``). torch.cuda.OutOfMemoryError propagates after
        everything was freed, so the caller can go on.
    """
    dev = require_cuda(device)
    amp = normalise_amp(amp)
    free_cuda()
    held_allocated = torch.cuda.memory_allocated(dev)
    held_reserved = torch.cuda.memory_reserved(dev)
    if held_allocated:
        LOGGER.info("%.2f GiB is still allocated by earlier work; it is subtracted from the peaks",
                    held_allocated / 2**30)
    module, name = resolve_model(model, num_classes, checkpoint)
    trainer = None
    try:
        trainer = build_real_trainer(module, amp=amp, channels_last=channels_last, device=dev, loss_fn=loss_fn,
                                     optimizer=optimizer, lean=lean)
        trainer.oom_backoff = False  # an out-of-memory must surface, not halve the micro-batch
        images, targets = synthetic_batch(batch_size, imgsz, num_targets, int(getattr(module, "nc", num_classes)))
        times = _run_steps(trainer, images, targets, steps, warmup, dev)
        peak_allocated = torch.cuda.max_memory_allocated(dev) - held_allocated
        peak_reserved = torch.cuda.max_memory_reserved(dev) - held_reserved
        parts = _tracked_breakdown(trainer, images, targets, peak_allocated) if breakdown else \
            {**dict.fromkeys(CATEGORIES, 0), "workspace_other": peak_allocated}
    finally:
        del trainer, module  # the model was moved to the GPU in place: drop it before emptying the cache
        free_cuda()
    step_s = statistics.median(times)
    spec = gpu_from_device(dev.index or 0)
    free, total = torch.cuda.mem_get_info(dev)
    # what the card holds beyond this process's cache: the CUDA context (and any other process)
    context = max(0, total - free - torch.cuda.memory_reserved(dev))
    return MemoryReport(model=name, batch_size=batch_size, imgsz=imgsz, amp=amp, checkpoint=checkpoint,
                        channels_last=channels_last, lean=lean, source="measured", device=spec.name,
                        peak_allocated=int(peak_allocated), peak_reserved=int(peak_reserved), breakdown=parts,
                        step_time_s=step_s, images_per_s=batch_size / step_s, context_bytes=int(context),
                        num_targets=num_targets, gpu_total_bytes=spec.total_bytes,
                        notes=[f"torch {torch.__version__}, median of {steps} steps after {warmup} warm-up, "
                               f"cudnn.benchmark={torch.backends.cudnn.benchmark}"])


def _run_steps(trainer, images, targets, steps: int, warmup: int, dev: torch.device) -> list[float]:
    from yolo9kit.train.step import train_step

    for _ in range(warmup):
        train_step(trainer, images, targets)
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for _ in range(max(1, steps)):
        t0 = time.perf_counter()
        train_step(trainer, images, targets)
        torch.cuda.synchronize(dev)  # CPU-GPU sync point: the step is over when the GPU is done
        times.append(time.perf_counter() - t0)
    return times


def _tracked_breakdown(trainer, images, targets, peak_allocated: int) -> dict[str, int]:
    """Categories at the tracked peak of one more step; the rest of the CUDA peak is workspace_other."""
    from yolo9kit.memory.trace import trace_real_step

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
