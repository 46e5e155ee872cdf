"""The deployed model as an ONNX file: ``yolo9kit.export(model, "model.onnx", imgsz=640)``.

What the file holds: the deployed model (a YOLOv9 model converted to its GELAN twin, auxiliary branch
dropped, Conv+BN fused: :func:`~yolo9kit.models.to_deploy`; a GELAN model fused), in float32, for one input
size and, by default, any batch size. Its input and outputs:

* ``images``: (B, 3, H, W) float32, RGB in [0, 1], letterboxed to H x W as ``predict`` does.
* ``predictions``: (B, 4 + nc, A) float32, A anchors over the three levels: cx, cy, w, h in input pixels,
  then the class scores in [0, 1]; what :func:`~yolo9kit.detections.non_max_suppression` takes. NMS is the
  caller's (the default).
* with ``nms``: ``detections`` first, (K, 7) float32, one row per kept box of the whole batch:
  ``[image_index, x1, y1, x2, y2, score, class]`` in input pixels, each image's rows by descending score;
  then ``predictions``. The NMS is ONNX's NonMaxSuppression with the official rule of ``detect_dual.py``
  (the best class of each box, score strictly above ``conf``, class-aware by offsetting boxes by class x
  7680, at most ``max_det`` boxes per image), so it equals ``predict``'s NMS; only the official cap of 30000
  candidates before NMS is not applied (a 640-px input has 8400 anchors).

The class names, strides and input size are in the file's metadata (``names``, ``stride``, ``imgsz``).
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import json
import logging
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from yolo9kit.config import PREDICT_NMS, ExportConfig, NMSConfig
from yolo9kit.detections import MAX_WH, non_max_suppression
from yolo9kit.files import refuse_own_input, write_bytes_atomically
from yolo9kit.models import load_model
from yolo9kit.models.deploy import max_stride, prepare_model, select_head

LOGGER = logging.getLogger(__name__)
EXTRA = "pip install 'yolo9kit[export]'"

__all__ = ["ExportCheckError", "ExportReport", "export"]


class ExportCheckError(RuntimeError):
    """ONNX Runtime's outputs differ from PyTorch's by more than the tolerance (the file is kept)."""


@dataclass
class ExportReport:
    """What :func:`export` wrote and how it checked it.

    Attributes:
        path: the ONNX file. input_shape: (batch, 3, h, w), batch ``"batch"`` when dynamic.
        outputs: output names in order. opset: ONNX operator set. nms: the NMS in the file, or None.
        checked: ONNX Runtime ran the file. max_abs_diff: largest |ONNX Runtime - PyTorch| over ``predictions``
        (None when not checked). atol: the tolerance. detections: rows compared with the kit's NMS (with nms).
        note: how it was checked, or why not.
    """

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
        model: a DetectionModel, or anything :func:`~yolo9kit.models.load_model` accepts (checkpoint path,
            model name). Never changed: the export works on its deployed copy, on the CPU in float32.
        path: the .onnx file to write (its folder is made): written whole or not at all, never over the
            weights file it exports (``files.write_file``).
        imgsz: input size (int or (h, w)), rounded up to a multiple of the model stride as ``predict`` does.
        nms: None leaves NMS to the caller (output ``predictions``); an :class:`~yolo9kit.config.NMSConfig`
            puts it in the file (output ``detections`` first), its unset fields taking
            :data:`~yolo9kit.config.PREDICT_NMS` (conf 0.25, iou 0.45, max_det 1000).
        onnx: an :class:`~yolo9kit.config.ExportConfig` (opset, dynamic batch, the check and its tolerance).

    Returns:
        :class:`ExportReport`; the module docstring gives the file's inputs and outputs.

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
                "imgsz": json.dumps(list(size)), "nms": json.dumps(dataclasses.asdict(nms) if nms else None)}
    for key, value in metadata.items():
        proto.metadata_props.add(key=key, value=value)
    onnx_lib.checker.check_model(proto)
    write_bytes_atomically(path, proto.SerializeToString(), inputs=inputs)
    report = ExportReport(path, ("batch" if settings.dynamic_batch else 1, 3, *size),
                          [o.name for o in proto.graph.output], settings.opset, nms, atol=settings.atol)
    if settings.check:
        _check(report, wrapper, settings)
    else:
        report.note = "check switched off"
    LOGGER.debug("exported %s", report.summary())
    return report


def _traced(model: torch.nn.Module, imgsz: int | Sequence[int], settings: ExportConfig):
    """(the ONNX proto of the deployed ``model``'s predictions, the traced wrapper, the input size rounded up
    to the stride), built in memory."""
    onnx_lib = _require("onnx")
    deployed = prepare_model(model, torch.device("cpu"), False, deploy=True, head="main")
    wrapper = _Predictions(deployed).eval()
    stride = max_stride(deployed)
    size = (imgsz, imgsz) if isinstance(imgsz, int) else tuple(imgsz)
    size = tuple(math.ceil(s / stride) * stride for s in size)
    axes = {"images": {0: "batch"}, "predictions": {0: "batch"}} if settings.dynamic_batch else None
    # The TorchScript exporter: torch.export (the default exporter since torch 2.9) does not trace this model
    # (tested with torch 2.14). Its tracer warnings are about the input-size checks, constant for one size.
    extra = {"dynamo": False} if "dynamo" in _parameters(torch.onnx.export) else {}
    buffer = io.BytesIO()  # built in memory: the file is written once, whole (files.write_file)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, (torch.zeros(1, 3, *size),), buffer, input_names=["images"],
                          output_names=["predictions"], opset_version=settings.opset, dynamic_axes=axes, **extra)
    return onnx_lib.load_model_from_string(buffer.getvalue()), wrapper, size


class OnnxRuntimeForward:
    """The deployed ``model`` exported in memory (as :func:`export` writes it, without NMS) and run by ONNX
    Runtime on the CPU with torch's thread count: ``predict(..., backend="onnxruntime")``. Called with float32
    (B, 3, H, W) images of ``size`` (the export size: one shape, any batch), it returns the main head's
    predictions (B, 4 + nc, A) as a tensor, as the model's forward does."""

    def __init__(self, model: torch.nn.Module, imgsz: int | Sequence[int]) -> None:
        ort = _require("onnxruntime")
        proto, _, self.size = _traced(model, imgsz, ExportConfig(check=False))
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        # ONNX Runtime's threads spin for a while after each run by default: they would take the cores from
        # the letterbox, the tensor conversion and the NMS that follow in this process
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run(["predictions"], {"images": images.numpy()})[0])


