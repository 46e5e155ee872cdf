"""``cache="disk"``: every image decoded once, resized to the training size, in one memory-mapped file.

For data sets larger than RAM. The file sits beside the label cache (``<labels>.<size>px-<interp>.yolo9kit-images``
with a JSON header of the same name plus ``.json``), holds the images back to back as raw uint8 BGR, and is
rebuilt whenever an image is added, removed or changed (MD5 of every path, size and modification time,
as the label cache). Reading an image is a slice of the map: no decoding, and the operating system's
page cache is shared by all loader workers.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from yolo9kit.data.cache import files_hash
from yolo9kit.data.images import load_resized, resized_size
from yolo9kit.files import write_file, write_text_atomically

log = logging.getLogger(__name__)
DISK_CACHE_VERSION = 2  # 2: validation images fully decoded (1 reduced large JPEGs), official sizes
DISK_SUFFIX = ".yolo9kit-images"


class DiskImages(Sequence):
    """Read-only (H, W, 3) uint8 views into the cache file, by image index (a list-like RAM cache stand-in)."""

    def __init__(self, path: Path, shapes_hw: list[tuple[int, int]]):
        self.path, self.shapes = Path(path), [tuple(s) for s in shapes_hw]
        sizes = np.array([h * w * 3 for h, w in self.shapes], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)])
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

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1])


def disk_cache_path(label_cache: Path, image_size: int, augment: bool) -> Path:
    """Where the image cache of a split lives: beside its label cache, one file per size and interpolation."""
    tag = f"{image_size}px-{'linear' if augment else 'area'}"
    return label_cache.with_name(f"{label_cache.name.split('.yolo9kit')[0]}.{tag}{DISK_SUFFIX}")


def _header(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def open_disk_cache(path: Path, paths: list[str], sizes: list[tuple[int, int]], image_size: int,
                    augment: bool) -> DiskImages:
    """The cache at ``path`` for these images, built first when it is missing or out of date.

    Raises:
        OSError: the folder is not writable or the disk has not enough free space (the numbers are given).
    """
    shapes = [tuple(reversed(resized_size(w, h, image_size))) for w, h in sizes]  # (h, w)
    meta = {"version": DISK_CACHE_VERSION, "hash": files_hash(paths), "image_size": image_size,
            "augment": augment, "shapes": [list(s) for s in shapes]}
    images = DiskImages(path, shapes)
    try:
        if json.loads(_header(path).read_text()) == meta and path.stat().st_size == images.nbytes:
            log.info("using the disk image cache %s (%.2f GiB)", path, images.nbytes / 2**30)
            return images
    except (OSError, ValueError):
        pass  # missing or damaged: rebuilt below
    free = shutil.disk_usage(path.parent).free
    if images.nbytes > free:
        raise OSError(f"cache='disk' needs {images.nbytes / 2**30:.2f} GiB for {len(paths)} images at {image_size} px "
                      f"in {path.parent}, which has {free / 2**30:.2f} GiB free: use cache=None or a smaller size")

    def write(tmp: Path) -> None:
        bar = tqdm(total=len(paths), disable=len(paths) < 1000,
                   desc=f"writing the disk image cache ({images.nbytes / 2**30:.2f} GiB)")
        with open(tmp, "wb") as f, ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
            for start in range(0, len(paths), 256):  # bounded: decoded images never pile up in RAM
                part = slice(start, start + 256)
                decoded = pool.map(lambda p, wh: load_resized(p, image_size, augment, wh), paths[part], sizes[part])
                for path_i, image, shape in zip(paths[part], decoded, shapes[part]):
                    if image.shape[:2] != shape:  # the file changed between the check and now
                        raise OSError(f"{path_i} changed while caching: expected {shape}, got {image.shape[:2]}")
                    f.write(np.ascontiguousarray(image).data)
                bar.update(len(shapes[part]))
        bar.close()

    write_file(path, write, needed=images.nbytes, what=f"writing the disk image cache {path}", durable=False)
    write_text_atomically(_header(path), json.dumps(meta))
    log.info("wrote the disk image cache %s (%.2f GiB)", path, images.nbytes / 2**30)
    return images
