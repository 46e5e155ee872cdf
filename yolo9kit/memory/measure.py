"""``MemoryReport``, the step a memory function describes, and the real step: ``measure`` on CUDA, ``trace``
on the CPU, ``export_snapshot`` for PyTorch's memory visualiser."""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from yolo9kit.config import StepConfig, TrainConfig
from yolo9kit.env import free_cuda_memory, resolve_device
from yolo9kit.files import format_bytes, write_file
from yolo9kit.memory.gpus import gpu_from_device
from yolo9kit.memory.tracer import CATEGORIES, synthetic_batch, trace_real_step
from yolo9kit.models import create_model
from yolo9kit.train.step import build_trainer, cudnn_autotune, train_step

LOGGER = logging.getLogger(__name__)
GIB = 1 << 30
_STEP_FIELDS = frozenset(f.name for f in dataclasses.fields(StepConfig))


@dataclass
class MemoryReport:
    """Peak memory and speed of one training step (optimizer update) of ``step``, the resolved ``StepConfig``
    the figures describe (its ``batch_size`` is the batch). Sizes are bytes; ``breakdown`` splits
    ``peak_allocated`` at the peak into ``CATEGORIES`` and sums to it; ``context_bytes`` is the CUDA context
    outside PyTorch's counters; ``method`` is "measured", "estimated" or "traced" (docs/memory.md).
    """

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
        missing = [c for c in CATEGORIES if c not in self.breakdown]
        if missing:
            raise ValueError(f"MemoryReport breakdown lacks {missing}; expected the keys {CATEGORIES}")

    @property
    def model(self) -> str:
        return self.step.model_name

    @property
    def batch_size(self) -> int:
        return self.step.batch_size

    @property
    def device_bytes(self) -> int:
        """What the process holds on the card: reserved peak + CUDA context."""
        return self.peak_reserved + self.context_bytes

    @property
    def fits(self) -> bool | None:
        """Does the step fit on ``gpu_total_bytes``? None when no capacity is known."""
        return None if self.gpu_total_bytes is None else self.device_bytes <= self.gpu_total_bytes

    def as_row(self) -> dict[str, Any]:
        """A flat dict (one DataFrame row): the step's settings, bytes, GiB columns for reading, breakdown."""
        step = self.step
        row: dict[str, Any] = {
            "model": step.model_name, "batch_size": step.batch_size, "imgsz": step.peak_imgsz, "amp": step.amp,
            "activation_checkpointing": "none" if step.activation_checkpointing is None
            else str(step.activation_checkpointing),
            "channels_last": step.channels_last, "lean_activations": step.lean_activations,
            "setting": step.label, "method": self.method, "device": self.device,
            "peak_allocated": self.peak_allocated, "peak_reserved": self.peak_reserved,
            "step_time_s": self.step_time_s, "images_per_s": self.images_per_s,
            "context_bytes": self.context_bytes, "num_targets": step.num_targets,
            "gpu_total_bytes": self.gpu_total_bytes,
        }
        row.update({f"{c}_bytes": self.breakdown[c] for c in CATEGORIES})
        row.update(device_bytes=self.device_bytes, fits=self.fits, peak_allocated_gib=self.peak_allocated / GIB,
                   peak_reserved_gib=self.peak_reserved / GIB, device_gib=self.device_bytes / GIB)
        return row

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "step": self.step.to_dict()}

    def __str__(self) -> str:
        speed = "" if self.step_time_s is None else \
            f", {self.step_time_s * 1000:.0f} ms/step, {self.images_per_s:.1f} img/s"
        head = (f"{self.model} batch {self.batch_size}, {self.step.label}, {self.method} for {self.device}: "
                f"peak allocated {format_bytes(self.peak_allocated)}, "
                f"reserved {format_bytes(self.peak_reserved)}{speed}")
        return "\n".join([head, *[f"  {c:16s} {format_bytes(self.breakdown[c]):>12s}" for c in CATEGORIES]])


