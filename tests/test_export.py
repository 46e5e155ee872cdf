"""ONNX export: the deployed model's file gives PyTorch's outputs in ONNX Runtime (gelan-t directly, yolov9-t
through its deployed form), for batch 1 and 2; the NMS in the file gives predict's detections; a missing
extra is named. Skipped, with the reason, where onnx or onnxruntime are not installed."""

from __future__ import annotations

import sys

import cv2
import numpy as np
import pytest
import torch

from yolo9kit.cli import main
from yolo9kit.config import NMSConfig
from yolo9kit.extras.onnx import ExportCheckError, ExportConfig, ExportReport, _check, _Predictions, export
from yolo9kit.models import create_model
from yolo9kit.models.deploy import select_head

REASON = "the export extra is not installed (pip install 'yolo9kit[export]')"
ATOL = 1e-3  # pixels for boxes, probability for scores; measured with random weights: 3e-5 at most


def _runtime():
    pytest.importorskip("onnx", reason=REASON)
    return pytest.importorskip("onnxruntime", reason=REASON)


def _session(ort, path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gelan-t", "yolov9-t"])
def test_onnx_equals_pytorch_for_batch_1_and_2(name, tmp_path):
    """yolov9-t is exported in its deployed form (main head only): the file still gives the main head of the
    dual model the caller holds, which is left as it was."""
    ort = _runtime()
    import onnx

    torch.manual_seed(0)
    model = create_model(name, num_classes=3).eval()
    keys = set(model.state_dict())
    report = export(model, tmp_path / "m.onnx", imgsz=64)
    assert report.checked and report.max_abs_diff <= ATOL and report.outputs == ["predictions"]
    assert report.input_shape == ("batch", 3, 64, 64)
    assert set(model.state_dict()) == keys and model.is_dual == (name == "yolov9-t")
    graph = onnx.load(str(tmp_path / "m.onnx")).graph
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    session = _session(ort, tmp_path / "m.onnx")
    for batch in (1, 2):
        images = torch.rand(batch, 3, 64, 64, generator=torch.Generator().manual_seed(batch))
        (got,) = session.run(None, {"images": images.numpy()})
        with torch.no_grad():
            expected = select_head(model(images), "main").numpy()
        assert got.shape == expected.shape == (batch, 4 + 3, 84)
        np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)


@pytest.mark.slow
def test_nms_in_the_file_gives_predicts_detections(tmp_path):
    """The shipped shapes model with NMS in the file: on shapes images its detections rows are predict's (one
    class per box, conf 0.25, iou 0.45) to the pixel; the file's metadata names the classes."""
    ort = _runtime()
    import onnx

    from yolo9kit.data import make_shapes
    from yolo9kit.models.checkpoint import SHAPES_CLASSES, SHAPES_IMGSZ, SHAPES_MODEL
    from yolo9kit.prediction import predict

    model = create_model(SHAPES_MODEL).eval()
    make_shapes(tmp_path / "shapes", n_train=3, n_val=1, imgsz=SHAPES_IMGSZ, num_classes=3, seed=7)
    images = [cv2.imread(str(p)) for p in sorted((tmp_path / "shapes" / "images" / "train").iterdir())]
    report = export(model, tmp_path / "m.onnx", imgsz=SHAPES_IMGSZ, nms=NMSConfig())
    # trained weights: 6.7e-4 px measured, inside the default tolerance (0.01) that the check applies
    assert report.outputs == ["detections", "predictions"] and report.checked and report.max_abs_diff <= 1e-2
    metadata = {p.key: p.value for p in onnx.load(str(tmp_path / "m.onnx")).metadata_props}
    assert metadata["names"] == '["' + '", "'.join(SHAPES_CLASSES) + '"]'
    batch = np.stack([im[..., ::-1].transpose(2, 0, 1) for im in images]).astype(np.float32) / 255  # square: no pad
    detections, _ = _session(ort, tmp_path / "m.onnx").run(None, {"images": batch})
    expected = predict(model, images, imgsz=SHAPES_IMGSZ, device="cpu", half=False)  # the file is FP32
    assert sum(len(r) for r in expected) > 0
    for index, result in enumerate(expected):
        rows = detections[detections[:, 0] == index]
        assert len(rows) == len(result)
        np.testing.assert_array_equal(rows[:, 1:5].round(), result.boxes)
        np.testing.assert_allclose(rows[:, 5], result.scores, atol=ATOL)
        np.testing.assert_array_equal(rows[:, 6].astype(np.int64), result.classes)


