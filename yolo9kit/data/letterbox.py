"""Letterbox: resize an image keeping its aspect ratio, then pad it to a target shape.

Shared by training (non-mosaic samples), validation and inference.
"""

from __future__ import annotations

import cv2
import numpy as np

PAD_VALUE = 114  # grey used for every padded or uncovered pixel, as in the official pipeline


def letterbox(
    image: np.ndarray,
    new_shape: int | tuple[int, int] = 640,
    color: tuple[int, int, int] = (PAD_VALUE, PAD_VALUE, PAD_VALUE),
    auto: bool = True,
    scale_fill: bool = False,
    scaleup: bool = True,
    stride: int = 32,
) -> tuple[np.ndarray, tuple[float, float], tuple[float, float]]:
    """Resize and pad ``image`` to ``new_shape``; matches the official utils/augmentations.py letterbox.

    Args:
        image: (H, W, C) uint8 array (any channel order; the padding colour is written as given).
        new_shape: target (height, width) in pixels, or one int for a square.
        color: padding value per channel.
        auto: pad only up to the next multiple of ``stride`` (minimum rectangle) instead of the full shape.
        scale_fill: stretch to ``new_shape`` without padding (aspect ratio not kept).
        scaleup: allow enlarging; when False the ratio is capped at 1 (validation of small images).
        stride: the multiple used by ``auto``.

    Returns:
        ``(image, (rw, rh), (pad_w, pad_h))``: the padded image, the width/height ratios applied and the
        padding added on the left and on the top (half the total, may be fractional).
    """
    shape = image.shape[:2]
    if isinstance(new_shape, int):
        new_shape = (new_shape, new_shape)
    r = min(new_shape[0] / shape[0], new_shape[1] / shape[1])
    if not scaleup:
        r = min(r, 1.0)
    ratio = (r, r)
    new_unpad = (int(round(shape[1] * r)), int(round(shape[0] * r)))  # (w, h)
    dw, dh = new_shape[1] - new_unpad[0], new_shape[0] - new_unpad[1]
    if auto:
        dw, dh = np.mod(dw, stride), np.mod(dh, stride)
    elif scale_fill:
        dw, dh = 0.0, 0.0
        new_unpad = (new_shape[1], new_shape[0])
        ratio = (new_shape[1] / shape[1], new_shape[0] / shape[0])
    dw /= 2
    dh /= 2
    if shape[::-1] != new_unpad:
        image = cv2.resize(image, new_unpad, interpolation=cv2.INTER_LINEAR)
    top, bottom = int(round(dh - 0.1)), int(round(dh + 0.1))
    left, right = int(round(dw - 0.1)), int(round(dw + 0.1))
    image = cv2.copyMakeBorder(image, top, bottom, left, right, cv2.BORDER_CONSTANT, value=color)
    return image, ratio, (float(dw), float(dh))
