"""yolo9kit.predict / yolo9kit.validate: sources, outputs, head selection, metrics end to end.

A stand-in model returns chosen decoded outputs (exact labels from the main head, nothing useful
from the auxiliary one), so the metric pipeline is checked against known answers without training.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from torch import nn

from yolo9kit.config import NMSConfig, SaveConfig
from yolo9kit.models import DualOutput, create_model
from yolo9kit.prediction import predict
from yolo9kit.validate import compare_heads, evaluate

NAMES = ["square", "bar"]


def _write_dataset(root: Path) -> Path:
    """Three 64x96 (h x w) images: two objects, one object, and no labels at all."""
    objects = {"000001": [(0, 10, 10, 40, 40), (1, 50, 20, 90, 30)], "000002": [(1, 5, 30, 60, 60)], "000003": []}
    for split in ("images", "labels"):
        (root / split / "val").mkdir(parents=True, exist_ok=True)
    for stem, boxes in objects.items():
        image = np.full((64, 96, 3), 90, np.uint8)
        lines = []
        for cls, x1, y1, x2, y2 in boxes:
            cv2.rectangle(image, (x1, y1), (x2 - 1, y2 - 1), (20, 200, 240), -1)
            lines.append(f"{cls} {(x1 + x2) / 192} {(y1 + y2) / 128} {(x2 - x1) / 96} {(y2 - y1) / 64}")
        cv2.imwrite(str(root / "images" / "val" / f"{stem}.png"), image)
        (root / "labels" / "val" / f"{stem}.txt").write_text("\n".join(lines))
    data = root / "data.yaml"
    data.write_text(f"path: {root}\ntrain: images/val\nval: images/val\nnames: {NAMES}\n")
    return data


def _batches(root: Path, batch_size: int = 2):
    """(images uint8, targets (N,6), paths, shapes) batches; 64x96 images need no letterbox at 96."""
    paths = sorted(str(p) for p in (root / "images" / "val").glob("*.png"))
    batches = []
    for start in range(0, len(paths), batch_size):
        chunk = paths[start:start + batch_size]
        images, targets, shapes = [], [], []
        for i, path in enumerate(chunk):
            images.append(torch.from_numpy(cv2.imread(path)[..., ::-1].transpose(2, 0, 1).copy()))
            text = Path(path.replace("images", "labels")).with_suffix(".txt").read_text().split()
            for row in np.array(text, dtype=float).reshape(-1, 5):
                targets.append([i, *row])
            shapes.append(((64, 96), ((1.0, 1.0), (0.0, 0.0))))
        batches.append((torch.stack(images), torch.tensor(targets, dtype=torch.float32).reshape(-1, 6), chunk,
                        shapes))
    return batches


class StandIn(nn.Module):
    """Eval-mode outputs: main = the labels of each image as boxes scored 0.9 (+ one wrong low-score box),
    aux = boxes far from every object."""

    def __init__(self, batches, nc: int = 2, dual: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.register_buffer("stride", torch.tensor([8.0, 16.0, 32.0]))
        self.nc, self.names, self.is_dual = nc, list(NAMES[:nc]) + [f"c{i}" for i in range(nc - 2)], dual
        self.outputs = [self._decoded(images, targets) for images, targets, *_ in batches]
        self.calls = 0

    def _decoded(self, images, targets, anchors: int = 8):
        batch, _, height, width = images.shape
        main = torch.zeros(batch, 4 + self.nc, anchors)
        aux = torch.zeros(batch, 4 + self.nc, anchors)
        for i in range(batch):
            rows = targets[targets[:, 0] == i]
            for a, (_, cls, cx, cy, w, h) in enumerate(rows.tolist()):
                main[i, :4, a] = torch.tensor([cx * width, cy * height, w * width, h * height])
                main[i, 4 + int(cls), a] = 0.9
            main[i, :4, anchors - 1] = torch.tensor([width - 16.0, height - 9.0, 6.0, 6.0])  # a false positive
            main[i, 4, anchors - 1] = 0.3
            aux[i, :4] = torch.tensor([2.0, 2.0, 2.0, 2.0])[:, None]
            aux[i, 4:, :] = 0.5
        return aux, main

    def forward(self, x):
        aux, main = self.outputs[self.calls % len(self.outputs)]
        self.calls += 1
        return DualOutput(aux=aux if self.is_dual else None, main=main)


class Blank(nn.Module):
    """A single-head model that never scores anything above 0.01: no detections, no compute."""

    def __init__(self, nc: int = 2):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.register_buffer("stride", torch.tensor([8.0, 16.0, 32.0]))
        self.nc, self.names, self.is_dual = nc, NAMES[:nc], False

    def forward(self, x):
        out = torch.zeros(x.shape[0], 4 + self.nc, 8, dtype=x.dtype)
        out[:, 2:4] = 4.0
        out[:, 4:] = 0.01
        return DualOutput(aux=None, main=out)


@pytest.fixture()
def dataset(tmp_path):
    data = _write_dataset(tmp_path / "toy")
    return data, _batches(tmp_path / "toy")


def test_evaluate_perfect_main_head_and_empty_image(dataset, tmp_path):
    data, batches = dataset
    result = evaluate(StandIn(batches), data, dataloader=batches, device="cpu", plots=True,
                      save_dir=tmp_path / "val", progress_bar=False)
    assert result.seen == 3 and result.instances == 3
    # every label found at IoU 1 before the only false positive: AP is the 101-point maximum 0.995
    assert result.map50 == pytest.approx(0.995) and result.map50_95 == pytest.approx(0.995)
    assert result.fitness == pytest.approx(0.995)
    assert list(result.per_class["instances"]) == [1, 2] and list(result.per_class["images"]) == [1, 2]
    assert result.confusion_matrix.matrix.diagonal()[:2].tolist() == [1, 2]
    for name in ("confusion_matrix.png", "PR_curve.png", "F1_curve.png", "P_curve.png", "R_curve.png"):
        assert (tmp_path / "val" / name).stat().st_size > 0
        assert hasattr(result.figures[name], "savefig")
    assert "all" in result.summary() and result.speed_line().startswith("Speed: ")


def test_evaluate_aux_head_really_uses_aux_output(dataset):
    data, batches = dataset
    aux = evaluate(StandIn(batches), data, dataloader=batches, device="cpu", head="aux", progress_bar=False)
    assert aux.map50 == 0 and aux.head == "aux"
    table = compare_heads(StandIn(batches), data, dataloader=batches, device="cpu", progress_bar=False)
    assert table.loc["main", "mAP50"] == pytest.approx(0.995) and table.loc["aux", "mAP50"] == 0


def test_evaluate_single_head_model_rejects_aux(dataset):
    data, batches = dataset
    with pytest.raises(ValueError, match="auxiliary"):
        evaluate(StandIn(batches, dual=False), data, dataloader=batches, device="cpu", head="aux", progress_bar=False)


def test_evaluate_rejects_class_count_mismatch(dataset):
    data, batches = dataset
    with pytest.raises(ValueError, match="predicts 3 classes but the data .* has 2"):
        evaluate(StandIn(batches, nc=3), data, dataloader=batches, device="cpu", progress_bar=False)


def test_evaluate_coco_json_and_cocoeval(dataset, tmp_path):
    data, batches = dataset
    result = evaluate(StandIn(batches), data, dataloader=batches, device="cpu", coco=True,
                      save_dir=tmp_path / "val", progress_bar=False)
    records = json.loads((tmp_path / "val" / "predictions.json").read_text())
    assert {r["image_id"] for r in records} == {1, 2, 3}  # numeric stems become ints
    first = next(r for r in records if r["image_id"] == 1 and r["category_id"] == 0)
    assert first["bbox"] == [10.0, 10.0, 30.0, 30.0] and first["score"] == 0.9
    # COCOeval reaches 1.0 where the official 101-point trapezoid stops at 0.995 (see docs/validation.md)
    assert result.coco["AP50"] == pytest.approx(1.0) and result.coco["AP50-95"] == pytest.approx(1.0)
    assert result.map50_95 == pytest.approx(0.995)
    again = evaluate(StandIn(batches), data, dataloader=batches, device="cpu", coco=True,
                     coco_gt=tmp_path / "val" / "ground_truth.json", progress_bar=False)  # a COCO JSON file
    assert again.coco == result.coco


def test_coco_records_follow_the_official_rules():
    from yolo9kit.metrics import COCO80_TO_COCO91, coco_predictions, is_coco_val

    det = torch.tensor([[10.12345, 20.0, 30.5, 60.25, 0.123456789, 11.0]])
    (record,) = coco_predictions(det, "images/val2017/000000000139.jpg", COCO80_TO_COCO91)
    assert record == {"image_id": 139, "category_id": 13, "bbox": [10.123, 20.0, 20.377, 40.25], "score": 0.12346}
    assert coco_predictions(det, "a/photo_1.png")[0]["image_id"] == "photo_1"
    assert coco_predictions(det, "a/photo_1.png")[0]["category_id"] == 11
    assert is_coco_val("../datasets/coco/val2017.txt") and not is_coco_val("shapes/images/val")
    assert len(COCO80_TO_COCO91) == 80 and COCO80_TO_COCO91[-1] == 90


def test_evaluate_with_the_data_layer_rect_loader(tmp_path):
    from yolo9kit.data import create_dataloader, make_shapes

    data = make_shapes(tmp_path / "shapes", n_train=2, n_val=5, imgsz=(96, 64), num_classes=3)
    settings = dict(imgsz=96, batch_size=2, workers=0)
    batches = list(create_dataloader(data, "val", augment=False, rect=True, pad=0.5, **settings))
    assert batches[0][0].shape[2:] == (96, 128)  # 64x96 image, rect batch padded by half a stride
    labels = sum(len(b[1]) for b in batches)
    oracle = StandIn(batches, nc=3)  # exact labels in letterboxed pixels: only the padding maps them back
    result = evaluate(oracle, data, device="cpu", progress_bar=False, **settings)
    assert result.seen == 5 and result.instances == labels
    assert result.map50 == pytest.approx(0.995) and result.map50_95 == pytest.approx(0.995)
    assert result.input_shape == (2, 3, 96, 96)


def test_random_model_without_detections_gives_zero_metrics(dataset):
    data, batches = dataset
    model = create_model("gelan-t", num_classes=2)
    result = evaluate(model, data, dataloader=batches, device="cpu", nms=NMSConfig(conf=0.5), progress_bar=False)
    assert result.map50_95 == 0 and result.instances == 3 and model.training  # mode restored
    # every labelled class still gets its row, with zeros (the official table would print none)
    assert list(result.per_class["instances"]) == [1, 2] and (result.per_class["mAP50"] == 0).all()


# ---------------------------------------------------------------------------------------------- predict


def test_predict_writes_labels_that_parse_back(dataset, tmp_path):
    data, batches = dataset
    model = StandIn(batches, dual=True)
    model.outputs = [(aux[:1], main[:1]) for aux, main in model.outputs]  # predict runs batch 1
    model.outputs = [model.outputs[0]]
    out = tmp_path / "detect"
    image = str(data.parent / "images" / "val" / "000001.png")
    results = predict(model, image, imgsz=96, nms=NMSConfig(conf=0.5), device="cpu",
                      save=SaveConfig(out, txt=True, conf=True))
    (result,) = results
    assert result.boxes.tolist() == [[10, 10, 40, 40], [50, 20, 90, 30]]  # back in original pixels
    assert result.classes.tolist() == [0, 1] and result.orig_shape == (64, 96)
    rows = np.loadtxt(out / "labels" / "000001.txt", ndmin=2)
    expected = np.loadtxt(data.parent / "labels" / "val" / "000001.txt", ndmin=2)
    np.testing.assert_allclose(rows[:, :5], expected, atol=1e-6)
    np.testing.assert_allclose(rows[:, 5], 0.9, atol=1e-6)
    assert (out / "000001.png").is_file()
    assert list(results.speed.columns) == ["path", "load_ms", "preprocess_ms", "inference_ms", "nms_ms"]
    assert len(result.to_frame()) == 2 and hasattr(result.plot(), "savefig")


def test_predict_array_sources_and_no_detections():
    model = Blank()
    images = [np.zeros((40, 50, 3), np.uint8), np.full((33, 70, 3), 200, np.uint8)]
    results = predict(model, images, imgsz=64, device="cpu")
    assert [r.orig_shape for r in results] == [(40, 50), (33, 70)]
    assert [len(r) for r in results] == [0, 0] and results[0].input_shape == (64, 64)
    assert "(no detections)" in results[0].summary()
    assert results.to_frame().empty


def test_predict_bad_inputs(tmp_path):
    model = Blank()
    with pytest.raises(FileNotFoundError, match="missing.jpg does not exist"):
        predict(model, tmp_path / "missing.jpg", device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no images found in folder .*empty"):
        predict(model, tmp_path / "empty", device="cpu")
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg")
    good = tmp_path / "good.png"
    cv2.imwrite(str(good), np.zeros((32, 32, 3), np.uint8))
    results = predict(model, [broken, good], imgsz=32, device="cpu")
    assert len(results) == 1 and results[0].path == str(good)
    assert results.skipped == [(str(broken), "OpenCV could not decode it (corrupt or not an image)")]


# ---------------------------------------------------------------------------------------------- CLI


def _cli(argv):
    from yolo9kit.cli import build_parser

    args = build_parser().parse_args(argv)
    return args.func(args)


def test_detect_cli_prints_speed_and_writes_run_folder(dataset, tmp_path, capsys):
    data, _ = dataset
    argv = ["detect", "--weights", "gelan-t", "--source", str(data.parent / "images" / "val"), "--imgsz", "64",
            "--device", "cpu", "--save-txt", "--project", str(tmp_path / "runs"), "--name", "exp"]
    assert _cli(argv) == 0
    assert _cli(argv) == 0  # a second run goes to exp2
    out = capsys.readouterr().out
    assert "image 1/3 " in out and ": 64x64 " in out  # 64x96 letterboxed to imgsz 64 -> 64x64 rectangle
    assert "Speed: " in out and "per image at shape (1, 3, 64, 64)" in out
    speed = json.loads((tmp_path / "runs" / "exp2" / "speed.json").read_text())
    assert speed["images"] == 3 and set(speed["per_image_mean_ms"]) >= {"preprocess_ms", "inference_ms", "nms_ms"}


def test_half_evaluation_leaves_the_callers_fp32_weights_alone(dataset):
    data, batches = dataset
    model = StandIn(batches)
    model.weight.data.fill_(0.1)  # not representable in fp16: a cast round trip would change it
    model.train()
    evaluate(model, data, dataloader=batches, device="cpu", half=True, progress_bar=False)
    assert model.weight.dtype == torch.float32 and model.weight.item() == torch.tensor(0.1).item()
    assert model.training


def test_val_cli_on_a_kit_checkpoint(dataset, tmp_path, capsys):
    from yolo9kit.models.checkpoint import save_checkpoint

    data, _ = dataset
    weights = save_checkpoint(tmp_path / "gelan.pt", create_model("gelan-t", num_classes=2, names=NAMES))
    argv = ["val", "--data", str(data), "--weights", str(weights), "--imgsz", "64", "--batch-size", "2",
            "--workers", "0", "--device", "cpu", "--save-json", "--project", str(tmp_path / "runs")]
    assert _cli(argv) == 0
    out = capsys.readouterr().out
    assert "Class     Images  Instances" in out and "per image at shape (2, 3, 64, 64)" in out
    record = json.loads((tmp_path / "runs" / "exp" / "results.json").read_text())
    assert record["images"] == 3 and record["instances"] == 3 and record["head"] == "main"
    assert (tmp_path / "runs" / "exp" / "confusion_matrix.png").is_file()


def test_figures_render_as_png_for_notebooks(dataset):
    data, batches = dataset
    result = evaluate(StandIn(batches), data, dataloader=batches, device="cpu", plots=True, progress_bar=False)
    for figure in result.figures.values():
        assert figure._repr_png_().startswith(b"\x89PNG")  # what Jupyter shows for the last value of a cell


def test_a_channels_last_model_is_evaluated_in_its_layout_with_the_same_metrics(tmp_path):
    """The shipped shapes model on shapes images, contiguous and channels_last (a trainer's layout on the CPU,
    where oneDNN runs the convolutions): the same detections, so the same metrics."""
    from yolo9kit import create_model
    from yolo9kit.data import make_shapes
    from yolo9kit.models.deploy import inference_layout

    data = make_shapes(tmp_path / "shapes", n_train=1, n_val=8, imgsz=160, num_classes=3, seed=2)
    model = create_model("yolov9-t-shapes").float()
    plain = evaluate(model, data, imgsz=160, device="cpu", progress_bar=False)
    nhwc = model.to(memory_format=torch.channels_last)
    assert inference_layout(nhwc, torch.device("cpu"), own_copy=False) is (
        torch.channels_last if torch.backends.mkldnn.is_available() else torch.contiguous_format)
    fast = evaluate(nhwc, data, imgsz=160, device="cpu", progress_bar=False)
    assert plain.map50 > 0.5
    assert (fast.map50, fast.map50_95, fast.precision, fast.recall) == pytest.approx(
        (plain.map50, plain.map50_95, plain.precision, plain.recall), abs=1e-6)
    assert inference_layout(nn.Conv2d(3, 8, 3), torch.device("cpu"), own_copy=False) is torch.contiguous_format
