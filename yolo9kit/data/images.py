"""Pixels: reading and resizing (official ``load_image``), the image caches, ``letterbox``, the HSV jitter in torch."""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import torch
from tqdm.auto import tqdm

from yolo9kit.data.labels import decode_pool, files_hash
from yolo9kit.env import memory_limits, to_device_async
from yolo9kit.files import write_file, write_text_atomically

log = logging.getLogger(__name__)

PAD_VALUE = 114  # grey used for every padded or uncovered pixel, as in the official pipeline
_REDUCED = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}
DISK_CACHE_VERSION = 2  # 2: validation images fully decoded (1 reduced large JPEGs), official sizes
DISK_SUFFIX = ".yolo9kit-images"


def read_bgr(path: str, reduce: int = 1) -> np.ndarray:
    """(H, W, 3) uint8 BGR as displayed (EXIF orientation); ``reduce`` 2, 4 or 8 decodes a JPEG at 1/reduce."""
    flag = _REDUCED[reduce] if reduce > 1 and path.lower().endswith((".jpg", ".jpeg")) else cv2.IMREAD_COLOR
    image = cv2.imread(path, flag)
    if image is None:
        raise FileNotFoundError(f"cannot read image {path}: the file is missing or no longer decodes since the data "
                                f"set was checked; `python -m yolo9kit data check DATA --no-cache` checks it again")
    return image


def reduce_factor(scale: float) -> int:
    """Largest JPEG reduction (1, 2, 4, 8) that leaves at least one source pixel per output pixel."""
    return next((factor for factor in (8, 4, 2) if scale * factor <= 1.0), 1)


def resized_size(width: int, height: int, image_size: int) -> tuple[int, int]:
    """(w, h) once the long side is ``image_size``: ``int(side * r)`` as the official load_image (1241 -> 639)."""
    r = image_size / max(width, height)
    return (max(int(width * r), 1), max(int(height * r), 1)) if r != 1 else (width, height)


def load_resized(path: str, image_size: int, augment: bool, size_wh: tuple[int, int]) -> np.ndarray:
    """Official load_image: BGR, long side ``image_size``; ``augment``: a large JPEG (``size_wh``) decoded reduced."""
    if augment:
        w0, h0 = size_wh
        image = read_bgr(path, reduce_factor(image_size / max(h0, w0) * 2))
    else:  # the official validation path: full decode, sizes from the decoded image
        image = read_bgr(path)
        h0, w0 = image.shape[:2]
    size = resized_size(w0, h0, image_size)
    if image.shape[1::-1] == size:
        return image
    interp = cv2.INTER_AREA if not augment and image_size < max(h0, w0) else cv2.INTER_LINEAR
    return cv2.resize(image, size, interpolation=interp)


def cache_images(paths: list[str], sizes: list[tuple[int, int]], image_size: int, augment: bool, mode: str,
                 budget_fraction: float, label_cache: Path) -> Sequence[np.ndarray] | None:
    """The images decoded once and resized for cache ``mode`` "disk", "auto" or "ram" (docs/data.md, "Loader")."""
    if mode == "disk":
        tag = f"{image_size}px-{'linear' if augment else 'area'}"  # one file per size and interpolation
        path = label_cache.with_name(f"{label_cache.name.split('.yolo9kit')[0]}.{tag}{DISK_SUFFIX}")
        try:
            return _disk_images(path, paths, sizes, image_size, augment)
        except OSError as e:  # read-only data, a full disk: the run goes on, as with the label cache
            log.warning("cache='disk': cannot write the image cache in %s (%s); caching the images in RAM instead "
                        "when they fit in %.0f%% of the available memory (else no cache)", path.parent, e,
                        100 * budget_fraction)
    need = sum(w * h * 3 for w, h in (resized_size(w0, h0, image_size) for w0, h0 in sizes))
    avail = memory_limits().get("RAM")
    if avail is not None and need > budget_fraction * avail:
        msg = (f"caching {len(paths)} images at {image_size} px needs {need / 2**30:.2f} GiB but only "
               f"{avail / 2**30:.2f} GiB of RAM is available (limit {budget_fraction:.0%} of it)")
        if mode == "ram":
            raise MemoryError(msg + ": use cache=None or a smaller image size")
        log.info("%s: not caching images", msg)
        return None
    with decode_pool() as pool:
        images = list(tqdm(pool.map(lambda p, wh: load_resized(p, image_size, augment, wh), paths, sizes),
                           total=len(paths), desc=f"caching images ({need / 2**30:.2f} GiB)",
                           disable=len(paths) < 1000))
    log.info("cached %d images in RAM (%.2f GiB)", len(paths), need / 2**30)
    return images


