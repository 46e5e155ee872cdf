"""``MemoryReport``, the step a memory function describes, and the real step: ``measure`` (CUDA), ``trace`` (CPU),
``export_snapshot``."""

from __future__ import annotations

import copy
import functools
import logging
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from yolo9kit.config import StepConfig, TrainConfig
from yolo9kit.env import free_cuda_memory, resolve_device
from yolo9kit.files import format_bytes, write_file
from yolo9kit.memory.gpus import target_gpu
from yolo9kit.memory.tracer import CATEGORIES, synthetic_batch, trace_real_step
from yolo9kit.models import create_model
from yolo9kit.train.step import build_trainer, cudnn_autotune, train_step

LOGGER = logging.getLogger(__name__)
GIB = 1 << 30
SNAPSHOT_ENTRIES = 100_000  # allocations a snapshot keeps
_STEP_FIELDS = frozenset(f.name for f in fields(StepConfig))


@dataclass
class MemoryReport:
    """Peak memory (bytes) and speed of one training step of ``step``, the resolved ``StepConfig`` it describes;
    ``breakdown`` splits ``peak_allocated`` into ``CATEGORIES``; ``method``: "measured", "estimated" or "traced"."""

    step: StepConfig
    method: str
    device: str
    peak_allocated: int
    peak_reserved: int
    breakdown: dict[str, int]
    step_time_s: float | None = None
    images_per_s: float | None = None
    context_bytes: int = 0
    gpu_total_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if missing := [c for c in CATEGORIES if c not in self.breakdown]:
            raise ValueError(f"MemoryReport breakdown lacks {missing}; expected the keys {CATEGORIES}")

    @property
    def model(self) -> str:
        return self.step.model_name

    @property
    def batch_size(self) -> int:
        return self.step.batch_size

    @property
    def device_bytes(self) -> int:  # what the process holds on the card
        return self.peak_reserved + self.context_bytes

    @property
    def fits(self) -> bool | None:  # None when no capacity is known
        return None if self.gpu_total_bytes is None else self.device_bytes <= self.gpu_total_bytes

    def as_row(self) -> dict[str, Any]:
        step, ckpt = self.step, self.step.activation_checkpointing
        return {"model": step.model_name, "batch_size": step.batch_size, "imgsz": step.peak_imgsz, "amp": step.amp,
                "activation_checkpointing": "none" if ckpt is None else str(ckpt),
                "channels_last": step.channels_last, "lean_activations": step.lean_activations,
                "setting": step.label, "method": self.method, "device": self.device,
                "peak_allocated": self.peak_allocated, "peak_reserved": self.peak_reserved,
                "step_time_s": self.step_time_s, "images_per_s": self.images_per_s,
                "context_bytes": self.context_bytes, "num_targets": step.num_targets,
                "gpu_total_bytes": self.gpu_total_bytes, **{f"{c}_bytes": self.breakdown[c] for c in CATEGORIES},
                "device_bytes": self.device_bytes, "fits": self.fits, "peak_allocated_gib": self.peak_allocated / GIB,
                "peak_reserved_gib": self.peak_reserved / GIB, "device_gib": self.device_bytes / GIB}

    def __str__(self) -> str:
        speed = "" if self.step_time_s is None else \
            f", {self.step_time_s * 1000:.0f} ms/step, {self.images_per_s:.1f} img/s"
        head = (f"{self.model} batch {self.batch_size}, {self.step.label}, {self.method} for {self.device}: peak "
                f"allocated {format_bytes(self.peak_allocated)}, reserved {format_bytes(self.peak_reserved)}{speed}")
        return "\n".join([head, *[f"  {c:16s} {format_bytes(self.breakdown[c]):>12s}" for c in CATEGORIES]])


