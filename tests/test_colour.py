"""The HSV colour jitter in torch (for the GPU) against the loader's OpenCV path, and the loader running it."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from yolo9kit.data import augment as A
from yolo9kit.data import create_dataloader, make_shapes
from yolo9kit.data.images import hsv_cv_to_rgb, hsv_jitter, rgb_to_hsv_cv


@pytest.fixture(scope="module")
def shapes_yaml(tmp_path_factory):
    return make_shapes(tmp_path_factory.mktemp("shapes"), n_train=12, n_val=2, imgsz=96, num_classes=3, seed=3)


def _to_torch(image_hwc: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(image_hwc)).permute(2, 0, 1)[None]


def _truncated_columns(width: int) -> np.ndarray:
    """The columns of a row that the installed OpenCV converts HSV -> RGB in its vector loop, which truncates.

    It leaves the last ``width % block`` pixels (block 16, 32 or 64 by CPU and version) to a loop that rounds:
    HSV (60, 100, 100) has R = 100 * 155 / 255 = 60.8, 60 truncated and 61 rounded.
    """
    columns = cv2.cvtColor(np.full((1, width, 3), (60, 100, 100), np.uint8), cv2.COLOR_HSV2RGB)[0, :, 0] == 60
    assert columns.any(), f"this OpenCV converts no pixel of a {width}-pixel row in its vector loop"
    return columns


def test_rgb_to_hsv_equals_opencv_on_every_colour():
    codes = np.arange(2**24, dtype=np.uint32)
    rgb = np.stack([(codes >> 16) & 255, (codes >> 8) & 255, codes & 255], -1).astype(np.uint8).reshape(4096, 4096, 3)
    ours = rgb_to_hsv_cv(_to_torch(rgb))[0].permute(1, 2, 0).numpy()
    assert np.array_equal(ours, cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV).astype(np.int32))


def test_hsv_to_rgb_within_one_level_of_opencv():
    h, s, v = np.meshgrid(np.arange(180), np.arange(256), np.arange(256), indexing="ij")
    hsv = np.stack([h, s, v], -1).astype(np.uint8).reshape(180 * 256, 256, 3)
    ref = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB).astype(np.int32)
    x = _to_torch(hsv).float()
    ours = hsv_cv_to_rgb(x[:, 0], x[:, 1], x[:, 2])[0].permute(1, 2, 0).numpy().astype(np.int32)
    diff = np.abs(ours - ref)
    assert _truncated_columns(256).all()
    assert diff.max() <= 1 and (diff.max(-1) > 0).mean() < 0.001  # measured: 0.015 % of the HSV codes


def test_jitter_matches_the_loader_opencv_path(shapes_yaml):
    rng = np.random.default_rng(0)
    hyp = A.Hyp()
    files = sorted((shapes_yaml.parent / "images" / "train").glob("*.jpg"))[:6]
    differing = total = 0
    for path in files:
        bgr = cv2.imread(str(path))
        gains = A.hsv_gains(rng, hyp)
        ref = A.bgr_to_rgb(bgr, gains)
        ours = hsv_jitter(_to_torch(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)), torch.tensor(gains)[None])
        diff = np.abs(ours[0].permute(1, 2, 0).numpy().astype(int) - ref.astype(int))
        assert diff.max() <= 1, path
        truncated = (diff.max(-1) > 0)[:, _truncated_columns(diff.shape[1])]
        differing, total = differing + truncated.sum(), total + truncated.size
    assert differing / total < 0.01  # measured 0.07 % on OpenCV 4.8, 5.0 and 5.1


def test_unit_gains_leave_images_alone_and_bad_shapes_are_clear_errors():
    images = torch.randint(0, 256, (3, 3, 8, 8), dtype=torch.uint8)
    gains = torch.tensor([[1.0, 1.0, 1.0], [1.01, 0.5, 1.2], [1.0, 1.0, 1.0]])
    out = hsv_jitter(images, gains)
    assert torch.equal(out[0], images[0]) and torch.equal(out[2], images[2]) and not torch.equal(out[1], images[1])
    with pytest.raises(ValueError, match="uint8"):
        hsv_jitter(images.float(), gains)
    with pytest.raises(ValueError, match="gains"):
        hsv_jitter(images, gains[:2])


def test_loader_with_colour_on_device_gives_the_same_batches_within_one_level(shapes_yaml):
    """The same draws (mosaic, affine, flips, gains) either way; only the colour arithmetic moves."""
    kwargs = dict(imgsz=96, batch_size=4, workers=0, seed=0, cache=None)
    cpu = list(create_dataloader(shapes_yaml, "train", **kwargs))
    moved_loader = create_dataloader(shapes_yaml, "train", colour_device="cpu", **kwargs)
    assert moved_loader.dataset.colour_on_device
    moved = list(moved_loader)
    assert len(cpu) == len(moved) == 3
    for (im_a, t_a, p_a, _), (im_b, t_b, p_b, _) in zip(cpu, moved):
        assert p_a == p_b and torch.equal(t_a, t_b) and im_b.dtype == torch.uint8
        diff = (im_a.int() - im_b.int()).abs()
        columns = _truncated_columns(diff.shape[-1])
        truncated = diff[..., torch.from_numpy(columns & columns[::-1])]  # either way a flip turned the image
        assert diff.max() <= 1 and (truncated > 0).float().mean() < 0.01
    workers = list(create_dataloader(shapes_yaml, "train", colour_device="cpu", **{**kwargs, "workers": 2}))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(moved, workers))  # seeded: worker count does not matter