@pytest.mark.slow
def test_fixed_batch_and_no_check(tmp_path):
    _runtime()
    import onnx

    model = create_model("gelan-t", num_classes=2)
    report = export(model, tmp_path / "fixed.onnx", imgsz=(64, 96), onnx=ExportConfig(dynamic_batch=False,
                                                                                         check=False))
    assert report.input_shape == (1, 3, 64, 96) and not report.checked and report.max_abs_diff is None
    dims = onnx.load(str(tmp_path / "fixed.onnx")).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [1, 3, 64, 96]


@pytest.mark.slow
def test_the_check_fails_on_outputs_that_differ(tmp_path):
    """A file whose outputs are not the model's is refused with the difference and the tolerance."""
    _runtime()
    model = create_model("gelan-t", num_classes=2)
    report = export(model, tmp_path / "m.onnx", imgsz=64, onnx=ExportConfig(check=False))

    class Shifted(_Predictions):
        def forward(self, images):
            return super().forward(images) + 0.5

    wrong = ExportReport(report.path, report.input_shape, report.outputs, report.opset, None)
    with pytest.raises(ExportCheckError, match=r"differ by up to 0\.5 \(tolerance 0\.01\)"):
        _check(wrong, Shifted(model.eval()), ExportConfig())


def test_a_missing_extra_is_named(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx now raises ImportError
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'yolo9kit\[export\]'"):
        export("gelan-t", tmp_path / "m.onnx", imgsz=64)
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.slow
def test_without_onnxruntime_the_file_is_written_and_the_report_says_unchecked(monkeypatch, tmp_path):
    pytest.importorskip("onnx", reason=REASON)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    report = export(create_model("gelan-t", num_classes=2), tmp_path / "m.onnx", imgsz=64)
    assert (tmp_path / "m.onnx").is_file() and not report.checked
    assert "onnxruntime is not installed" in report.note and "yolo9kit[export]" in report.note


@pytest.mark.slow
def test_export_cli(tmp_path, capsys):
    _runtime()
    out = tmp_path / "gelan.onnx"
    code = main(["export", "gelan-t", "--imgsz", "64", "--out", str(out), "--nms", "--conf-thres", "0.3"])
    printed = capsys.readouterr().out
    assert code == 0 and out.is_file(), printed
    assert "outputs detections, predictions" in printed and "Checked: ONNX Runtime = PyTorch" in printed
    assert main(["export", "gelan-t", "--iou-thres", "0.5"]) == 2
    assert "--iou-thres set the NMS in the file: add --nms" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_an_exported_backend_of_predict_detects_what_the_torch_model_detects(tmp_path, backend):
    """``predict(..., backend=...)`` runs the deployed model exported in memory, in ONNX Runtime or OpenVINO:
    its predictions are the model's within the export check's tolerance, and its detections those of the
    torch path letterboxed to the same full size (a batch above 1), box for box."""
    _runtime()
    if backend == "openvino":
        pytest.importorskip("openvino", reason="the openvino extra is not installed (pip install "
                            "'yolo9kit[openvino]')")
    from yolo9kit import predict
    from yolo9kit.data import make_shapes
    from yolo9kit.extras.onnx import OnnxRuntimeForward, OpenVinoForward
    from yolo9kit.models.deploy import prepare_model

    model = create_model("yolov9-t-shapes").eval()
    folder = make_shapes(tmp_path / "shapes", n_train=2, n_val=6, imgsz=160).parent / "images" / "val"
    images = sorted(str(p) for p in folder.glob("*.jpg"))
    forward = (OnnxRuntimeForward if backend == "onnxruntime" else OpenVinoForward)(model, 160)
    x = torch.rand(2, 3, 160, 160, generator=torch.Generator().manual_seed(0))
    deployed = prepare_model(model, torch.device("cpu"), torch.float32, deploy=True)
    assert (forward(x) - select_head(deployed(x.contiguous()))).abs().max() <= ExportConfig().atol
    by_torch = predict(model, images, imgsz=160, batch_size=2, device="cpu", half=False)  # the file is FP32
    by_exported = predict(model, images, imgsz=160, backend=backend)
    assert sum(len(p.boxes) for p in by_exported) > 0
    for a, b in zip(by_torch, by_exported, strict=True):
        assert len(a.boxes) == len(b.boxes) and (a.classes == b.classes).all() and a.input_shape == b.input_shape
        assert np.abs(a.boxes - b.boxes).max(initial=0) <= 1  # whole pixels: rounded after scaling
        assert np.abs(a.scores - b.scores).max(initial=0) <= ExportConfig().atol
    for wrong in ({"half": True}, {"head": "aux"}, {"compile": True}, {"deploy": False}):
        with pytest.raises(ValueError, match=f"backend='{backend}' runs the deployed model"):
            predict(model, images[:1], imgsz=160, backend=backend, **wrong)
    with pytest.raises(ValueError, match="backend='tensorrt': expected one of"):
        predict(model, images[:1], backend="tensorrt")