def as_step(step: StepConfig | str, batch_size: int | None = None, changes: Mapping[str, Any] | None = None, *,
            caller: str, needs_batch: bool = False) -> StepConfig:
    """The ``StepConfig`` a memory function describes: ``step``, or a model name's default step, with
    ``batch_size`` and the field ``changes`` (``imgsz=320, amp="fp16"``) applied (``needs_batch``: the step
    must then have a batch). A multi-scale step runs at its largest size (``StepConfig.peak_imgsz``)."""
    changes = dict(changes or {})
    unknown = sorted(set(changes) - _STEP_FIELDS)
    if unknown:
        raise TypeError(f"{caller}() got unexpected keyword arguments {unknown}; the step's settings are the "
                        f"fields of yolo9kit.config.StepConfig: {sorted(_STEP_FIELDS - {'device_type'})}")
    if isinstance(step, str):
        step = StepConfig(step)
    elif not isinstance(step, StepConfig):
        raise TypeError(f"{caller}(): step must be a StepConfig or a registered model name (e.g. 'yolov9-s'), "
                        f"got {type(step).__name__}")
    if batch_size is not None:
        changes["batch_size"] = batch_size
    step = dataclasses.replace(step, **changes) if changes else step
    if step.model is None:
        raise ValueError(f"{caller}(): the step has no model (a TrainConfig's step is fit's model's): "
                         "step.replace(model=...)")
    if needs_batch and step.batch_size is None:
        raise ValueError(f"{caller}(): the step of {step.model_name} has no batch_size: pass one")
    return step


@functools.lru_cache(maxsize=2)
def _built_model(name: str, num_classes: int | None) -> nn.Module:
    return create_model(name, num_classes)  # kept for the next estimate (callers copy it or only read it)


def resolve_model(step: StepConfig, *, copy_model: bool = True) -> nn.Module:
    """The step's model in train mode, a copy (``copy_model=False``: the shared built model or the caller's
    module, untouched, for read-only use)."""
    module = _built_model(str(step.model), step.num_classes) if isinstance(step.model, str) else step.model
    if not isinstance(module, nn.Module):
        raise TypeError(f"StepConfig.model must be a registered name (e.g. 'yolov9-s') or an nn.Module, "
                        f"got {type(step.model).__name__}")
    return copy.deepcopy(module).train() if copy_model else module


def num_classes_of(step: StepConfig, model: nn.Module) -> int:
    return int(getattr(model, "nc", None) or step.num_classes or 80)


def build_real_trainer(model: nn.Module, step: StepConfig, device: torch.device):
    """The kit's own ``build_trainer`` (what ``fit`` uses) for ``model`` and ``step`` on ``device``."""
    config = TrainConfig(step=step.replace(batch_size=None), device=str(device))  # each batch whole, as given
    return build_trainer(model, config, loss_fn=step.loss_fn, device=device)


def require_cuda(device: str | torch.device) -> torch.device:
    """``device`` with its index when it is a usable CUDA device, else a RuntimeError pointing to estimate()."""
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
    """Run ``warmup_repeats + repeats`` real training steps (``yolo9kit.train.step.train_step``) of ``step`` on a
    CUDA device, resolved as ``fit`` would run it there. Isolated: its own copy of the model, what earlier
    cells hold subtracted, everything freed before returning.

    Args:
        step: a ``StepConfig``, or a model name for its default step.
        batch_size: images per forward/backward (default: the step's).
        device: the CUDA device (None: the first one).
        repeats: timed steps; warmup_repeats: steps before them.
        breakdown: one more step under the storage tracker splits the peak into categories (the rest of the
            CUDA counter is ``workspace_other``).
        **changes: ``StepConfig`` fields to change (``measure("yolov9-s", 32, amp="fp16")``).

    Returns:
        MemoryReport with ``method="measured"``: peaks of the CUDA counters over the timed steps, median time.

    Raises:
        RuntimeError: without CUDA (use ``estimate``). torch.cuda.OutOfMemoryError after everything was freed.
    """
    step = as_step(step, batch_size, changes, caller="measure", needs_batch=True)
    dev = require_cuda("cuda" if device is None else device)
    step = step.resolve(dev)
    free_cuda_memory()
    held_allocated, held_reserved = torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev)
    if held_allocated:
        LOGGER.info("%.2f GiB is still allocated by earlier work; it is subtracted from the peaks",
                    held_allocated / GIB)
    module = resolve_model(step)
    trainer = None
    try:
        trainer = build_real_trainer(module, step, dev)  # train_step itself: an out-of-memory error surfaces
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
    context = max(0, total - free - torch.cuda.memory_reserved(dev))  # the CUDA context (and other processes)
    return MemoryReport(step=step, method="measured", device=spec.name, peak_allocated=int(peak_allocated),
                        peak_reserved=int(peak_reserved), breakdown=parts, step_time_s=step_s,
                        images_per_s=step.batch_size / step_s, context_bytes=int(context),
                        gpu_total_bytes=spec.total_bytes,
                        notes=[f"torch {torch.__version__}, median of {repeats} steps after {warmup_repeats} "
                               "warm-up, cuDNN autotuning on"])


