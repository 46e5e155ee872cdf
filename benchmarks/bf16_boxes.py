"""Do bf16 boxes score as FP32 ones? The shipped shapes model on its validation split, FP32 against bf16.

    python benchmarks/bf16_boxes.py [--val 128] [--imgsz 160] [--weights FILE] [--tolerance 0.005]

``predict`` runs bf16 by default on a CPU that computes it in hardware (``half="auto"``); this checks that its
boxes are as good. The shipped yolov9-t (or ``--weights``) is validated with ``yolo9kit.evaluate`` on the shapes
validation split the notebooks draw from (``make_shapes(n_val=128, imgsz=160, num_classes=3, seed=0)``, never
trained on), with ``half=False`` and ``half="bf16"``, both as trained and as ``predict`` runs it (the deployed
model: auxiliary branch dropped, Conv+BN fused). Prints the mAPs, the differences and a verdict: each bf16
mAP50-95 within ``--tolerance`` of its FP32 one, or not. Exits 1 when not. About a minute on a CPU.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", help="a kit checkpoint (default: the shipped shapes model)")
    p.add_argument("--val", type=int, default=128, help="validation images")
    p.add_argument("--imgsz", type=int, default=160)
    p.add_argument("--tolerance", type=float, default=0.005, help="largest |bf16 - FP32| mAP50-95 that passes")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)

    import torch

    import yolo9kit
    from yolo9kit.data import make_shapes
    from yolo9kit.env import native_cpu_bf16
    from yolo9kit.models.deploy import deploy_for_inference

    if args.threads:
        torch.set_num_threads(args.threads)
    data = make_shapes(Path(tempfile.mkdtemp(prefix="yolo9kit-bf16-")) / "shapes", n_train=0, n_val=args.val,
                       imgsz=args.imgsz, num_classes=3, seed=0)
    model = yolo9kit.create_model(args.weights or "yolov9-t-shapes").eval()
    print(f"{args.weights or 'the shipped shapes model'} on {args.val} shapes validation images at {args.imgsz} px, "
          f"rect batches of 16, on the CPU (bf16 in hardware: {'yes' if native_cpu_bf16() else 'no, emulated'})\n")
    print("| model | FP32 mAP50 | bf16 mAP50 | FP32 mAP50-95 | bf16 mAP50-95 | bf16 - FP32 (mAP50-95) |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for label, run in (("as trained", model), ("deployed (predict's)", deploy_for_inference(model, "main"))):
        fp32, bf16 = (yolo9kit.evaluate(run, data, imgsz=args.imgsz, batch_size=16, device="cpu", half=half,
                                        workers=0, progress_bar=False) for half in (False, "bf16"))
        worst = max(worst, abs(bf16.map50_95 - fp32.map50_95))
        print(f"| {label} | {fp32.map50:.4f} | {bf16.map50:.4f} | {fp32.map50_95:.4f} | {bf16.map50_95:.4f} | "
              f"{bf16.map50_95 - fp32.map50_95:+.4f} |", flush=True)
    within = worst <= args.tolerance
    print(f"\nlargest |bf16 - FP32| mAP50-95: {worst:.4f}, {'within' if within else 'NOT within'} {args.tolerance}")
    return 0 if within else 1


if __name__ == "__main__":
    raise SystemExit(main())
