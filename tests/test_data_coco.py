"""COCO -> YOLO conversion: round trip, arbitrary category ids, crowd boxes, malformed input."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from yolo9kit.data import check, coco_to_yolo, make_shapes


def _yolo_to_coco(root, split="train", category_ids=(7, 3, 42)) -> dict:
    """Build COCO annotations from a YOLO-format shapes split (pixel xywh, arbitrary category ids)."""
    ids = sorted(category_ids)
    images, annotations = [], []
    for k, lb in enumerate(sorted((root / "labels" / split).glob("*.txt"))):
        w, h = 96, 64
        images.append({"id": 100 + k, "file_name": lb.stem + ".jpg", "width": w, "height": h})
        for c, cx, cy, bw, bh in np.loadtxt(lb, ndmin=2):
            annotations.append({"id": len(annotations), "image_id": 100 + k, "category_id": ids[int(c)],
                                "bbox": [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h], "iscrowd": 0})
    annotations.append({"id": 999, "image_id": 100, "category_id": ids[0], "bbox": [1, 1, 5, 5], "iscrowd": 1})
    categories = [{"id": i, "name": f"cat{i}"} for i in reversed(ids)]
    return {"images": images, "annotations": annotations, "categories": categories}


def test_round_trip(tmp_path):
    src = tmp_path / "src"
    make_shapes(src, n_train=5, n_val=1, imgsz=(96, 64), num_classes=3, seed=2)
    (tmp_path / "ann.json").write_text(json.dumps(_yolo_to_coco(src)))
    out = tmp_path / "out"
    shutil.copytree(src / "images" / "train", out / "images" / "train")
    result = coco_to_yolo(tmp_path / "ann.json", out)
    assert result.names == ["cat3", "cat7", "cat42"] and result.category_ids == [3, 7, 42]
    assert result.n_images == 5 and result.n_crowd_skipped == 1
    for lb in sorted((src / "labels" / "train").glob("*.txt")):
        a = np.loadtxt(lb, ndmin=2)
        b = np.loadtxt(out / "labels" / "train" / lb.name, ndmin=2)
        np.testing.assert_allclose(b[:, 1:], a[:, 1:], atol=2e-6)
        assert b[:, 0].tolist() == a[:, 0].tolist()  # ids 3 < 7 < 42 keep the class order
    train, val = check(result.yaml_path), check(result.yaml_path, "val")  # one image of five held out
    assert train.ok and val.ok and (train.n_images, val.n_images, result.n_val) == (4, 1, 1)
    assert train.n_instances + val.n_instances == result.n_boxes


def test_images_in_their_own_folder_make_a_self_contained_data_set_with_a_validation_split(tmp_path):
    """The usual layout of a COCO export: a JSON and a folder of images elsewhere. The converted set finds
    every label (the images are linked beside them), trains on images it does not validate on, and leaves out
    an image the JSON names that is not there, saying so."""
    from yolo9kit.data import create_dataloader, load_data_config

    src = tmp_path / "src"
    make_shapes(src, n_train=10, n_val=1, imgsz=(96, 64), num_classes=3, seed=2)
    coco = _yolo_to_coco(src)
    coco["images"].append({"id": 999, "file_name": "gone.jpg", "width": 96, "height": 64})
    (tmp_path / "ann.json").write_text(json.dumps(coco))
    photos = tmp_path / "my photos"
    shutil.copytree(src / "images" / "train", photos)
    result = coco_to_yolo(tmp_path / "ann.json", tmp_path / "out", images_dir=photos)
    assert result.n_missing_images == 1 and any("gone.jpg" in line for line in result.skipped)
    data = load_data_config(result.yaml_path)
    train, val = data.images("train"), data.images("val")
    assert (len(train), len(val), result.n_val) == (8, 2, 2) and not {p.name for p in train} & {p.name for p in val}
    for split in ("train", "val"):
        report = check(result.yaml_path, split)
        assert report.ok and report.n_labelled == report.n_images and not report.problems, report.summary()
    assert check(result.yaml_path).n_instances + check(result.yaml_path, "val").n_instances == result.n_boxes
    images, targets, *_ = next(iter(create_dataloader(result.yaml_path, "train", imgsz=96, batch_size=8, workers=0)))
    assert len(targets) > 0  # the labels reach the loader
    assert sorted(p.name for p in photos.iterdir()) == sorted(p.name for p in (src / "images" / "train").iterdir())
    with pytest.raises(ValueError, match="holdout=1.0"):
        coco_to_yolo(tmp_path / "ann.json", tmp_path / "other", images_dir=photos, holdout=1.0)


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON (line 1"),
    ("[]", "top level must be an object"),
    ('{"images": [], "categories": []}', "missing list 'annotations'"),
    ('{"images": [{"id": 1}], "annotations": [], "categories": []}', "an image needs 'id', 'file_name'"),
    ('{"images": [{"id": 1, "file_name": "a.jpg", "width": 10, "height": 10}], "categories": [{"id": 1}],'
     ' "annotations": [{"image_id": 2, "category_id": 1, "bbox": [0, 0, 1, 1]}]}', "unknown image id 2"),
    ('{"images": [{"id": 1, "file_name": "a.jpg", "width": 10, "height": 10}], "categories": [{"id": 1}],'
     ' "annotations": [{"image_id": 1, "category_id": 1, "bbox": [0, 0]}]}', "annotation 0 needs"),
])
def test_malformed_json_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        coco_to_yolo(path, tmp_path / "out")
    assert str(path) in str(info.value)
