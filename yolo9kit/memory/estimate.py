"""``estimate``: the memory of a training step on any GPU, predicted on the CPU: the step traced on ``meta``
tensors at batches 1 and 2, extrapolated to any batch, allocator overhead on top (docs/memory.md)."""

from __future__ import annotations

import bisect
import copy
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from yolo9kit.config import StepConfig, TrainConfig
from yolo9kit.loss import DetectionLoss
from yolo9kit.memory.gpus import CachingAllocatorModel, GPUSpec, ThroughputModel, calibration_for, target_gpu
from yolo9kit.memory.measure import MemoryReport, as_step, num_classes_of, resolve_model
from yolo9kit.memory.tracer import CATEGORIES, Trace, trace_meta_step
from yolo9kit.train.step import build_trainer

LOGGER = logging.getLogger(__name__)
DEFAULT_WORKSPACE_BYTES = 64 << 20  # cuDNN's workspace at the peak, assumed without a measured calibration
B1, B2 = 1, 2  # the traced batches
_UNALIGNED_PHASES = {"loss", "loss_backward"}  # the assigner branches on data: its phases do not align
_BATCH_CATEGORIES = {"activations", "loss_assigner", "workspace_other"}
_CACHE_SIZE = 8  # traced steps kept: a trace takes seconds to a minute, and an explorer revisits settings
_traced: OrderedDict[tuple, StepEstimator] = OrderedDict()


def _segments(trace: Trace) -> dict[tuple[str, int], tuple[int, int]]:
    """(phase, ordinal among the segments of that phase) -> (start, end) event indices, in order."""
    starts = trace.phase_starts + [("<end>", trace.num_events)]
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for (name, s), (_, e) in zip(starts[:-1], starts[1:]):
        out[name, sum(n == name for n, _ in out)] = (s, e)
    return out


def _by_segment(trace: Trace) -> dict[tuple[int, str], list[int]]:
    """Record indices by (phase segment, phase name) of their allocation."""
    starts = [s for _, s in trace.phase_starts]
    out: dict[tuple[int, str], list[int]] = {}
    for i, rec in enumerate(trace.records):
        j = bisect.bisect_right(starts, rec.alloc) - 1
        out.setdefault((j, trace.phase_starts[j][0]), []).append(i)
    return out


class StepMemoryModel:
    """Live bytes per category over the step as ``base + (b - B1) / (B2 - B1) * slope``, from the two traces."""

    def __init__(self, trace1: Trace, trace2: Trace) -> None:
        self.trace1, self.trace2 = trace1, trace2
        live1, live2 = trace1.live(), trace2.live()
        seg2 = _segments(trace2)
        rows1, rows2 = [], []
        for (name, k), (s1, e1) in _segments(trace1).items():
            if e1 == s1:
                continue
            r1 = r2 = live1[s1:e1]  # a phase traced once only (optimizer, EMA) is independent of the batch
            if (name, k) in seg2:
                r2 = live2[slice(*seg2[name, k])]
                if name in _UNALIGNED_PHASES or len(r1) != len(r2) or len(r2) == 0:  # reduced to its peak moment
                    r1 = r1[[int(r1.sum(1).argmax())]]
                    r2 = r2[[int(r2.sum(1).argmax())]] if len(r2) else r1
            rows1.append(r1)
            rows2.append(r2)
        self.base = np.concatenate(rows1).astype(np.float64)  # (rows, K)
        self.slope = np.concatenate(rows2).astype(np.float64) - self.base

    def peak(self, batch_size: int) -> tuple[int, dict[str, int]]:
        """(peak live bytes, breakdown at that moment) for ``batch_size``."""
        rows = np.maximum(self.base + (batch_size - B1) / (B2 - B1) * self.slope, 0)
        breakdown = {c: int(round(v)) for c, v in zip(CATEGORIES, rows[int(rows.sum(1).argmax())])}
        return sum(breakdown.values()), breakdown

    def reserved_overhead(self, batch_size: int) -> int:
        """Peak reserved minus peak allocated of two steps at ``batch_size`` replayed through the allocator model."""
        t1, t2 = self.trace1, self.trace2
        f = (batch_size - B1) / (B2 - B1)
        by_segment1 = _by_segment(t1)
        sizes: dict[int, int] = {}
        for key, idx2 in _by_segment(t2).items():
            idx1 = by_segment1.get(key, [])
            for j, i in enumerate(idx2):
                rec = t2.records[i]
                if len(idx1) == len(idx2):  # records pair up one to one
                    n1 = t1.records[idx1[j]].nbytes
                    size = n1 + f * (rec.nbytes - n1)
                else:
                    size = rec.nbytes * batch_size / B2 if t2.category(rec) in _BATCH_CATEGORIES else rec.nbytes
                sizes[i] = max(int(size), 1)
        persistent = {i for i, r in enumerate(t2.records) if r.phase == "setup" and r.free is None}
        sim = CachingAllocatorModel()
        for i in sorted(persistent):
            sim.malloc(i, sizes[i])
        timeline = sorted([(rec.alloc, i, sizes[i]) for i, rec in enumerate(t2.records) if i not in persistent]
                          + [(t2.num_events if rec.free is None else rec.free, i, 0)  # never freed: end of step
                             for i, rec in enumerate(t2.records) if i not in persistent], key=lambda e: e[0])
        for s in (1, 2):  # two steps: the second reuses the blocks the first left cached
            for _, i, size in timeline:
                if size:
                    sim.malloc(s * len(t2.records) + i, size)
                else:
                    sim.free(s * len(t2.records) + i)
        return max(0, sim.peak_reserved - sim.peak_allocated)