def as_step(step: StepConfig | str, batch_size: int | None = None, changes: Mapping[str, Any] | None = None, *,
            caller: str, needs_batch: bool = False) -> StepConfig:
    """``step`` (or a model name's default step) with ``batch_size`` and the field ``changes`` applied."""
    changes = dict(changes or {})
    if unknown := sorted(set(changes) - _STEP_FIELDS):
        raise TypeError(f"{caller}() got unexpected keyword arguments {unknown}; the step's settings are the "
                        f"fields of yolo9kit.config.StepConfig: {sorted(_STEP_FIELDS - {'device_type'})}")
    if isinstance(step, str):
        step = StepConfig(step)
    elif not isinstance(step, StepConfig):
        raise TypeError(f"{caller}(): step must be a StepConfig or a registered model name (e.g. 'yolov9-s'), "
                        f"got {type(step).__name__}")
    if batch_size is not None:
        changes["batch_size"] = batch_size
    step = replace(step, **changes) if changes else step
    if step.model is None:
        raise ValueError(f"{caller}(): the step has no model (a TrainConfig's step is fit's model's): "
                         "step.replace(model=...)")
    if needs_batch and step.batch_size is None:
        raise ValueError(f"{caller}(): the step of {step.model_name} has no batch_size: pass one")
    return step


_built_model = functools.lru_cache(maxsize=2)(create_model)  # kept for the next estimate (callers copy or only read)


def resolve_model(step: StepConfig, *, copy_model: bool = True) -> nn.Module:
    """The step's model, a copy in train mode (``copy_model=False``: the shared one, to read only)."""
    module = _built_model(str(step.model), step.num_classes) if isinstance(step.model, str) else step.model
    if not isinstance(module, nn.Module):
        raise TypeError(f"StepConfig.model must be a registered name (e.g. 'yolov9-s') or an nn.Module, "
                        f"got {type(step.model).__name__}")
    return copy.deepcopy(module).train() if copy_model else module


def num_classes_of(step: StepConfig, model: nn.Module) -> int:
    return int(getattr(model, "nc", None) or step.num_classes or 80)


def build_real_trainer(model: nn.Module, step: StepConfig, device: torch.device):
    config = TrainConfig(step=step.replace(batch_size=None), device=str(device))  # each batch whole, as given
    return build_trainer(model, config, loss_fn=step.loss_fn, device=device)


