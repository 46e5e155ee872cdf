"""Curves, the largest batch that fits, and batch x accumulation plans that reach the nominal batch.

``sweep`` measures where a CUDA device is present and estimates otherwise (the ``source`` column says
which); ``find_max_batch`` grows then bisects, surviving real out-of-memory errors; ``plan`` lists
every batch x accumulation that reaches ``nominal_batch_size`` with its memory and speed.
"""

from __future__ import annotations

import gc
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from yolo9kit.memory.estimate import estimate_curve
from yolo9kit.memory.gpus import GPUSpec, resolve_gpu
from yolo9kit.memory.report import GIB
from yolo9kit.memory.throughput import ThroughputModel

LOGGER = logging.getLogger(__name__)

# Head-room kept below the card's capacity: validation runs at 2x the batch in eval mode (no saved
# activations, but its own peak), the number of objects per image changes the assigner's memory, and
# the allocator fragments over an epoch (YOLOv5 went from 0.9 to 0.8 of the card for this reason;
# ultralytics uses 0.6).
DEFAULT_MARGIN = 0.10


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _use_measure(source: str, device: str | None) -> bool:
    if source not in ("auto", "measured", "estimated", "both"):
        raise ValueError(f"source={source!r}: expected 'auto', 'measured', 'estimated' or 'both'")
    has_cuda = torch.cuda.is_available() and (device is None or str(device).startswith("cuda"))
    if source in ("measured", "both") and not has_cuda:
        from yolo9kit.memory.measure import require_cuda

        require_cuda(device or "cuda")
    return source in ("measured", "both") or (source == "auto" and has_cuda)


def sweep(model: str | nn.Module, batch_sizes: Sequence[int], imgsz: int | Sequence[int] = 640,
          amp: str | Sequence[str] = "fp16", checkpoint: Any = None, channels_last: bool | Sequence[bool] = False,
          *, gpu: str | int | GPUSpec | None = None, num_targets: int = 8, source: str = "auto",
          device: str | None = None, steps: int = 3, warmup: int = 1, **kwargs: Any) -> pd.DataFrame:
    """Memory (and speed) against batch size, one row per (setting, batch size).

    ``imgsz``, ``amp``, ``checkpoint`` (a list of settings such as ``[None, "all"]``; a list of ints is
    one setting, the layer indices) and ``channels_last`` may be lists: every combination becomes a
    curve, labelled in the ``setting`` column.

    Args:
        source: "auto" (measure on CUDA, else estimate), "measured", "estimated" or "both" (measured
            points and estimated lines, for ``plots.memory_vs_batch``).
        gpu: the card the estimate is for (default: the local one when measuring, else "H100").

    Returns:
        DataFrame with the ``MemoryReport.as_row`` columns plus ``setting`` and ``oom`` (a measured
        batch that ran out of memory: its memory columns are NaN).
    """
    measured = _use_measure(source, device)
    rows = []
    # a list of settings ([None, "all"]) makes curves; a list of ints is one setting (layer indices)
    several = isinstance(checkpoint, list) and not all(isinstance(c, int) for c in checkpoint)
    checkpoints = checkpoint if several else [checkpoint]
    for size, amp_, ckpt, cl in itertools.product(_as_list(imgsz), _as_list(amp), checkpoints, _as_list(channels_last)):
        setting = f"{amp_} ckpt={ckpt or 'none'}{' cl' if cl else ''}{' lean' if kwargs.get('lean') else ''} {size}px"
        if source in ("estimated", "both") or not measured:
            target = gpu if gpu is not None else (_local_gpu() if measured else "H100")
            for r in estimate_curve(model, list(batch_sizes), imgsz=size, amp=amp_, checkpoint=ckpt,
                                    channels_last=cl, num_targets=num_targets, gpu=target, **kwargs):
                rows.append({**r.as_row(), "setting": setting, "oom": False})
        if measured:
            rows.extend({**row, "setting": setting} for row in
                        _measured_rows(model, batch_sizes, size, amp_, ckpt, cl, num_targets, device, steps,
                                       warmup, kwargs))
    return pd.DataFrame(rows)


def _local_gpu() -> GPUSpec:
    from yolo9kit.memory.gpus import gpu_from_device

    return gpu_from_device(torch.cuda.current_device())


