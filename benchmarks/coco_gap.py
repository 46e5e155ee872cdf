"""The official mAP against COCOeval on the same predictions: the shipped shapes model on its validation split.

    python benchmarks/coco_gap.py [--val 128] [--imgsz 160] [--conf 0.001 0.25] [--weights FILE]

The shipped yolov9-t (``create_model("yolov9-t-shapes")``; or ``--weights``) is validated with
``yolo9kit.evaluate(..., coco=True)`` on the shapes validation split the notebooks draw from
(``make_shapes(n_val=128, imgsz=160, num_classes=3, seed=0)``, never trained on), at each ``--conf``.
Both methods score the same predictions: the official-method numbers come from the kit's metrics
(equal to the official ``val_dual.py``), the COCOeval numbers from pycocotools on the JSON that evaluate
wrote (ground truth converted from the YOLO labels, no crowd boxes). Prints one Markdown table row per
conf, and the main and auxiliary heads (``compare_heads``) at the first conf. Runs in about a minute on a
CPU. Why the two methods differ: docs/validation.md.
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
    p.add_argument("--conf", type=float, nargs="+", default=[0.001, 0.25])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--work", help="folder for the data and the JSON files (default: a temporary folder)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)

    import torch

    import yolo9kit
    from yolo9kit.config import NMSConfig
    from yolo9kit.data import make_shapes

    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(args.work or tempfile.mkdtemp(prefix="yolo9kit-coco-gap-"))
    data = make_shapes(work / f"shapes-{args.imgsz}", n_train=0, n_val=args.val, imgsz=args.imgsz, num_classes=3,
                       seed=0)
    model = yolo9kit.create_model(args.weights or "yolov9-t-shapes").eval()
    print(f"{args.weights or 'the shipped shapes model'} on {args.val} shapes validation images at {args.imgsz} px, "
          f"rect batches of 16, FP32 on the CPU\n")
    print("| conf | official mAP50 | official mAP50-95 | COCOeval AP50 | COCOeval AP50-95 | COCOeval AR@100 |")
    print("|---|---|---|---|---|---|")
    for conf in args.conf:
        r = yolo9kit.evaluate(model, data, imgsz=args.imgsz, batch_size=16, nms=NMSConfig(conf=conf), coco=True,
                              save_dir=work / f"conf-{conf:g}", device="cpu", half=False, workers=0, progress_bar=False)
        c = r.coco
        print(f"| {conf:g} | {r.map50:.4f} | {r.map50_95:.4f} | {c['AP50']:.4f} | {c['AP50-95']:.4f} | "
              f"{c['AR50-95 maxDets100']:.4f} |", flush=True)
    heads = yolo9kit.compare_heads(model, data, imgsz=args.imgsz, batch_size=16, device="cpu", half=False,
                                   workers=0, progress_bar=False)
    cols = ["mAP50", "mAP50-95"]
    print(f"\ncompare_heads (conf 0.001, as val_dual.py):\n{heads[cols].round(4).to_string()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
