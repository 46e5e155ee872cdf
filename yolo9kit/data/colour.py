"""HSV colour jitter of a uint8 batch in torch, so it can run on the GPU instead of in the loader's workers.

It reproduces the loader's OpenCV path (``augment.bgr_to_rgb`` with gains): OpenCV's 8-bit RGB -> HSV
(hue in [0, 180), its fixed-point division tables and rounding), the official look-up tables (hue
``floor(h * g) % 180``, saturation and value ``clip(floor(x * g), 0, 255)``) and OpenCV's HSV -> RGB as
its vector loop computes it, truncated to uint8. OpenCV rounds instead in the last pixels of a row that its
vector loop leaves over, so there the two differ by one level (docs/data.md, ``tests/test_colour.py``).

Memory: the work is done ``chunk`` images at a time in float32, about 40 bytes per pixel of a chunk.
"""

from __future__ import annotations

import torch

from yolo9kit.env import to_device_async

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
    """OpenCV's 8-bit HSV -> RGB for float32 tensors (h in half degrees, any real value; s, v in 0..255).

    The float32 arithmetic of OpenCV's vector loop (s and v scaled by 1/255, then 255 times the result)
    and its truncation to uint8.
    """
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