def _measured_rows(model, batch_sizes, imgsz, amp, checkpoint, channels_last, num_targets, device, steps, warmup,
                   kwargs) -> list[dict]:
    from yolo9kit.memory.measure import measure

    rows = []
    for b in batch_sizes:
        try:
            r = measure(model, b, imgsz=imgsz, amp=amp, checkpoint=checkpoint, channels_last=channels_last,
                        steps=steps, warmup=warmup, device=device or "cuda", num_targets=num_targets, **kwargs)
            rows.append({**r.as_row(), "oom": False})
        except torch.cuda.OutOfMemoryError:
            _free_after_oom()
            rows.append({"model": str(model), "batch_size": b, "imgsz": imgsz, "amp": amp, "source": "measured",
                         "checkpoint": str(checkpoint or "none"), "channels_last": channels_last, "oom": True})
    return rows


def _free_after_oom() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


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


def find_max_batch(model: str | nn.Module | None = None, imgsz: int = 640, amp: str = "fp16", checkpoint: Any = None,
                   channels_last: bool = False, *, gpu: str | int | GPUSpec | None = None,
                   margin: float = DEFAULT_MARGIN, max_batch: int = 1024, start: int = 1,
                   num_targets: int = 8, source: str = "auto", device: str | None = None,
                   step_fn: Callable[[int], int | None] | None = None, **kwargs: Any) -> BatchSearch:
    """The largest batch size whose step runs and stays under ``(1 - margin)`` of the card.

    Grows the batch by doubling from ``start`` until a trial fails, then bisects between the last
    success and the first failure. A trial fails when it raises ``torch.cuda.OutOfMemoryError`` (the
    error is dropped, garbage collected and the CUDA cache emptied before the next trial, so the
    process can go on training) or when its memory exceeds the budget.

    Args:
        model: name or module; not needed when ``step_fn`` is given.
        gpu: card to fit (default: the local CUDA device; required when estimating).
        margin: share of the card kept free for validation (2x batch, eval mode), more objects per image
            and fragmentation over an epoch (default 0.10).
        step_fn: ``step_fn(batch_size) -> bytes used or None`` replaces the built-in trial (measure on
            CUDA, estimate otherwise); it may raise ``torch.cuda.OutOfMemoryError``.

    Returns:
        BatchSearch with the batch, the budget, every trial and the reason for the answer.
    """
    spec = resolve_gpu(gpu) if gpu is not None else (_local_gpu() if torch.cuda.is_available() else None)
    budget = int(spec.total_bytes * (1 - margin)) if spec is not None else None
    if step_fn is None:
        if model is None:
            raise ValueError("find_max_batch needs a model (or a step_fn)")
        step_fn = _default_trial(model, imgsz, amp, checkpoint, channels_last, num_targets, source, device,
                                 spec, kwargs)
    trials: list[dict] = []

    def ok(b: int) -> bool:
        oom = False
        try:
            used = step_fn(b)
        except torch.cuda.OutOfMemoryError:
            used, oom = None, True
        if oom:  # outside the except block: the traceback and the tensors it holds are gone
            _free_after_oom()
            trials.append({"batch_size": b, "ok": False, "bytes": None, "reason": "out of memory"})
            return False
        fits = budget is None or used is None or used <= budget
        trials.append({"batch_size": b, "ok": fits, "bytes": used,
                       "reason": "fits" if fits else "over the budget"})
        return fits

    lo, hi = 0, None
    b = max(1, start)
    while b <= max_batch:
        if ok(b):
            lo, b = b, b * 2
        else:
            hi = b
            break
    if hi is None:
        hi = max_batch + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    where = f"{budget / GIB:.2f} GiB = {1 - margin:.0%} of {spec.name}" if spec is not None else "no capacity given"
    if lo == 0:
        reason = f"batch {max(1, start)} already fails ({where})"
    elif lo >= max_batch:
        reason = f"reached max_batch={max_batch} ({where})"
    else:
        reason = f"batch {lo + 1} fails ({where}); margin {margin:.0%} kept for validation and object-count spikes"
    return BatchSearch(lo, budget, margin, trials, reason)


def _default_trial(model, imgsz, amp, checkpoint, channels_last, num_targets, source, device, spec, kwargs):
    if _use_measure(source, device):
        from yolo9kit.memory.measure import measure

        def trial(b: int) -> int:
            r = measure(model, b, imgsz=imgsz, amp=amp, checkpoint=checkpoint, channels_last=channels_last,
                        device=device or "cuda", num_targets=num_targets, breakdown=False, **kwargs)
            return r.device_bytes
        return trial
    if spec is None:
        raise ValueError("find_max_batch without CUDA estimates: say for which card, e.g. gpu='RTX 4090'")
    from yolo9kit.memory.estimate import StepEstimator

    est = StepEstimator(model, imgsz=imgsz, amp=amp, checkpoint=checkpoint, channels_last=channels_last,
                        num_targets=num_targets, **kwargs)

    def trial(b: int) -> int:
        return est.reports([b], spec)[0].device_bytes
    return trial


