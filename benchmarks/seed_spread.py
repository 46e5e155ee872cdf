"""The run-to-run noise of the demo: its recipe trained with several seeds, and the spread of the results.

    python benchmarks/seed_spread.py                 # 3 seeds of the demo (30 epochs, 160 px, CPU, amp auto)
    python benchmarks/seed_spread.py --amp off       # the same in fp32
    python benchmarks/seed_spread.py --seeds 5 --epochs 10
    python benchmarks/seed_spread.py --amp bf16         # the same under bf16 autocast

The data is the demo's (``python -m yolo9kit demo``: 384 training and 64 validation shapes images at 160 px,
written once with the demo's data seed), so only the run's seed changes: the initial weights, the data order and
the augmentation. Runs go one after the other in this process. Prints each seed's last-epoch and best-epoch
mAP (best.pt is the best epoch's, what the demo prints), then mean, standard deviation and range: a difference
between two runs of this size that is inside the range could come from the seed alone.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--imgsz", type=int, default=160)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", default="auto", help="TrainConfig.amp: auto, fp16, bf16 or off")
    args = parser.parse_args()

    from yolo9kit.cli import DEMO_CLASSES, demo_config
    from yolo9kit.data import make_shapes
    from yolo9kit.extras import fit_seeds

    with tempfile.TemporaryDirectory() as tmp:
        data = make_shapes(Path(tmp) / "shapes", n_train=384, n_val=64, imgsz=args.imgsz, num_classes=DEMO_CLASSES,
                           max_objects=3, seed=0)
        config = demo_config(args.epochs, args.imgsz, args.device, Path(tmp)).replace(plots=False, amp=args.amp)
        t0 = time.perf_counter()
        spread = fit_seeds("yolov9-t", data, config, seeds=args.seeds)
        seconds = time.perf_counter() - t0
    print(f"demo recipe, yolov9-t, {args.epochs} epochs at {args.imgsz} px on {args.device}, amp {args.amp}, seeds "
          f"{spread.table['seed'].tolist()} ({seconds / 60:.1f} min in all)")
    print(spread.table.drop(columns="run").round(4).to_string(index=False))
    print(spread.summary().round(4).to_string())


if __name__ == "__main__":
    main()