def _run_steps(trainer, images, targets, repeats: int, warmup_repeats: int, dev: torch.device) -> list[float]:
    for ni in range(warmup_repeats):
        train_step(trainer, images, targets, ni=ni, accumulate_steps=1)
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for ni in range(warmup_repeats, warmup_repeats + max(1, repeats)):
        t0 = time.perf_counter()
        train_step(trainer, images, targets, ni=ni, accumulate_steps=1)
        torch.cuda.synchronize(dev)  # CPU-GPU sync point: the step is over when the GPU is done
        times.append(time.perf_counter() - t0)
    return times


def _tracked_breakdown(trainer, images, targets, peak_allocated: int) -> dict[str, int]:
    return fit_to_total(trace_real_step(trainer, images, targets, device_type="cuda").peak(), int(peak_allocated))


def fit_to_total(parts: dict[str, int], total: int) -> dict[str, int]:
    """The breakdown made to sum to ``total``: missing bytes go to workspace_other; if the tracker saw more than
    the counter (it can peak at another moment), all parts shrink in proportion."""
    seen = sum(parts.values())
    if seen <= total:
        return {**parts, "workspace_other": parts["workspace_other"] + total - seen}
    scaled = {c: int(v * total / seen) for c, v in parts.items()}
    scaled["workspace_other"] += total - sum(scaled.values())
    return scaled


def trace(step: StepConfig | str, batch_size: int | None = None, **changes: Any) -> MemoryReport:
    """Run one real training step of ``step`` on the CPU under the storage tracker and report its peak: the CPU
    counterpart of ``measure`` (no CUDA allocator: ``peak_reserved`` equals ``peak_allocated``).

    Args:
        step: a ``StepConfig``, or a model name for its default step; resolved for the CPU.
        batch_size: images per forward/backward (default: the step's).
        **changes: ``StepConfig`` fields to change.

    Returns:
        MemoryReport with ``method="traced"`` (the step's wall time on this CPU as ``step_time_s``).
    """
    step = as_step(step, batch_size, changes, caller="trace", needs_batch=True).resolve("cpu")
    module = resolve_model(step)
    trainer = build_real_trainer(module, step, torch.device("cpu"))
    images, targets = synthetic_batch(step.batch_size, step.peak_imgsz, step.num_targets, num_classes_of(step, module))
    train_step(trainer, images, targets, ni=0, accumulate_steps=1)  # steady state: the momentum buffers exist
    t0 = time.perf_counter()
    parts = trace_real_step(trainer, images, targets, device_type="cpu").peak()
    seconds = time.perf_counter() - t0
    peak = sum(parts.values())
    return MemoryReport(step=step, method="traced", device="CPU (traced)", peak_allocated=peak,
                        peak_reserved=peak, breakdown=parts, step_time_s=seconds,
                        images_per_s=step.batch_size / seconds,
                        notes=["the real step on the CPU under the storage tracker"])


def export_snapshot(path: str | Path, fn: Callable[..., Any], *args: Any, max_entries: int = 100_000,
                    **kwargs: Any) -> Path:
    """Run ``fn(*args, **kwargs)`` (e.g. a few training steps) recording every CUDA allocation, and write the
    snapshot to ``path`` (a .pickle for https://pytorch.org/memory_viz), also when ``fn`` raises.

    Raises:
        RuntimeError: without CUDA.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("export_snapshot records the CUDA caching allocator and needs a CUDA device "
                           "(torch.cuda.is_available() is False); on the CPU use "
                           "yolo9kit.memory.estimate(...) for a breakdown of the step's memory")
    path = Path(path)
    torch.cuda.memory._record_memory_history(max_entries=max_entries)  # private API, the documented way
    try:
        fn(*args, **kwargs)
    finally:
        try:  # written whole: a snapshot of a long run takes hundreds of MB
            write_file(path, lambda tmp: torch.cuda.memory._dump_snapshot(str(tmp)), needed=max_entries * 2048,
                       what=f"writing the memory snapshot {path}")
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
    return path