class DiskImages(Sequence):
    """Read-only (H, W, 3) uint8 views into the disk cache file, by image index (as the RAM cache's list)."""

    def __init__(self, path: Path, shapes_hw: list[tuple[int, int]]):
        self.path, self.shapes = Path(path), [tuple(s) for s in shapes_hw]
        self.offsets = np.concatenate([[0], np.cumsum([h * w * 3 for h, w in self.shapes], dtype=np.int64)])
        self.nbytes = int(self.offsets[-1])
        self._map = None

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, i: int) -> np.ndarray:
        if self._map is None:  # opened lazily, so that worker processes map the file themselves
            self._map = np.memmap(self.path, np.uint8, "r")
        h, w = self.shapes[i]
        return np.asarray(self._map[self.offsets[i]:self.offsets[i + 1]]).reshape(h, w, 3)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_map": None}


def _disk_images(path: Path, paths: list[str], sizes: list[tuple[int, int]], image_size: int,
                 augment: bool) -> DiskImages:
    """The disk cache at ``path`` (a JSON header beside it), built when missing or out of date."""
    shapes = [tuple(reversed(resized_size(w, h, image_size))) for w, h in sizes]  # (h, w)
    meta = {"version": DISK_CACHE_VERSION, "hash": files_hash(paths), "image_size": image_size,
            "augment": augment, "shapes": [list(s) for s in shapes]}
    images, header = DiskImages(path, shapes), path.with_name(path.name + ".json")
    try:
        if json.loads(header.read_text()) == meta and path.stat().st_size == images.nbytes:
            log.info("using the disk image cache %s (%.2f GiB)", path, images.nbytes / 2**30)
            return images
    except (OSError, ValueError):
        pass  # missing or damaged: rebuilt below

    def write(tmp: Path) -> None:
        with (open(tmp, "wb") as f, decode_pool() as pool,
              tqdm(total=len(paths), desc=f"writing the disk image cache ({images.nbytes / 2**30:.2f} GiB)",
                   disable=len(paths) < 1000) as bar):
            for start in range(0, len(paths), 256):  # bounded: decoded images never pile up in RAM
                part = slice(start, start + 256)
                decoded = pool.map(lambda p, wh: load_resized(p, image_size, augment, wh), paths[part], sizes[part])
                for path_i, image, shape in zip(paths[part], decoded, shapes[part]):
                    if image.shape[:2] != shape:  # the file changed between the check and now
                        raise OSError(f"{path_i} changed while caching: expected {shape}, got {image.shape[:2]}")
                    f.write(np.ascontiguousarray(image).data)
                bar.update(len(shapes[part]))

    write_file(path, write, needed=images.nbytes, what=f"writing the disk image cache {path}", durable=False)
    write_text_atomically(header, json.dumps(meta))
    log.info("wrote the disk image cache %s (%.2f GiB)", path, images.nbytes / 2**30)
    return images


