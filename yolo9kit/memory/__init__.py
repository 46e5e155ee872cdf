"""Where the GPU memory of a YOLOv9 training step goes, measured on CUDA or estimated on the CPU.

* ``measure(model, batch_size, ...)``: run the kit's real step on CUDA -> ``MemoryReport``.
* ``estimate(model, batch_size, ..., gpu="RTX 4090")``: the same report, predicted on any machine.
* ``sweep(model, batch_sizes, ...)``: a DataFrame of either, one row per setting and batch size.
* ``find_max_batch(...)``: the largest batch that fits with a safety margin (survives real OOMs).
* ``plan(model, nominal_batch_size=64, gpu=...)``: batch x accumulation options and a recommendation.
* ``export_snapshot``, ``VramSampler``: PyTorch memory snapshots and a per-step VRAM trace (CUDA).

How the estimate works and what it assumes: docs/memory.md.
"""

from __future__ import annotations

from yolo9kit.memory.estimate import StepEstimator, estimate, estimate_curve
from yolo9kit.memory.gpus import GPUS, GPUSpec, resolve_gpu
from yolo9kit.memory.measure import measure
from yolo9kit.memory.plan import BatchPlan, BatchSearch, find_max_batch, plan, sweep
from yolo9kit.memory.report import MemoryReport
from yolo9kit.memory.snapshot import VramSampler, export_snapshot
from yolo9kit.memory.tracker import CATEGORIES

__all__ = [
    "CATEGORIES", "GPUS", "BatchPlan", "BatchSearch", "GPUSpec", "MemoryReport", "StepEstimator", "VramSampler",
    "estimate", "estimate_curve", "export_snapshot", "find_max_batch", "measure", "plan", "resolve_gpu", "sweep",
]
