"""``python -m yolo9kit val``: validate a model on a data set, as the official ``val_dual.py``.

Prints the official table and ``Speed:`` line; writes the plots, ``results.json`` and, with
``--save-json``, COCO predictions and the COCOeval numbers into ``<project>/<name>``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from yolo9kit.cli.flags import (
    add_model_limit_flag,
    device,
    image_size,
    model_limit,
    non_negative_int,
    positive_int,
    share,
)
from yolo9kit.files import write_text_atomically


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("val", help="validate a model on a data set (val_dual.py flags)")
    p.add_argument("--data", required=True, help="data.yaml")
    p.add_argument("--weights", required=True, help="kit checkpoint, official .pt, or a model name (random weights)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="images per batch (default 32)")
    p.add_argument("--imgsz", "--img", "--img-size", type=image_size, default=640, help="image size (default 640)")
    p.add_argument("--conf-thres", type=share, default=0.001, help="confidence threshold (default 0.001)")
    p.add_argument("--iou-thres", type=share, default=0.7, help="NMS IoU threshold (default 0.7)")
    p.add_argument("--max-det", type=positive_int, default=300, help="maximum detections per image (default 300)")
    p.add_argument("--task", default="val", choices=("train", "val", "test", "speed"),
                   help="split to validate; 'speed' = val split with conf 0.25, IoU 0.45, no JSON, no plots")
    p.add_argument("--device", type=device, default="", help="cuda device (0) or cpu; default: CUDA when available")
    p.add_argument("--workers", type=non_negative_int, default=8, help="data loader workers (default 8)")
    p.add_argument("--single-cls", action="store_true", help="treat all classes as one")
    p.add_argument("--half", action=argparse.BooleanOptionalAction, default="auto",
                   help="FP16 inference (default: on CUDA, off on the CPU; --no-half for the official FP32)")
    p.add_argument("--save-json", action="store_true", help="COCO predictions JSON + pycocotools COCOeval")
    p.add_argument("--coco-gt", default=None, help="COCO ground-truth JSON (default: converted from the labels)")
    p.add_argument("--no-plots", action="store_true", help="skip the confusion matrix and curves")
    # SUPPRESS: left unset, so that ``python -m yolo9kit -v val`` keeps the top-level --verbose (tracebacks too)
    p.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="per-class rows even with 50 classes or more (and tracebacks of errors)")
    p.add_argument("--project", default="runs/val", help="parent folder of the run folder")
    p.add_argument("--name", default="exp", help="run folder name (exp, exp2, ... unless --exist-ok)")
    p.add_argument("--exist-ok", action="store_true", help="reuse an existing run folder")
    p.add_argument("--head", choices=("main", "aux", "both"), default="main",
                   help="head of a YOLOv9 model to evaluate; 'both' prints them side by side")
    add_model_limit_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from yolo9kit.cli.detect import increment_path
    from yolo9kit.config import NMSConfig
    from yolo9kit.models import load_model
    from yolo9kit.validate import compare_heads, evaluate

    speed_task = args.task == "speed"
    model = load_model(args.weights, model_limit(args))  # first: a wrong --weights leaves no empty run folder behind
    save_dir = increment_path(Path(args.project) / args.name, args.exist_ok)  # made once there is a result
    nms = NMSConfig(conf=0.25 if speed_task else args.conf_thres, iou=0.45 if speed_task else args.iou_thres,
                    max_det=args.max_det)  # the official speed task times the detect thresholds
    settings = dict(split="val" if speed_task else args.task, imgsz=args.imgsz, batch_size=args.batch_size, nms=nms,
                    half=args.half, device=args.device or None, single_cls=args.single_cls, workers=args.workers)
    if args.head == "both":
        table = compare_heads(model, args.data, **settings)
        print(table.to_string(float_format="%.4f"))
        write_text_atomically(save_dir / "results.json", table.to_json(orient="index", indent=1))
        print(f"Results saved to {save_dir}")
        return 0
    result = evaluate(model, args.data, head=args.head, plots=not (args.no_plots or speed_task), save_dir=save_dir,
                      coco=args.save_json and not speed_task, coco_gt=args.coco_gt, **settings)
    lines = result.summary().splitlines()
    print("\n".join(lines if getattr(args, "verbose", False) or len(result.names) < 50 else lines[:2]))
    print(result.speed_line())
    if result.coco is not None:
        print("COCOeval (pycocotools):")
        for name, value in result.coco.items():
            print(f"  {name:>20s} {value:.3f}")
    record = {**result.to_dict(), "speed_ms_per_image": result.speed, "images": result.seen,
              "instances": result.instances, "head": result.head, "weights": str(args.weights)}
    write_text_atomically(save_dir / "results.json", json.dumps(record, indent=1))
    print(f"Results saved to {save_dir}")
    return 0
