"""The demo's training (30 epochs of yolov9-t on 384 + 64 shapes images at 160 px, ``yolo9kit.cli.demo_config``) with
the CPU step the kit picks for this processor, or with the plain fp32 contiguous step it used before:
wall time of ``fit`` and the final mAP50 of the EMA, one run per step.

    python benchmarks/demo_recipe.py --step default plain     # one after the other, on a quiet machine
    python benchmarks/demo_recipe.py --step default --epochs 5

The official train_dual.py on the same recipe: mAP50 0.890 (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

STEPS = {"default": {}, "plain": {"amp": "off", "channels_last": False},
         "bf16": {"amp": "bf16", "channels_last": True}, "fp32-channels-last": {"amp": "off", "channels_last": True}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", nargs="+", choices=sorted(STEPS), default=["default", "plain"])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--imgsz", type=int, default=160)
    args = parser.parse_args(argv)

    from yolo9kit.cli import DEMO_CLASSES, demo_config
    from yolo9kit.data import load_data_config, make_shapes
    from yolo9kit.models import create_model
    from yolo9kit.train.fit import fit

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = make_shapes(Path(tmp) / "shapes", n_train=384, n_val=64, imgsz=args.imgsz, num_classes=DEMO_CLASSES,
                           max_objects=3, seed=0)  # the demo's data
        for name in args.step:
            config = demo_config(args.epochs, args.imgsz, "cpu", Path(tmp) / name).replace(
                plots=False, progress_bar=False, **STEPS[name])
            model = create_model("yolov9-t", names=load_data_config(data).names)
            start = time.perf_counter()
            result = fit(model, data, config)
            seconds = time.perf_counter() - start
            step = result.step
            rows.append((name, f"{step.amp}, {'channels_last' if step.channels_last else 'contiguous'}", seconds,
                         result.results[-1]["metrics/mAP50"]))
    print(f"yolov9-t, demo recipe, {args.epochs} epochs, {args.imgsz} px, CPU")
    print("| step | resolved | fit s | final mAP50 |")
    print("|---|---|---|---|")
    for name, resolved, seconds, map50 in rows:
        print(f"| {name} | {resolved} | {seconds:.0f} | {map50:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
