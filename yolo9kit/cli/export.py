"""``python -m yolo9kit export WEIGHTS --out model.onnx``: the deployed model as an ONNX file.

Writes the file, checks it in ONNX Runtime against PyTorch (when onnxruntime is installed) and prints what
it wrote: input shape, outputs, the largest difference found. The format: ``yolo9kit/export_onnx.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from yolo9kit.cli.train import add_model_limit_flag, checked, model_limit

NMS_FLAGS = ("conf_thres", "iou_thres", "max_det", "classes", "agnostic_nms")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("export", help="write the deployed model as an ONNX file (needs yolo9kit[export])")
    p.add_argument("weights", help="kit checkpoint, official .pt, or a model name (random weights)")
    p.add_argument("--out", help="the .onnx file (default: the weights' name with .onnx, in the current folder)")
    p.add_argument("--imgsz", "--img", "--img-size", type=checked(int, low=1), nargs="+", default=[640],
                   help="h [w] of the input (default 640)")
    p.add_argument("--nms", action="store_true",
                   help="include NMS: output detections (K, 7) [image, x1, y1, x2, y2, score, class] first")
    p.add_argument("--conf-thres", type=checked(float, low=0, high=1),
                   help="with --nms: confidence threshold (default 0.25)")
    p.add_argument("--iou-thres", type=checked(float, low=0, high=1),
                   help="with --nms: NMS IoU threshold (default 0.45)")
    p.add_argument("--max-det", type=checked(int, low=1), help="with --nms: most detections per image (default 1000)")
    p.add_argument("--classes", type=checked(int, low=0), nargs="+", help="with --nms: keep only these class ids")
    p.add_argument("--agnostic-nms", action="store_true", default=None, help="with --nms: class-agnostic NMS")
    p.add_argument("--opset", type=checked(int, low=1), default=17, help="ONNX opset, 13 to 20 (default 17)")
    p.add_argument("--dynamic-batch", action=argparse.BooleanOptionalAction, default=True,
                   help="a symbolic batch axis (default on; off: batch 1)")
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="run the file in ONNX Runtime and compare with PyTorch (default on)")
    p.add_argument("--atol", type=float, default=1e-2,
                   help="largest allowed |ONNX Runtime - PyTorch| in pixels / probability (default 0.01)")
    add_model_limit_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from yolo9kit.config import ExportConfig, NMSConfig
    from yolo9kit.export_onnx import export
    from yolo9kit.files import refuse_own_input
    from yolo9kit.models import load_model

    if len(args.imgsz) > 2:
        raise ValueError(f"--imgsz: expected one size or h w, got {len(args.imgsz)} values {args.imgsz}")
    given = [f"--{name.replace('_', '-')}" for name in NMS_FLAGS if getattr(args, name) is not None]
    if given and not args.nms:
        raise ValueError(f"{', '.join(given)} set the NMS in the file: add --nms (without it NMS is the caller's)")
    nms = NMSConfig(conf=args.conf_thres, iou=args.iou_thres, max_det=args.max_det, classes=args.classes,
                    agnostic=bool(args.agnostic_nms)) if args.nms else None
    settings = ExportConfig(opset=args.opset, dynamic_batch=args.dynamic_batch, check=args.check, atol=args.atol)
    out = Path(args.out) if args.out else Path(f"{Path(args.weights).stem}.onnx")
    imgsz = args.imgsz * 2 if len(args.imgsz) == 1 else args.imgsz
    refuse_own_input(out, [args.weights])  # before the weights are read: export X.pt --out X.pt
    model = load_model(args.weights, model_limit(args))
    report = export(model, out, imgsz=imgsz, nms=nms, onnx=settings)
    print(f"Wrote {report.path}: input images {report.input_shape}, outputs {', '.join(report.outputs)}, "
          f"opset {report.opset}")
    if report.checked:
        print(f"Checked: ONNX Runtime = PyTorch within {report.atol:g} (max abs diff {report.max_abs_diff:.3g}); "
              f"{report.note}")
    else:
        print(f"Not checked: {report.note}")
    return 0
