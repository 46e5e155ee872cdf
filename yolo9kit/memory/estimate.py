"""``estimate``: the memory of a training step on a GPU you may not have, predicted on the CPU.

How (each step's assumptions are in its module):

0. The step is a ``StepConfig`` resolved for the card (``StepConfig.resolve``: "auto" AMP and the
   ``None`` switches decided as ``fit`` decides them on CUDA), so the estimate describes the step ``fit``
   would run there.
1. The kit's step (``steptrace.traced_step``: the kit's ``micro_step``, forward and loss under autocast
   and backward, then its ``optimizer_step``, clip, SGD, EMA) runs on ``meta`` tensors, which carry
   shapes, dtypes and strides but no data, under a ``StorageTracker`` that records every storage by
   category and over time (``tracker``), with the autocast policy of the step's device applied by
   ``autocast_sim`` and the real loss bridged in (``steptrace``).
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
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from torch import nn

from yolo9kit.config import StepConfig
from yolo9kit.memory.calibration import calibration_for
from yolo9kit.memory.extrapolate import StepMemoryModel
from yolo9kit.memory.gpus import GPUSpec, target_gpu
from yolo9kit.memory.report import MemoryReport
from yolo9kit.memory.step import as_step, build_meta_trainer, num_classes_of, resolve_model
from yolo9kit.memory.throughput import ThroughputModel

LOGGER = logging.getLogger(__name__)

# cuDNN allocates its convolution workspace through PyTorch's allocator, one convolution at a time.
# Assumed allowance at the peak until a measured calibration gives the real figure.
DEFAULT_WORKSPACE_BYTES = 64 << 20
TRACE_BATCHES = (1, 2)
_AMP_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "off": None}
_CACHE_SIZE = 8  # traced steps kept (a trace takes seconds to a minute; an explorer revisits settings)
_cache: OrderedDict[tuple, StepEstimator] = OrderedDict()  # (step at batch 1, module structure or None)


def estimate(step: StepConfig | str | nn.Module, batch_size: int | None = None, *,
             gpu: str | int | GPUSpec | None = None, **changes: Any) -> MemoryReport:
    """Predict, on any machine, what ``measure`` would report for one training step on ``gpu``.

    Args:
        step: the step (a ``StepConfig``), or a model name / module for the step ``fit`` would run with
            it. ``changes`` are ``StepConfig`` fields to change: ``estimate("yolov9-c", 16, imgsz=512,
            activation_checkpointing="all")``.
        batch_size: images per forward/backward (default: the step's).
        gpu: the card (a name from ``GPUS``, a capacity in bytes, a ``GPUSpec``); None: this machine's
            CUDA card, else ``DEFAULT_GPU``. The step is resolved for it ("auto" AMP is bf16 where it has
            bf16, and the CUDA switches are on unless the step turns them off).

    Returns:
        MemoryReport with ``method="estimated"``, the breakdown at the peak, the reserved peak from the
        allocator model (or the GPU's measured calibration) and a modelled step time.
    """
    step = as_step(step, batch_size, changes, caller="estimate", needs_batch=True)
    spec = target_gpu(gpu)
    return estimator_for(step, spec).reports([step.batch_size], spec)[0]


def is_traced(step: StepConfig | str | nn.Module, gpu: str | int | GPUSpec | None = None, **changes: Any) -> bool:
    """Whether ``estimate`` already holds the traced step for ``step`` on ``gpu``: then any batch size of it is
    answered at once; otherwise the next estimate traces it first (seconds to a minute on a CPU)."""
    step = as_step(step, None, changes, caller="is_traced")
    spec = target_gpu(gpu)
    return _key(step.resolve(spec.device_type, bf16=spec.bf16, gpu_name=spec.name), step) in _cache


def _key(resolved: StepConfig, step: StepConfig) -> tuple:
    return replace(resolved, batch_size=1), None if isinstance(step.model, str) else _structure(step.model)


def estimator_for(step: StepConfig, spec: GPUSpec) -> StepEstimator:
    """The traced step of ``step`` resolved for ``spec``, kept for the next call with the same step. A step of
    a module is kept while the module's structure (its layers, parameter shapes, dtypes and which ones train)
    stays the same: its weights do not change the memory, but a module may be edited between calls."""
    resolved = step.resolve(spec.device_type, bf16=spec.bf16, gpu_name=spec.name)
    key = _key(resolved, step)
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    est = _cache[key] = StepEstimator(resolved)
    while len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return est


def _structure(module: nn.Module) -> tuple:
    """What a trace of ``module`` depends on besides the step: its layers and its parameters' shapes."""
    return (tuple(type(m).__name__ for m in module.modules()),
            tuple((name, tuple(p.shape), p.dtype, p.requires_grad) for name, p in module.named_parameters()))


def trace_model(step: StepConfig) -> tuple[StepMemoryModel, float]:
    """Trace the resolved step at the two ``TRACE_BATCHES`` -> (memory model, forward GFLOPs per image)."""
    import torch

    from yolo9kit.memory.steptrace import trace_meta_step

    real = resolve_model(step, copy_model=False)
    t0 = time.perf_counter()
    trainer, loss_fn = build_meta_trainer(real, step)
    LOGGER.debug("meta copy, EMA and optimizer state in %.1f s", time.perf_counter() - t0)
    amp_dtype = getattr(torch, _AMP_DTYPES[step.amp]) if _AMP_DTYPES[step.amp] else None
    traces, gflops = [], 0.0
    for i, b in enumerate(TRACE_BATCHES):
        trace, gflops = trace_meta_step(trainer, loss_fn, batch_size=b, imgsz=step.peak_imgsz,
                                        num_targets=step.num_targets,
                                        num_classes=num_classes_of(step, real), amp_dtype=amp_dtype, optimizer=i == 0,
                                        autocast="cpu" if step.device_type == "cpu" else "cuda")
        traces.append(trace)
        LOGGER.debug("traced batch %d in %.1f s", b, time.perf_counter() - t0)
    return StepMemoryModel.fit(traces[0], traces[1], *TRACE_BATCHES), gflops


class StepEstimator:
    """One step, traced once; ``reports`` answers for any batch sizes and GPU.

    ``step`` is resolved for CUDA first when it is not yet (bf16 assumed for "auto"; ``estimator_for``
    resolves for a given card).
    """

    def __init__(self, step: StepConfig | str | nn.Module, **changes: Any) -> None:
        t0 = time.perf_counter()
        step = as_step(step, None, changes, caller="StepEstimator")
        self.step = step if step.device_type else step.resolve("cuda", bf16=True)
        self.memory, self.gflops = trace_model(self.step)
        self.trace_seconds = time.perf_counter() - t0
        self._overheads: dict[int, int] = {}
        LOGGER.info("memory of one %s step (%s) measured without a GPU in %.1f s", self.step.model_name,
                    self.step.label, self.trace_seconds)

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
        return self.gflops * (4.0 if self.step.activation_checkpointing else 3.0)

    def reports(self, batch_sizes: Sequence[int], gpu: str | int | GPUSpec | None = None,
                throughput: ThroughputModel | None = None) -> list[MemoryReport]:
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"batch_sizes must be positive integers, got {list(batch_sizes)}")
        spec = target_gpu(gpu)
        cal = calibration_for(spec.name, self.step.amp) if spec.device_type == "cuda" else None
        overheads = self._reserved_overheads(batch_sizes) if cal is None and spec.device_type == "cuda" else {}
        throughput = throughput or ThroughputModel(**(cal or {}).get("throughput") or {})
        return [_report(self, b, spec, cal, overheads, throughput) for b in batch_sizes]


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


def _report(est: StepEstimator, b: int, spec: GPUSpec, cal: dict | None, overheads: dict[int, int],
            throughput: ThroughputModel) -> MemoryReport:
    traced, breakdown = est.memory.peak(b)
    notes = []
    if spec.device_type != "cuda":  # host memory: no caching allocator model, no CUDA context
        allocated = reserved = traced
        notes.append("host memory of the traced step (no CUDA allocator on the CPU)")
    elif cal is None:
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
    context = (cal or {}).get("context_bytes") or spec.context_bytes
    step_s = throughput.step_s(spec, b, 1, est.train_gflops_per_image, est.step.amp)
    return MemoryReport(step=replace(est.step, batch_size=b), method="estimated",
                        device=spec.name, peak_allocated=allocated, peak_reserved=reserved,
                        breakdown=breakdown, step_time_s=step_s, images_per_s=b / step_s,
                        context_bytes=int(context), gpu_total_bytes=spec.total_bytes, notes=notes)
