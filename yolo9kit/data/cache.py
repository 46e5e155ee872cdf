"""The caches of a split (docs/data.md): the label cache (official ``cache_labels``, in JSON), the decoded images
in RAM, and ``cache="disk"``, the decoded images in one memory-mapped file."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from yolo9kit.data.images import load_resized, resized_size
from yolo9kit.data.labels import DataError, DatasetReport, ImageRecord, Problem, build_report, check_image_label
from yolo9kit.data.sources import DataConfig, label_path
from yolo9kit.env import memory_limits
from yolo9kit.files import write_file, write_text_atomically

log = logging.getLogger(__name__)
CACHE_VERSION = 4  # 3: label files with a byte-order mark read (not errors); 4: JSON
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


def _record(row: list) -> ImageRecord:
    im, lb, size, labels, segments, problems, n_duplicates, unnamed = row
    return ImageRecord(im, lb, tuple(size), np.array(labels, np.float32).reshape(-1, 5),
                       [np.array(seg, np.float32) for seg in segments], [Problem(*p) for p in problems],
                       n_duplicates, tuple(unnamed))


def scan_split(config: DataConfig, split: str, use_cache: bool) -> tuple[list[ImageRecord], DatasetReport]:
    """Every image of ``split`` checked (from the label cache when nothing changed) and the report."""
    ims, sources = [str(p) for p in config.images(split)], config.sources[split]
    if not ims:
        raise DataError(f"{config.yaml_file or 'the data config'}: the {split} split has no images in "
                        f"{', '.join(map(str, sources))}; put images there (folders are searched recursively) or "
                        f"fix its {split}: entry")
    lbs = [str(label_path(p)) for p in ims]
    key, path = {"version": CACHE_VERSION, "hash": files_hash(ims + lbs), "nc": config.nc}, cache_path(sources, lbs)
    records = None
    if use_cache and path.is_file():
        try:
            cached = json.loads(path.read_text())
            if {k: cached.get(k) for k in key} == key:
                records = [_record(row) for row in cached["records"]]
        except Exception as e:  # a damaged cache is rebuilt, never trusted
            log.warning("ignoring unreadable label cache %s (%s)", path, e)
    if records is None:
        with _pool() as pool:
            records = list(tqdm(pool.map(check_image_label, ims, lbs, [config.nc] * len(ims)), total=len(ims),
                                desc=f"checking {split}", disable=len(ims) < 1000))
        if use_cache:
            _save_cache(path, key, records)
    return records, build_report(split, records, sources)


def _save_cache(path: Path, key: dict, records: list[ImageRecord]) -> None:
    text = json.dumps({**key, "records": [
        [r.im_file, r.lb_file, r.size, r.labels.tolist(), [seg.tolist() for seg in r.segments],
         [[p.file, p.reason, p.severity] for p in r.problems], r.n_duplicates, r.unnamed_classes] for r in records]})
    try:
        write_file(path, lambda tmp: tmp.write_text(text), needed=len(text) + (1 << 20),
                   what=f"writing the label cache {path}", durable=False)
    except OSError as e:
        log.warning("could not write the label cache %s (%s); the labels will be checked again next time", path, e)


def cache_images(paths: list[str], sizes: list[tuple[int, int]], image_size: int, augment: bool, mode: str,
                 budget_fraction: float, label_cache: Path) -> Sequence[np.ndarray] | None:
    """The images decoded once and resized, for cache ``mode`` (docs/data.md, "Loader"): "disk" (a memory map
    beside ``label_cache``; else as "auto"), "auto" (in RAM when they fit in ``budget_fraction`` of it; else None)
    or "ram" (MemoryError with the numbers when they do not fit)."""
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
    with _pool() as pool:
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
    """The disk cache at ``path`` (a JSON header beside it), built when missing or out of date; OSError when it
    cannot be written."""
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
