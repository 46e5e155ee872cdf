"""Pixels: reading and resizing an image (official ``load_image``), letterbox (official ``letterbox``), and the
HSV colour jitter in torch for the device (docs/data.md, "Loader", says how close it is to OpenCV's)."""

from __future__ import annotations

import cv2
import numpy as np
import torch
from PIL import Image

from yolo9kit.data.labels import exif_size
from yolo9kit.env import to_device_async

PAD_VALUE = 114  # grey used for every padded or uncovered pixel, as in the official pipeline
_REDUCED = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
            8: cv2.IMREAD_REDUCED_COLOR_8}


def read_bgr(path: str, reduce: int = 1) -> np.ndarray:
    """(H, W, 3) uint8 BGR, EXIF orientation applied, alpha dropped, grayscale and 16-bit made 8-bit BGR;
    ``reduce`` 2, 4 or 8 decodes a JPEG at 1/reduce of its size (DCT scaling). FileNotFoundError when it fails."""
    flag = _REDUCED[reduce] if reduce > 1 and path.lower().endswith((".jpg", ".jpeg")) else cv2.IMREAD_COLOR
    image = cv2.imread(path, flag)
    if image is None:
        raise FileNotFoundError(f"cannot read image {path}: the file is missing or no longer decodes since the data "
                                f"set was checked; `python -m yolo9kit data check DATA --no-cache` checks it again")
    return image


def reduce_factor(scale: float) -> int:
    """Largest JPEG DCT reduction (1, 2, 4, 8) that still leaves at least one source pixel per output pixel."""
    for factor in (8, 4, 2):
        if scale * factor <= 1.0:
            return factor
    return 1


def resized_size(width: int, height: int, image_size: int) -> tuple[int, int]:
    """(w, h) once the long side is ``image_size``: ``int(side * r)`` as the official load_image (1241 -> 639)."""
    r = image_size / max(width, height)
    return (max(int(width * r), 1), max(int(height * r), 1)) if r != 1 else (width, height)


def load_resized(path: str, image_size: int, augment: bool, size_wh: tuple[int, int] | None = None) -> np.ndarray:
    """Official load_image: BGR with the long side at ``image_size``; the training path (``augment``) decodes
    a JPEG that shrinks over 2x at a reduced size (docs/data.md, "Reduced JPEG decoding"). ``size_wh``: the
    (width, height) after EXIF orientation when known."""
    if not augment:  # the official validation path: full decode, sizes from the decoded image
        image = read_bgr(path)
        h0, w0 = image.shape[:2]
        w_new, h_new = resized_size(w0, h0, image_size)
        if (w0, h0) == (w_new, h_new):
            return image
        interp = cv2.INTER_AREA if image_size < max(h0, w0) else cv2.INTER_LINEAR
        return cv2.resize(image, (w_new, h_new), interpolation=interp)
    if size_wh is None:
        with Image.open(path) as im:
            size_wh = exif_size(im)
    w0, h0 = size_wh
    r = image_size / max(h0, w0)
    image = read_bgr(path, reduce_factor(r * 2) if r < 0.5 else 1)
    h, w = image.shape[:2]
    w_new, h_new = resized_size(w0, h0, image_size)
    if (w, h) != (w_new, h_new):
        image = cv2.resize(image, (w_new, h_new), interpolation=cv2.INTER_LINEAR)
    return image


def letterbox(image: np.ndarray, new_shape: int | tuple[int, int] = 640,
              color: tuple[int, int, int] = (PAD_VALUE, PAD_VALUE, PAD_VALUE), auto: bool = True,
              scale_fill: bool = False, scaleup: bool = True, stride: int = 32
              ) -> tuple[np.ndarray, tuple[float, float], tuple[float, float]]:
    """Resize keeping the aspect ratio, then pad to ``new_shape``; equals the official letterbox.

    Args:
        image: (H, W, C) uint8 array (any channel order).
        new_shape: target (height, width), or one int for a square.
        color: padding value per channel.
        auto: pad only up to the next multiple of ``stride`` instead of the full shape.
        scale_fill: stretch to ``new_shape`` without padding.
        scaleup: allow enlarging (False caps the ratio at 1).
        stride: the multiple used by ``auto``.

    Returns:
        ``(image, (rw, rh), (pad_w, pad_h))``: the padded image, the ratios applied and the padding on the
        left and on the top (half the total, may be fractional).
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


# HSV colour jitter in torch: OpenCV's 8-bit RGB <-> HSV and the official look-up tables (``hsv_jitter`` works
# ``chunk`` images at a time in float32, about 40 bytes per pixel of a chunk).
_SHIFT = 12  # OpenCV's hsv_shift: the division tables hold round((numerator << 12) / i)
# HSV -> RGB: for each sector of the hue circle, which of (v, p, q, t) goes to R, G and B.
_SECTOR_TO_RGB = ((0, 3, 1), (2, 0, 1), (1, 0, 3), (1, 2, 0), (3, 1, 0), (0, 1, 2))


_TABLES: dict = {}


def _sector_table(device: torch.device) -> torch.Tensor:
    """``_SECTOR_TO_RGB`` on ``device``, made once per device (a copy to the GPU waits for it)."""
    key = ("sector", str(device))
    if key not in _TABLES:
        _TABLES[key] = torch.tensor(_SECTOR_TO_RGB, device=device)
    return _TABLES[key]


def _div_table(numerator: float, device: torch.device) -> torch.Tensor:
    """OpenCV's ``saturate_cast<int>((numerator << 12) / i)`` for i in 0..255 (entry 0 is 0); cached per device."""
    key = (numerator, str(device))
    if key not in _TABLES:
        i = torch.arange(256, dtype=torch.float64, device=device)
        table = torch.where(i > 0, torch.round(numerator * (1 << _SHIFT) / i.clamp(min=1)), torch.zeros_like(i))
        _TABLES[key] = table.to(torch.int32)
    return _TABLES[key]


