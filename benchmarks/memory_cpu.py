"""Estimated training-step memory on the CPU: the plain step and the kit's CUDA default step, next to the
official step measured on an H200 (the reference points shipped in ``yolo9kit/memory_calibration``).

    python benchmarks/memory_cpu.py [--models yolov9-t yolov9-s yolov9-c] [--batches 8 64 128] [--no-extras]

"plain" is the step with the official memory layout (NCHW, BatchNorm and SiLU each keeping their own
activation); "kit default on CUDA" adds channels_last and the lean BatchNorm+SiLU (``yolo9kit.models.layers``),
as ``fit`` runs on a CUDA device. Both include the dense loss. AMP fp16, 640, 8 boxes per image,
estimated for an H200 (allocator model, no calibration of the kit's own step yet). Also prints the time of
one curve (model build and trace included).

Then (unless ``--no-extras``) the tables of docs/memory.md: the plain step's estimate against every point of
the official H200 reference (peak allocated and reserved, AMP fp16 and off); where the memory of yolov9-t
goes (activations against the whole peak); and yolov9-c with activation checkpointing on an RTX 4090.
"""

from __future__ import annotations

import argparse
import time

from yolo9kit import memory
from yolo9kit.memory.gpus import packaged_calibrations


def official_points() -> dict[tuple[str, int], float]:
    """(model, batch) -> the official step's peak allocated GiB measured on the H200 (fp16, 640)."""
    out = {}
    for cal in packaged_calibrations():
        if cal["kind"] == "reference" and cal["gpu"] == "H200":
            for p in cal["points"]:
                if p["amp"] == "fp16" and p["imgsz"] == 640 and p["checkpoint"] is None:
                    out[p["model"], p["batch_size"]] = p["measured_peak_allocated"] / 2**30
    return out


def reference_table() -> None:
    """The plain step (the official memory layout) estimated for the H200 against each official measurement."""
    points = [p for cal in packaged_calibrations() if cal["kind"] == "reference" and cal["gpu"] == "H200"
              for p in cal["points"] if p["imgsz"] == 640 and p["checkpoint"] is None]
    print("\n| model | batch | AMP | official allocated | estimated allocated | official reserved | estimated reserved "
          "| allocated error | reserved error |\n|---|---|---|---|---|---|---|---|---|")
    curves = {}
    for p in points:
        key = (p["model"], p["amp"])
        if key not in curves:
            step = memory.StepConfig(p["model"], amp=p["amp"], channels_last=False, lean_activations=False)
            batches = sorted({q["batch_size"] for q in points if (q["model"], q["amp"]) == key})
            curves[key] = dict(zip(batches, memory.StepEstimator(step).reports(batches, gpu="H200")))
        r = curves[key][p["batch_size"]]
        a, b = p["measured_peak_allocated"], p["measured_peak_reserved"]
        print(f"| {p['model']} | {p['batch_size']} | {p['amp']} | {a / 2**30:.2f} | {r.peak_allocated / 2**30:.2f} | "
              f"{b / 2**30:.2f} | {r.peak_reserved / 2**30:.2f} | {100 * (r.peak_allocated / a - 1):+.1f} % | "
              f"{100 * (r.peak_reserved / b - 1):+.1f} % |", flush=True)


def breakdown_lines() -> None:
    """How much of the plain yolov9-t fp16 step's peak (H200, 640) the activations are."""
    step = memory.StepConfig("yolov9-t", amp="fp16", channels_last=False, lean_activations=False)
    for r in memory.StepEstimator(step).reports([8, 128], gpu="H200"):
        print(f"yolov9-t, fp16, plain step, batch {r.batch_size}: "
              f"activations {r.breakdown['activations'] / 2**30:.2f} GiB of {r.peak_allocated / 2**30:.2f} GiB "
              f"allocated", flush=True)


def checkpointing_table() -> None:
    """yolov9-c at 640, AMP fp16, fit's CUDA step, estimated for an RTX 4090: device GiB per checkpointing."""
    batches = [16, 32, 64]
    print("\n| checkpoint | " + " | ".join(f"batch {b}" for b in batches) + " | activations at batch 64 |")
    print("|---|" + "---|" * (len(batches) + 1))
    for ckpt in (None, "backbone", "all"):
        step = memory.StepConfig("yolov9-c", amp="fp16", activation_checkpointing=ckpt)
        reports = memory.StepEstimator(step).reports(batches, gpu="RTX 4090")
        cells = [f"{r.device_bytes / 2**30:.1f} GiB" + ("" if r.fits else " (does not fit)") for r in reports]
        activations = reports[-1].breakdown["activations"] / 2**30
        print(f"| {ckpt or 'none'} | " + " | ".join(cells) + f" | {activations:.1f} GiB |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["yolov9-t", "yolov9-s", "yolov9-c", "gelan-s"])
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 64, 128])
    parser.add_argument("--no-extras", action="store_true", help="only the first table (no docs/memory.md tables)")
    args = parser.parse_args()
    official = official_points()
    rows = []
    for model in args.models:
        curves = {}
        for label, fast in (("plain", False), ("kit default on CUDA", True)):
            t = time.perf_counter()
            # fp16 as the official measurement; "plain" turns channels_last and the lean activations off
            switches = {} if fast else {"channels_last": False, "lean_activations": False}
            step = memory.StepConfig(model, amp="fp16", **switches)
            reports = memory.StepEstimator(step).reports(args.batches, gpu="H200")
            curves[label] = ([r.peak_allocated / 2**30 for r in reports], time.perf_counter() - t)
        rows.append((model, curves))
        print(model, {k: ([round(x, 2) for x in v[0]], round(v[1], 1)) for k, v in curves.items()}, flush=True)
    b = " / ".join(str(x) for x in args.batches)
    print(f"\n| model | seconds per curve | plain, GiB at batch {b} | kit default on CUDA, GiB | "
          f"official measured (H200), GiB | kit default / official |")
    print("|---|---|---|---|---|---|")
    for model, curves in rows:
        plain, t = curves["plain"]
        fast, _ = curves["kit default on CUDA"]
        measured = [official.get((model, x)) for x in args.batches]
        ratios = [f"{f / m:.2f}" if m else "-" for f, m in zip(fast, measured)]
        print(f"| {model} | {t:.1f} | {' / '.join(f'{x:.2f}' for x in plain)} | {' / '.join(f'{x:.2f}' for x in fast)} "
              f"| {' / '.join(f'{x:.2f}' if x else '-' for x in measured)} | {' / '.join(ratios)} |")
    if not args.no_extras:
        reference_table()
        print()
        breakdown_lines()
        checkpointing_table()


if __name__ == "__main__":
    main()