def require_cuda(device: str | torch.device) -> torch.device:
    """``device`` with its index when it is a usable CUDA device, else a RuntimeError pointing to ``estimate``."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(
            f"measure() runs real training steps on a CUDA device, but device={str(device)!r} and "
            f"torch.cuda.is_available() is {torch.cuda.is_available()}. On this machine use "
            "yolo9kit.memory.estimate(step, gpu='RTX 4090') to predict the same report on any machine, "
            "trace(step) for the real step on the CPU, or sweep(...), which falls back to the estimate.")
    return resolve_device(dev)


def measure(step: StepConfig | str, batch_size: int | None = None, *, device: str | torch.device | None = None,
            repeats: int = 3, warmup_repeats: int = 1, breakdown: bool = True, **changes: Any) -> MemoryReport:
    """Run ``warmup_repeats + repeats`` real training steps of ``step`` (as ``estimate``'s) on a copy of the model
    on CUDA -> MemoryReport ("measured": the timed steps' peaks, what earlier cells hold subtracted, median time);
    ``breakdown``: one more step under the storage tracker splits the peak. Everything is freed before returning.

    Raises:
        RuntimeError: without CUDA (use ``estimate``). torch.cuda.OutOfMemoryError after everything was freed.
    """
    step = as_step(step, batch_size, changes, caller="measure", needs_batch=True)
    dev = require_cuda("cuda" if device is None else device)
    step = step.resolve(dev)
    free_cuda_memory()
    held_allocated, held_reserved = torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev)
    if held_allocated:
        LOGGER.info("%.2f GiB is still allocated by earlier work; subtracted from the peaks", held_allocated / GIB)
    module, trainer = resolve_model(step), None
    try:
        trainer = build_real_trainer(module, step, dev)  # train_step itself: an out-of-memory error surfaces
        images, targets = synthetic_batch(step.batch_size, step.peak_imgsz, step.num_targets,
                                          num_classes_of(step, module))
        with cudnn_autotune(dev):  # as fit runs the step
            for ni in range(warmup_repeats):
                train_step(trainer, images, targets, ni=ni, accumulate_steps=1)
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            times = []
            for ni in range(warmup_repeats, warmup_repeats + max(1, repeats)):
                t0 = time.perf_counter()
                train_step(trainer, images, targets, ni=ni, accumulate_steps=1)
                torch.cuda.synchronize(dev)  # the step is over when the GPU is done
                times.append(time.perf_counter() - t0)
        peak_allocated = torch.cuda.max_memory_allocated(dev) - held_allocated
        peak_reserved = torch.cuda.max_memory_reserved(dev) - held_reserved
        parts = {**dict.fromkeys(CATEGORIES, 0), "workspace_other": peak_allocated}
        if breakdown:
            parts = fit_to_total(trace_real_step(trainer, images, targets, device_type="cuda").peak(), peak_allocated)
    finally:
        del trainer, module  # the model was moved to the GPU in place: drop it before emptying the cache
        free_cuda_memory()
    step_s, spec = statistics.median(times), target_gpu(None, dev)
    free, total = torch.cuda.mem_get_info(dev)
    context = max(0, total - free - torch.cuda.memory_reserved(dev))  # the CUDA context (and other processes)
    note = f"torch {torch.__version__}, median of {repeats} steps after {warmup_repeats} warm-up, cuDNN autotuning on"
    return MemoryReport(step=step, method="measured", device=spec.name, peak_allocated=int(peak_allocated),
                        peak_reserved=int(peak_reserved), breakdown=parts, step_time_s=step_s,
                        images_per_s=step.batch_size / step_s, context_bytes=int(context),
                        gpu_total_bytes=spec.total_bytes, notes=[note])


def fit_to_total(parts: dict[str, int], total: int) -> dict[str, int]:
    """The breakdown made to sum to ``total``: the rest to workspace_other, or all parts scaled down."""
    seen = sum(parts.values())
    if seen <= total:
        return {**parts, "workspace_other": parts["workspace_other"] + total - seen}
    scaled = {c: int(v * total / seen) for c, v in parts.items()}
    scaled["workspace_other"] += total - sum(scaled.values())
    return scaled


def trace(step: StepConfig | str, batch_size: int | None = None, **changes: Any) -> MemoryReport:
    """One real training step of ``step`` (as ``estimate``'s) on the CPU under the storage tracker -> MemoryReport
    with ``method="traced"`` (``peak_reserved`` is ``peak_allocated``; the CPU's step time)."""
    step = as_step(step, batch_size, changes, caller="trace", needs_batch=True).resolve("cpu")
    module = resolve_model(step)
    trainer = build_real_trainer(module, step, torch.device("cpu"))
    images, targets = synthetic_batch(step.batch_size, step.peak_imgsz, step.num_targets, num_classes_of(step, module))
    train_step(trainer, images, targets, ni=0, accumulate_steps=1)  # steady state: the momentum buffers exist
    t0 = time.perf_counter()
    parts = trace_real_step(trainer, images, targets, device_type="cpu").peak()
    seconds, peak = time.perf_counter() - t0, sum(parts.values())
    return MemoryReport(step=step, method="traced", device="CPU (traced)", peak_allocated=peak, peak_reserved=peak,
                        breakdown=parts, step_time_s=seconds, images_per_s=step.batch_size / seconds,
                        notes=["the real step on the CPU under the storage tracker"])


def export_snapshot(path: str | Path, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Path:
    """Run ``fn(*args, **kwargs)`` recording every CUDA allocation, and write the snapshot to ``path`` (a .pickle
    for https://pytorch.org/memory_viz), also when ``fn`` raises; a RuntimeError without CUDA."""
    if not torch.cuda.is_available():
        raise RuntimeError("export_snapshot records the CUDA caching allocator and needs a CUDA device "
                           "(torch.cuda.is_available() is False); on the CPU use "
                           "yolo9kit.memory.estimate(...) for a breakdown of the step's memory")
    path = Path(path)
    torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_ENTRIES)  # private API, the documented way
    try:
        fn(*args, **kwargs)
    finally:
        try:  # written whole: a snapshot of a long run takes hundreds of MB
            write_file(path, lambda tmp: torch.cuda.memory._dump_snapshot(str(tmp)), needed=SNAPSHOT_ENTRIES * 2048,
                       what=f"writing the memory snapshot {path}")
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
    return path
