"""GPU memory of a training step: measured on CUDA, estimated anywhere, and the batch sizes it allows. Every
function describes a ``StepConfig`` (or a model name's), whose fields it takes as keywords (docs/memory.md)."""

from yolo9kit.config import DEFAULT_MARGIN, StepConfig
from yolo9kit.files import format_bytes
from yolo9kit.memory.estimate import StepEstimator, estimate, is_traced
from yolo9kit.memory.gpus import DEFAULT_GPU, GPUS, GPUSpec, resolve_gpu, target_gpu
from yolo9kit.memory.measure import MemoryReport, export_snapshot, measure, trace
from yolo9kit.memory.plan import BatchPlan, BatchSearch, batch_grid, find_max_batch, plan, sweep
from yolo9kit.memory.tracer import CATEGORIES

__all__ = ["CATEGORIES", "DEFAULT_GPU", "DEFAULT_MARGIN", "GPUS", "BatchPlan", "BatchSearch", "GPUSpec",
           "MemoryReport", "StepConfig", "StepEstimator", "batch_grid", "estimate", "export_snapshot",
           "find_max_batch", "format_bytes", "is_traced", "measure", "plan", "resolve_gpu", "sweep", "target_gpu",
           "trace"]