def prime(trainer) -> None:
    """Make the optimizer state (one step on zero gradients, with the ``foreach`` kernels, the CUDA default) and
    the scaler's scale now, as a first step does, so that a traced step is a steady-state step."""
    for group in trainer.optimizer.param_groups:
        group["foreach"] = True
    for p in trainer.model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.scaler.scale(torch.zeros((), device=trainer.device))


def build_meta_trainer(real_model: nn.Module, step: StepConfig):
    """``fit``'s trainer (``build_trainer``) for the resolved ``step`` over a ``meta`` copy of ``real_model``, its
    optimizer primed -> (trainer, loss_fn); the loss (default ``DetectionLoss``) stays real: the trace runs it."""
    loss_fn = step.loss_fn or DetectionLoss(real_model)
    if step.activation_checkpointing is not None and not hasattr(real_model, "set_activation_checkpointing"):
        raise ValueError(f"activation_checkpointing={step.activation_checkpointing!r} needs a model with "
                         f"set_activation_checkpointing(); {step.model_name} has none")
    fmt = torch.channels_last if step.channels_last else torch.preserve_format

    def meta(t: torch.Tensor) -> torch.Tensor:  # a meta tensor of the same shape, dtype and strides
        return torch.empty_like(t, device="meta", memory_format=fmt if t.ndim == 4 else torch.preserve_format)

    memo: dict[int, Any] = {id(p): nn.Parameter(meta(p.detach()), requires_grad=p.requires_grad)
                            for p in real_model.parameters()}
    memo.update({id(b): meta(b) for b in real_model.buffers()})
    stride = getattr(real_model, "stride", None)  # DetectionModel.stride: a plain tensor attribute
    if isinstance(stride, torch.Tensor) and id(stride) not in memo:
        memo[id(stride)] = meta(stride)
    model = copy.deepcopy(real_model, memo).train()  # the meta copy
    config = TrainConfig(step=step.replace(batch_size=None))  # the trace sets the batch; the rest is the step's
    trainer = build_trainer(model, config, loss_fn=loss_fn, device=torch.device("meta"),  # no compile, no fused kernel
                            step=step.replace(fused_optimizer=False, compile=False))  # on meta; autocast emulated
    trainer.step, trainer.amp_dtype, trainer.autocast_device = step, None, "cpu"
    prime(trainer)
    return trainer, loss_fn


