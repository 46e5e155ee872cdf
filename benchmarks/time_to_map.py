"""Time to a useful model on the CPU: the kit's ``train`` and Ultralytics' ``YOLO.train`` side by side, each
with its own defaults, on the same shapes data, until the EMA's validation mAP50 reaches a target.

    pip install ultralytics      # a peer, not a dependency of the kit (runs offline: YOLO_OFFLINE=1)
    python benchmarks/time_to_map.py                          # kit (recipe auto), then Ultralytics
    python benchmarks/time_to_map.py --runs kit kit-official  # the kit's two recipes

Each run is a whole command in its own process, one after the other (never two at once: on a small machine
two processes slow each other by several times). The same data (the demo's shapes set: 384 training and 64
validation images at 160 px, 3 classes, written by ``make_shapes``), image size, batch, epochs and device are
given to both; everything else is each system's default (the kit: ``recipe="auto"``, which picks the short
recipe for a run this length; Ultralytics: ``optimizer="auto"``, which picks AdamW). Wall time is read from
the outside: the moment each epoch's row appears in the run's results.csv, counted from the start of the
process (start-up, data checks and validation included, on both sides). A run stops as soon as its mAP50
reaches the target, or after ``--epochs``.
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the column each system writes its validation mAP50 into
MAP50_COLUMN = {"kit": "metrics/mAP50", "ultralytics": "metrics/mAP50(B)"}

ULTRALYTICS = """
import sys
from ultralytics import YOLO
data, epochs, imgsz, batch, project = sys.argv[1:6]
YOLO("yolov9t.yaml").train(data=data, epochs=int(epochs), imgsz=int(imgsz), batch=int(batch), device="cpu",
                           project=project, name="run", exist_ok=True, plots=False, verbose=False)
"""


def _command(run: str, data: Path, args: argparse.Namespace, project: Path) -> tuple[list[str], Path]:
    """The command of one run and the results.csv it writes."""
    if run.startswith("kit"):
        recipe = "official" if run == "kit-official" else "auto"
        cmd = [sys.executable, "-m", "yolo9kit", "train", "--model", "yolov9-t", "--data", str(data),
               "--epochs", str(args.epochs), "--imgsz", str(args.imgsz), "--batch-size", str(args.batch),
               "--device", "cpu", "--no-plots", "--recipe", recipe, "--project", str(project), "--name", "run"]
        return cmd, project / "run" / "results.csv"
    # Ultralytics reads a data.yaml's relative `path` from the working folder, not from the file's folder
    absolute = data.with_name("data-absolute.yaml")
    absolute.write_text(data.read_text().replace("path: .", f"path: {data.parent}"))
    cmd = [sys.executable, "-c", ULTRALYTICS, str(absolute), str(args.epochs), str(args.imgsz), str(args.batch),
           str(project)]
    return cmd, project / "run" / "results.csv"


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as f:
            return [{k.strip(): v.strip() for k, v in row.items() if k} for row in csv.DictReader(f)]
    except (OSError, csv.Error):
        return []


def time_run(run: str, data: Path, args: argparse.Namespace, work: Path) -> dict:
    """Run one command to the target (or its last epoch): mAP50 and wall seconds at the end of each epoch."""
    cmd, results = _command(run, data, args, work / run)
    env = {**os.environ, "YOLO_OFFLINE": "1"}
    log = (work / f"{run}.log").open("w")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
    column = MAP50_COLUMN["ultralytics" if run == "ultralytics" else "kit"]
    epochs: list[tuple[float, float]] = []  # (wall seconds, mAP50) per finished epoch
    while True:
        done = proc.poll() is not None
        rows = _rows(results)
        while len(epochs) < len(rows):
            value = rows[len(epochs)].get(column) or "nan"
            epochs.append((time.perf_counter() - start, float(value)))
        if any(m >= args.target for _, m in epochs) or done:
            break
        time.sleep(0.25)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # the target is reached: the rest of the run is not timed
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
    log.close()
    if not epochs:
        raise SystemExit(f"{run}: no epoch finished; its output is in {work / (run + '.log')}:\n"
                         + (work / f"{run}.log").read_text()[-3000:])
    reached = next((i for i, (_, m) in enumerate(epochs) if m >= args.target), None)
    return {"run": run, "epochs": epochs, "reached": reached}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", choices=("kit", "kit-official", "ultralytics"),
                        default=["kit", "ultralytics"])
    parser.add_argument("--target", type=float, default=0.5, help="mAP50 to reach")
    parser.add_argument("--epochs", type=int, default=30, help="epochs each run is started with (its schedule)")
    parser.add_argument("--imgsz", type=int, default=160)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--keep", type=Path, default=None, help="write the data and runs here (default: a temp dir)")
    args = parser.parse_args(argv)

    from yolo9kit.cli import DEMO_CLASSES
    from yolo9kit.data import make_shapes

    with tempfile.TemporaryDirectory() as tmp:
        work = (args.keep or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        data = make_shapes(work / "shapes", n_train=384, n_val=64, imgsz=args.imgsz, num_classes=DEMO_CLASSES,
                           max_objects=3, seed=0, overwrite=True)  # the demo's data
        rows = [time_run(run, data, args, work) for run in args.runs]
    print(f"shapes data (384 + 64 images, {DEMO_CLASSES} classes), {args.imgsz} px, batch {args.batch}, "
          f"{args.epochs}-epoch schedule, CPU, target mAP50 {args.target}")
    print("| run | epochs to target | wall s to target | s per epoch | mAP50 at epoch 5 / 10 / last |")
    print("|---|---|---|---|---|")
    for row in rows:
        epochs, reached = row["epochs"], row["reached"]
        per_epoch = (epochs[-1][0] - epochs[0][0]) / max(len(epochs) - 1, 1)
        at = " / ".join(f"{epochs[i][1]:.3f}" if i < len(epochs) else "-" for i in (4, 9)) + \
            f" / {epochs[-1][1]:.3f} (epoch {len(epochs)})"
        to_target = (f"{reached + 1}", f"{epochs[reached][0]:.0f}") if reached is not None else \
            (f"not in {len(epochs)}", "-")
        print(f"| {row['run']} | {to_target[0]} | {to_target[1]} | {per_epoch:.1f} | {at} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
