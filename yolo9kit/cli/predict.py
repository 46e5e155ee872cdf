"""``python -m yolo9kit detect`` and ``val``: detect_dual.py and val_dual.py, their flags and their outputs."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from yolo9kit.cli.train import add_model_limit_flag, add_setting_flag, checked, device
from yolo9kit.config import PREDICT_NMS, VAL_NMS, NMSConfig, SaveConfig
from yolo9kit.files import write_text_atomically
from yolo9kit.models import load_model
from yolo9kit.prediction import SPEED_COLUMNS, predict
from yolo9kit.train.guards import Interrupted, StopSignals
from yolo9kit.train.state import increment_path
from yolo9kit.validate import compare_heads, evaluate


def _add_shared(p: argparse.ArgumentParser, verb: str, nms: NMSConfig, batch_size: int, heads: tuple) -> None:
    """The flags detect and val share, with the official defaults of each (``nms``)."""
    p.add_argument("--weights", required=True, help="kit checkpoint, official .pt, or a model name (random weights)")
    p.add_argument("--batch-size", type=checked(int, low=1), default=batch_size,
                   help=f"images per forward pass (default {batch_size}; detect: above 1, full-size letterbox)")
    for name in ("conf", "iou", "max_det"):  # --conf-thres, --iou-thres, --max-det
        add_setting_flag(p, name, NMSConfig, default=getattr(nms, name))
    p.add_argument("--device", type=device, default="", help="cuda device (0) or cpu; default: CUDA when available")
    p.add_argument("--half", action=argparse.BooleanOptionalAction, default="auto",
                   help="FP16 model and inputs (default: on CUDA; on the CPU FP32, detect bf16 where the CPU has it; "
                   "--no-half for the official FP32)")
    p.add_argument("--head", choices=heads, default="main",
                   help="head of a YOLOv9 model" + ("; 'both' prints them side by side" if "both" in heads else ""))
    p.add_argument("--project", default=f"runs/{verb}", help="parent folder of the run folder")
    p.add_argument("--name", default="exp", help="run folder name (exp, exp2, ... unless --exist-ok)")
    p.add_argument("--exist-ok", action="store_true", help="reuse an existing run folder")
    add_model_limit_flag(p)


def add_detect(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("detect", help="detect objects in images and videos (detect_dual.py flags)")
    _add_shared(p, "detect", PREDICT_NMS, 1, ("main", "aux"))
    p.add_argument("--source", required=True, nargs="+", help="images, videos, folders, globs, .txt lists of them")
    p.add_argument("--imgsz", "--img", "--img-size", type=checked(int, low=1), nargs="+", default=[640],
                   help="h [w] (default 640)")
    p.add_argument("--save-txt", action="store_true", help="write labels/<stem>.txt (cls cx cy w h)")
    p.add_argument("--save-conf", action="store_true", help="add the confidence to --save-txt lines")
    p.add_argument("--nosave", action="store_true", help="do not write annotated images")
    p.add_argument("--classes", type=checked(int, low=0), nargs="+", help="keep only these class ids")
    p.add_argument("--agnostic-nms", action="store_true", help="class-agnostic NMS")
    p.add_argument("--line-thickness", type=checked(int, low=1), default=3, help="box line width in pixels")
    p.add_argument("--vid-stride", type=checked(int, low=1), default=1, help="every k-th frame of a video (1)")
    p.add_argument("--backend", choices=("torch", "onnxruntime", "openvino"), default="torch", help="torch, or the "
                   "model exported in memory and run on the CPU by ONNX Runtime or OpenVINO (their extras)")
    p.set_defaults(func=run_detect)


def add_val(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("val", help="validate a model on a data set (val_dual.py flags)")
    _add_shared(p, "val", VAL_NMS, 32, ("main", "aux", "both"))
    p.add_argument("--data", required=True, help="data.yaml")
    p.add_argument("--imgsz", "--img", "--img-size", type=checked(int, low=1), default=640, help="image size (640)")
    p.add_argument("--task", default="val", choices=("train", "val", "test", "speed"),
                   help="split to validate; 'speed' = val split with conf 0.25, IoU 0.45, no JSON, no plots")
    p.add_argument("--workers", type=checked(int, low=0), default=8, help="data loader workers (default 8)")
    p.add_argument("--single-cls", action="store_true", help="treat all classes as one")
    p.add_argument("--save-json", action="store_true", help="COCO predictions JSON + pycocotools COCOeval")
    p.add_argument("--coco-gt", help="COCO ground-truth JSON (default: converted from the labels)")
    p.add_argument("--no-plots", action="store_true", help="skip the confusion matrix and curves")
    # SUPPRESS: left unset, so that ``python -m yolo9kit -v val`` keeps the top-level --verbose (tracebacks too)
    p.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="per-class rows even with 50 classes or more (and tracebacks of errors)")
    p.set_defaults(func=run_val)


def run_detect(args: argparse.Namespace) -> int:
    if len(args.imgsz) > 2:
        raise ValueError(f"--imgsz: expected one size or h w, got {len(args.imgsz)} values {args.imgsz}")
    imgsz = args.imgsz * 2 if len(args.imgsz) == 1 else args.imgsz
    save_dir = increment_path(Path(args.project) / args.name, args.exist_ok)  # made by predict, once it can run
    nms = NMSConfig(conf=args.conf, iou=args.iou, max_det=args.max_det, classes=args.classes,
                    agnostic=args.agnostic_nms)
    save = SaveConfig(save_dir, txt=args.save_txt, conf=args.save_conf, images=not args.nosave,
                      line_width=args.line_thickness)
    model = load_model(args.weights, args.max_model_bytes)
    try:  # a stop signal raises, so that the video being written is closed (playable)
        with StopSignals() as stop, stop.raising():
            results = predict(model, args.source if len(args.source) > 1 else args.source[0], imgsz=imgsz, nms=nms,
                              save=save, half=args.half, device=args.device or None, head=args.head,
                              batch_size=args.batch_size, vid_stride=args.vid_stride, backend=args.backend,
                              on_result=_print_line)
    except Interrupted as stopped:
        print(f"python -m yolo9kit detect: stopped by {stopped.reason}; what was written so far is in {save_dir}",
              file=sys.stderr)
        return 128 + signal.Signals[stopped.reason]
    for source, reason in results.skipped:
        print(f"skipped {source}: {reason}")
    print(results.speed_line())
    means = {c: float(results.speed[c].mean()) if len(results.speed) else 0.0 for c in ["load_ms", *SPEED_COLUMNS]}
    frames = sum(result.frame is not None for result in results)
    report = {"per_image_mean_ms": means, "images": len(results) - frames, "video_frames": frames,
              "skipped": results.skipped, "shape": [1, 3, *imgsz], "per_image": results.speed.to_dict(orient="records")}
    write_text_atomically(save_dir / "speed.json", json.dumps(report, indent=1))
    print(f"Results saved to {save_dir}")
    if args.save_txt:
        print(f"{len(list((save_dir / 'labels').glob('*.txt')))} labels saved to {save_dir / 'labels'}")
    return 0 if len(results) else 1


def _print_line(result, number: int, inputs: int) -> None:
    """The line of one image or frame, as detect_dual.py prints it, as soon as it is done (flushed for a pipe)."""
    what = "image" if result.frame is None else f"video frame {result.frame}"
    text, _, counts = result.summary().partition(": ")
    print(f"{what} {number}/{inputs} {result.path or 'array'}: {text} {counts}, {result.speed['inference_ms']:.1f}ms",
          flush=True)


def run_val(args: argparse.Namespace) -> int:
    speed_task = args.task == "speed"
    model = load_model(args.weights, args.max_model_bytes)  # first: a wrong --weights leaves no empty run folder behind
    save_dir = increment_path(Path(args.project) / args.name, args.exist_ok)  # made once there is a result
    nms = NMSConfig(conf=0.25 if speed_task else args.conf, iou=0.45 if speed_task else args.iou,
                    max_det=args.max_det)  # the official speed task times the detect thresholds
    settings = dict(split="val" if speed_task else args.task, imgsz=args.imgsz, batch_size=args.batch_size, nms=nms,
                    half=args.half, device=args.device or None, single_cls=args.single_cls, workers=args.workers)
    if args.head == "both":
        table = compare_heads(model, args.data, **settings)
        print(table.to_string(float_format="%.4f"))
        text = table.to_json(orient="index", indent=1)
    else:
        result = evaluate(model, args.data, head=args.head, plots=not (args.no_plots or speed_task),
                          save_dir=save_dir, coco=args.save_json and not speed_task, coco_gt=args.coco_gt, **settings)
        lines = result.summary().splitlines()
        print("\n".join(lines if getattr(args, "verbose", False) or len(result.names) < 50 else lines[:2]))
        print(result.speed_line())
        if result.coco is not None:
            print("COCOeval (pycocotools):")
            for name, value in result.coco.items():
                print(f"  {name:>20s} {value:.3f}")
        text = json.dumps({**result.to_dict(), "speed_ms_per_image": result.speed, "images": result.seen,
                           "instances": result.instances, "head": result.head, "weights": str(args.weights)}, indent=1)
    write_text_atomically(save_dir / "results.json", text)
    print(f"Results saved to {save_dir}")
    return 0
