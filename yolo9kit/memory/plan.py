"""Curves, the largest batch that fits, and batch x accumulation plans that reach the nominal batch.

Every function describes one ``StepConfig`` (or a model name, then the step ``fit`` would run with it).
``sweep`` measures where a CUDA device is present and estimates otherwise (the ``method`` column says
which); ``find_max_batch`` grows then bisects, surviving real out-of-memory errors; ``plan`` lists the
batch x accumulation choices that reach ``nominal_batch_size`` with their memory and speed, and picks one
(what ``TrainConfig(batch_size="auto")`` trains with).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from yolo9kit.config import DEFAULT_MARGIN, StepConfig, TrainConfig
from yolo9kit.config.train import official_accumulate
from yolo9kit.env import free_cuda_memory, parse_device
from yolo9kit.files import format_bytes
from yolo9kit.memory.estimate import estimator_for
from yolo9kit.memory.gpus import GPUSpec, target_gpu
from yolo9kit.memory.report import GIB
from yolo9kit.memory.step import as_step
from yolo9kit.memory.throughput import ThroughputModel

LOGGER = logging.getLogger(__name__)
METHODS = ("auto", "measured", "estimated", "both")


def _use_measure(method: str, device: Any) -> bool:
    if method not in METHODS:
        raise ValueError(f"method={method!r}: expected one of {METHODS}")
    has_cuda = torch.cuda.is_available() and parse_device(device).type == "cuda"
    if method in ("measured", "both") and not has_cuda:
        from yolo9kit.memory.measure import require_cuda

        require_cuda(device or "cuda")
    return method in ("measured", "both") or (method == "auto" and has_cuda)


def batch_grid(low: int, high: int) -> list[int]:
    """Batch sizes for a curve over [low, high]: the ends, powers of two and 1.5x powers of two (~2 per octave)."""
    if low < 1 or high < low:
        raise ValueError(f"batch range ({low}, {high}): expected 1 <= low <= high")
    grid = {low, high}
    k = 1
    while k <= high:
        grid.update(b for b in (k, k + k // 2) if low <= b <= high)
        k *= 2
    return sorted(grid)


def _curves(step: StepConfig | str | nn.Module | Sequence, changes: dict[str, Any], caller: str) -> list[StepConfig]:
    """One step per curve: a list of steps, or every combination of the changes given as lists
    (``amp=["fp16", "bf16"]``; a list of layer indices for ``activation_checkpointing`` is one setting)."""
    if isinstance(step, (list, tuple)):
        return [as_step(s, None, changes, caller=caller) for s in step]
    several = {k: v for k, v in changes.items() if isinstance(v, (list, tuple))
               and not (k == "activation_checkpointing" and all(isinstance(i, int) for i in v))}
    single = {k: v for k, v in changes.items() if k not in several}
    combos = itertools.product(*several.values()) if several else [()]
    return [as_step(step, None, {**single, **dict(zip(several, combo))}, caller=caller) for combo in combos]


def sweep(step: StepConfig | str | nn.Module | Sequence[StepConfig], batch_sizes: Sequence[int], *,
          gpu: str | int | GPUSpec | None = None, method: str = "auto", device: str | None = None,
          **changes: Any) -> pd.DataFrame:
    """Memory (and speed) against batch size, one row per (step, batch size).

    ``step`` may be a list of steps, and any ``StepConfig`` field given in ``changes`` as a list makes one
    curve per value (``sweep("yolov9-s", [8, 16, 32], amp=["fp16", "bf16"])``), labelled in ``setting``.

    Args:
        method: "auto" (measure on CUDA, else estimate), "measured", "estimated" or "both" (measured
            points and estimated lines, for ``plots.memory_vs_batch``).
        gpu: the card the estimate is for (None: this machine's CUDA card, else ``DEFAULT_GPU``).

    Returns:
        DataFrame with the ``MemoryReport.as_row`` columns plus ``oom`` (a measured batch that ran out of
        memory: its memory columns are NaN).
    """
    measured = _use_measure(method, device)
    spec = target_gpu(gpu)
    rows = []
    for one in _curves(step, changes, "sweep"):
        if method in ("estimated", "both") or not measured:
            rows += [{**r.as_row(), "oom": False} for r in estimator_for(one, spec).reports(list(batch_sizes), spec)]
        if measured:
            rows += _measured_rows(one, batch_sizes, device)
    return pd.DataFrame(rows)


def _measured_rows(step: StepConfig, batch_sizes: Sequence[int], device: Any) -> list[dict]:
    from yolo9kit.memory.measure import measure

    rows = []
    for b in batch_sizes:
        try:
            rows.append({**measure(step, b, device=device).as_row(), "oom": False})
        except torch.cuda.OutOfMemoryError:
            free_cuda_memory()
            resolved = dataclasses.replace(step, batch_size=b).resolve(device or "cuda")
            rows.append({"model": resolved.model_name, "batch_size": b, "imgsz": resolved.peak_imgsz,
                         "amp": resolved.amp, "setting": resolved.label, "method": "measured", "oom": True})
    return rows


@dataclass
class BatchSearch:
    """Result of ``find_max_batch``: ``batch_size`` is the answer (0 when even batch 1 fails)."""

    batch_size: int
    budget_bytes: int | None
    margin: float
    trials: list[dict] = field(default_factory=list)  # batch_size, ok, bytes, reason
    reason: str = ""

    def __str__(self) -> str:
        return f"largest batch: {self.batch_size} ({self.reason})"


def find_max_batch(step: StepConfig | str | nn.Module | None = None, *, gpu: str | int | GPUSpec | None = None,
                   margin: float = DEFAULT_MARGIN, max_batch: int = 1024, start: int = 1, method: str = "auto",
                   device: str | None = None, trial: Callable[[int], int | None] | None = None,
                   **changes: Any) -> BatchSearch:
    """The largest batch size whose step runs and stays under ``(1 - margin)`` of the card.

    Grows the batch by doubling from ``start`` until a trial fails, then bisects between the last
    success and the first failure. A trial fails when it raises ``torch.cuda.OutOfMemoryError`` (the
    error is dropped, garbage collected and the CUDA cache emptied before the next trial, so the
    process can go on training) or when its memory exceeds the budget.

    Args:
        step: the step (or a model name); not needed when ``trial`` is given.
        gpu: the card to fit (None: this machine's CUDA card, else ``DEFAULT_GPU``).
        margin: share of the card kept free for validation (2x batch, eval mode), more objects per image
            and fragmentation over an epoch (default 0.10).
        method: "auto" measures on CUDA and estimates otherwise; "measured" or "estimated".
        trial: ``trial(batch_size) -> bytes used or None`` replaces the built-in trial; it may raise
            ``torch.cuda.OutOfMemoryError``.

    Returns:
        BatchSearch with the batch, the budget, every trial and the reason for the answer.
    """
    if trial is None and step is None:
        raise ValueError("find_max_batch needs a step (or a model name), or a trial function")
    spec = target_gpu(gpu)
    budget = int(spec.total_bytes * (1 - margin))
    if trial is None:
        trial = _default_trial(as_step(step, None, changes, caller="find_max_batch"), method, device, spec)
    trials: list[dict] = []

    def ok(b: int) -> bool:
        oom = False
        try:
            used = trial(b)
        except torch.cuda.OutOfMemoryError:
            used, oom = None, True
        if oom:  # outside the except block: the traceback and the tensors it holds are gone
            free_cuda_memory()
            trials.append({"batch_size": b, "ok": False, "bytes": None, "reason": "out of memory"})
            return False
        fits = used is None or used <= budget
        trials.append({"batch_size": b, "ok": fits, "bytes": used, "reason": "fits" if fits else "over the budget"})
        return fits

    lo, hi, b = 0, None, max(1, start)
    while b <= max_batch:
        if ok(b):
            lo, b = b, b * 2
        else:
            hi = b
            break
    hi = max_batch + 1 if hi is None else hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return BatchSearch(lo, budget, margin, trials, _search_reason(lo, max(1, start), max_batch, trials, budget,
                                                                  margin, spec))


def _search_reason(lo: int, start: int, max_batch: int, trials: list[dict], budget: int, margin: float,
                   spec: GPUSpec) -> str:
    where = (f"a budget of {format_bytes(budget)}, {1 - margin:.0%} of the {format_bytes(spec.total_bytes)} "
             f"of {spec.name}")
    if lo >= max_batch:
        return f"reached max_batch={max_batch} within {where}"
    first_fail = next((t for t in trials if t["batch_size"] == (lo + 1 if lo else start)), None)
    needs = f" needs {format_bytes(first_fail['bytes'])}" if first_fail and first_fail["bytes"] else \
        " runs out of memory"
    failing = lo + 1 if lo else start
    return f"batch {failing}{needs}, over {where}"


def _default_trial(step: StepConfig, method: str, device: Any, spec: GPUSpec) -> Callable[[int], int]:
    if _use_measure(method, device):
        from yolo9kit.memory.measure import measure

        return lambda b: measure(step, b, device=device, breakdown=False).device_bytes
    est = estimator_for(step, spec)
    return lambda b: est.reports([b], spec)[0].device_bytes


@dataclass
class BatchPlan:
    """What ``plan`` found: ``table`` (one row per batch x accumulation), ``recommended`` (the chosen row,
    None when nothing fits), ``reason`` (why), ``largest_batch`` (the largest batch that fits), and the step
    and card it is for. ``train_config`` turns the recommendation into a ``TrainConfig``."""

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
        """``base`` (default ``TrainConfig()``) training the planned step: the plan's step as its ``step``
        (switches as the step gave them, so ``fit`` decides the undecided ones for its device as the plan did
        for the card), the recommended batch, whole (no micro-batches), and the nominal batch."""
        if self.recommended is None:
            raise ValueError(f"nothing to train: {self.reason}")
        return (base or TrainConfig()).replace(step=self.step.replace(batch_size=None),
                                               batch_size=int(self.recommended["batch_size"]),
                                               nominal_batch_size=self.nominal_batch_size)


def plan(step: StepConfig | str | nn.Module, nominal_batch_size: int = 64, *,
         gpu: str | int | GPUSpec | None = None, margin: float = DEFAULT_MARGIN, method: str = "auto",
         device: str | None = None, throughput: ThroughputModel | None = None, **changes: Any) -> BatchPlan:
    """Batch x accumulation choices that reach ``nominal_batch_size``, their memory and speed, and a choice.

    Candidates: every divisor of the nominal batch (exactly nominal images per optimizer step), and the
    largest batch that fits when it is not one of them. Each trains with the accumulation of the official
    rule ``max(round(nominal / batch), 1)``, which is what ``fit`` applies (so a batch of 24 for a nominal
    64 accumulates 3: 72 images per step, with the weight decay scaled by 72/64 as officially).
    Memory is measured on the local CUDA card (``method="auto"`` with CUDA) or estimated for ``gpu``.
    Speed: the throughput model (``throughput.ThroughputModel``): each micro-step pays a fixed launch cost
    and a per-image cost, each optimizer step a fixed cost; a measured step time replaces the modelled
    one for the micro-step when memory was measured.

    The recommendation is the fitting row (device bytes under ``(1 - margin)`` of the card) with the
    most images per second, which is the largest batch that fits: accumulation does not save compute,
    it only adds fixed costs per micro-step.
    """
    if nominal_batch_size < 1:
        raise ValueError(f"nominal_batch_size={nominal_batch_size}: must be >= 1")
    step = as_step(step, None, changes, caller="plan")
    measured = _use_measure(method, device)
    spec = target_gpu(gpu)
    budget = int(spec.total_bytes * (1 - margin))
    search = find_max_batch(step, gpu=spec, margin=margin, max_batch=nominal_batch_size,
                            method="measured" if measured else "estimated", device=device)
    batches = sorted({b for b in range(1, nominal_batch_size + 1) if nominal_batch_size % b == 0}
                     | ({search.batch_size} if search.batch_size else set()))
    throughput = throughput or ThroughputModel()
    if measured:
        df = sweep(step, batches, method="measured", device=device)
        gflops = None
    else:
        est = estimator_for(step, spec)
        df = pd.DataFrame([{**r.as_row(), "oom": False} for r in est.reports(batches, spec)])
        gflops = est.train_gflops_per_image
    table = pd.DataFrame([_plan_row(row, nominal_batch_size, budget, spec, gflops, throughput)
                          for row in df.to_dict("records")])
    fitting = table[table["fits"]]
    if fitting.empty:
        reason = (f"nothing fits in {format_bytes(budget)} ({1 - margin:.0%} of {spec.name}): try "
                  "activation_checkpointing='all', a smaller imgsz or a smaller model")
        return BatchPlan(table, None, reason, step, spec, nominal_batch_size, margin, search.batch_size)
    best = fitting.loc[fitting["images_per_s"].idxmax()].to_dict()
    reason = (f"recommended: batch {best['batch_size']} x accumulate {best['accumulate']} = "
              f"{best['effective_batch']} images per optimizer step, {best['device_gib']:.1f} GiB of "
              f"{spec.total_bytes / GIB:.1f} GiB ({spec.name}, {margin:.0%} kept free), about "
              f"{best['images_per_s']:.0f} img/s: the fastest option that fits (fewer micro-steps, "
              "less fixed cost per image)")
    return BatchPlan(table, best, reason, step, spec, nominal_batch_size, margin, search.batch_size)


def _plan_row(row: dict, nominal: int, budget: int, spec: GPUSpec, gflops: float | None,
              throughput: ThroughputModel) -> dict:
    b = int(row["batch_size"])
    acc = official_accumulate(nominal, b)  # the rule fit applies
    oom = bool(row.get("oom"))
    device_bytes = None if oom else int(row["device_bytes"])
    if gflops is not None:
        step_s = throughput.step_s(spec, b, acc, gflops, row["amp"])
    elif not oom:  # measured: micro-step time = measured step - optimizer overhead
        step_s = acc * max(row["step_time_s"] - throughput.optimizer_overhead_s, 1e-6) + throughput.optimizer_overhead_s
    else:
        step_s = float("nan")
    return {"batch_size": b, "accumulate": acc, "effective_batch": b * acc, "device_bytes": device_bytes,
            "device_gib": None if oom else device_bytes / GIB, "fits": (not oom) and device_bytes <= budget,
            "step_s": step_s, "images_per_s": b * acc / step_s, "method": row["method"]}
