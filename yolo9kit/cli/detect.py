"""``python -m yolo9kit detect``: detect objects in images and videos, as the official ``detect_dual.py``.

Prints one line per image or video frame as soon as it is done, then the official ``Speed:`` line; writes
annotated images and videos (unless ``--nosave``), ``labels/*.txt`` with ``--save-txt`` and ``speed.json`` (the
per-frame timings included) into ``<project>/<name>``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
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
    p = subparsers.add_parser("detect", help="detect objects in images and videos (detect_dual.py flags)")
    p.add_argument("--weights", required=True, help="kit checkpoint, official .pt, or a model name (random weights)")
    p.add_argument("--source", required=True, nargs="+",
                   help="image or video files, folders, glob patterns, .txt files listing images or videos")
    p.add_argument("--imgsz", "--img", "--img-size", type=image_size, nargs="+", default=[640],
                   help="h [w] (default 640)")
    p.add_argument("--conf-thres", type=share, default=0.25, help="confidence threshold (default 0.25)")
    p.add_argument("--iou-thres", type=share, default=0.45, help="NMS IoU threshold (default 0.45)")
    p.add_argument("--max-det", type=positive_int, default=1000, help="maximum detections per image (default 1000)")
    p.add_argument("--device", type=device, default="", help="cuda device (0) or cpu; default: CUDA when available")
    p.add_argument("--save-txt", action="store_true", help="write labels/<stem>.txt (cls cx cy w h)")
    p.add_argument("--save-conf", action="store_true", help="add the confidence to --save-txt lines")
    p.add_argument("--nosave", action="store_true", help="do not write annotated images")
    p.add_argument("--classes", type=non_negative_int, nargs="+", help="keep only these class ids")
    p.add_argument("--agnostic-nms", action="store_true", help="class-agnostic NMS")
    p.add_argument("--project", default="runs/detect", help="parent folder of the run folder")
    p.add_argument("--name", default="exp", help="run folder name (exp, exp2, ... unless --exist-ok)")
    p.add_argument("--exist-ok", action="store_true", help="reuse an existing run folder")
    p.add_argument("--half", action=argparse.BooleanOptionalAction, default="auto",
                   help="FP16 model and inputs (default: on CUDA, off on the CPU)")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="images per forward pass (above 1: full-size letterbox)")
    p.add_argument("--line-thickness", type=positive_int, default=3, help="box line width in pixels")
    p.add_argument("--head", choices=("main", "aux"), default="main", help="which head of a YOLOv9 model")
    p.add_argument("--vid-stride", type=positive_int, default=1,
                   help="keep every k-th frame of a video (default 1: every frame)")
    p.add_argument("--backend", choices=("torch", "onnxruntime", "openvino"), default="torch",
                   help="torch (default), or onnxruntime / openvino: the deployed model exported in memory and run "
                        "by ONNX Runtime (the export extra) or OpenVINO (the openvino extra) on the CPU, every "
                        "image letterboxed to the full --imgsz")
    add_model_limit_flag(p)
    p.set_defaults(func=run)


def increment_path(path: str | Path, exist_ok: bool = False) -> Path:
    """``runs/exp`` if free (or ``exist_ok``), else the first free ``runs/exp2``, ``runs/exp3``, ..."""
    path = Path(path)
    if exist_ok or not path.exists():
        return path
    n = 2
    while Path(f"{path}{n}").exists():
        n += 1
    return Path(f"{path}{n}")


def run(args: argparse.Namespace) -> int:
    from yolo9kit.config import NMSConfig, SaveConfig
    from yolo9kit.models import load_model
    from yolo9kit.prediction import SPEED_COLUMNS, predict

    if len(args.imgsz) > 2:
        raise ValueError(f"--imgsz: expected one size or h w, got {len(args.imgsz)} values {args.imgsz}")
    imgsz = args.imgsz * 2 if len(args.imgsz) == 1 else args.imgsz
    save_dir = increment_path(Path(args.project) / args.name, args.exist_ok)  # made by predict, once it can run
    nms = NMSConfig(conf=args.conf_thres, iou=args.iou_thres, max_det=args.max_det, classes=args.classes,
                    agnostic=args.agnostic_nms)
    save = SaveConfig(save_dir, txt=args.save_txt, conf=args.save_conf, images=not args.nosave,
                      line_width=args.line_thickness)
    model = load_model(args.weights, model_limit(args))
    source = args.source if len(args.source) > 1 else args.source[0]
    try:
        with _signals_interrupt():  # SIGTERM and SIGHUP stop it as Ctrl-C does: the video being written is closed
            results = predict(model, source, imgsz=imgsz, nms=nms, save=save, half=args.half,
                              device=args.device or None, head=args.head, batch_size=args.batch_size,
                              vid_stride=args.vid_stride, backend=args.backend, on_result=_print_line)
    except _Signalled as stop:
        print(f"python -m yolo9kit detect: stopped by {stop.name}; what was written so far is in {save_dir}",
              file=sys.stderr)
        return 128 + stop.signum
    for source, reason in results.skipped:
        print(f"skipped {source}: {reason}")
    print(results.speed_line())
    means = {c: float(results.speed[c].mean()) if len(results.speed) else 0.0 for c in ["load_ms", *SPEED_COLUMNS]}
    frames = sum(result.frame is not None for result in results)
    report = {"per_image_mean_ms": means, "images": len(results) - frames, "video_frames": frames,
              "skipped": results.skipped,
              "shape": [1, 3, *imgsz], "per_image": results.speed.to_dict(orient="records")}
    write_text_atomically(save_dir / "speed.json", json.dumps(report, indent=1))
    print(f"Results saved to {save_dir}")
    if args.save_txt:
        print(f"{len(list((save_dir / 'labels').glob('*.txt')))} labels saved to {save_dir / 'labels'}")
    return 0 if len(results) else 1


class _Signalled(KeyboardInterrupt):
    def __init__(self, signum: int) -> None:
        self.signum, self.name = signum, signal.Signals(signum).name
        super().__init__(self.name)


@contextlib.contextmanager
def _signals_interrupt():
    """SIGTERM and SIGHUP raise ``_Signalled`` in the main thread (where the default would end the process
    without running ``finally`` blocks: an annotated mp4 would lose its index and not play)."""
    def handler(signum, frame):
        raise _Signalled(signum)

    wanted = [s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    previous = {s: signal.signal(s, handler) for s in wanted} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def _print_line(result, number: int, inputs: int) -> None:
    """The line of one image or frame, as soon as it is done (``number`` of the ``inputs`` files)."""
    what = "image" if result.frame is None else f"video frame {result.frame}"
    print(f"{what} {number}/{inputs} {result.path or 'array'}: {_official_counts(result)}"
          f"{result.speed['inference_ms']:.1f}ms", flush=True)  # flushed: a pipe sees each line when it is done


def _official_counts(result) -> str:
    """``640x480 4 persons, 1 bus, `` as detect_dual.py prints it (``Prediction.summary`` is the readable form)."""
    text, _, counts = result.summary().partition(": ")
    counts = "" if counts == "(no detections)" else counts
    return f"{text} {counts}, " if counts else f"{text} (no detections), "
