"""``export``: the deployed model as an ONNX file (its inputs and outputs: docs/export.md), ``python -m yolo9kit
export``; and ``predict``'s backends that run it in ONNX Runtime or OpenVINO."""

from __future__ import annotations

import argparse
import importlib
import inspect
import io
import json
import logging
import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from yolo9kit.cli.train import add_model_limit_flag, checked
from yolo9kit.config import PREDICT_NMS, NMSConfig
from yolo9kit.config.step import Settings, declare
from yolo9kit.detections import MAX_WH, non_max_suppression
from yolo9kit.files import refuse_own_input, write_text_atomically
from yolo9kit.models import load_model
from yolo9kit.models.deploy import max_stride, prepare_model, select_head

LOGGER = logging.getLogger(__name__)
NMS_FLAGS = ("conf_thres", "iou_thres", "max_det", "classes", "agnostic_nms")


@dataclass(frozen=True)
class ExportConfig(Settings):
    """How :func:`yolo9kit.extras.export` writes and checks an ONNX file (docs/export.md)."""

    # 17: the newest the exporter writes without warnings; 13: Unsqueeze with axes as an input (the NMS part)
    opset: int = declare(17, "the ONNX operator set", flag="--opset", integer=True, low=13, high=20)
    dynamic_batch: bool = declare(True, "a symbolic batch axis; off: the traced batch of 1 (static-shape compilers)",
                                  flag="--dynamic-batch")
    check: bool = declare(True, "run the file in ONNX Runtime (when installed) and compare with PyTorch",
                          flag="--check")
    atol: float = declare(1e-2, "largest |ONNX Runtime - PyTorch| (pixels, probabilities): a wrong graph, never "
                          "rounding (docs/export.md)", flag="--atol", low=0, low_open=True)


class ExportCheckError(RuntimeError):
    """ONNX Runtime's outputs differ from PyTorch's by more than the tolerance (the file is kept)."""


@dataclass
class ExportReport:
    """What ``export`` wrote (``path``, ``input_shape`` with batch "batch" when dynamic, ``outputs``, ``opset``,
    ``nms``) and how it checked it: ``checked`` (ONNX Runtime ran it), ``max_abs_diff`` over ``predictions`` against
    PyTorch within ``atol``, ``detections`` compared with the kit's NMS, ``note`` (how, or why not)."""

    path: Path
    input_shape: tuple
    outputs: list[str]
    opset: int
    nms: NMSConfig | None
    checked: bool = False
    max_abs_diff: float | None = None
    atol: float = 0.0
    detections: int | None = None
    note: str = ""

    def summary(self) -> str:
        check = (f"ONNX Runtime = PyTorch within {self.atol:g} (max abs diff {self.max_abs_diff:.3g})"
                 if self.checked else "not checked")
        return (f"{self.path}: input {self.input_shape}, outputs {self.outputs}, opset {self.opset}; {check}; "
                f"{self.note}")


def _require(module: str, extra: str = "export"):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        what = "onnx and onnxruntime" if extra == "export" else "onnx and openvino"
        raise ModuleNotFoundError(f"this needs the package {module!r}, which is not installed: pip install "
                                  f"'yolo9kit[{extra}]' (the {extra} extra: {what})") from e