def letterbox(image: np.ndarray, new_shape: int | tuple[int, int] = 640,
              color: tuple[int, int, int] = (PAD_VALUE, PAD_VALUE, PAD_VALUE), auto: bool = True,
              scale_fill: bool = False, scaleup: bool = True, stride: int = 32
              ) -> tuple[np.ndarray, tuple[float, float], tuple[float, float]]:
    """Resize keeping the aspect ratio, then pad to ``new_shape`` (height, width): the official letterbox.

    Args:
        auto: pad only up to the next multiple of ``stride``; scale_fill: stretch, no padding; scaleup: may enlarge.
    Returns:
        ``(image, (rw, rh), (pad_w, pad_h))``: the ratios applied and half the padding (may be fractional).
    """
    shape = image.shape[:2]
    new_shape = (new_shape, new_shape) if isinstance(new_shape, int) else new_shape
    r = min(new_shape[0] / shape[0], new_shape[1] / shape[1], math.inf if scaleup else 1.0)
    ratio = (r, r)
    new_unpad = (int(round(shape[1] * r)), int(round(shape[0] * r)))  # (w, h)
    dw, dh = new_shape[1] - new_unpad[0], new_shape[0] - new_unpad[1]
    if auto:
        dw, dh = np.mod(dw, stride), np.mod(dh, stride)
    elif scale_fill:
        dw, dh, new_unpad = 0.0, 0.0, (new_shape[1], new_shape[0])
        ratio = (new_shape[1] / shape[1], new_shape[0] / shape[0])
    dw, dh = dw / 2, dh / 2
    if shape[::-1] != new_unpad:
        image = cv2.resize(image, new_unpad, interpolation=cv2.INTER_LINEAR)
    top, bottom = int(round(dh - 0.1)), int(round(dh + 0.1))
    left, right = int(round(dw - 0.1)), int(round(dw + 0.1))
    image = cv2.copyMakeBorder(image, top, bottom, left, right, cv2.BORDER_CONSTANT, value=color)
    return image, ratio, (float(dw), float(dh))


# HSV colour jitter in torch: OpenCV's 8-bit RGB <-> HSV and the official look-up tables
_SHIFT = 12  # OpenCV's hsv_shift: the division tables hold round((numerator << 12) / i)


@functools.cache  # once per device: a copy to the GPU waits for it
def _sector_table(device: torch.device) -> torch.Tensor:
    """HSV -> RGB: for each sector of the hue circle, which of (v, p, q, t) goes to R, G and B."""
    return torch.tensor(((0, 3, 1), (2, 0, 1), (1, 0, 3), (1, 2, 0), (3, 1, 0), (0, 1, 2)), device=device)


@functools.cache
def _div_table(numerator: float, device: torch.device) -> torch.Tensor:
    """OpenCV's ``saturate_cast<int>((numerator << 12) / i)`` for i in 0..255 (entry 0 is 0)."""
    i = torch.arange(256, dtype=torch.float64, device=device)
    return torch.where(i > 0, torch.round(numerator * (1 << _SHIFT) / i.clamp(min=1)), torch.zeros_like(i)).int()


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
    """OpenCV's 8-bit HSV -> RGB (its vector loop) for float32 h (half degrees, any value), s and v (0..255)."""
    h = torch.remainder(h * torch.tensor(6.0 / 180.0, dtype=torch.float32), 6.0)
    sector = torch.floor(h).clamp_(0, 5)
    f = h - sector
    scale = torch.tensor(1.0 / 255.0, dtype=torch.float32)
    s, v = s * scale, v * scale
    tab = torch.stack((v, v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))), 1)  # v, p, q, t
    index = _sector_table(h.device)[sector.long()]  # (B, H, W, 3)
    rgb = torch.gather(tab, 1, index.permute(0, 3, 1, 2)) * 255
    return rgb.clamp_(0, 255).to(torch.uint8)  # truncation, as OpenCV's vector loop


def hsv_jitter(images: torch.Tensor, gains: torch.Tensor, chunk: int = 8) -> torch.Tensor:
    """Per-image HSV gains (B, 3) applied to uint8 RGB ``images`` (B, 3, H, W), ``chunk`` at a time: a new batch.
    ValueError: images not uint8 (B, 3, H, W), or gains not (B, 3)."""
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
        hsv, g = rgb_to_hsv_cv(images[sl]).float(), g_all[sl]
        h = torch.remainder(torch.floor(hsv[:, 0:1] * g[:, 0:1]), 180.0)  # the official tables: floor(x * gain)
        sv = torch.floor(hsv[:, 1:] * g[:, 1:]).clamp_(0, 255)
        rgb = hsv_cv_to_rgb(h[:, 0], sv[:, 0], sv[:, 1])
        out[sl] = torch.where(keep_all[sl], images[sl], rgb)
    return out