@dataclass
class BatchPlan:
    """``table``: one row per batch x accumulation; ``recommended``: the chosen row; ``reason``: why."""

    table: pd.DataFrame
    recommended: dict | None
    reason: str

    def __str__(self) -> str:
        cols = ["batch_size", "accumulate", "effective_batch", "device_gib", "fits", "step_s", "images_per_s"]
        return f"{self.table[cols].to_string(index=False)}\n{self.reason}"


def plan(model: str | nn.Module, nominal_batch_size: int = 64, *, gpu: str | int | GPUSpec | None = None,
         imgsz: int = 640, amp: str = "fp16", checkpoint: Any = None, channels_last: bool = False,
         num_targets: int = 8, margin: float = DEFAULT_MARGIN, source: str = "auto",
         throughput: ThroughputModel | None = None, **kwargs: Any) -> BatchPlan:
    """Every batch x accumulation that reaches ``nominal_batch_size``, its memory and speed, and a choice.

    Candidates are the divisors of the nominal batch (exactly nominal images per optimizer step) with
    ``accumulate = nominal / batch``, the kit's and the official rule ``max(round(nominal / batch), 1)``.
    Memory is measured on the local CUDA card (``source="auto"`` with CUDA) or estimated for ``gpu``.
    Speed: the throughput model (``throughput.ThroughputModel``): each micro-step pays a fixed
    launch cost and a per-image cost, each optimizer step a fixed cost; a measured step time replaces
    the modelled one for the micro-step when memory was measured.

    The recommendation is the fitting row (device bytes under ``(1 - margin)`` of the card) with the
    most images per second, which is the largest batch that fits: accumulation does not save compute,
    it only adds fixed costs per micro-step.
    """
    if nominal_batch_size < 1:
        raise ValueError(f"nominal_batch_size={nominal_batch_size}: must be >= 1")
    measured = _use_measure(source, kwargs.get("device"))
    spec = resolve_gpu(gpu) if gpu is not None else (_local_gpu() if measured else resolve_gpu("H100"))
    budget = int(spec.total_bytes * (1 - margin))
    batches = [b for b in range(1, nominal_batch_size + 1) if nominal_batch_size % b == 0]
    throughput = throughput or ThroughputModel()
    if measured:
        df = sweep(model, batches, imgsz=imgsz, amp=amp, checkpoint=checkpoint, channels_last=channels_last,
                   num_targets=num_targets, source="measured", **kwargs)
        gflops = None
    else:
        from yolo9kit.memory.estimate import StepEstimator

        est = StepEstimator(model, imgsz=imgsz, amp=amp, checkpoint=checkpoint, channels_last=channels_last,
                            num_targets=num_targets, **{k: v for k, v in kwargs.items() if k != "device"})
        df = pd.DataFrame([{**r.as_row(), "oom": False} for r in est.reports(batches, spec)])
        gflops = est.train_gflops_per_image
    rows = []
    for row in df.to_dict("records"):
        b = int(row["batch_size"])
        acc = nominal_batch_size // b
        oom = bool(row.get("oom"))
        device_bytes = None if oom else int(row["device_bytes"])
        if gflops is not None:
            step_s = throughput.step_s(spec, b, acc, gflops, row["amp"])
        elif not oom:  # measured: micro-step time = measured step - optimizer overhead
            step_s = acc * max(row["step_time_s"] - throughput.optimizer_overhead_s, 1e-6) \
                + throughput.optimizer_overhead_s
        else:
            step_s = float("nan")
        rows.append({"batch_size": b, "accumulate": acc, "effective_batch": b * acc, "device_bytes": device_bytes,
                     "device_gib": None if oom else device_bytes / GIB,
                     "fits": (not oom) and device_bytes <= budget, "step_s": step_s,
                     "images_per_s": b * acc / step_s, "source": row["source"]})
    table = pd.DataFrame(rows)
    fitting = table[table["fits"]]
    if fitting.empty:
        return BatchPlan(table, None, f"nothing fits in {budget / GIB:.1f} GiB ({1 - margin:.0%} of {spec.name}): "
                                      "try checkpoint='all', a smaller imgsz or a smaller model")
    best = fitting.loc[fitting["images_per_s"].idxmax()].to_dict()
    reason = (f"recommended: batch {best['batch_size']} x accumulate {best['accumulate']} = "
              f"{best['effective_batch']} images per optimizer step, {best['device_gib']:.1f} GiB of "
              f"{spec.total_bytes / GIB:.1f} GiB ({spec.name}, {margin:.0%} kept free), about "
              f"{best['images_per_s']:.0f} img/s: the fastest option that fits (fewer micro-steps, "
              "less fixed cost per image)")
    return BatchPlan(table, best, reason)
