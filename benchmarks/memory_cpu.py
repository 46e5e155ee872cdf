"""Estimated training-step memory on the CPU: the plain step and the kit's CUDA default step, next to the
official step measured on an H200 (the reference points shipped in ``yolo9kit/memory_calibration``).

    python benchmarks/memory_cpu.py [--models yolov9-t yolov9-s yolov9-c] [--batches 8 64 128]

"plain" is the step with the official memory layout (NCHW, BatchNorm and SiLU each keeping their own
activation); "kit default on CUDA" adds channels_last and the lean BatchNorm+SiLU (``yolo9kit.models.lean``),
as ``fit`` runs on a CUDA device. Both include the sync-free (dense) loss. AMP fp16, 640, 8 boxes per image,
estimated for an H200 (allocator model, no calibration of the kit's own step yet). Also prints the time of
one curve (model build and trace included).
"""

from __future__ import annotations

import argparse
import time

from yolo9kit import memory
from yolo9kit.memory.calibration import packaged_calibrations


def official_points() -> dict[tuple[str, int], float]:
    """(model, batch) -> the official step's peak allocated GiB measured on the H200 (fp16, 640)."""
    out = {}
    for cal in packaged_calibrations():
        if cal["kind"] == "reference" and cal["gpu"] == "H200":
            for p in cal["points"]:
                if p["amp"] == "fp16" and p["imgsz"] == 640 and p["checkpoint"] is None:
                    out[p["model"], p["batch_size"]] = p["measured_peak_allocated"] / 2**30
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["yolov9-t", "yolov9-s", "yolov9-c", "gelan-s"])
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 64, 128])
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


if __name__ == "__main__":
    main()
