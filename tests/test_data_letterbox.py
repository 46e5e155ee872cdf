"""Letterbox parity with the official function on every recorded case."""

from __future__ import annotations

import numpy as np
import pytest

from yolo9kit.data.images import letterbox


def test_letterbox_equals_official_on_every_case(load_fixture):
    """Official utils/augmentations.py letterbox: auto, fixed, stretched, no upscaling, other colour, stride."""
    cases = load_fixture("ops.parity.pt")["letterbox"]
    assert len(cases) >= 5
    for case in cases:
        kwargs = dict(case["kwargs"])
        if "scaleFill" in kwargs:
            kwargs["scale_fill"] = kwargs.pop("scaleFill")
        out, ratio, pad = letterbox(case["input"].numpy(), **kwargs)
        expected = case["out"].numpy()
        assert out.shape == expected.shape, kwargs
        assert np.array_equal(out, expected), kwargs
        assert ratio == pytest.approx(tuple(case["ratio"]), abs=0)
        assert pad == pytest.approx(tuple(case["pad"]), abs=0)


def test_letterbox_scale_fill_stretches_without_padding():
    image = np.zeros((100, 50, 3), np.uint8)
    out, ratio, pad = letterbox(image, (64, 96), auto=False, scale_fill=True)
    assert out.shape == (64, 96, 3)
    assert ratio == (96 / 50, 64 / 100)
    assert pad == (0.0, 0.0)
