"""The synthetic shapes data set: deterministic, exact boxes, valid YOLO format."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import yaml

from yolo9kit.data import check, make_shapes
from yolo9kit.data.shapes import _background, _draw_image


def _digest(root):
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in {".jpg", ".txt", ".yaml"})
    return {str(p.relative_to(root)): hashlib.md5(p.read_bytes()).hexdigest() for p in files}


def test_same_seed_same_files(tmp_path):
    make_shapes(tmp_path / "a", n_train=6, n_val=2, imgsz=96, seed=3)
    make_shapes(tmp_path / "b", n_train=6, n_val=2, imgsz=96, seed=3)
    make_shapes(tmp_path / "c", n_train=6, n_val=2, imgsz=96, seed=4)
    a, b, c = _digest(tmp_path / "a"), _digest(tmp_path / "b"), _digest(tmp_path / "c")
    assert a == b and len(a) == 6 + 2 + 6 + 2 + 1
    assert a != c


def test_layout_and_check(tmp_path):
    path = make_shapes(tmp_path, n_train=10, n_val=3, imgsz=(128, 96), num_classes=5, seed=0)
    config = yaml.safe_load(path.read_text())
    assert config["names"] == ["rectangle", "ellipse", "triangle", "star", "cross"]
    report = check(path, "train")
    assert report.ok and not report.problems and report.n_labelled == 10
    assert check(path, "val").n_usable == 3
    classes = np.concatenate([np.loadtxt(p, ndmin=2)[:, 0] for p in (tmp_path / "labels/train").glob("*.txt")])
    assert set(classes.astype(int)) <= set(range(5)) and len(set(classes)) > 1
    with pytest.raises(ValueError, match="num_classes"):
        make_shapes(tmp_path / "x", num_classes=9)


@pytest.mark.parametrize("index", range(6))
def test_box_is_the_exact_pixel_extent(index):
    """With one object, the pixels that differ from the background span exactly the box."""
    height, width = 80, 112
    rng = np.random.default_rng([7, 0, index])
    image, labels = _draw_image(rng, height, width, num_classes=8, max_objects=1)
    background = _background(np.random.default_rng([7, 0, index]), height, width)
    ys, xs = np.nonzero((image != background).any(-1))
    (cls, cx, cy, w, h), = labels
    assert xs.min() == pytest.approx((cx - w / 2) * width, abs=1e-6)
    assert xs.max() + 1 == pytest.approx((cx + w / 2) * width, abs=1e-6)
    assert ys.min() == pytest.approx((cy - h / 2) * height, abs=1e-6)
    assert ys.max() + 1 == pytest.approx((cy + h / 2) * height, abs=1e-6)
