"""The shipped shapes model (yolo9kit/models/yolov9-t-shapes.pt): it loads, it finds the shapes of images it
never saw, the notebooks' viewer draws its boxes, and the script that made it writes a loadable checkpoint."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO

from yolo9kit.boxes import box_iou, cxcywh_to_xyxy
from yolo9kit.models import create_model
from yolo9kit.models.checkpoint import SHAPES_CLASSES, SHAPES_IMGSZ, SHAPES_MODEL, SHAPES_WEIGHTS, read_checkpoint

FOUND_IOU = 0.5  # a labelled object counts as found when a box of its class overlaps it this much


@pytest.fixture(scope="module")
def model():
    return create_model(SHAPES_MODEL).eval()


def _labels(image: str, h: int, w: int) -> tuple[np.ndarray, torch.Tensor]:
    from yolo9kit.data import label_path

    rows = np.loadtxt(label_path(image), ndmin=2).reshape(-1, 5)
    return rows[:, 0].astype(int), cxcywh_to_xyxy(torch.from_numpy(rows[:, 1:])) * torch.tensor([w, h, w, h])


def _match(prediction, image: str) -> tuple[int, int, int]:
    """(labelled objects, those found by a box of their class at IoU > FOUND_IOU, boxes that found one)."""
    classes, boxes = _labels(image, *prediction.orig_shape)
    iou = box_iou(torch.from_numpy(prediction.boxes).double(), boxes.double())
    same = torch.from_numpy(prediction.classes[:, None] == classes[None, :])
    hit = (iou > FOUND_IOU) & same  # (boxes, labels)
    return len(classes), int(hit.any(0).sum()), int(hit.any(1).sum())


def test_shipped_file_is_a_small_fp16_kit_checkpoint_of_a_dual_head_yolov9_t():
    assert SHAPES_WEIGHTS.is_file() and SHAPES_WEIGHTS.stat().st_size < 10 * 2**20
    ckpt = read_checkpoint(SHAPES_WEIGHTS)
    floats = [t for t in ckpt["model"].values() if t.is_floating_point()]
    assert floats and all(t.dtype == torch.float16 for t in floats)
    assert ckpt["imgsz"] == SHAPES_IMGSZ and "make_shapes_model.py" in ckpt["command"]
    assert all(0.0 < v <= 1.0 for v in ckpt["map50"].values())
    model = create_model(SHAPES_WEIGHTS)
    assert next(model.parameters()).dtype == torch.float32
    assert tuple(model.names) == SHAPES_CLASSES and model.is_dual


def test_shapes_model_is_packaged_and_not_ignored_by_git():
    import tomllib

    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["yolo9kit"]
    assert "models/*.pt" in data
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: cannot ask git whether the weights file is ignored")
    ignored = subprocess.run(["git", "check-ignore", "-q", str(SHAPES_WEIGHTS)], cwd=REPO)
    assert ignored.returncode == 1, f"{SHAPES_WEIGHTS} is ignored by .gitignore: it must be committed"


@pytest.mark.slow
@pytest.mark.parametrize("side", [SHAPES_IMGSZ, 64, 640], ids=["160px", "64px-smoke-notebooks", "640px-tour"])
def test_shipped_model_finds_the_shapes_of_unseen_images(model, tmp_path, side):
    """Images of a seed no training used, at the sizes the notebooks generate; predicted at SHAPES_IMGSZ."""
    from yolo9kit.data import load_data_config, make_shapes
    from yolo9kit.prediction import predict

    data = make_shapes(tmp_path, n_train=0, n_val=12, imgsz=side, num_classes=3, seed=123)
    images = [str(p) for p in load_data_config(data).val]
    predictions = predict(model, images, imgsz=SHAPES_IMGSZ, device="cpu")
    labelled, found, right = np.sum([_match(p, i) for p, i in zip(predictions, images)], axis=0)
    boxes = sum(len(p) for p in predictions)
    assert found >= 0.8 * labelled, f"{found} of {labelled} labelled shapes found at {side} px"
    assert right >= 0.8 * boxes, f"only {right} of {boxes} boxes are on a labelled shape of their class"


def test_detection_viewer_draws_the_shipped_models_boxes(model, tmp_path):
    from yolo9kit.data import load_data_config, make_shapes
    from yolo9kit.widgets import detection_viewer, output_png

    data = make_shapes(tmp_path, n_train=0, n_val=2, imgsz=64, num_classes=3, seed=5)
    images = [str(p) for p in load_data_config(data).val]
    app = detection_viewer(model, images, imgsz=SHAPES_IMGSZ, conf=0.25, device="cpu")
    shown = app.state["prediction"]
    labelled, found, _ = _match(shown, images[0])
    assert len(shown) > 0 and found >= 1
    assert f": {len(shown)} boxes" in app.figures["image"].axes[0].get_title()
    assert len(app.figures["image"].axes[0].patches) == len(shown)  # one rectangle per box
    assert output_png(app.outputs["image"]) is not None


@pytest.mark.slow
def test_maker_quick_mode_writes_a_loadable_fp16_checkpoint(tmp_path):
    out = tmp_path / "tiny.pt"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_shapes_model.py"), "--quick",
                           "--out", str(out), "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "mAP50 on" in proc.stdout and f"wrote {out}" in proc.stdout
    ckpt = read_checkpoint(out)
    assert ckpt["imgsz"] == 64 and len(ckpt["map50"]) == 2
    assert all(t.dtype == torch.float16 for t in ckpt["model"].values() if t.is_floating_point())
    model = create_model(out).eval()
    assert tuple(model.names) == SHAPES_CLASSES and model.is_dual
    with torch.no_grad():
        assert torch.isfinite(model(torch.rand(1, 3, 64, 64)).main).all()
