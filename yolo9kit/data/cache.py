"""The caches of a split (docs/data.md, "Format rules" and "Loader"): the label cache (official
``cache_labels``, an ``.npz`` without pickles), the decoded images in RAM, and ``cache="disk"``: the decoded
images back to back in one memory-mapped file. Both files are rebuilt when any file changes."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from yolo9kit.data.images import load_resized, resized_size
from yolo9kit.data.labels import ImageRecord, Problem, check_image_label
from yolo9kit.data.sources import label_path
from yolo9kit.env import memory_limits
from yolo9kit.files import write_file, write_text_atomically

log = logging.getLogger(__name__)
CACHE_VERSION = 3  # 2: unnamed class ids per image; 3: label files with a byte-order mark read (not errors)
CACHE_SUFFIX = ".yolo9kit.cache"  # not the official ".cache" (a pickle): both tools keep theirs side by side
DISK_CACHE_VERSION = 2  # 2: validation images fully decoded (1 reduced large JPEGs), official sizes
DISK_SUFFIX = ".yolo9kit-images"


def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(min(8, os.cpu_count() or 1))  # cv2 and PIL release the GIL while decoding


def files_hash(paths: list[str]) -> str:
    """MD5 over path, size and mtime (ns) of each file (missing files count as absent)."""
    md5 = hashlib.md5()
    for p in paths:
        try:
            st = os.stat(p)
            md5.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            md5.update(f"{p}\0-\n".encode())
    return md5.hexdigest()


def cache_path(sources: list[Path], label_files: list[str]) -> Path:
    """``<list file>.yolo9kit.cache`` for a single ``.txt`` source, else ``<label folder>.yolo9kit.cache``."""
    base = sources[0] if len(sources) == 1 and sources[0].is_file() else Path(label_files[0]).parent
    return base.with_name(base.stem + CACHE_SUFFIX) if base.is_file() else base.with_name(base.name + CACHE_SUFFIX)


def save_cache(path: Path, records: list[ImageRecord], file_hash: str, nc: int) -> None:
    """Write the records atomically; an unwritable folder only logs a warning."""
    labels = [r.labels for r in records]
    segs = [s for r in records for s in r.segments]
    meta = {
        "version": CACHE_VERSION, "hash": file_hash, "nc": nc,
        "im_files": [r.im_file for r in records], "lb_files": [r.lb_file for r in records],
        "sizes": [list(r.size) for r in records], "n_duplicates": [r.n_duplicates for r in records],
        "unnamed_classes": [list(r.unnamed_classes) for r in records],
        "problems": [[p.file, p.reason, p.severity, i] for i, r in enumerate(records) for p in r.problems],
    }
    arrays = {
        "meta": np.array(json.dumps(meta)),
        "labels": np.concatenate(labels) if labels else np.zeros((0, 5), np.float32),
        "label_counts": np.array([len(x) for x in labels], np.int64),
        "seg_counts": np.array([len(r.segments) for r in records], np.int64),
        "seg_lengths": np.array([len(s) for s in segs], np.int64),
        "seg_points": np.concatenate(segs).astype(np.float32) if segs else np.zeros((0, 2), np.float32),
    }

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: np.savez would add ".npz" to a path
            np.savez(f, **arrays)

    try:
        write_file(path, write, needed=sum(a.nbytes for a in arrays.values()) + (1 << 20),
                   what=f"writing the label cache {path}", durable=False)
    except OSError as e:
        log.warning("could not write the label cache %s (%s); the labels will be checked again next time", path, e)


def load_cache(path: Path, file_hash: str, nc: int) -> list[ImageRecord] | None:
    """Records from a cache that matches ``file_hash`` and ``nc``, else None."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if meta.get("version") != CACHE_VERSION or meta.get("hash") != file_hash or meta.get("nc") != nc:
                return None
            labels = np.split(z["labels"], np.cumsum(z["label_counts"])[:-1])
            seg_all = np.split(z["seg_points"], np.cumsum(z["seg_lengths"])[:-1]) if len(z["seg_lengths"]) else []
            seg_offsets = np.concatenate([[0], np.cumsum(z["seg_counts"])])
    except Exception as e:  # a damaged cache is rebuilt, never trusted
        log.warning("ignoring unreadable label cache %s (%s)", path, e)
        return None
    records = [ImageRecord(im, lb, tuple(size), lab.reshape(-1, 5), list(seg_all[seg_offsets[i]:seg_offsets[i + 1]]),
                           [], dup, tuple(unnamed))
               for i, (im, lb, size, lab, dup, unnamed) in enumerate(zip(
                   meta["im_files"], meta["lb_files"], meta["sizes"], labels, meta["n_duplicates"],
                   meta["unnamed_classes"]))]
    for file, reason, severity, i in meta["problems"]:
        records[i].problems.append(Problem(file, reason, severity))
    return records