class _Predictions(torch.nn.Module):
    """The deployed model with one output: the main head's decoded (B, 4+nc, A) predictions."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return select_head(self.model(images), "main")


@torch.no_grad()
def export(model, path: str | Path = "model.onnx", *, imgsz: int | Sequence[int] = 640, nms: NMSConfig | None = None,
           onnx: ExportConfig | None = None) -> ExportReport:
    """Write the deployed model as an ONNX file and check it against PyTorch in ONNX Runtime.

    Args:
        model: a DetectionModel (never changed) or what ``load_model`` takes (checkpoint path, model name).
        path: the .onnx file, written whole or not at all, never over the weights file it exports.
        imgsz: input size (int or (h, w)), rounded up to a multiple of the stride as ``predict`` does.
        nms: None leaves NMS to the caller; an ``NMSConfig`` (unset fields: ``PREDICT_NMS``) puts it in the file.
        onnx: an ``ExportConfig`` (opset, dynamic batch, the check and its tolerance).

    Returns:
        ExportReport.

    Raises:
        ModuleNotFoundError: ``onnx`` is not installed (``pip install 'yolo9kit[export]'``).
        ExportCheckError: ONNX Runtime's outputs differ from PyTorch's by more than ``onnx.atol``.
        OwnInputError: ``path`` is the weights file ``model`` names.
        DiskFullError: no room for the file (checked before it is written; an existing file is kept).
    """
    settings = onnx or ExportConfig()
    nms = nms.filled(PREDICT_NMS) if nms is not None else None
    path = Path(path)
    inputs = [model] if isinstance(model, (str, Path)) else []
    refuse_own_input(path, inputs)  # before any work: export X.pt --out X.pt would replace the weights
    onnx_lib = _require("onnx")
    proto, wrapper, size = _traced(load_model(model), imgsz, settings)
    deployed = wrapper.model
    if nms is not None:
        _append_nms(proto, nms, deployed.nc, settings.opset)
    metadata = {"names": json.dumps(list(deployed.names)), "stride": json.dumps([int(s) for s in deployed.stride]),
                "imgsz": json.dumps(list(size)), "nms": json.dumps(asdict(nms) if nms else None)}
    for key, value in metadata.items():
        proto.metadata_props.add(key=key, value=value)
    onnx_lib.checker.check_model(proto)
    write_text_atomically(path, proto.SerializeToString(), inputs=inputs)
    report = ExportReport(path, ("batch" if settings.dynamic_batch else 1, 3, *size),
                          [o.name for o in proto.graph.output], settings.opset, nms, atol=settings.atol)
    if settings.check:
        _check(report, wrapper, settings)
    else:
        report.note = "check switched off"
    LOGGER.debug("exported %s", report.summary())
    return report


def _traced(model: torch.nn.Module, imgsz: int | Sequence[int], settings: ExportConfig):
    """(the ONNX proto of the deployed model's predictions, built in memory; the wrapper; the size rounded up)."""
    onnx_lib = _require("onnx")
    deployed = prepare_model(model, torch.device("cpu"), torch.float32, deploy=True, head="main")
    wrapper = _Predictions(deployed).eval()
    stride = max_stride(deployed)
    size = tuple(math.ceil(s / stride) * stride for s in ((imgsz, imgsz) if isinstance(imgsz, int) else imgsz))
    axes = {"images": {0: "batch"}, "predictions": {0: "batch"}} if settings.dynamic_batch else None
    # the TorchScript exporter, its tracer warnings ignored: docs/export.md, "Why the TorchScript exporter"
    extra = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
    buffer = io.BytesIO()  # built in memory: the file is written once, whole (files.write_file)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, (torch.zeros(1, 3, *size),), buffer, input_names=["images"],
                          output_names=["predictions"], opset_version=settings.opset, dynamic_axes=axes, **extra)
    return onnx_lib.load_model_from_string(buffer.getvalue()), wrapper, size


class OnnxRuntimeForward:
    """``predict(..., backend="onnxruntime")``: the deployed model exported in memory, run by ONNX Runtime on the
    CPU with torch's threads; called with (B, 3, H, W) float32 images of ``size``, it returns the predictions."""

    def __init__(self, model: torch.nn.Module, imgsz: int | Sequence[int]) -> None:
        ort = _require("onnxruntime")
        proto, _, self.size = _traced(model, imgsz, ExportConfig(check=False))
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        # its threads would spin after each run, taking the cores from the letterbox and NMS that follow
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run(["predictions"], {"images": images.numpy()})[0])


class OpenVinoForward:
    """``predict(..., backend="openvino")``: as ``OnnxRuntimeForward``, run by OpenVINO, in float32 (on a bf16
    processor it would compute in bf16, with other scores: docs/benchmarks.md), tuned for one request at a time."""

    def __init__(self, model: torch.nn.Module, imgsz: int | Sequence[int]) -> None:
        ov = _require("openvino", "openvino")
        proto, _, self.size = _traced(model, imgsz, ExportConfig(check=False))
        core = ov.Core()
        compiled = core.compile_model(core.read_model(proto.SerializeToString()), "CPU", {
            "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": torch.get_num_threads(),
            "PERFORMANCE_HINT": "LATENCY"})
        self.request, self.output = compiled.create_infer_request(), compiled.output("predictions")

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.request.infer({"images": images.numpy()})[self.output].copy())


