"""Augmented boxes stay on their objects; rect shapes, HSV and box filtering follow the official formulas."""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from yolo9kit.data import YOLODataset, rect_batch_shapes
from yolo9kit.data import augment as A

# distinct saturated colours (RGB); one object per image, class = colour index
COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (255, 0, 255), (0, 255, 255)]


@pytest.fixture(scope="module")
def coloured(tmp_path_factory) -> Path:
    """Six images (varied sizes) on a grey background, each with one rectangle of a unique colour."""
    root = tmp_path_factory.mktemp("coloured")
    rng = np.random.default_rng(0)
    for i, colour in enumerate(COLOURS):
        w, h = int(rng.integers(120, 240)), int(rng.integers(120, 240))
        image = np.full((h, w, 3), 60, np.uint8)
        x1, y1 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
        x2, y2 = x1 + int(rng.integers(20, w // 2)), y1 + int(rng.integers(20, h // 2))
        image[y1:y2, x1:x2] = colour[::-1]  # BGR on disk
        (root / "images").mkdir(exist_ok=True)
        (root / "labels").mkdir(exist_ok=True)
        cv2.imwrite(str(root / "images" / f"{i}.png"), image)
        (root / "labels" / f"{i}.txt").write_text(
            f"{i} {(x1 + x2) / 2 / w} {(y1 + y2) / 2 / h} {(x2 - x1) / w} {(y2 - y1) / h}\n")
    (root / "data.yaml").write_text(yaml.safe_dump({"path": str(root), "train": "images", "val": "images",
                                                    "names": [f"c{i}" for i in range(len(COLOURS))]}))
    return root / "data.yaml"


def _check_boxes_on_objects(image: np.ndarray, targets: np.ndarray, tol: float = 2.5, skip_border: bool = False) -> int:
    """Each box must equal the bounding box of its colour's pixels near it (within ``tol`` px).

    ``skip_border``: do not check boxes cut by the image border (a polygon cut there keeps slivers thinner
    than a pixel in its box, by the official rule)."""
    h, w = image.shape[:2]
    boxes = np.stack([(targets[:, 2] - targets[:, 4] / 2) * w, (targets[:, 3] - targets[:, 5] / 2) * h,
                      (targets[:, 2] + targets[:, 4] / 2) * w, (targets[:, 3] + targets[:, 5] / 2) * h], 1)
    n_checked = 0
    for k, cls in enumerate(targets[:, 1]):
        colour = np.array(COLOURS[int(cls)])
        x1, y1, x2, y2 = boxes[k]
        if skip_border and (min(x1, y1) < 1 or x2 > w - 1 or y2 > h - 1):
            continue
        m = 4
        wx1, wy1 = max(int(math.floor(x1)) - m, 0), max(int(math.floor(y1)) - m, 0)
        wx2, wy2 = min(int(math.ceil(x2)) + m, w), min(int(math.ceil(y2)) + m, h)
        window = image[wy1:wy2, wx1:wx2].astype(int)
        mask = (np.abs(window - colour).max(-1) < 60)
        for j in np.flatnonzero(targets[:, 1] == cls):  # another copy of the same object nearby is not ours
            if j != k:
                ox1, oy1, ox2, oy2 = (int(round(v)) for v in boxes[j])
                other = np.zeros((h, w), bool)
                other[max(oy1, 0):oy2, max(ox1, 0):ox2] = True
                other[max(int(y1), 0):int(math.ceil(y2)), max(int(x1), 0):int(math.ceil(x2))] = False
                mask &= ~other[wy1:wy2, wx1:wx2]
        ys, xs = np.nonzero(mask)
        assert xs.size, f"no pixel of colour {colour} under box {x1:.1f},{y1:.1f},{x2:.1f},{y2:.1f}"
        px1, py1, px2, py2 = xs.min() + wx1, ys.min() + wy1, xs.max() + 1 + wx1, ys.max() + 1 + wy1
        assert abs(px1 - x1) <= tol and abs(py1 - y1) <= tol, (cls, (x1, y1, x2, y2), (px1, py1, px2, py2))
        assert abs(px2 - x2) <= tol and abs(py2 - y2) <= tol, (cls, (x1, y1, x2, y2), (px1, py1, px2, py2))
        n_checked += 1
    return n_checked


@pytest.mark.parametrize("cache", [None, "ram"])
def test_mosaic_affine_flip_boxes_stay_on_objects(coloured, cache):
    hyp = {"hsv_h": 0, "hsv_s": 0, "hsv_v": 0, "mixup": 0.0, "fliplr": 0.5, "flipud": 0.5}
    ds = YOLODataset(coloured, "train", imgsz=256, augment=True, hyp=hyp, cache=cache)
    n_boxes = 0
    for epoch in range(8):
        for i in range(len(ds)):
            from yolo9kit.data.dataset import SampleKey

            image, targets, _, shapes = ds[SampleKey(i, epoch, True)]
            assert shapes is None and image.shape == (3, 256, 256)
            n_boxes += _check_boxes_on_objects(image.permute(1, 2, 0).numpy(), targets.numpy())
    assert n_boxes > 40  # the check really ran on many boxes


def test_rotation_shear_and_single_image_path_keep_boxes_on_objects(coloured):
    # rotation makes boxes of rotated rectangles larger than the object: only check containment there
    hyp = {"hsv_h": 0, "hsv_s": 0, "hsv_v": 0, "mixup": 0.0, "mosaic": 0.0, "scale": 0.5}
    ds = YOLODataset(coloured, "train", imgsz=256, augment=True, hyp=hyp)
    from yolo9kit.data.dataset import SampleKey

    n = 0
    for epoch in range(6):
        for i in range(len(ds)):
            image, targets, _, shapes = ds[SampleKey(i, epoch, True)]
            assert shapes is not None  # letterboxed single image
            n += _check_boxes_on_objects(image.permute(1, 2, 0).numpy(), targets.numpy())
    assert n > 20
    ds = YOLODataset(coloured, "train", imgsz=256, augment=True,
                     hyp={**hyp, "mosaic": 1.0, "degrees": 30, "shear": 5})
    for i in range(len(ds)):
        image, targets, _, _ = ds[SampleKey(i, 1, True)]
        image = image.permute(1, 2, 0).numpy()
        for _, cls, cx, cy, bw, bh in targets.numpy():
            mask = (np.abs(image.astype(int) - COLOURS[int(cls)]).max(-1) < 60)
            x1, y1 = int((cx - bw / 2) * 256), int((cy - bh / 2) * 256)
            x2, y2 = math.ceil((cx + bw / 2) * 256), math.ceil((cy + bh / 2) * 256)
            assert mask[max(y1, 0):y2, max(x1, 0):x2].any()


def test_val_path_is_letterbox_of_official_load_image(coloured):
    ds = YOLODataset(coloured, "val", imgsz=256, augment=False, rect=True, batch_size=2, pad=0.5)
    for i in range(len(ds)):
        image, targets, path, shapes = ds[i]
        raw = cv2.imread(path)
        h0, w0 = raw.shape[:2]
        r = 256 / max(h0, w0)
        resized = cv2.resize(raw, (int(w0 * r), int(h0 * r)), interpolation=cv2.INTER_LINEAR)
        from yolo9kit.data import letterbox

        expected, ratio, pad = letterbox(resized, tuple(ds.batch_shapes[ds.batch_index[i]]), auto=False,
                                         scaleup=False)
        assert np.array_equal(image.permute(1, 2, 0).numpy(), expected[..., ::-1])
        assert shapes[0] == (h0, w0) and shapes[1][1] == pad
        _check_boxes_on_objects(image.permute(1, 2, 0).numpy(), targets.numpy(), tol=1.5)


def _official_rect_shapes(wh: np.ndarray, batch_size: int, img_size: int, stride: int, pad: float) -> np.ndarray:
    """The rect batch shapes of the official utils/dataloaders.py LoadImagesAndLabels.__init__, written out
    independently."""
    ar = np.sort(wh[:, 1] / wh[:, 0])
    out = []
    for start in range(0, len(ar), batch_size):
        chunk = ar[start:start + batch_size]
        rel = [chunk.max(), 1] if chunk.max() < 1 else ([1, 1 / chunk.min()] if chunk.min() > 1 else [1, 1])
        out.append(np.ceil(np.array(rel) * img_size / stride + pad).astype(int) * stride)
    return np.array(out)


@pytest.mark.parametrize("pad", [0.0, 0.5])
def test_rect_batch_shapes_equal_official_formula(pad):
    rng = np.random.default_rng(3)
    wh = rng.integers(100, 1400, (37, 2))
    order, shapes = rect_batch_shapes(wh, 8, 640, 32, pad)
    assert np.array_equal(shapes, _official_rect_shapes(wh, 8, 640, 32, pad))
    ar = wh[order, 1] / wh[order, 0]
    assert (np.diff(ar) >= 0).all()
    # hand-computed: 640x480 images (h/w 0.75), pad 0.5 -> [ceil(0.75*20+0.5), ceil(20.5)] * 32 = [512, 672]
    _, s = rect_batch_shapes(np.array([[640, 480]] * 3), 4, 640, 32, 0.5)
    assert s.tolist() == [[512, 672]]


def test_hsv_matches_official_lookup_tables():
    rng = np.random.default_rng(0)
    image = cv2.GaussianBlur(rng.integers(0, 256, (64, 96, 3), dtype=np.uint8), (0, 0), 2)
    for _ in range(10):
        r = rng.uniform(-1, 1, 3) * [0.015, 0.7, 0.4] + 1
        x = np.arange(0, 256, dtype=np.float64)
        hue, sat, val = cv2.split(cv2.cvtColor(image, cv2.COLOR_BGR2HSV))
        hsv = cv2.merge((cv2.LUT(hue, ((x * r[0]) % 180).astype(np.uint8)),
                         cv2.LUT(sat, np.clip(x * r[1], 0, 255).astype(np.uint8)),
                         cv2.LUT(val, np.clip(x * r[2], 0, 255).astype(np.uint8))))
        expected = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
        out = A.bgr_to_rgb(image, r)
        diff = np.abs(out.astype(int) - expected)
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-3


def test_box_candidates_thresholds():
    before = np.array([[0, 0, 10, 10]] * 4, float).T
    after = np.array([[0, 0, 10, 10], [0, 0, 2, 10], [0, 0, 3, 3], [0, 0, 10, 10]], float).T
    keep = A.box_candidates(before, after)
    assert keep.tolist() == [True, False, False, True]
    assert A.box_candidates(before * 10, after).tolist() == [False, False, False, False]  # area ratio < 0.1


def test_affine_statistics_follow_hyp():
    rng = np.random.default_rng(0)
    hyp = A.Hyp()
    zooms, shifts = [], []
    for _ in range(4000):
        M, s = A.random_affine_matrix(rng, hyp, (1280, 1280), (640, 640))
        zooms.append(s)
        shifts.append(M[0, 2] + s * 640)  # T = M translation + s * centre
    zooms, shifts = np.array(zooms), np.array(shifts)
    assert 0.1 <= zooms.min() < 0.12 and 1.88 < zooms.max() <= 1.9
    assert abs(zooms.mean() - 1.0) < 0.03
    assert 0.4 * 640 <= shifts.min() and shifts.max() <= 0.6 * 640


@pytest.fixture(scope="module")
def polygon_data(tmp_path_factory) -> Path:
    """Six images, each with one filled octagon of a unique colour, labelled by its polygon."""
    root = tmp_path_factory.mktemp("polygons")
    (root / "images").mkdir()
    (root / "labels").mkdir()
    rng = np.random.default_rng(1)
    for i, colour in enumerate(COLOURS):
        w, h = int(rng.integers(140, 220)), int(rng.integers(140, 220))
        image = np.full((h, w, 3), 60, np.uint8)
        x0, y0 = int(rng.integers(5, w // 3)), int(rng.integers(5, h // 3))
        size, a = int(rng.integers(30, 60)), int(rng.integers(5, 12))
        octagon = np.array([[a, 0], [size - a, 0], [size, a], [size, size - a], [size - a, size], [a, size],
                            [0, size - a], [0, a]])
        pts = octagon + (x0, y0)
        cv2.fillPoly(image, [pts.astype(np.int32)], colour[::-1])
        cv2.imwrite(str(root / "images" / f"{i}.png"), image)
        # the polygon through the outer pixel edges of the filled shape (flat extremes, no thin tips)
        edge = pts + (octagon > size / 2)
        coords = " ".join(f"{x / w:.6f} {y / h:.6f}" for x, y in edge)
        (root / "labels" / f"{i}.txt").write_text(f"{i} {coords}\n")
    (root / "data.yaml").write_text(yaml.safe_dump({"path": str(root), "train": "images", "val": "images",
                                                    "names": [f"c{i}" for i in range(len(COLOURS))]}))
    return root / "data.yaml"


def test_polygon_labels_are_reboxed_from_the_transformed_polygon(polygon_data):
    from yolo9kit.data.dataset import SampleKey

    # with rotation, boxes of transformed box corners would be far too large; polygon boxes stay tight
    hyp = {"hsv_h": 0, "hsv_s": 0, "hsv_v": 0, "mixup": 0.0, "copy_paste": 0.0, "degrees": 30}
    ds = YOLODataset(polygon_data, "train", imgsz=256, augment=True, hyp=hyp)
    assert all(len(s) == 1 for s in ds.segments)
    n_boxes = 0
    for epoch in range(6):
        for i in range(len(ds)):
            image, targets, _, _ = ds[SampleKey(i, epoch, True)]
            n_boxes += _check_boxes_on_objects(image.permute(1, 2, 0).numpy(), targets.numpy(), tol=3.0,
                                               skip_border=True)
    assert n_boxes > 40


def test_copy_paste_puts_mirrored_objects_under_new_boxes(polygon_data):
    """Pasted objects may hide up to 30 % of others (official rule), so only containment is checked."""
    from yolo9kit.data.dataset import SampleKey

    hyp = {"hsv_h": 0, "hsv_s": 0, "hsv_v": 0, "mixup": 0.0, "copy_paste": 1.0}
    ds = YOLODataset(polygon_data, "train", imgsz=256, augment=True, hyp=hyp)
    n_pasted = 0
    for epoch in range(6):
        for i in range(len(ds)):
            image, targets, _, _ = ds[SampleKey(i, epoch, True)]
            image = image.permute(1, 2, 0).numpy().astype(int)
            classes = targets[:, 1].long().tolist()
            n_pasted += len(classes) - len(set(classes))  # a class twice: an object and its mirror
            for _, cls, cx, cy, bw, bh in targets.numpy():
                ys, xs = np.nonzero(np.abs(image - COLOURS[int(cls)]).max(-1) < 60)
                x1, y1, x2, y2 = (cx - bw / 2) * 256, (cy - bh / 2) * 256, (cx + bw / 2) * 256, (cy + bh / 2) * 256
                inside = (xs >= x1 - 2) & (xs < x2 + 2) & (ys >= y1 - 2) & (ys < y2 + 2)
                assert inside.sum() >= 0.1 * bw * bh * 256 * 256, (cls, (x1, y1, x2, y2))
    assert n_pasted > 5