class StepEstimator:
    """One step (a ``StepConfig`` or a model name, with ``StepConfig`` field ``changes``), traced once;
    ``reports`` answers for any batch sizes and GPU. An unresolved step is resolved for CUDA with bf16."""

    def __init__(self, step: StepConfig | str, **changes: Any) -> None:
        t0 = time.perf_counter()
        step = as_step(step, None, changes, caller="StepEstimator")
        self.step = step if step.device_type else step.resolve("cuda", bf16=True)
        real = resolve_model(self.step, copy_model=False)
        trainer, loss_fn = build_meta_trainer(real, self.step)
        (trace1, self.gflops), (trace2, _) = (  # the optimizer once: it does not depend on the batch
            trace_meta_step(trainer, loss_fn, b, num_classes_of(self.step, real), optimizer=b == B1) for b in (B1, B2))
        self.train_gflops_per_image = self.gflops * (4.0 if self.step.activation_checkpointing else 3.0)  # fwd+2x bwd
        self.memory = StepMemoryModel(trace1, trace2)
        self.trace_seconds = time.perf_counter() - t0
        self._overheads: dict[int, int] = {}
        LOGGER.info("memory of one %s step (%s) measured without a GPU in %.1f s", self.step.model_name,
                    self.step.label, self.trace_seconds)

    def reports(self, batch_sizes: Sequence[int], gpu: str | int | GPUSpec | None = None) -> list[MemoryReport]:
        """One estimated ``MemoryReport`` per batch size, for ``gpu`` (as ``estimate``'s); a ValueError for an empty
        list or a batch size < 1."""
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"batch_sizes must be positive integers, got {list(batch_sizes)}")
        spec = target_gpu(gpu)
        cal = calibration_for(spec.name, self.step.amp) if spec.device_type == "cuda" else None
        if cal is None and spec.device_type == "cuda":  # the allocator model at the anchors 1, 8, 64, ... around
            lo, hi = min(batch_sizes), max(batch_sizes)
            for a in [8 ** k for k in range(8) if lo < 8 ** (k + 1) and 8 ** k < 8 * hi]:
                if a not in self._overheads:
                    self._overheads[a] = self.memory.reserved_overhead(a)
        throughput = ThroughputModel(**(cal or {}).get("throughput") or {})
        context = (cal or {}).get("context_bytes") or spec.context_bytes
        out = []
        for b in batch_sizes:
            traced, breakdown = self.memory.peak(b)
            if spec.device_type != "cuda":  # host memory: no caching allocator, no CUDA context
                allocated = reserved = traced
                note = "host memory of the traced step (no CUDA allocator on the CPU)"
            elif cal is None:
                breakdown["workspace_other"] += DEFAULT_WORKSPACE_BYTES
                allocated = traced + DEFAULT_WORKSPACE_BYTES
                xs, ys = sorted(self._overheads), self._overheads  # interpolated between the anchors around b
                lo, hi = max([x for x in xs if x <= b], default=xs[0]), min([x for x in xs if x >= b], default=xs[-1])
                reserved = allocated + int(ys[lo] if lo == hi else ys[lo] + (ys[hi] - ys[lo]) * (b - lo) / (hi - lo))
                note = ("reserved from the caching-allocator model; cuDNN workspace assumed "
                        f"{DEFAULT_WORKSPACE_BYTES >> 20} MiB (no measured calibration for this GPU)")
            else:
                (a_alloc, b_alloc), (a_res, b_res) = cal["allocated"], cal["reserved"]
                allocated = max(traced, int(a_alloc * traced + b_alloc))
                breakdown["workspace_other"] += allocated - traced
                reserved = max(allocated, int(a_res * traced + b_res))
                note = "allocated and reserved from the measured calibration of this GPU"
            step_s = throughput.step_s(spec, b, 1, self.train_gflops_per_image, self.step.amp)
            out.append(MemoryReport(step=replace(self.step, batch_size=b), method="estimated", device=spec.name,
                                    peak_allocated=allocated, peak_reserved=reserved, breakdown=breakdown,
                                    step_time_s=step_s, images_per_s=b / step_s, context_bytes=int(context),
                                    gpu_total_bytes=spec.total_bytes, notes=[note]))
        return out


def _key(step: StepConfig, spec: GPUSpec) -> tuple[StepConfig, tuple]:
    """The step resolved for the card, and what its trace depends on (a module may be edited between calls)."""
    resolved = step.resolve(spec.device_type, bf16=spec.bf16, gpu_name=spec.name)
    model = step.model
    structure = None if isinstance(model, str) else (
        tuple(type(m).__name__ for m in model.modules()),
        tuple((name, tuple(p.shape), p.dtype, p.requires_grad) for name, p in model.named_parameters()))
    return resolved, (replace(resolved, batch_size=1), structure)


def estimator_for(step: StepConfig, spec: GPUSpec) -> StepEstimator:
    """The traced step of ``step`` resolved for ``spec``, kept for the next call with the same step."""
    resolved, key = _key(step, spec)
    if key not in _traced:
        _traced[key] = StepEstimator(resolved)
        while len(_traced) > _CACHE_SIZE:
            _traced.popitem(last=False)
    _traced.move_to_end(key)
    return _traced[key]


def is_traced(step: StepConfig | str, gpu: str | int | GPUSpec | None = None, **changes: Any) -> bool:
    """Whether ``estimate`` holds the traced step for ``step`` on ``gpu`` already (any batch is then instant)."""
    return _key(as_step(step, None, changes, caller="is_traced"), target_gpu(gpu))[1] in _traced


def estimate(step: StepConfig | str, batch_size: int | None = None, *, gpu: str | int | GPUSpec | None = None,
             **changes: Any) -> MemoryReport:
    """Predict, on any machine, the MemoryReport ``measure`` would give for one training step on ``gpu``
    (``method="estimated"``).

    Args:
        step: a ``StepConfig``, or a model name for the step ``fit`` would run with it.
        gpu: a name from ``GPUS``, a capacity in bytes or a ``GPUSpec`` (default: ``target_gpu``), the step resolved
            for it as ``fit`` would; **changes: ``StepConfig`` fields: ``estimate("yolov9-c", 16, amp="fp16")``.
    """
    step = as_step(step, batch_size, changes, caller="estimate", needs_batch=True)
    spec = target_gpu(gpu)
    return estimator_for(step, spec).reports([step.batch_size], spec)[0]