@torch.no_grad()
def _check(report: ExportReport, wrapper: torch.nn.Module, settings: ExportConfig) -> None:
    """Run the file in ONNX Runtime on a random batch (2 when the batch is dynamic) and compare with PyTorch."""
    try:
        ort = importlib.import_module("onnxruntime")
    except ImportError:
        report.note = "onnxruntime is not installed, so the file was not run (pip install 'yolo9kit[export]')"
        LOGGER.warning("%s: %s", report.path, report.note)
        return
    session = ort.InferenceSession(str(report.path), providers=["CPUExecutionProvider"])
    batch = 2 if settings.dynamic_batch else 1
    images = torch.rand(batch, 3, *report.input_shape[2:], generator=torch.Generator().manual_seed(0))
    got = dict(zip(report.outputs, session.run(None, {"images": images.numpy()})))
    report.checked = True
    report.max_abs_diff = float(np.abs(got["predictions"] - wrapper(images).numpy()).max())
    report.note = f"ONNX Runtime {ort.__version__}, CPU, random batch of {batch}"
    problems = []
    if not report.max_abs_diff <= settings.atol:
        problems.append(f"predictions differ by up to {report.max_abs_diff:.3g} (tolerance {settings.atol:g})")
    if report.nms is not None:  # the NMS part alone: the kit's NMS on the file's own predictions
        problems += _compare_detections(report, got["detections"], torch.from_numpy(got["predictions"]), settings.atol)
    if problems:
        raise ExportCheckError(f"{report.path}: ONNX Runtime's outputs are not PyTorch's: {'; '.join(problems)}. "
                               "The file is kept; export with ExportConfig(check=False) to skip the check")


def _compare_detections(report: ExportReport, rows: np.ndarray, predictions: torch.Tensor, atol: float) -> list[str]:
    """The file's detections against the kit's NMS on the file's own predictions, image by image."""
    nms = report.nms
    kit = non_max_suppression(predictions, nms.conf, nms.iou, nms.classes, nms.agnostic, max_det=nms.max_det)
    report.detections = len(rows)
    report.note += f", {len(rows)} detections compared with the kit's NMS"
    problems, tied = [], 0
    for index, det in enumerate(kit):
        mine, theirs = rows[rows[:, 0] == index][:, 1:], det.numpy()
        if any(len(np.unique(d[:, 4])) < len(d) for d in (mine, theirs)):
            tied += 1  # equal scores: which of the tied boxes survives depends on each NMS's sort; not comparable
            continue
        if mine.shape != theirs.shape:
            problems.append(f"image {index}: {len(mine)} detections, the kit's NMS keeps {len(theirs)}")
        elif len(mine) and np.abs(mine - theirs).max() > atol:
            problems.append(f"image {index}: detections differ by up to {np.abs(mine - theirs).max():.3g}")
    if tied:
        report.note += f" ({tied} image(s) not compared: boxes with equal scores, kept in either NMS's sort order)"
    return problems


