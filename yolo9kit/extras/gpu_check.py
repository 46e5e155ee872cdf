"""``checks(gpu=True)``, ``python -m yolo9kit checks --gpu``: two minutes on a CUDA card that say whether the kit's
GPU half works there, written to ``gpu_check.json`` (what it runs and records: docs/gpu.md)."""

from __future__ import annotations

import copy
import datetime as dt
import json
import platform
import re
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from yolo9kit.config import TrainConfig
from yolo9kit.config.step import FAST_SWITCHES, StepConfig
from yolo9kit.env import EnvReport, environment_report, free_cuda_memory, resolve_device
from yolo9kit.files import write_text_atomically
from yolo9kit.memory import estimate, gpus, measure
from yolo9kit.memory.estimate import estimator_for
from yolo9kit.memory.gpus import GPUSpec, target_gpu
from yolo9kit.memory.tracer import synthetic_batch
from yolo9kit.models import create_model
from yolo9kit.train.step import build_trainer, cudnn_autotune, train_step

RESULT_NAME = "gpu_check.json"
RECORD_ABOVE = 0.02  # the estimate's error (peak reserved) above which a measured calibration is recorded


def fit_line(x: list[float], y: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a x + b``; with one point, ``a = y / x`` and ``b = 0``; with one ``x``, ``a = 1``."""
    if len(x) == 1:
        return (y[0] / x[0] if x[0] else 1.0), 0.0
    if len(set(x)) == 1:
        return 1.0, statistics.fmean(y) - x[0]
    return tuple(statistics.linear_regression(x, y))


def calibration_from_points(points: list[dict], gpu_name: str, gpu_bytes: int, *, smoke: bool = False,
                            step: str = "yolo9kit.train.train_step (SGD, clip 10, EMA), synthetic batch") -> dict:
    """A "measured" calibration (docs/memory.md) fitted per AMP mode on ``points``, dicts of ``amp``,
    ``estimated_traced_bytes``, ``measured_peak_allocated`` / ``_reserved`` (unmeasured ones left out) and optionally
    ``context_bytes``. ``smoke``: a check of the script, never applied; ``step``: what was measured."""
    fits = {}
    for amp in sorted({p["amp"] for p in points if p.get("measured_peak_allocated")}):
        pts = [p for p in points if p["amp"] == amp and p.get("measured_peak_allocated")]
        x = [p["estimated_traced_bytes"] for p in pts]
        a_alloc = fit_line(x, [p["measured_peak_allocated"] for p in pts])
        a_res = fit_line(x, [p["measured_peak_reserved"] for p in pts])
        err = max(abs(a_res[0] * xi + a_res[1] - p["measured_peak_reserved"]) / p["measured_peak_reserved"]
                  for xi, p in zip(x, pts))
        fits[amp] = {"allocated": list(a_alloc), "reserved": list(a_res), "n": len(pts), "max_rel_error": err}
    contexts = sorted(p["context_bytes"] for p in points if p.get("context_bytes"))
    return {"format": gpus.FORMAT, "version": 1, "kind": "measured", "smoke": smoke, "gpu": gpu_name,
            "gpu_total_bytes": gpu_bytes, "torch": torch.__version__, "cuda": torch.version.cuda,
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "step": step, "fits": fits,
            "workspace_bytes": None, "context_bytes": int(contexts[len(contexts) // 2]) if contexts else None,
            "throughput": None, "points": points}


@dataclass(frozen=True)
class GPUCheckConfig:
    """What the GPU check runs; the defaults fit a 16 GB card in about a minute."""

    model: str = "yolov9-s"  # the model of the speed goals (benchmarks/gpu_suite.py)
    imgsz: int = 640
    batch_size: int = 8  # small, so that both steps fit a T4 side by side
    steps: int = 6  # timed steps of each kind, after the warm-up
    warmup_batches: int = 2  # cuDNN autotuning and the optimizer state happen here
    memory_batches: tuple[int, ...] = (8, 16, 32)  # a batch the estimate says would not fit is skipped
    loss_tolerance: float = 0.02  # the relative loss difference that agrees: under AMP the steps round differently
    time_budget_s: float = 120.0  # memory points past it are skipped (and said so)


@dataclass
class GPUCheck:
    """The outcome of ``check_gpu``: ``ran`` False when there is no CUDA device (``reason`` says so)."""

    ran: bool
    reason: str
    device: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    step: str = ""  # the resolved default step (its label)
    losses: dict = field(default_factory=dict)  # "fast", "plain": the loss of each step (all steps)
    loss_max_rel_diff: float | None = None
    tolerance: float = GPUCheckConfig.loss_tolerance
    images_per_s: dict = field(default_factory=dict)  # "fast", "plain"
    syncs_in_fast_step: int | None = None
    memory: list = field(default_factory=list)  # one row per batch: measured and estimated bytes, error
    calibration: str = ""
    notes: list = field(default_factory=list)
    seconds: float = 0.0
    command: str = ""
    path: str | None = None

    @property
    def losses_agree(self) -> bool:
        return self.loss_max_rel_diff is not None and self.loss_max_rel_diff <= self.tolerance

    @property
    def ok(self) -> bool:  # nothing to check without CUDA; on a card, the two steps must agree
        return not self.ran or self.losses_agree

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "losses_agree": self.losses_agree, "ok": self.ok}

    def __str__(self) -> str:
        if not self.ran:
            return f"GPU check: {self.reason}"
        d = self.device
        lines = [f"GPU check on {d['name']} (cuda:{d['index']}, sm_{d['capability']}, "
                 f"{d['total_bytes'] / 2**30:.1f} GiB), {self.step}, {self.seconds:.0f} s"]
        verdict = "agree" if self.losses_agree else "DISAGREE"
        lines.append(f"  fast and plain steps: losses {verdict} (largest difference {self.loss_max_rel_diff:.2%}, "
                     f"allowed {self.tolerance:.0%}); fast {self.images_per_s['fast']:.1f} img/s, "
                     f"plain {self.images_per_s['plain']:.1f} img/s "
                     f"({self.images_per_s['fast'] / self.images_per_s['plain']:.2f}x)")
        if self.syncs_in_fast_step is not None:
            lines.append(f"  host-device synchronisations in one fast step: {self.syncs_in_fast_step}")
        for row in self.memory:
            if row.get("measured_peak_reserved") is None:
                lines.append(f"  batch {row['batch_size']}: {row['skipped']}")
                continue
            lines.append(f"  batch {row['batch_size']}: peak reserved {row['measured_peak_reserved'] / 2**30:.2f} GiB "
                         f"measured, {row['estimated_peak_reserved'] / 2**30:.2f} GiB estimated "
                         f"({row['error_reserved']:+.1%}); allocated {row['error_allocated']:+.1%}")
        lines.append(f"  calibration: {self.calibration}")
        lines += [f"  note: {n}" for n in self.notes]
        if self.path:
            lines.append(f"  wrote {self.path}")
        return "\n".join(lines)


def checks(verbose: bool = True, widgets: bool = True, gpu: bool = False, out: str | Path = ".") -> EnvReport:
    """``yolo9kit.checks`` (the environment report), with ``gpu`` also ``check_gpu`` as its ``gpu_check``.

    Args:
        verbose: log the report. widgets: ask JupyterLab about its widget extension.
        gpu: run the GPU check. out: the folder of ``gpu_check.json``.

    Returns:
        EnvReport; ``ok`` False when the GPU check's steps disagree.
    """
    report = environment_report(verbose=verbose, widgets=widgets)
    if gpu:
        report = replace(report, gpu_check=check_gpu(out=out, command="yolo9kit.checks(gpu=True)"))
    return report


def check_gpu(config: GPUCheckConfig | None = None, *, out: str | Path = ".", command: str = "",
              calibration_dir: str | Path | None = None) -> GPUCheck:
    """Run the GPU check on the current CUDA device; without CUDA, say so.

    Args:
        config: what runs (``GPUCheckConfig()``). out: the folder of ``gpu_check.json``. command: recorded in it.
        calibration_dir: where a measured calibration goes (default ``memory.gpus.user_calibration_dir()``).

    Returns:
        GPUCheck, also written to ``out/gpu_check.json`` when it ran.
    """
    config = config or GPUCheckConfig()
    if not torch.cuda.is_available():
        return GPUCheck(False, f"no CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False): "
                               "nothing to check on a GPU", command=command)
    start = time.perf_counter()
    device = resolve_device("cuda")
    spec = target_gpu(None, device)
    major, minor = torch.cuda.get_device_capability(device.index)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    result = GPUCheck(True, "", command=command, tolerance=config.loss_tolerance, device={
        "name": torch.cuda.get_device_name(device.index), "index": device.index, "capability": f"{major}{minor}",
        "total_bytes": spec.total_bytes, "bf16": spec.bf16, "spec": spec.name}, versions={
        "yolo9kit": metadata.version("yolo9kit"), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": cudnn, "python": platform.python_version(), "platform": platform.platform(),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})
    with cudnn_autotune(device):
        _compare_steps(result, config, device)
    result.memory = _memory_points(config, device, spec, deadline=start + config.time_budget_s)
    if any("time budget" in str(row.get("skipped", "")) for row in result.memory):
        result.notes.append(f"memory points past the {config.time_budget_s:.0f} s budget were skipped")
    folder = Path(calibration_dir) if calibration_dir is not None else gpus.user_calibration_dir()
    result.calibration = _record_calibration(result.memory, spec, config, folder)
    result.seconds = time.perf_counter() - start
    path = Path(out) / RESULT_NAME
    result.path = str(path)
    write_text_atomically(path, json.dumps({**result.to_dict(), "config": asdict(config)}, indent=1) + "\n")
    return result


def _compare_steps(result: GPUCheck, config: GPUCheckConfig, device: torch.device) -> None:
    """The fast and the plain step from the same weights on the same batches: losses, images/s, syncs."""
    torch.manual_seed(0)
    model = create_model(config.model)
    batches = [synthetic_batch(config.batch_size, config.imgsz, 8, model.nc, seed=i)
               for i in range(config.warmup_batches + config.steps)]
    batches = [(images.pin_memory(), targets) for images, targets in batches]  # as the loader hands them over
    for kind, switches in (("fast", {}), ("plain", dict.fromkeys(FAST_SWITCHES, False))):
        trainer = build_trainer(copy.deepcopy(model), TrainConfig(device=str(device), batch_size=config.batch_size,
                                                                  imgsz=config.imgsz, **switches), device=device)
        losses, times = [], []
        for i, (images, targets) in enumerate(batches):
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            losses.append(train_step(trainer, images, targets, ni=i, accumulate_steps=1))
            torch.cuda.synchronize(device)  # CPU-GPU sync point: the step is over when the GPU is done
            if i >= config.warmup_batches:
                times.append(time.perf_counter() - t0)
        result.losses[kind] = [float(items.float().sum().cpu()) for items in losses]
        result.images_per_s[kind] = config.batch_size / statistics.median(times)
        if kind == "fast":
            result.step = f"{config.model} {trainer.step.label} batch {config.batch_size}"
            result.syncs_in_fast_step = _syncs_in_step(trainer, *batches[-1])
        del trainer
        free_cuda_memory(device)
    pairs = zip(result.losses["fast"], result.losses["plain"])
    result.loss_max_rel_diff = max(abs(f - p) / max(abs(p), 1e-12) for f, p in pairs)


def _syncs_in_step(trainer, images: torch.Tensor, targets: torch.Tensor) -> int:
    """Host-device synchronisations torch reports (``set_sync_debug_mode("warn")``) in one more step."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            train_step(trainer, images, targets, ni=trainer.last_opt_step + 1, accumulate_steps=1)
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum("synchronizing" in str(w.message) for w in seen)


def _memory_points(config: GPUCheckConfig, device: torch.device, spec: GPUSpec, deadline: float) -> list[dict]:
    """The default step's measured peaks beside the estimate (bytes; errors = estimated / measured - 1)."""
    rows = []
    for b in config.memory_batches:
        step = StepConfig(config.model, b, imgsz=config.imgsz)
        row: dict[str, Any] = {"model": config.model, "batch_size": b, "imgsz": config.imgsz}
        if time.perf_counter() > deadline:
            rows.append({**row, "skipped": "skipped: past the time budget"})
            continue
        est = estimate(step, gpu=spec)
        row.update(amp=est.step.amp, estimated_peak_allocated=est.peak_allocated,
                   estimated_peak_reserved=est.peak_reserved,
                   estimated_traced_bytes=int(estimator_for(step, spec).memory.peak(b)[0]))
        if est.device_bytes > 0.9 * spec.total_bytes:
            rows.append({**row, "skipped": f"skipped: the estimate ({est.device_bytes / 2**30:.1f} GiB) would "
                                           f"not fit in {spec.total_bytes / 2**30:.1f} GiB"})
            continue
        try:
            m = measure(step, b, device=device, repeats=2, warmup_repeats=1, breakdown=False)
        except torch.cuda.OutOfMemoryError:
            free_cuda_memory(device)
            rows.append({**row, "skipped": "out of memory"})
            continue
        rows.append({**row, "measured_peak_allocated": m.peak_allocated, "measured_peak_reserved": m.peak_reserved,
                     "context_bytes": m.context_bytes, "measured_step_s": m.step_time_s,
                     "error_allocated": est.peak_allocated / m.peak_allocated - 1,
                     "error_reserved": est.peak_reserved / m.peak_reserved - 1})
    return rows


def _record_calibration(rows: list[dict], spec: GPUSpec, config: GPUCheckConfig, folder: Path) -> str:
    """This card's calibration, recorded if the estimate is > ``RECORD_ABOVE`` off and a fit halves it (docs/gpu.md)."""
    points = [r for r in rows if r.get("measured_peak_reserved")]
    if len(points) < 2:
        return "not recorded: fewer than two batches were measured"
    amp = points[0]["amp"]
    cal = calibration_from_points(points, spec.name, spec.total_bytes,
                                  step=f"{config.model} {config.imgsz}px, the default step (checks --gpu)")
    fitted = cal["fits"][amp]["max_rel_error"]
    current = max(abs(r["error_reserved"]) for r in points)
    if current <= RECORD_ABOVE or fitted > current / 2:
        return (f"not recorded: the estimate is already within {current:.1%} of the measured peaks "
                f"(a calibration from them: {fitted:.1%})")
    path = folder / f"{re.sub(r'[^A-Za-z0-9.-]+', '_', spec.name)}-{amp}.json"
    write_text_atomically(path, json.dumps(cal, indent=1) + "\n")
    read_from = gpus.user_calibration_dir()
    read = folder.resolve() == read_from.resolve()
    return (f"recorded in {path} (error on the measured points {current:.1%} -> {fitted:.1%}); "
            + (f"later estimates for {spec.name} at {amp} use it" if read else
               f"estimates read {read_from}, not this folder"))
