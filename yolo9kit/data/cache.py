"""Scan a split once and keep the result in a label cache beside the labels (official ``utils/dataloaders.py``
LoadImagesAndLabels.cache_labels).

The cache is an ``.npz`` of plain arrays plus one JSON string (no pickled objects), written to a temporary
file and renamed, and it is rebuilt whenever an image or label file is added, removed, resized or touched
(MD5 of every path, size and modification time).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from yolo9kit.data.labels import ImageRecord, check_image_label
from yolo9kit.data.report import WARNING, DatasetReport, Problem
from yolo9kit.data.sources import label_path, orphan_label_files
from yolo9kit.files import write_file

log = logging.getLogger(__name__)
CACHE_VERSION = 3  # 2: unnamed class ids per image; 3: label files with a byte-order mark read (not errors)
CACHE_SUFFIX = ".yolo9kit.cache"


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
    """``<list file>.yolo9kit.cache`` for a single ``.txt`` source, else ``<label folder>.yolo9kit.cache``.

    The official code uses the same places with a plain ``.cache`` suffix (a pickle); the different name
    lets both tools keep their caches beside the same data set.
    """
    base = sources[0] if len(sources) == 1 and sources[0].is_file() else Path(label_files[0]).parent
    return base.with_name(base.stem + CACHE_SUFFIX) if base.is_file() else base.with_name(base.name + CACHE_SUFFIX)


def save_cache(path: Path, records: list[ImageRecord], file_hash: str, nc: int) -> None:
    """Write the records atomically; an unwritable folder only logs a warning."""
    labels = [r.labels for r in records]
    seg_counts = [len(r.segments) for r in records]
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
        "seg_counts": np.array(seg_counts, np.int64),
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
                           [], dup)
               for i, (im, lb, size, lab, dup) in enumerate(zip(meta["im_files"], meta["lb_files"], meta["sizes"],
                                                                 labels, meta["n_duplicates"]))]
    for file, reason, severity, i in meta["problems"]:
        records[i].problems.append(Problem(file, reason, severity))
    for record, ids in zip(records, meta["unnamed_classes"]):
        record.unnamed_classes = tuple(ids)
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
    workers = min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as pool:
        records = list(tqdm(pool.map(check_image_label, ims, lbs, [nc] * len(ims)), total=len(ims), desc=desc,
                            disable=len(ims) < 1000))
    if use_cache and path is not None:
        save_cache(path, records, file_hash, nc)
    return records


def build_report(split: str, records: list[ImageRecord], sources: list[Path] | None = None) -> DatasetReport:
    """Counts and problems of a scanned split; with ``sources``, label files without an image too (warnings)."""
    report = DatasetReport(split=split, n_images=len(records))
    for r in records:
        report.problems += r.problems
        if not r.usable:
            report.n_skipped += 1
            continue
        report.n_usable += 1
        report.n_duplicates_removed += r.n_duplicates
        report.n_instances += len(r.labels)
        if len(r.labels):
            report.n_labelled += 1
        else:
            report.n_background += 1
    orphans = orphan_label_files(sources, [r.lb_file for r in records]) if sources else []
    report.n_orphan_labels = len(orphans)
    report.problems += [Problem(f, "label file with no image: not used", WARNING) for f in orphans]
    return report
