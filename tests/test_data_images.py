"""Grayscale, RGBA, 16-bit and EXIF-rotated images load with the right shape, colours and orientation; validation
decodes as the official code, training may decode large JPEGs at a reduced size."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from PIL import Image

from yolo9kit.data import YOLODataset, check, letterbox
from yolo9kit.data.images import load_resized


def _write_yaml(root: Path) -> Path:
    (root / "data.yaml").write_text(yaml.safe_dump({"path": str(root), "train": "images", "val": "images",
                                                    "names": ["thing"]}))
    return root / "data.yaml"


def _label(root: Path, stem: str, text: str = "0 0.25 0.25 0.3 0.3\n") -> None:
    (root / "labels").mkdir(exist_ok=True)
    (root / "labels" / f"{stem}.txt").write_text(text)


def _sample(ds: YOLODataset, stem: str) -> np.ndarray:
    i = [Path(f).stem for f in ds.im_files].index(stem)
    image, _, _, shapes = ds[i]
    return image.permute(1, 2, 0).numpy(), shapes


def test_modes_and_exif(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    # grayscale 8-bit, 40x60 (w x h): bright top half
    gray = np.zeros((60, 40), np.uint8)
    gray[:30] = 200
    Image.fromarray(gray).save(images / "gray.png")
    # RGBA: red opaque, alpha must be dropped, not blended
    rgba = np.zeros((50, 50, 4), np.uint8)
    rgba[..., 0], rgba[..., 3] = 255, 10
    Image.fromarray(rgba, "RGBA").save(images / "rgba.png")
    # 16-bit grayscale: 65535 -> 255, 100 * 256 -> 100
    g16 = np.full((30, 50), 100 * 256, np.uint16)
    g16[:, :25] = 65535
    Image.fromarray(g16).save(images / "g16.png")
    # EXIF orientation 6 (rotate 90 clockwise to display): stored 80 wide x 40 high, displayed 40 x 80,
    # and the displayed image has a green block in its top-left corner.
    shown = np.zeros((80, 40, 3), np.uint8)
    shown[:20, :20] = (0, 255, 0)
    stored = np.rot90(shown, k=1).copy()  # undoing a 90 degree clockwise turn
    im = Image.fromarray(stored)
    exif = im.getexif()
    exif[0x0112] = 6
    im.save(images / "rotated.jpg", exif=exif, quality=95)
    for stem in ("gray", "rgba", "g16", "rotated"):
        _label(tmp_path, stem)
    yaml_path = _write_yaml(tmp_path)

    report = check(yaml_path)
    assert report.ok and report.n_usable == 4, str(report)
    ds = YOLODataset(yaml_path, "train", imgsz=80, rect=False)
    sizes = {Path(f).stem: tuple(s) for f, s in zip(ds.im_files, ds.shapes)}
    assert sizes == {"gray": (40, 60), "rgba": (50, 50), "g16": (50, 30), "rotated": (40, 80)}

    image, shapes = _sample(ds, "gray")
    assert image.shape == (80, 80, 3)
    assert shapes[0] == (60, 40)
    assert (image[10:30, 20:50] == 200).all() and (image[50:70, 20:50] == 0).all()

    image, _ = _sample(ds, "rgba")
    assert (image[20:60, 20:60] == (255, 0, 0)).all()

    image, _ = _sample(ds, "g16")
    assert image.dtype == np.uint8
    assert (image[30:45, 5:35] == 255).all() and (image[30:45, 45:75] == 100).all()

    image, shapes = _sample(ds, "rotated")
    assert shapes[0] == (80, 40)  # (h0, w0) after orientation
    # letterboxed 40x80 -> 80x80 with 20 px padding left and right; green block at the displayed top-left
    block = image[2:18, 22:38]
    assert (block[..., 1] > 200).all() and (block[..., 0] < 60).all(), block.mean((0, 1))
    assert (image[60:78, 22:58, 1] < 60).all()


def _textured_jpeg(path: Path, w: int = 600, h: int = 400) -> None:
    """A JPEG with fine detail, so that a reduced (DCT-scaled) decode gives other pixels than a full one."""
    rng = np.random.default_rng(0)
    coarse = rng.integers(0, 256, (h // 8, w // 8, 3), dtype=np.uint8)
    coarse = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC)
    image = np.clip(coarse.astype(int) + rng.integers(-40, 41, coarse.shape), 0, 255).astype(np.uint8)
    cv2.imwrite(str(path), image, [cv2.IMWRITE_JPEG_QUALITY, 90])


@pytest.mark.parametrize("cache", [None, "ram", "disk"])
def test_validation_decodes_the_whole_jpeg_then_resizes_as_the_official_load_image(tmp_path, cache):
    images = tmp_path / "images"
    images.mkdir()
    _textured_jpeg(images / "big.jpg")  # 600x400 at imgsz 128: shrunk 4.7x, where training reduces the decode
    _label(tmp_path, "big")
    # official LoadImagesAndLabels.load_image without augmentation: cv2.imread, then cv2.resize to
    # (int(w0 * r), int(h0 * r)) with INTER_AREA when shrinking
    raw = cv2.imread(str(images / "big.jpg"))
    r = 128 / 600
    official = cv2.resize(raw, (int(600 * r), int(400 * r)), interpolation=cv2.INTER_AREA)
    assert official.shape[:2] == (85, 128)  # int(85.33): the official size, not 86
    ds = YOLODataset(_write_yaml(tmp_path), "val", imgsz=128, cache=cache)
    np.testing.assert_array_equal(np.asarray(ds.load_image(0)), official)
    image, _, _, shapes = ds[0]
    expected, _, pad = letterbox(official, (128, 128), auto=False, scaleup=False)
    np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), expected[..., ::-1])
    assert shapes[0] == (400, 600) and shapes[1][1] == pad


def test_training_may_decode_a_large_jpeg_at_a_reduced_size(tmp_path):
    path = str(tmp_path / "big.jpg")
    _textured_jpeg(tmp_path / "big.jpg")
    # 600 -> 128 shrinks by 4.7x: decoded at 1/2 (300x200, still at least twice the target), then resized
    reduced = cv2.resize(cv2.imread(path, cv2.IMREAD_REDUCED_COLOR_2), (128, 85), interpolation=cv2.INTER_LINEAR)
    full = cv2.resize(cv2.imread(path), (128, 85), interpolation=cv2.INTER_LINEAR)
    train = load_resized(path, 128, augment=True, size_wh=(600, 400))
    np.testing.assert_array_equal(train, reduced)
    assert not np.array_equal(train, full)  # the reduced path was taken: its pixels differ from a full decode
    np.testing.assert_array_equal(load_resized(path, 128, augment=False, size_wh=(600, 400)),
                                  cv2.resize(cv2.imread(path), (128, 85), interpolation=cv2.INTER_AREA))
