"""``estimate``: the memory of a training step on a GPU you may not have, predicted on the CPU.

How (each step's assumptions are in its module):

1. The kit's step (``trace.traced_step``: forward and loss under autocast, backward, clip, SGD,
   EMA) runs on ``meta`` tensors, which carry shapes, dtypes and strides but no data, under a
   ``StorageTracker`` that records every storage by category and over time (``tracker``), with the
   CUDA autocast policy applied by ``autocast_sim`` and the real loss bridged in (``trace``).
2. That is done at two small batch sizes; every storage is linear in the batch, so the live bytes
   at every moment of the step, and their peak, follow for any batch (``extrapolate``).
3. Peak reserved = peak allocated + a cuDNN workspace allowance + what the caching-allocator model
   (``allocator``) holds on top (rounding, 2 / 20 MiB segments, cached blocks) in two replayed steps.
4. When the package holds a measured calibration for the GPU (``calibration``), the measured lines
   ``measured = a * estimated + b`` replace 3.

Speed: tracing costs per op, not per byte, so the two traces take the same time for any batch or
image size; after them a curve of any number of batch sizes is array arithmetic, plus one allocator
replay at up to three batch sizes (the overhead is interpolated in between).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from torch import nn

from yolo9kit.memory.calibration import calibration_for
from yolo9kit.memory.extrapolate import StepMemoryModel
from yolo9kit.memory.gpus import GPUSpec, resolve_gpu
from yolo9kit.memory.report import MemoryReport
from yolo9kit.memory.step import AMP_DTYPES, build_meta_trainer, normalise_amp, resolve_model
from yolo9kit.memory.throughput import ThroughputModel

LOGGER = logging.getLogger(__name__)

# cuDNN allocates its convolution workspace through PyTorch's allocator, one convolution at a time.
# Assumed allowance at the peak until a measured calibration gives the real figure.
DEFAULT_WORKSPACE_BYTES = 64 << 20
TRACE_BATCHES = (1, 2)


def estimate(model: str | nn.Module, batch_size: int, imgsz: int = 640, amp: str = "fp16",
             checkpoint: Any = None, channels_last: bool = False, steps: int = 3, warmup: int = 1,
             device: str = "cuda", num_targets: int = 8, *, gpu: str | int | GPUSpec | None = "H100",
             num_classes: int = 80, loss_fn: Any = None, optimizer: str = "SGD", lean: bool = False) -> MemoryReport:
    """Predict, on the CPU, what ``measure`` would report for one training step on ``gpu``.

    Takes ``measure``'s arguments (``steps``, ``warmup`` and ``device`` are accepted and unused: the
    estimate traces one steady-state step) plus ``gpu``: a name from ``GPUS`` ("T4", "RTX 4090",
    "A100-40GB", "H100", ...), a capacity in bytes, or None. ``loss_fn`` replaces the kit's
    ``DetectionLoss`` (a callable ``(outputs, targets) -> (loss, items)`` for real tensors). ``lean``:
    the lean BatchNorm+SiLU of ``yolo9kit.models.lean`` (what ``fit`` uses on CUDA, with channels_last).

    Returns:
        MemoryReport with ``source="estimated"``, the breakdown at the peak, the reserved peak from the
        allocator model (or the GPU's measured calibration) and a modelled step time.
    """
    return estimate_curve(model, [batch_size], imgsz=imgsz, amp=amp, checkpoint=checkpoint,
                          channels_last=channels_last, num_targets=num_targets, gpu=gpu,
                          num_classes=num_classes, loss_fn=loss_fn, optimizer=optimizer, lean=lean)[0]


def trace_model(model: str | nn.Module, *, imgsz: int, amp: str, checkpoint: Any, channels_last: bool,
                num_targets: int, num_classes: int, loss_fn: Any = None, optimizer: str = "SGD",
                lean: bool = False) -> tuple[StepMemoryModel, float, str]:
    """Trace the step at the two ``TRACE_BATCHES`` -> (memory model, forward GFLOPs per image, name)."""
    from yolo9kit.memory.trace import trace_meta_step

    amp = normalise_amp(amp)
    if imgsz % 32:
        raise ValueError(f"imgsz={imgsz}: must be a multiple of 32 (the largest stride)")
    real, name = resolve_model(model, num_classes, checkpoint, copy_model=False)
    nc = int(getattr(real, "nc", num_classes))
    t0 = time.perf_counter()
    trainer, loss_fn = build_meta_trainer(real, amp=amp, channels_last=channels_last, loss_fn=loss_fn,
                                          optimizer=optimizer, checkpoint=checkpoint, lean=lean)
    LOGGER.debug("meta copy, EMA and optimizer state in %.1f s", time.perf_counter() - t0)
    traces, gflops = [], 0.0
    for i, b in enumerate(TRACE_BATCHES):
        trace, gflops = trace_meta_step(trainer, loss_fn, batch_size=b, imgsz=imgsz, num_targets=num_targets,
                                        num_classes=nc, amp_dtype=AMP_DTYPES[amp], optimizer=i == 0)
        traces.append(trace)
        LOGGER.debug("traced batch %d in %.1f s", b, time.perf_counter() - t0)
    return StepMemoryModel.fit(traces[0], traces[1], *TRACE_BATCHES), gflops, name


class StepEstimator:
    """The step of one model and setting, traced once; ``reports`` answers for any batch sizes and GPU."""

    def __init__(self, model: str | nn.Module, *, imgsz: int = 640, amp: str = "fp16", checkpoint: Any = None,
                 channels_last: bool = False, num_targets: int = 8, num_classes: int = 80, loss_fn: Any = None,
                 optimizer: str = "SGD", lean: bool = False) -> None:
        t0 = time.perf_counter()
        self.imgsz, self.amp, self.checkpoint = imgsz, normalise_amp(amp), checkpoint
        self.channels_last, self.num_targets, self.lean = channels_last, num_targets, lean
        self.memory, self.gflops, self.name = trace_model(
            model, imgsz=imgsz, amp=self.amp, checkpoint=checkpoint, channels_last=channels_last,
            num_targets=num_targets, num_classes=num_classes, loss_fn=loss_fn, optimizer=optimizer, lean=lean)
        self.trace_seconds = time.perf_counter() - t0
        self._overheads: dict[int, int] = {}
        LOGGER.info("traced %s (%s, %d px) in %.1f s", self.name, self.amp, imgsz, self.trace_seconds)

    def _reserved_overheads(self, batch_sizes: Sequence[int]) -> dict[int, int]:
        """Allocator-model overhead at the fixed anchors 1, 8, 64, 512, ... that bracket the batch sizes
        (cached; fixed anchors make every curve through a batch size agree on it)."""
        lo, hi = min(batch_sizes), max(batch_sizes)
        anchors = [8 ** k for k in range(8)]
        chosen = [a for a in anchors if a <= lo][-1:] + [a for a in anchors if lo < a < hi] + \
            [a for a in anchors if a >= hi][:1]
        for a in chosen:
            if a not in self._overheads:
                self._overheads[a] = self.memory.reserved_overhead(a)
        return {a: self._overheads[a] for a in chosen}

    @property
    def train_gflops_per_image(self) -> float:
        """Forward + backward (2x forward) + recompute when checkpointing, from the traced convolutions."""
        return self.gflops * (4.0 if self.checkpoint else 3.0)

    def reports(self, batch_sizes: Sequence[int], gpu: str | int | GPUSpec | None = "H100",
                throughput: ThroughputModel | None = None) -> list[MemoryReport]:
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"batch_sizes must be positive integers, got {list(batch_sizes)}")
        spec = resolve_gpu(gpu)
        cal = calibration_for(spec.name, self.amp) if spec is not None else None
        overheads = self._reserved_overheads(batch_sizes) if cal is None else {}
        throughput = throughput or ThroughputModel(**(cal or {}).get("throughput") or {})
        return [_report(self, b, spec, cal, overheads, throughput) for b in batch_sizes]


def estimate_curve(model: str | nn.Module, batch_sizes: Sequence[int], *, imgsz: int = 640, amp: str = "fp16",
                   checkpoint: Any = None, channels_last: bool = False, num_targets: int = 8,
                   gpu: str | int | GPUSpec | None = "H100", num_classes: int = 80, loss_fn: Any = None,
                   optimizer: str = "SGD", throughput: ThroughputModel | None = None,
                   lean: bool = False) -> list[MemoryReport]:
    """``estimate`` for many batch sizes from one pair of traces (what ``sweep`` and ``plan`` use)."""
    if not batch_sizes or min(batch_sizes) < 1:
        raise ValueError(f"batch_sizes must be positive integers, got {list(batch_sizes)}")
    est = StepEstimator(model, imgsz=imgsz, amp=amp, checkpoint=checkpoint, channels_last=channels_last,
                        num_targets=num_targets, num_classes=num_classes, loss_fn=loss_fn, optimizer=optimizer,
                        lean=lean)
    return est.reports(batch_sizes, gpu, throughput)


def _interpolate(points: dict[int, int], b: int) -> float:
    xs = sorted(points)
    if b <= xs[0]:
        return points[xs[0]]
    if b >= xs[-1]:
        return points[xs[-1]]
    for lo, hi in zip(xs[:-1], xs[1:]):
        if lo <= b <= hi:
            return points[lo] + (points[hi] - points[lo]) * (b - lo) / (hi - lo)
    return points[xs[-1]]


def _report(est: StepEstimator, b: int, spec: GPUSpec | None, cal: dict | None, overheads: dict[int, int],
            throughput: ThroughputModel) -> MemoryReport:
    traced, breakdown = est.memory.peak(b)
    notes = []
    if cal is None:
        workspace = DEFAULT_WORKSPACE_BYTES
        breakdown["workspace_other"] += workspace
        allocated = traced + workspace
        reserved = allocated + int(_interpolate(overheads, b))
        notes.append("reserved from the caching-allocator model; cuDNN workspace assumed "
                     f"{workspace >> 20} MiB (no measured calibration for this GPU)")
    else:
        a_alloc, b_alloc = cal["allocated"]
        a_res, b_res = cal["reserved"]
        allocated = max(traced, int(a_alloc * traced + b_alloc))
        breakdown["workspace_other"] += allocated - traced
        reserved = max(allocated, int(a_res * traced + b_res))
        notes.append("allocated and reserved from the measured calibration of this GPU")
    if spec is not None and est.amp == "bf16" and not spec.bf16:
        notes.append(f"{spec.name} has no native bf16: training there would use fp16 or emulated bf16")
    context = (cal or {}).get("context_bytes") or (spec.context_bytes if spec else 0)
    step_s = images_s = None
    if spec is not None:
        step_s = throughput.step_s(spec, b, 1, est.train_gflops_per_image, est.amp)
        images_s = b / step_s
    return MemoryReport(model=est.name, batch_size=b, imgsz=est.imgsz, amp=est.amp, checkpoint=est.checkpoint,
                        channels_last=est.channels_last, lean=est.lean, source="estimated",
                        device=f"{spec.name if spec else 'any GPU'} (estimated on CPU)",
                        peak_allocated=allocated, peak_reserved=reserved, breakdown=breakdown,
                        step_time_s=step_s, images_per_s=images_s, context_bytes=int(context),
                        num_targets=est.num_targets, gpu_total_bytes=spec.total_bytes if spec else None,
                        notes=notes)