def _fixed_round(x: torch.Tensor) -> torch.Tensor:
    """``(x + 2048) >> 12`` with an arithmetic shift (floor), as OpenCV rounds its fixed-point products."""
    return torch.div(x + (1 << (_SHIFT - 1)), 1 << _SHIFT, rounding_mode="floor")


def rgb_to_hsv_cv(rgb: torch.Tensor) -> torch.Tensor:
    """uint8 (B, 3, H, W) RGB -> int32 (B, 3, H, W) HSV in OpenCV's 8-bit ranges (H < 180, S and V <= 255)."""
    x = rgb.to(torch.int32)
    r, g, b = x[:, 0], x[:, 1], x[:, 2]
    v = torch.maximum(torch.maximum(r, g), b)
    diff = v - torch.minimum(torch.minimum(r, g), b)
    s = _fixed_round(diff * _div_table(255.0, rgb.device)[v])
    numerator = torch.where(v == r, g - b, torch.where(v == g, b - r + 2 * diff, r - g + 4 * diff))
    h = _fixed_round(numerator * _div_table(30.0, rgb.device)[diff])
    h = torch.where(h < 0, h + 180, h)
    return torch.stack((h, s, v), 1)


def hsv_cv_to_rgb(h: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """OpenCV's 8-bit HSV -> RGB for float32 tensors (h in half degrees, any real value; s, v in 0..255), as
    OpenCV's vector loop computes it: s and v scaled by 1/255, 255 times the result, truncated to uint8. OpenCV
    rounds instead in the pixels its vector loop leaves over at the end of a row (docs/data.md)."""
    h = torch.remainder(h * torch.tensor(6.0 / 180.0, dtype=torch.float32), 6.0)
    sector = torch.floor(h).clamp_(0, 5)
    f = h - sector
    s = s * torch.tensor(1.0 / 255.0, dtype=torch.float32)
    v = v * torch.tensor(1.0 / 255.0, dtype=torch.float32)
    tab = torch.stack((v, v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))), 1)  # v, p, q, t
    index = _sector_table(h.device)[sector.long()]  # (B, H, W, 3)
    rgb = torch.gather(tab, 1, index.permute(0, 3, 1, 2)) * 255
    return rgb.clamp_(0, 255).to(torch.uint8)  # truncation, as OpenCV's vector loop


def hsv_jitter(images: torch.Tensor, gains: torch.Tensor, chunk: int = 8) -> torch.Tensor:
    """Apply per-image HSV gains (B, 3) to uint8 RGB ``images`` (B, 3, H, W); returns a new uint8 batch.

    A row of gains equal to (1, 1, 1) leaves its image unchanged (no colour round trip). Works in slices
    of ``chunk`` images, with no host-device synchronisation (the gains are copied without waiting).
    """
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"expected uint8 images (B, 3, H, W), got {images.dtype} {tuple(images.shape)}")
    if gains.shape != (images.shape[0], 3):
        raise ValueError(f"expected gains of shape ({images.shape[0]}, 3), got {tuple(gains.shape)}")
    host_gains = gains.detach().to("cpu", torch.float32)
    unit = (host_gains == 1).all(1)
    if bool(unit.all()):  # read on the host: nothing to do
        return images.clone(memory_format=torch.preserve_format)
    g_all = to_device_async(host_gains, images.device).view(-1, 3, 1, 1)
    keep_all = to_device_async(unit, images.device).view(-1, 1, 1, 1)
    out = torch.empty_like(images)
    for start in range(0, images.shape[0], chunk):
        sl = slice(start, start + chunk)
        g = g_all[sl]
        hsv = rgb_to_hsv_cv(images[sl]).float()
        # The official tables: floor(x * gain), hue taken modulo 180, saturation and value clipped.
        h = torch.remainder(torch.floor(hsv[:, 0:1] * g[:, 0:1]), 180.0)
        sv = torch.floor(hsv[:, 1:] * g[:, 1:]).clamp_(0, 255)
        rgb = hsv_cv_to_rgb(h[:, 0], sv[:, 0], sv[:, 1])
        out[sl] = torch.where(keep_all[sl], images[sl], rgb)
    return out
