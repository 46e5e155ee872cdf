"""Measure the kit's training step on a GPU, compare with the CPU estimate, write a calibration.

On a CUDA machine (one prepared run)::

    python benchmarks/memory_gpu.py --out runs/memory_gpu

measures yolov9-t/s/c at batches 8..128 (640 px) with AMP fp16, bf16 and fp16 + activation
checkpointing, and for each point:

* the ratio measured / estimated for peak allocated and peak reserved (goal: within 5 %),
* whether the breakdown sums to the measured peak and how much of it the tracker could not name,
* the time cost of checkpointing (step time with / without, same batch),
* whether yolov9-c trains at batch 64, 640 px, within 24 GiB with checkpointing.

Writes ``memory_gpu.json`` (all rows), ``memory_gpu.md`` (a Markdown table) and
``calibration-<gpu>.json`` (the package format: copy it to ``yolo9kit/memory_calibration/``).

``--smoke`` runs the same code path on the CPU with tiny sizes and estimates only (for tests).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch

from yolo9kit.extras.gpu_check import calibration_from_points
from yolo9kit.memory import StepConfig, StepEstimator, measure
from yolo9kit.memory.gpus import resolve_gpu, target_gpu

GIB = 1 << 30
SETTINGS = {"fp16": ("fp16", None), "bf16": ("bf16", None), "fp16+ckpt": ("fp16", "all")}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["yolov9-t", "yolov9-s", "yolov9-c"])
    p.add_argument("--batches", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--imgsz", "--img", dest="imgsz", type=int, default=640)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default="runs/memory_gpu")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, estimate only (tests the script)")
    return p.parse_args(argv)


def run_point(est: StepEstimator, model: str, b: int, amp: str, ckpt, args, gpu, measure_it: bool) -> dict:
    report = est.reports([b], gpu)[0]
    traced, _ = est.memory.peak(b)
    row = {"model": model, "batch_size": b, "imgsz": args.imgsz, "amp": amp, "activation_checkpointing": ckpt,
           "step": est.step.label,
           "estimated_traced_bytes": int(traced), "estimated_peak_allocated": report.peak_allocated,
           "estimated_peak_reserved": report.peak_reserved, "estimated_step_s": report.step_time_s}
    if not measure_it:
        return row
    try:
        m = measure(est.step, b, repeats=args.steps)  # the same step, resolved for this card
    except torch.cuda.OutOfMemoryError:
        return {**row, "oom": True}
    tracked_share = 1 - m.breakdown["workspace_other"] / max(m.peak_allocated, 1)
    return {**row, "oom": False, "measured_peak_allocated": m.peak_allocated,
            "measured_peak_reserved": m.peak_reserved, "measured_step_s": m.step_time_s,
            "measured_images_per_s": m.images_per_s, "context_bytes": m.context_bytes,
            "breakdown": m.breakdown, "breakdown_sums": sum(m.breakdown.values()) == m.peak_allocated,
            "named_share": tracked_share,
            "ratio_allocated": m.peak_allocated / report.peak_allocated,
            "ratio_reserved": m.peak_reserved / report.peak_reserved}


def checks(rows: list[dict]) -> dict:
    measured = [r for r in rows if r.get("measured_peak_allocated")]
    out = {"points": len(rows), "measured": len(measured), "oom": sum(bool(r.get("oom")) for r in rows)}
    if measured:
        out["allocated_within_5pct"] = sum(abs(r["ratio_allocated"] - 1) <= 0.05 for r in measured)
        out["reserved_within_5pct"] = sum(abs(r["ratio_reserved"] - 1) <= 0.05 for r in measured)
        out["breakdown_sums"] = all(r["breakdown_sums"] for r in measured)
        out["min_named_share"] = min(r["named_share"] for r in measured)
    cost = []
    for r in measured:
        if r["activation_checkpointing"]:
            base = next((q for q in measured if q["model"] == r["model"] and q["batch_size"] == r["batch_size"]
                         and q["amp"] == r["amp"] and not q["activation_checkpointing"]), None)
            if base:
                cost.append({"model": r["model"], "batch_size": r["batch_size"],
                             "time_ratio": r["measured_step_s"] / base["measured_step_s"],
                             "memory_ratio": r["measured_peak_reserved"] / base["measured_peak_reserved"]})
    out["checkpoint_cost"] = cost
    c64 = next((r for r in rows if r["model"] == "yolov9-c" and r["batch_size"] == 64 and r["activation_checkpointing"]
                and r["imgsz"] == 640), None)
    if c64 is not None:
        used = c64.get("measured_peak_reserved", c64["estimated_peak_reserved"]) + (c64.get("context_bytes") or 0)
        out["yolov9_c_b64_ckpt_gib"] = used / GIB
        out["yolov9_c_b64_ckpt_within_24gib"] = used <= 24 * GIB and not c64.get("oom")
    return out


def _gib(row: dict, key: str) -> str:
    return "" if row.get(key) is None else f"{row[key] / GIB:.2f}"


def _ratio(row: dict, key: str) -> str:
    return "" if row.get(key) is None else f"{row[key]:.3f}"


def markdown(rows: list[dict]) -> str:
    head = ("| model | batch | amp | ckpt | est. alloc GiB | meas. alloc GiB | ratio | est. reserved GiB | "
            "meas. reserved GiB | ratio | step ms | img/s |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        step = r.get("measured_step_s") or r.get("estimated_step_s") or math.nan
        ips = r.get("measured_images_per_s") or r["batch_size"] / step
        measured = _gib(r, "measured_peak_allocated") or ("OOM" if r.get("oom") else "")
        lines.append(f"| {r['model']} | {r['batch_size']} | {r['amp']} | {r['activation_checkpointing'] or ''} | "
                     f"{_gib(r, 'estimated_peak_allocated')} | {measured} | {_ratio(r, 'ratio_allocated')} | "
                     f"{_gib(r, 'estimated_peak_reserved')} | {_gib(r, 'measured_peak_reserved')} | "
                     f"{_ratio(r, 'ratio_reserved')} | {step * 1000:.0f} | {ips:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        args.models, args.batches, args.imgsz = args.models[:1], [1, 2], 64
        args.settings = ["fp16", "fp16+ckpt"]
    on_gpu = torch.cuda.is_available() and not args.smoke
    if not on_gpu and not args.smoke:
        print("no CUDA device: run with --smoke to test the script on the CPU (estimates only)")
        return 2
    gpu = target_gpu(None) if on_gpu else resolve_gpu("RTX 4090")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, t0 = [], time.perf_counter()
    for model in args.models:
        for setting in args.settings:
            amp, ckpt = SETTINGS[setting]
            # fit's default step on CUDA (channels_last, lean activations, fused optimizer) at this AMP
            est = StepEstimator(StepConfig(model, imgsz=args.imgsz, amp=amp, activation_checkpointing=ckpt))
            print(f"{model} {setting}: traced in {est.trace_seconds:.1f} s", flush=True)
            for b in args.batches:
                rows.append(run_point(est, model, b, amp, ckpt, args, gpu, on_gpu))
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "breakdown"}), flush=True)
    summary = checks(rows)
    meta = {"gpu": gpu.name, "gpu_total_bytes": gpu.total_bytes, "torch": torch.__version__,
            "python": platform.python_version(), "smoke": args.smoke, "seconds": time.perf_counter() - t0}
    (out / "memory_gpu.json").write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1))
    (out / "memory_gpu.md").write_text(markdown(rows))
    cal = calibration_from_points(rows, gpu.name, gpu.total_bytes, smoke=args.smoke)
    cal_name = f"calibration-{gpu.name.replace(' ', '_')}{'-smoke' if args.smoke else ''}.json"
    (out / cal_name).write_text(json.dumps(cal, indent=1))
    print(json.dumps(summary, indent=1))
    print(f"wrote {out / 'memory_gpu.json'}, {out / 'memory_gpu.md'}, {out / cal_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
