"""Image reading: EXIF orientation, grayscale/RGBA/16-bit to 8-bit BGR, reduced-size JPEG decoding,
and the in-memory image cache with its memory check."""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
from tqdm.auto import tqdm

log = logging.getLogger(__name__)

_REDUCED = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
            8: cv2.IMREAD_REDUCED_COLOR_8}
_JPEG = (".jpg", ".jpeg")


def read_bgr(path: str, reduce: int = 1) -> np.ndarray:
    """Read an image as (H, W, 3) uint8 BGR with its EXIF orientation applied.

    OpenCV's IMREAD_COLOR applies EXIF orientation, drops alpha, expands grayscale and maps 16-bit to 8-bit.
    ``reduce`` (2, 4 or 8) decodes a JPEG at 1/reduce of its size (DCT scaling: much less work); it is
    ignored for other formats.

    Raises:
        FileNotFoundError: the file is missing or cannot be decoded any more (it was readable when checked).
    """
    flag = _REDUCED[reduce] if reduce > 1 and path.lower().endswith(_JPEG) else cv2.IMREAD_COLOR
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
    """(w, h) once the long side is ``image_size``: ``int(side * r)`` of each side, as the official
    ``utils/dataloaders.py`` LoadImagesAndLabels.load_image (so a 1241-pixel side becomes 639 at 640, not 640)."""
    r = image_size / max(width, height)
    return (max(int(width * r), 1), max(int(height * r), 1)) if r != 1 else (width, height)


def load_resized(path: str, image_size: int, augment: bool, size_wh: tuple[int, int] | None = None) -> np.ndarray:
    """Official load_image: (H, W, 3) uint8 BGR with the long side at ``image_size``; INTER_AREA when shrinking
    without augmentation, else INTER_LINEAR.

    Validation (``augment=False``) decodes the whole file and then resizes, exactly as the official
    validation loader. Training (``augment=True``) decodes a JPEG that shrinks by more than 2x at a reduced
    size (DCT scaling, 1/2 to 1/8) that stays at least twice the target, then resizes: several times less
    decoding work, and pixels that differ slightly from a full decode (docs/data.md, "Reduced JPEG decoding
    in training", gives the measured time and difference).

    Args:
        size_wh: the image's (width, height) after EXIF orientation when already known (saves a header read).
    """
    if not augment:  # the official validation path: full decode, sizes from the decoded image
        image = read_bgr(path)
        h0, w0 = image.shape[:2]
        w_new, h_new = resized_size(w0, h0, image_size)
        if (w0, h0) == (w_new, h_new):
            return image
        interp = cv2.INTER_AREA if image_size < max(h0, w0) else cv2.INTER_LINEAR
        return cv2.resize(image, (w_new, h_new), interpolation=interp)
    w0, h0 = size_wh if size_wh is not None else _peek_size(path)[::-1]
    r = image_size / max(h0, w0)
    image = read_bgr(path, reduce_factor(r * 2) if r < 0.5 else 1)
    h, w = image.shape[:2]
    w_new, h_new = resized_size(w0, h0, image_size)
    if (w, h) != (w_new, h_new):
        image = cv2.resize(image, (w_new, h_new), interpolation=cv2.INTER_LINEAR)
    return image


def _peek_size(path: str) -> tuple[int, int]:
    from PIL import Image

    from yolo9kit.data.labels import exif_size

    with Image.open(path) as im:
        w, h = exif_size(im)
    return h, w


def available_memory() -> int | None:
    """Available RAM in bytes (Linux /proc/meminfo MemAvailable), or None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def cache_images(paths: list[str], sizes: list[tuple[int, int]], image_size: int, augment: bool,
                 budget_fraction: float, required: bool) -> list[np.ndarray] | None:
    """Decode every image once, resized to ``image_size``, and keep it in RAM.

    The memory is computed exactly from the known sizes and compared with ``budget_fraction`` of the
    available RAM. When it does not fit: ``required`` (cache="ram" asked explicitly) raises MemoryError
    with the numbers; otherwise the cache is skipped with a log line.
    """
    need = sum(w * h * 3 for w, h in (resized_size(w0, h0, image_size) for w0, h0 in sizes))
    avail = available_memory()
    if avail is not None and need > budget_fraction * avail:
        msg = (f"caching {len(paths)} images at {image_size} px needs {need / 2**30:.2f} GiB but only "
               f"{avail / 2**30:.2f} GiB of RAM is available (limit {budget_fraction:.0%} of it)")
        if required:
            raise MemoryError(msg + ": use cache=None or a smaller image size")
        log.info("%s: not caching images", msg)
        return None
    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:  # cv2 releases the GIL while decoding
        images = list(tqdm(pool.map(lambda p, wh: load_resized(p, image_size, augment, wh), paths, sizes),
                           total=len(paths),
                           desc=f"caching images ({need / 2**30:.2f} GiB)", disable=len(paths) < 1000))
    log.info("cached %d images in RAM (%.2f GiB)", len(paths), need / 2**30)
    return images