class OpenVinoForward:
    """The deployed ``model`` exported in memory, as for :class:`OnnxRuntimeForward`, and run by OpenVINO on the
    CPU: ``predict(..., backend="openvino")`` (the openvino extra). In float32 (precision hint ``f32``: on a
    processor with bf16 OpenVINO would otherwise compute in bf16, about 2x faster here and with other scores,
    docs/benchmarks.md), with torch's thread count, tuned for one request at a time."""

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


def _parameters(fn) -> set[str]:
    import inspect

    return set(inspect.signature(fn).parameters)


@torch.no_grad()
def _check(report: ExportReport, wrapper: torch.nn.Module, settings: ExportConfig) -> None:
    """Run the file in ONNX Runtime on a random batch (2 when the batch is dynamic) and compare with PyTorch."""
    try:
        ort = importlib.import_module("onnxruntime")
    except ImportError:
        report.note = f"onnxruntime is not installed, so the file was not run ({EXTRA})"
        LOGGER.warning("%s: %s", report.path, report.note)
        return
    session = ort.InferenceSession(str(report.path), providers=["CPUExecutionProvider"])
    batch = 2 if settings.dynamic_batch else 1
    images = torch.rand(batch, 3, *report.input_shape[2:], generator=torch.Generator().manual_seed(0))
    expected = wrapper(images)
    got = dict(zip(report.outputs, session.run(None, {"images": images.numpy()})))
    report.checked = True
    report.max_abs_diff = float(np.abs(got["predictions"] - expected.numpy()).max())
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
    """The file's detections against the kit's NMS on the same predictions, image by image (the same input, so
    near-equal scores cannot order differently)."""
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
    if opset >= 18:  # ReduceMax's axes moved from an attribute to an input in opset 18
        score = node("ReduceMax", [scores, axis2], "score", keepdims=0)
    else:
        score = node("ReduceMax", [scores], "score", axes=[2], keepdims=0)
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
