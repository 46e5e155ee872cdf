"""What the experiment loggers cost a run: the same short run without a logger, with TensorBoard, with MLflow (its
local SQLite store, or a server) and with both, side by side in one process.

    python benchmarks/loggers.py                                  # 3 rounds, CPU, 128 px shapes
    python benchmarks/loggers.py --rounds 5 --mlflow-uri http://127.0.0.1:5000   # MLflow on a running server

Each round trains every setting once, in turn (so a change in the machine's load spreads over all of them), from
the shipped shapes model with the pictures on (what the loggers copy). Prints each setting's median wall time of
``fit`` and its ratio to the run without a logger: the cost the run sees, including the end of the run, where a
logger sends the weights and its thread is joined.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--imgsz", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mlflow-uri", default=None, help="a tracking server (default: the local SQLite store)")
    args = parser.parse_args()

    from yolo9kit.config import TrainConfig
    from yolo9kit.data import make_shapes
    from yolo9kit.models.checkpoint import SHAPES_CLASSES, SHAPES_WEIGHTS
    from yolo9kit.train.fit import fit

    settings = {"none": (), "tensorboard": ("tensorboard",), "mlflow": ("mlflow",), "both": ("tensorboard", "mlflow")}
    seconds: dict[str, list[float]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as tmp:
        data = make_shapes(Path(tmp) / "shapes", n_train=64, n_val=16, imgsz=args.imgsz,
                           num_classes=len(SHAPES_CLASSES), seed=0)
        for round_ in range(args.rounds):
            for name, loggers in settings.items():
                config = TrainConfig(epochs=args.epochs, batch_size=16, imgsz=args.imgsz, device=args.device,
                                     workers=0, progress_bar=False, project=str(Path(tmp) / "runs"),
                                     name=f"{name}-{round_}", loggers=loggers, mlflow_uri=args.mlflow_uri)
                t0 = time.perf_counter()
                fit(str(SHAPES_WEIGHTS), data, config)
                seconds[name].append(time.perf_counter() - t0)
    base = statistics.median(seconds["none"])
    print(f"yolov9-t (shipped shapes model), {args.epochs} epochs of 64 images at {args.imgsz} px on {args.device}, "
          f"pictures on, {args.rounds} rounds; MLflow at {args.mlflow_uri or 'the local SQLite store'}")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"{name:12s} median {median:6.1f} s  ({', '.join(f'{v:.1f}' for v in values)})  x{median / base:.2f}")


if __name__ == "__main__":
    main()
