"""Curves over batch sizes (``sweep``), the largest batch that fits (``find_max_batch``), batch x accumulation
plans (``plan``) and ``TrainConfig(batch_size="auto")`` (``choose_batch``); how each decides: docs/memory.md."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from yolo9kit.config import DEFAULT_MARGIN, StepConfig, TrainConfig
from yolo9kit.config.train import official_accumulate
from yolo9kit.env import free_cuda_memory, parse_device
from yolo9kit.files import format_bytes, write_text_atomically
from yolo9kit.memory.estimate import estimator_for
from yolo9kit.memory.gpus import GPUSpec, ThroughputModel, target_gpu
from yolo9kit.memory.measure import GIB, as_step, measure, require_cuda

LOGGER = logging.getLogger(__name__)
METHODS = ("auto", "measured", "estimated", "both")


def _use_measure(method: str, device: Any) -> bool:
    if method not in METHODS:
        raise ValueError(f"method={method!r}: expected one of {METHODS}")
    has_cuda = torch.cuda.is_available() and parse_device(device).type == "cuda"
    if method in ("measured", "both") and not has_cuda:
        require_cuda(device or "cuda")
    return method in ("measured", "both") or (method == "auto" and has_cuda)


def batch_grid(low: int, high: int) -> list[int]:
    """Batch sizes for a curve over [low, high]: the ends, powers of two and 1.5x powers of two."""
    if low < 1 or high < low:
        raise ValueError(f"batch range ({low}, {high}): expected 1 <= low <= high")
    powers = [1 << e for e in range(high.bit_length())]
    return sorted({low, high} | {b for k in powers for b in (k, k + k // 2) if low <= b <= high})


def sweep(step: StepConfig | str | Sequence[StepConfig], batch_sizes: Sequence[int], *,
          gpu: str | int | GPUSpec | None = None, method: str = "auto", device: str | None = None,
          **changes: Any) -> pd.DataFrame:
    """Memory (and speed) against batch size: ``MemoryReport.as_row`` columns plus ``oom`` (measured: out of memory).

    Args:
        step: a step or model name, or a list of steps: one curve each, labelled in ``setting``.
        method: "auto" (measure on CUDA, else estimate), "measured", "estimated" or "both".
        **changes: ``StepConfig`` fields; one given as a list makes one curve per value (``amp=["fp16", "bf16"]``).
    """
    measured = _use_measure(method, device)
    spec = target_gpu(gpu)
    if isinstance(step, (list, tuple)):
        curves = [as_step(s, None, changes, caller="sweep") for s in step]
    else:
        several = {k: v for k, v in changes.items() if isinstance(v, (list, tuple))  # layer indices: one value
                   and not (k == "activation_checkpointing" and all(isinstance(i, int) for i in v))}
        curves = [as_step(step, None, {**changes, **dict(zip(several, c))}, caller="sweep")
                  for c in itertools.product(*several.values())]
    rows = []
    for one in curves:
        if method in ("estimated", "both") or not measured:
            rows += [{**r.as_row(), "oom": False} for r in estimator_for(one, spec).reports(list(batch_sizes), spec)]
        for b in batch_sizes if measured else []:
            try:
                rows.append({**measure(one, b, device=device).as_row(), "oom": False})
            except torch.cuda.OutOfMemoryError:
                free_cuda_memory()
                resolved = replace(one, batch_size=b).resolve(device or "cuda")
                rows.append({"model": resolved.model_name, "batch_size": b, "imgsz": resolved.peak_imgsz,
                             "amp": resolved.amp, "setting": resolved.label, "method": "measured", "oom": True})
    return pd.DataFrame(rows)


@dataclass
class BatchSearch:
    """Result of ``find_max_batch``: ``batch_size`` is the answer (0 when even batch 1 fails)."""

    batch_size: int
    budget_bytes: int | None
    margin: float
    trials: list[dict]  # batch_size, ok, bytes, reason
    reason: str

    def __str__(self) -> str:
        return f"largest batch: {self.batch_size} ({self.reason})"


def find_max_batch(step: StepConfig | str | None = None, *, gpu: str | int | GPUSpec | None = None,
                   margin: float = DEFAULT_MARGIN, max_batch: int = 1024, method: str = "auto",
                   device: str | None = None, trial: Callable[[int], int | None] | None = None,
                   **changes: Any) -> BatchSearch:
    """The largest batch whose step runs and stays under ``(1 - margin)`` of the card: doubling from 1, then
    bisection; an out-of-memory trial is dropped and the CUDA cache emptied, so training can go on.

    Args:
        step: the step (or a model name); not needed with ``trial``.
        gpu: the card (default: ``target_gpu``); margin: the share of it kept free.
        method: "auto" measures on CUDA and estimates otherwise; "measured" or "estimated".
        trial: ``trial(batch_size) -> bytes used or None`` replaces the built-in trial (it may raise out of memory).
    """
    if trial is None and step is None:
        raise ValueError("find_max_batch needs a step (or a model name), or a trial function")
    spec = target_gpu(gpu)
    budget = int(spec.total_bytes * (1 - margin))
    if trial is None:
        one = as_step(step, None, changes, caller="find_max_batch")
        est = None if _use_measure(method, device) else estimator_for(one, spec)

        def trial(b: int) -> int:  # measured on CUDA, else estimated
            report = measure(one, b, device=device, breakdown=False) if est is None else est.reports([b], spec)[0]
            return report.device_bytes
    trials: list[dict] = []

    def ok(b: int) -> bool:
        try:
            used, oom = trial(b), False
        except torch.cuda.OutOfMemoryError:
            used, oom = None, True
        if oom:  # outside the except block: the traceback and the tensors it holds are gone
            free_cuda_memory()
        fits = not oom and (used is None or used <= budget)
        trials.append({"batch_size": b, "ok": fits, "bytes": used,
                       "reason": "out of memory" if oom else "fits" if fits else "over the budget"})
        return fits

    lo, b = 0, 1
    while b <= max_batch and ok(b):  # grow, then bisect between the last success and the first failure
        lo, b = b, b * 2
    hi = min(b, max_batch + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    where = (f"a budget of {format_bytes(budget)}, {1 - margin:.0%} of the {format_bytes(spec.total_bytes)} "
             f"of {spec.name}")
    if lo >= max_batch:
        return BatchSearch(lo, budget, margin, trials, f"reached max_batch={max_batch} within {where}")
    used = next((t["bytes"] for t in trials if t["batch_size"] == lo + 1), None)
    needs = f" needs {format_bytes(used)}" if used else " runs out of memory"
    return BatchSearch(lo, budget, margin, trials, f"batch {lo + 1}{needs}, over {where}")


@dataclass
class BatchPlan:
    """What ``plan`` found: one row per batch x accumulation, the recommended row (None when nothing fits)."""

    table: pd.DataFrame
    recommended: dict | None
    reason: str
    step: StepConfig
    gpu: GPUSpec
    nominal_batch_size: int
    margin: float
    largest_batch: int

    def __str__(self) -> str:
        cols = ["batch_size", "accumulate", "effective_batch", "device_gib", "fits", "step_s", "images_per_s"]
        shown = self.table[cols].round({"device_gib": 2, "step_s": 3, "images_per_s": 1})
        return f"{shown.to_string(index=False)}\n{self.reason}"

    def train_config(self, base: TrainConfig | None = None) -> TrainConfig:
        """``base`` (default ``TrainConfig()``) with the plan's step, recommended batch and nominal batch; a
        ValueError when nothing fits."""
        if self.recommended is None:
            raise ValueError(f"nothing to train: {self.reason}")
        return (base or TrainConfig()).replace(step=self.step.replace(batch_size=None),
                                               batch_size=int(self.recommended["batch_size"]),
                                               nominal_batch_size=self.nominal_batch_size)


def plan(step: StepConfig | str, nominal_batch_size: int = 64, *, gpu: str | int | GPUSpec | None = None,
         margin: float = DEFAULT_MARGIN, method: str = "auto", device: str | None = None, **changes: Any) -> BatchPlan:
    """Batch x accumulation choices that reach ``nominal_batch_size`` (its divisors and the largest batch that
    fits, accumulating by the official rule as ``fit`` does), their memory and speed, and the fastest. ``gpu``,
    ``margin``, ``method``: as ``find_max_batch``'s (the speed: ``ThroughputModel``'s, or measured)."""
    if nominal_batch_size < 1:
        raise ValueError(f"nominal_batch_size={nominal_batch_size}: must be >= 1")
    step = as_step(step, None, changes, caller="plan")
    method = "measured" if _use_measure(method, device) else "estimated"
    spec = target_gpu(gpu)
    search = find_max_batch(step, gpu=spec, margin=margin, max_batch=nominal_batch_size, method=method, device=device)
    budget = search.budget_bytes
    batches = sorted({b for b in range(1, nominal_batch_size + 1) if nominal_batch_size % b == 0}
                     | ({search.batch_size} if search.batch_size else set()))
    throughput = ThroughputModel()
    gflops = estimator_for(step, spec).train_gflops_per_image if method == "estimated" else None
    rows = []
    for row in sweep(step, batches, gpu=spec, method=method, device=device).to_dict("records"):
        b, oom = int(row["batch_size"]), bool(row.get("oom"))
        acc = official_accumulate(nominal_batch_size, b)  # the rule fit applies
        if gflops is not None:
            step_s = throughput.step_s(spec, b, acc, gflops, row["amp"])
        elif not oom:  # measured: micro-step time = measured step - optimizer overhead
            overhead = throughput.optimizer_overhead_s
            step_s = acc * max(row["step_time_s"] - overhead, 1e-6) + overhead
        else:
            step_s = float("nan")
        used = None if oom else int(row["device_bytes"])
        rows.append({"batch_size": b, "accumulate": acc, "effective_batch": b * acc, "device_bytes": used,
                     "device_gib": None if oom else used / GIB, "fits": (not oom) and used <= budget,
                     "step_s": step_s, "images_per_s": b * acc / step_s, "method": row["method"]})
    table = pd.DataFrame(rows)
    fitting = table[table["fits"]]
    best = None if fitting.empty else fitting.loc[fitting["images_per_s"].idxmax()].to_dict()
    if best is None:
        reason = (f"nothing fits in {format_bytes(budget)} ({1 - margin:.0%} of {spec.name}): try "
                  "activation_checkpointing='all', a smaller imgsz or a smaller model")
    else:
        reason = (f"recommended: batch {best['batch_size']} x accumulate {best['accumulate']} = "
                  f"{best['effective_batch']} images per optimizer step, {best['device_gib']:.1f} GiB of "
                  f"{spec.total_bytes / GIB:.1f} GiB ({spec.name}, {margin:.0%} kept free), about "
                  f"{best['images_per_s']:.0f} img/s: the fastest option that fits (fewer micro-steps, "
                  "less fixed cost per image)")
    return BatchPlan(table, best, reason, step, spec, nominal_batch_size, margin, search.batch_size)


@dataclass
class AutoBatch:
    """What ``batch_size="auto"`` chose and predicted (bytes), and the measured peak once known (auto_batch.json)."""

    batch_size: int  # images per loader batch, all DDP ranks together (what TrainConfig.batch_size becomes)
    accumulate: int  # batches per optimizer step by the official rule
    gpu: str  # the card (or "CPU RAM") the batch was sized for
    capacity_bytes: int
    margin: float
    largest_batch: int  # the largest per-device batch that fits (the chosen one divides the nominal batch or is it)
    step: dict  # the resolved StepConfig at the chosen per-device batch (StepConfig.to_dict)
    predicted_peak_allocated: int
    predicted_peak_reserved: int
    predicted_device_bytes: int  # reserved + CUDA context: what must fit under (1 - margin) of the capacity
    reason: str
    measured_peak_allocated: int | None = None  # CUDA: torch.cuda.max_memory_allocated over the first epoch
    measured_peak_reserved: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def record_measured_peak(self, device: torch.device, peak_allocated: int | None, run_dir: Path | None) -> None:
        """On CUDA, once: the first epoch's measured peaks beside the prediction (auto_batch.json rewritten)."""
        if self.measured_peak_allocated is not None or device.type != "cuda" or peak_allocated is None:
            return
        self.measured_peak_allocated = int(peak_allocated)
        self.measured_peak_reserved = int(torch.cuda.max_memory_reserved(device))
        if run_dir is not None:
            self.save(run_dir)

    def save(self, run_dir: Path) -> Path:
        path = Path(run_dir) / "auto_batch.json"
        write_text_atomically(path, json.dumps(self.to_dict(), indent=2) + "\n")  # a reader never sees half
        return path

    def __str__(self) -> str:
        return (f"batch_size='auto': batch {self.batch_size} x accumulate {self.accumulate} on {self.gpu}, "
                f"predicted peak {format_bytes(self.predicted_device_bytes)} of {format_bytes(self.capacity_bytes)} "
                f"({self.margin:.0%} kept free)")