def scan_images(im_files: list[Path], sources: list[Path], nc: int, use_cache: bool = True,
                desc: str = "checking") -> list[ImageRecord]:
    """Check every image/label pair, reusing the cache when nothing changed."""
    ims = [str(p) for p in im_files]
    lbs = [str(label_path(p)) for p in ims]
    file_hash = files_hash(ims + lbs)
    path = cache_path(sources, lbs) if ims else None
    if use_cache and path is not None:
        records = load_cache(path, file_hash, nc)
        if records is not None:
            log.debug("label cache %s reused", path)
            return records
    with _pool() as pool:
        records = list(tqdm(pool.map(check_image_label, ims, lbs, [nc] * len(ims)), total=len(ims), desc=desc,
                            disable=len(ims) < 1000))
    if use_cache and path is not None:
        save_cache(path, records, file_hash, nc)
    return records


def cache_images(paths: list[str], sizes: list[tuple[int, int]], image_size: int, augment: bool,
                 budget_fraction: float, required: bool) -> list[np.ndarray] | None:
    """Every image decoded once, resized, in RAM; when it needs more than ``budget_fraction`` of the available
    RAM: MemoryError with the numbers when ``required`` (cache="ram"), else None with a log line."""
    need = sum(w * h * 3 for w, h in (resized_size(w0, h0, image_size) for w0, h0 in sizes))
    avail = memory_limits().get("RAM")
    if avail is not None and need > budget_fraction * avail:
        msg = (f"caching {len(paths)} images at {image_size} px needs {need / 2**30:.2f} GiB but only "
               f"{avail / 2**30:.2f} GiB of RAM is available (limit {budget_fraction:.0%} of it)")
        if required:
            raise MemoryError(msg + ": use cache=None or a smaller image size")
        log.info("%s: not caching images", msg)
        return None
    with _pool() as pool:
        images = list(tqdm(pool.map(lambda p, wh: load_resized(p, image_size, augment, wh), paths, sizes),
                           total=len(paths),
                           desc=f"caching images ({need / 2**30:.2f} GiB)", disable=len(paths) < 1000))
    log.info("cached %d images in RAM (%.2f GiB)", len(paths), need / 2**30)
    return images


class DiskImages(Sequence):
    """Read-only (H, W, 3) uint8 views into the disk cache file, by image index (as the RAM cache's list)."""

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
    """Beside the label cache, one file per size and interpolation (``train.640px-linear.yolo9kit-images``)."""
    tag = f"{image_size}px-{'linear' if augment else 'area'}"
    return label_cache.with_name(f"{label_cache.name.split('.yolo9kit')[0]}.{tag}{DISK_SUFFIX}")


def open_disk_cache(path: Path, paths: list[str], sizes: list[tuple[int, int]], image_size: int,
                    augment: bool) -> DiskImages:
    """The cache at ``path`` for these images (a JSON header beside it), built first when missing or out of date.

    Raises:
        OSError: the folder is not writable or the disk has not enough free space (the numbers are given).
    """
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
    free = shutil.disk_usage(path.parent).free
    if images.nbytes > free:
        raise OSError(f"cache='disk' needs {images.nbytes / 2**30:.2f} GiB for {len(paths)} images at {image_size} px "
                      f"in {path.parent}, which has {free / 2**30:.2f} GiB free: use cache=None or a smaller size")

    def write(tmp: Path) -> None:
        bar = tqdm(total=len(paths), disable=len(paths) < 1000,
                   desc=f"writing the disk image cache ({images.nbytes / 2**30:.2f} GiB)")
        with open(tmp, "wb") as f, _pool() as pool:
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
    write_text_atomically(header, json.dumps(meta))
    log.info("wrote the disk image cache %s (%.2f GiB)", path, images.nbytes / 2**30)
    return images
