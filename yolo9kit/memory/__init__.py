"""Where the GPU memory of a YOLOv9 training step goes, measured on CUDA (``measure``) or estimated on any
machine (``estimate``), and the batch sizes it allows (``sweep``, ``find_max_batch``, ``plan``). Every
function describes a ``StepConfig``, the step ``fit`` runs; a model name stands for its default step, and
``StepConfig`` fields can be changed in the call: ``estimate("yolov9-s", 16, imgsz=512)``. See docs/memory.md.
"""

from yolo9kit.config import DEFAULT_MARGIN, StepConfig
from yolo9kit.files import format_bytes
from yolo9kit.memory.estimate import StepEstimator, estimate, is_traced
from yolo9kit.memory.gpus import DEFAULT_GPU, GPUS, GPUSpec, resolve_gpu, target_gpu
from yolo9kit.memory.measure import MemoryReport, export_snapshot, measure, trace
from yolo9kit.memory.plan import BatchPlan, BatchSearch, batch_grid, find_max_batch, plan, sweep
from yolo9kit.memory.tracer import CATEGORIES

__all__ = [
    "CATEGORIES", "DEFAULT_GPU", "DEFAULT_MARGIN", "GPUS", "BatchPlan", "BatchSearch", "GPUSpec", "MemoryReport",
    "StepConfig", "StepEstimator", "batch_grid", "estimate", "export_snapshot", "find_max_batch", "format_bytes",
    "is_traced", "measure", "plan", "resolve_gpu", "sweep", "target_gpu", "trace",
]
