"""Per-GPU calibration of the estimator, from real measurements: shipped as JSON in
``yolo9kit/memory_calibration/``, and recorded on a user's machine by ``checks(gpu=True)`` in
``~/.cache/yolo9kit/memory_calibration/`` (``user_calibration_dir``), which wins over a shipped one for the
same card and AMP mode.

One file per GPU and source (``benchmarks/memory_gpu.py`` writes one in this format; drop it in the
folder). Keys::

    format: "yolo9kit-memory-calibration", version: 1
    kind: "measured" (the kit's own step, measured by measure()) or "reference" (someone else's step,
          e.g. the official YOLOv9 code: kept for sanity checks, never applied)
    gpu: table name (see yolo9kit.memory.GPUS); gpu_total_bytes; torch; cuda; step (what was run)
    fits: {amp: {"allocated": [a, b], "reserved": [a, b], "n": points, "max_rel_error": float}}
          measured peak = a * estimated peak allocated + b (bytes); for kind "reference" the key
          "reserved_vs_allocated": [a, b] relates the two measured peaks instead
    workspace_bytes, context_bytes: measured cuDNN workspace / CUDA context, or null
    throughput: ThroughputModel fields fitted on this GPU, or null
    points: the rows the fits come from (model, batch_size, imgsz, amp, checkpoint, measured_* and
            estimated_* bytes, step_time_s)
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

LOGGER = logging.getLogger(__name__)
FORMAT = "yolo9kit-memory-calibration"


def _check(data: Any, source: str) -> dict:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{source}: not a memory calibration file (expected \"format\": \"{FORMAT}\")")
    if data.get("kind") not in ("measured", "reference"):
        raise ValueError(f"{source}: \"kind\" must be \"measured\" or \"reference\", got {data.get('kind')!r}")
    if not isinstance(data.get("gpu"), str):
        raise ValueError(f"{source}: \"gpu\" must be a GPU name")
    return data


def read_calibration(path: str | Path) -> dict:
    """Read and check one calibration JSON file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from e
    return _check(data, str(path))


@lru_cache(maxsize=1)
def packaged_calibrations() -> tuple[dict, ...]:
    """Every calibration file shipped in ``yolo9kit/memory_calibration/`` (bad files are skipped with a
    warning naming them)."""
    found = []
    folder = resources.files("yolo9kit") / "memory_calibration"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        try:
            found.append(_check(json.loads(entry.read_text()), entry.name))
        except (ValueError, json.JSONDecodeError) as e:
            LOGGER.warning("skipping calibration file %s: %s", entry.name, e)
    return tuple(found)


def user_calibration_dir() -> Path:
    """Where this machine's own measurements are kept (``checks(gpu=True)`` writes them)."""
    return Path.home() / ".cache" / "yolo9kit" / "memory_calibration"


def user_calibrations() -> tuple[dict, ...]:
    """The calibration files in ``user_calibration_dir()`` (read on each call: a check may just have written
    one; a bad file is skipped with a warning naming it)."""
    folder = user_calibration_dir()
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            found.append(read_calibration(path))
        except (OSError, ValueError) as e:
            LOGGER.warning("skipping calibration file %s: %s", path, e)
    return tuple(found)


def calibration_for(gpu_name: str, amp: str, calibrations: tuple[dict, ...] | None = None) -> dict | None:
    """The measured calibration of ``gpu_name`` for ``amp``, or None (then the allocator model is used).
    By default this machine's own (``user_calibrations``) first, then the shipped ones."""
    for cal in (*user_calibrations(), *packaged_calibrations()) if calibrations is None else calibrations:
        if cal["kind"] == "measured" and not cal.get("smoke") and cal["gpu"] == gpu_name \
                and amp in cal.get("fits", {}):
            return {**cal["fits"][amp], "workspace_bytes": cal.get("workspace_bytes"),
                    "context_bytes": cal.get("context_bytes"), "throughput": cal.get("throughput")}
    return None


def fit_line(x: list[float], y: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a x + b``; with one point, ``a = y / x`` and ``b = 0``."""
    n = len(x)
    if n == 0:
        raise ValueError("fit_line needs at least one point")
    if n == 1:
        return (y[0] / x[0] if x[0] else 1.0), 0.0
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((v - mx) ** 2 for v in x)
    if sxx == 0:
        return 1.0, my - mx
    a = sum((u - mx) * (v - my) for u, v in zip(x, y)) / sxx
    return a, my - a * mx


def calibration_from_points(points: list[dict], gpu_name: str, gpu_bytes: int, *, smoke: bool = False,
                            step: str = "yolo9kit.train.train_step (SGD, clip 10, EMA), synthetic batch") -> dict:
    """A calibration (kind "measured") fitted on measured points, one line per AMP mode.

    Each point: ``amp``, ``estimated_traced_bytes`` (the traced peak the estimate starts from),
    ``measured_peak_allocated``, ``measured_peak_reserved`` and optionally ``context_bytes``; points
    without a measurement (out of memory) are left out of the fits.
    """
    import torch

    fits = {}
    for amp in sorted({p["amp"] for p in points}):
        pts = [p for p in points if p["amp"] == amp and p.get("measured_peak_allocated")]
        if not pts:
            continue
        x = [p["estimated_traced_bytes"] for p in pts]
        a_alloc = fit_line(x, [p["measured_peak_allocated"] for p in pts])
        a_res = fit_line(x, [p["measured_peak_reserved"] for p in pts])
        err = max(abs(a_res[0] * xi + a_res[1] - p["measured_peak_reserved"]) / p["measured_peak_reserved"]
                  for xi, p in zip(x, pts))
        fits[amp] = {"allocated": list(a_alloc), "reserved": list(a_res), "n": len(pts), "max_rel_error": err}
    contexts = [p["context_bytes"] for p in points if p.get("context_bytes")]
    return {"format": FORMAT, "version": 1, "kind": "measured", "smoke": smoke, "gpu": gpu_name,
            "gpu_total_bytes": gpu_bytes, "torch": torch.__version__, "cuda": torch.version.cuda,
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "step": step, "fits": fits,
            "workspace_bytes": None, "context_bytes": int(sorted(contexts)[len(contexts) // 2]) if contexts else None,
            "throughput": None, "points": points}
