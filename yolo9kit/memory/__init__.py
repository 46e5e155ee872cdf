"""Where the GPU memory of a YOLOv9 training step goes, measured on CUDA or estimated on the CPU.

Every function describes a ``StepConfig`` (yolo9kit.config): the step ``fit`` runs, with its batch, image
size, AMP, activation checkpointing and speed switches. A model name stands for its default step, and
``StepConfig`` fields can be changed in the call: ``estimate("yolov9-s", 16, imgsz=512)``.

* ``measure(step)``: run the kit's real step on CUDA -> ``MemoryReport``.
* ``estimate(step, gpu="RTX 4090")``: the same report, predicted on any machine.
* ``trace(step)``: the real step on the CPU under the storage tracker (checks the estimate there).
* ``sweep(step, batch_sizes)``: a DataFrame of measured or estimated reports, one row per batch size.
* ``find_max_batch(step, gpu=...)``: the largest batch that fits with a margin (survives real OOMs).
* ``plan(step, nominal_batch_size=64, gpu=...)``: batch x accumulation options and a recommendation,
  which ``TrainConfig(batch_size="auto")`` trains with.
* ``export_snapshot``, ``VramSampler``: PyTorch memory snapshots and a per-step VRAM trace (CUDA).

How the estimate works and what it assumes: docs/memory.md.
"""

from __future__ import annotations

from yolo9kit.config import DEFAULT_MARGIN, StepConfig
from yolo9kit.files import format_bytes
from yolo9kit.memory.estimate import StepEstimator, estimate, is_traced
from yolo9kit.memory.gpus import DEFAULT_GPU, GPUS, GPUSpec, resolve_gpu, target_gpu
from yolo9kit.memory.measure import measure, trace
from yolo9kit.memory.plan import BatchPlan, BatchSearch, batch_grid, find_max_batch, plan, sweep
from yolo9kit.memory.report import MemoryReport
from yolo9kit.memory.snapshot import VramSampler, export_snapshot
from yolo9kit.memory.tracker import CATEGORIES

__all__ = [
    "CATEGORIES", "DEFAULT_GPU", "DEFAULT_MARGIN", "GPUS", "BatchPlan", "BatchSearch", "GPUSpec", "MemoryReport",
    "StepConfig", "StepEstimator", "VramSampler", "batch_grid", "estimate", "export_snapshot", "find_max_batch",
    "format_bytes", "is_traced", "measure", "plan", "resolve_gpu", "sweep", "target_gpu", "trace",
]