def _append_nms(proto, nms: NMSConfig, nc: int, opset: int) -> None:
    """Add the official one-class-per-box NMS after ``predictions``: output ``detections`` (K, 7)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = proto.graph
    nodes = []

    def const(name: str, value, dtype) -> str:
        graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), f"nms/{name}"))
        return f"nms/{name}"

    def node(op: str, inputs: list[str], name: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [f"nms/{name}"], name=f"nms/{name}", **attrs))
        return f"nms/{name}"

    def unsqueeze(x: str, axis: int, name: str) -> str:
        return node("Unsqueeze", [x, const(f"{name}_axis", [axis], np.int64)], name)

    rows = node("Transpose", ["predictions"], "rows", perm=[0, 2, 1])  # (B, A, 4+nc)
    axis2 = const("axis2", [2], np.int64)
    centre = node("Slice", [rows, const("zero", [0], np.int64), const("four", [4], np.int64), axis2], "cxcywh")
    scores = node("Slice", [rows, "nms/four", const("end", [np.iinfo(np.int64).max], np.int64), axis2], "scores")
    # (cx, cy, w, h) @ M = (x1, y1, x2, y2): products by 0, 1 and 0.5 are exact, as the official subtraction
    corners = [[1, 0, 1, 0], [0, 1, 0, 1], [-0.5, 0, 0.5, 0], [0, -0.5, 0, 0.5]]
    boxes = node("MatMul", [centre, const("to_xyxy", corners, np.float32)], "xyxy")
    axes = {} if opset >= 18 else {"axes": [2]}  # ReduceMax's axes moved from an attribute to an input in opset 18
    score = node("ReduceMax", [scores, axis2] if opset >= 18 else [scores], "score", keepdims=0, **axes)
    cls = node("ArgMax", [scores], "class", axis=2, keepdims=0)  # (B, A) int64, the best class
    if nms.classes is not None:  # the official filter keeps a box whose best class is listed: others score 0
        keep = np.isin(np.arange(nc), list(nms.classes)).astype(np.float32)
        score = node("Mul", [score, node("Gather", [const("keep", keep, np.float32), cls], "kept")], "score_kept")
    cls_float = node("Cast", [cls], "class_float", to=TensorProto.FLOAT)
    shifted = boxes
    if not nms.agnostic:
        offset = node("Mul", [cls_float, const("max_wh", MAX_WH, np.float32)], "offset")
        shifted = node("Add", [boxes, unsqueeze(offset, 2, "offset_b")], "shifted")
    selected = node("NonMaxSuppression", [shifted, unsqueeze(score, 1, "score_b"),
                                          const("max_det", [nms.max_det], np.int64),
                                          const("iou", [nms.iou], np.float32), const("conf", [nms.conf], np.float32)],
                    "selected")  # (K, 3): image, class (always 0), anchor
    where = node("Gather", [selected, const("image_anchor", [0, 2], np.int64)], "where", axis=1)
    image = node("Cast", [node("Slice", [selected, "nms/zero", const("one", [1], np.int64), "nms/one"], "image")],
                 "image_float", to=TensorProto.FLOAT)
    columns = [image, node("GatherND", [boxes, where], "kept_boxes"),
               unsqueeze(node("GatherND", [score, where], "kept_score"), 1, "kept_score_col"),
               unsqueeze(node("GatherND", [cls_float, where], "kept_class"), 1, "kept_class_col")]
    nodes.append(helper.make_node("Concat", columns, ["detections"], name="nms/detections", axis=1))
    graph.node.extend(nodes)
    graph.output.insert(0, helper.make_tensor_value_info("detections", TensorProto.FLOAT, ["detections", 7]))


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``python -m yolo9kit export WEIGHTS --out model.onnx``: write, check in ONNX Runtime, say what was written."""
    p = subparsers.add_parser("export", help="write the deployed model as an ONNX file (needs yolo9kit[export])")
    p.add_argument("weights", help="kit checkpoint, official .pt, or a model name (random weights)")
    p.add_argument("--out", help="the .onnx file (default: the weights' name with .onnx, in the current folder)")
    p.add_argument("--imgsz", "--img", "--img-size", type=checked(int, low=1), nargs="+", default=[640],
                   help="h [w] of the input (default 640)")
    p.add_argument("--nms", action="store_true",
                   help="include NMS: output detections (K, 7) [image, x1, y1, x2, y2, score, class] first")
    p.add_argument("--conf-thres", type=checked(float, low=0, high=1), help="with --nms: confidence (default 0.25)")
    p.add_argument("--iou-thres", type=checked(float, low=0, high=1), help="with --nms: NMS IoU (default 0.45)")
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
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if len(args.imgsz) > 2:
        raise ValueError(f"--imgsz: expected one size or h w, got {len(args.imgsz)} values {args.imgsz}")
    given = [f"--{name.replace('_', '-')}" for name in NMS_FLAGS if getattr(args, name) is not None]
    if given and not args.nms:
        raise ValueError(f"{', '.join(given)} set the NMS in the file: add --nms (without it NMS is the caller's)")
    nms = NMSConfig(conf=args.conf_thres, iou=args.iou_thres, max_det=args.max_det, classes=args.classes,
                    agnostic=bool(args.agnostic_nms)) if args.nms else None
    settings = ExportConfig(opset=args.opset, dynamic_batch=args.dynamic_batch, check=args.check, atol=args.atol)
    out = Path(args.out) if args.out else Path(f"{Path(args.weights).stem}.onnx")
    refuse_own_input(out, [args.weights])  # before the weights are read: export X.pt --out X.pt
    imgsz = args.imgsz * 2 if len(args.imgsz) == 1 else args.imgsz
    report = export(load_model(args.weights, args.max_model_bytes), out, imgsz=imgsz, nms=nms, onnx=settings)
    print(f"Wrote {report.path}: input images {report.input_shape}, outputs {', '.join(report.outputs)}, "
          f"opset {report.opset}")
    print(f"Checked: ONNX Runtime = PyTorch within {report.atol:g} (max abs diff {report.max_abs_diff:.3g}); "
          f"{report.note}" if report.checked else f"Not checked: {report.note}")
    return 0