def choose_batch(config: TrainConfig, model: nn.Module, device: torch.device, world_size: int = 1, *,
                 loss_fn: Callable | None = None) -> tuple[TrainConfig, AutoBatch]:
    """``config`` with ``batch_size="auto"`` replaced by ``plan``'s batch for ``config.gpu``, else the training
    device's card or RAM, and the record of it. ``world_size``: DDP ranks (the batch is per device); ``loss_fn``:
    the run's loss, if not ``DetectionLoss``. A RuntimeError saying what to change when not even batch 1 fits."""
    spec = target_gpu(config.gpu, device)
    step = config.step.replace(model=model, batch_size=1, num_classes=getattr(model, "nc", None), loss_fn=loss_fn)
    chosen = plan(step, config.optim.nominal_batch_size, gpu=spec, margin=config.margin, method="estimated")
    if chosen.recommended is None:
        raise RuntimeError(f"batch_size='auto' for {step.model_name} at {step.peak_imgsz} px: {chosen.reason}")
    per_device = int(chosen.recommended["batch_size"])
    report = estimator_for(step, spec).reports([per_device], spec)[0]
    record = AutoBatch(batch_size=per_device * world_size, accumulate=int(chosen.recommended["accumulate"]),
                       gpu=spec.name, capacity_bytes=spec.total_bytes, margin=config.margin,
                       largest_batch=chosen.largest_batch, step=report.step.to_dict(),
                       predicted_peak_allocated=report.peak_allocated, predicted_peak_reserved=report.peak_reserved,
                       predicted_device_bytes=report.device_bytes, reason=chosen.reason)
    LOGGER.info("%s", record)
    return replace(config, batch_size=per_device * world_size), record
