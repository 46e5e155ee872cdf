"""Checking a split: each image and label file (official ``verify_image_label``), the report, the label cache."""

from __future__ import annotations

import hashlib
import html
import json
import logging
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image
from tqdm.auto import tqdm

from yolo9kit.data.sources import DataConfig, label_path, orphan_label_files
from yolo9kit.files import write_file

log = logging.getLogger(__name__)

ERROR, WARNING, INFO = "error", "warning", "info"
MIN_IMAGE_SIDE = 10  # pixels, as in the official checks
PIL_FORMATS = {"BMP", "DNG", "JPEG", "MPO", "PNG", "TIFF", "WEBP", "PFM"}
OVERHANG = 1e-3  # share of a side a box may pass an edge unreported: rounding, converters clipping in pixels
MAX_DROPPED_SHARE = 0.10  # more labelled images lost to errors: something systematic is wrong
_PROCEED = "or pass allow_bad_labels=True (TrainConfig, create_dataloader) to train on the images that are left"
CACHE_VERSION = 4  # 3: label files with a byte-order mark read (not errors); 4: JSON
CACHE_SUFFIX = ".yolo9kit.cache"  # not the official ".cache" (a pickle): both tools keep theirs side by side


class DataError(ValueError):
    """A data set that cannot be used as it is; the message says where, the counts and what to do."""

    def _render_traceback_(self) -> list[str]:  # what IPython shows: the message, no traceback (%tb prints it)
        return [f"\x1b[31mDataError\x1b[0m: {self}"]


@dataclass(frozen=True)
class Problem:
    """One finding: ``error`` leaves the image out, ``warning`` keeps it (fixed or odd), ``info`` as it is."""

    file: str
    reason: str
    severity: str = ERROR


@dataclass
class DatasetReport:
    """What :func:`yolo9kit.data.check` found in one split: the counts and every finding, in file order."""

    split: str
    n_images: int = 0
    n_usable: int = 0
    n_labelled: int = 0
    n_background: int = 0
    n_skipped: int = 0
    n_instances: int = 0
    n_duplicates_removed: int = 0
    n_orphan_labels: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no image had to be left out."""
        return not any(p.severity == ERROR for p in self.problems)

    def to_frame(self) -> pd.DataFrame:
        """One row per problem: columns file, severity, reason."""
        return pd.DataFrame([(p.file, p.severity, p.reason) for p in self.problems],
                            columns=["file", "severity", "reason"])

    def summary(self) -> str:
        orphans = f", {self.n_orphan_labels} label files without an image" if self.n_orphan_labels else ""
        return (f"{self.split}: {self.n_images} images, {self.n_usable} usable ({self.n_labelled} labelled, "
                f"{self.n_background} background), {self.n_skipped} skipped, {self.n_instances} boxes, "
                f"{self.n_duplicates_removed} duplicate rows removed{orphans}, {len(self.problems)} problems")

    def __str__(self) -> str:
        width = min(max((len(p.file) for p in self.problems), default=0), 80)
        rows = [f"{p.severity:8}  {p.file:{width}}  {p.reason}" for p in self.problems]
        return "\n".join([self.summary(), *([f"{'severity':8}  {'file':{width}}  reason", *rows] if rows else [])])

    def _repr_html_(self) -> str:
        table = self.to_frame().to_html(index=False) if self.problems else "<p>no problems found</p>"
        return f"<div><p><b>{html.escape(self.summary())}</b></p>{table}</div>"


@dataclass
class ImageRecord:
    """One image checked: ``size`` (w, h) as displayed, ``labels`` (n, 5), ``segments`` a polygon per row or none."""

    im_file: str
    lb_file: str
    size: tuple[int, int] = (0, 0)
    labels: np.ndarray = field(default_factory=lambda: np.zeros((0, 5), np.float32))
    segments: list[np.ndarray] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    n_duplicates: int = 0
    unnamed_classes: tuple[int, ...] = ()

    @property
    def usable(self) -> bool:
        return not any(p.severity == ERROR for p in self.problems)


def _check_image(path: str) -> tuple[tuple[int, int], str | None, str | None]:
    """Size, error reason (None when fine) and a warning (None when nothing is odd)."""
    if not os.path.isfile(path):
        return (0, 0), "image file not found", None
    note = None
    with open(path, "rb") as f:
        head = f.read(2)
        f.seek(-2, 2) if os.path.getsize(path) >= 4 else None
        tail = f.read(2)
    if head == b"\xff\xd8" and tail != b"\xff\xd9":  # kept, never re-saved as the official code does
        end = Path(path).read_bytes().rfind(b"\xff\xd9")  # only for the rare JPEG that does not end with it
        try:
            with Image.open(path) as im:
                im.load()  # a truncated scan raises here, even when an EXIF thumbnail holds an end marker
        except Exception:  # PIL raises many types for damaged data
            end = -1
        if end < 0:
            return (0, 0), "corrupt or truncated JPEG (no end-of-image marker)", None
        trailing = os.path.getsize(path) - end - 2
        note = f"{trailing} bytes after the JPEG end-of-image marker: ignored when decoding (the file is left as it is)"
    try:
        with Image.open(path) as im:
            im.verify()
        with Image.open(path) as im:
            (w, h), fmt = im.size, im.format
            try:
                orientation = im.getexif().get(0x0112)
            except Exception:  # a broken EXIF block is not a reason to drop the image
                orientation = None
    except Exception as e:  # PIL raises many types for unreadable files
        return (0, 0), f"unreadable image ({type(e).__name__}: {e})", None
    size = (h, w) if orientation in {5, 6, 7, 8} else (w, h)  # EXIF orientations that swap width and height
    if fmt not in PIL_FORMATS:
        return size, f"unsupported image format {fmt}", None
    if size[0] < MIN_IMAGE_SIDE or size[1] < MIN_IMAGE_SIDE:
        return size, f"image too small ({size[0]}x{size[1]} px, need at least {MIN_IMAGE_SIDE} on each side)", None
    return size, None, note


def _parse_rows(rows: list[list[str]], nc: int) -> tuple[np.ndarray, list[np.ndarray], str | None]:
    """Split label lines -> (n, 5) boxes and polygons, or an error reason."""
    is_polygon = any(len(r) > 6 for r in rows)  # official rule: one long row makes every row a polygon
    boxes, segments = [], []
    for i, row in enumerate(rows, 1):
        if is_polygon and (len(row) < 7 or len(row) % 2 == 0):
            return boxes, segments, f"line {i}: polygon needs a class and at least 3 x y pairs, got {len(row)} values"
        if not is_polygon and len(row) != 5:
            return boxes, segments, f"line {i}: wrong column count, expected 5 values (class cx cy w h), got {len(row)}"
        numbers = [_number(v) for v in row]
        if None in numbers:
            return boxes, segments, f"line {i}: non-numeric value {row[numbers.index(None)]!r}"
        values = np.array(numbers, np.float64)
        if not np.isfinite(values).all():
            return boxes, segments, f"line {i}: non-finite value"
        cls = values[0]
        if cls != int(cls) or not 0 <= cls < nc:
            return boxes, segments, f"line {i}: class id {row[0]} outside 0..{nc - 1} (nc={nc})"
        if (values[1:] < 0).any() or (values[1:] > 1).any():  # official rule; overhanging boxes are clipped later
            return boxes, segments, f"line {i}: coordinates outside [0, 1] ({' '.join(row[1:5])}...)"
        if is_polygon:  # read as its bounding box
            pts = values[1:].reshape(-1, 2)
            segments.append(pts.astype(np.float32))
            (x1, y1), (x2, y2) = pts.min(0), pts.max(0)
            values = np.array([cls, (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1])
        boxes.append(values)
    return np.array(boxes, np.float32).reshape(-1, 5), segments, None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _rows_noted(lb_file: str, mask: np.ndarray, what: str) -> Problem:
    return Problem(lb_file, f"{what} (line {', '.join(str(i + 1) for i in np.flatnonzero(mask))})", WARNING)


def check_image_label(im_file: str | Path, lb_file: str | Path, nc: int) -> ImageRecord:
    """Check one image and its label file; bad content goes to the record's problems, never raised."""
    im_file, lb_file = str(im_file), str(lb_file)
    rec = ImageRecord(im_file, lb_file)
    rec.size, reason, note = _check_image(im_file)
    if reason or note:
        rec.problems.append(Problem(im_file, reason or note, ERROR if reason else WARNING))
    if reason:
        return rec
    if not os.path.isfile(lb_file):
        rec.problems.append(Problem(im_file, f"no label file ({lb_file}): used as a background image", WARNING))
        return rec
    try:
        text = Path(lb_file).read_text(encoding="utf-8-sig")  # the byte-order mark Windows Notepad writes
    except (OSError, UnicodeDecodeError) as e:
        rec.problems.append(Problem(lb_file, f"unreadable label file ({type(e).__name__}: {e})", ERROR))
        return rec
    rows = [line.split() for line in text.splitlines() if line.strip()]
    if not rows:
        rec.problems.append(Problem(lb_file, "empty label file: used as a background image", WARNING))
        return rec
    boxes, segments, reason = _parse_rows(rows, nc)
    if reason:
        rec.problems.append(Problem(lb_file, reason, ERROR))
        ids = {v for row in rows if (v := _number(row[0])) is not None}  # whole numbers >= nc: a short names list
        rec.unnamed_classes = tuple(sorted(int(v) for v in ids if math.isfinite(v) and v == int(v) and v >= nc))
        return rec
    if segments:
        rec.problems.append(Problem(lb_file, f"{len(segments)} polygons read as their bounding boxes", INFO))
    centre, half = boxes[:, 1:3], boxes[:, 3:5] / 2
    overhang = ((centre - half < -OVERHANG) | (centre + half > 1 + OVERHANG)).any(1)
    if overhang.any():  # training clips the box to the image: what it learns is not the box in the file
        rec.problems.append(_rows_noted(lb_file, overhang, "box reaches past the image edge, training clips it to "
                                                           "the image"))
    zero = (boxes[:, 3] <= 0) | (boxes[:, 4] <= 0)
    if zero.any():
        rec.problems.append(_rows_noted(lb_file, zero, "zero-size box removed"))
    _, first = np.unique(boxes[~zero], axis=0, return_index=True)  # the first of each set of equal rows
    keep = np.flatnonzero(~zero)[np.sort(first)]
    rec.n_duplicates = int((~zero).sum()) - len(keep)
    if rec.n_duplicates:
        rec.problems.append(Problem(lb_file, f"{rec.n_duplicates} duplicate rows removed", WARNING))
    rec.labels, rec.segments = boxes[keep], [segments[i] for i in keep] if segments else []
    return rec


def check_command(config: DataConfig, split: str) -> str:
    """What a shell user runs to see every problem of ``split`` (a Python call for a dict config)."""
    return (f"python -m yolo9kit data check {config.yaml_file} --split {split}" if config.yaml_file else
            f"yolo9kit.data.check(data, split={split!r})")


def refuse_bad_labels(config: DataConfig, split: str, report: DatasetReport, records: list[ImageRecord]) -> None:
    """Raise :class:`DataError` for unnamed class ids, no box at all or too many labelled images lost (docs/data.md)."""
    where = f"{config.yaml_file or 'the data config'} ({split} split)"
    unnamed = sorted({c for r in records for c in r.unnamed_classes})
    if unnamed:
        files = [r.lb_file for r in records if r.unnamed_classes]
        raise DataError(
            f"{where}: labels use class id{'s' * (len(unnamed) > 1)} {', '.join(map(str, unnamed))} but names has "
            f"{config.nc} (ids 0..{config.nc - 1}): {len(files)} of {report.n_images} images would be left out "
            f"(e.g. {files[0]}); add the missing names to data.yaml or fix the label files, {_PROCEED}")
    if report.n_usable == 0:  # left to the caller's own error
        return
    if report.n_instances == 0:
        missing = sum(not os.path.isfile(r.lb_file) for r in records if r.usable)
        example = next(r for r in records if r.usable)
        raise DataError(
            f"{where}: none of the {report.n_usable} usable images has a box ({missing} without a label file, "
            f"{report.n_usable - missing} with an empty one); the label of {example.im_file} is expected at "
            f"{example.lb_file} (the last images/ of the path becomes labels/, the suffix .txt): put the labels "
            f"there, {_PROCEED}")
    candidates = report.n_images - report.n_background
    if report.n_skipped > MAX_DROPPED_SHARE * candidates:
        raise DataError(
            f"{where}: {report.n_skipped} of {candidates} images with labels would be left out because of errors "
            f"(more than {MAX_DROPPED_SHARE:.0%}), {report.n_labelled} kept; `{check_command(config, split)}` "
            f"lists the files and reasons: fix them, {_PROCEED}")


def decode_pool() -> ThreadPoolExecutor:
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
            if {k: cached.get(k) for k in key} == key:  # each row as astuple(ImageRecord) below
                records = [ImageRecord(im, lb, tuple(size), np.array(labels, np.float32).reshape(-1, 5),
                                       [np.array(s, np.float32) for s in segments], [Problem(*p) for p in problems],
                                       n_duplicates, tuple(unnamed))
                           for im, lb, size, labels, segments, problems, n_duplicates, unnamed in cached["records"]]
        except Exception as e:  # a damaged cache is rebuilt, never trusted
            log.warning("ignoring unreadable label cache %s (%s)", path, e)
    if records is None:
        with decode_pool() as pool:
            records = list(tqdm(pool.map(check_image_label, ims, lbs, [config.nc] * len(ims)), total=len(ims),
                                desc=f"checking {split}", disable=len(ims) < 1000))
        if use_cache:
            text = json.dumps({**key, "records": [astuple(r) for r in records]}, default=np.ndarray.tolist)
            try:
                write_file(path, lambda tmp: tmp.write_text(text), needed=len(text) + (1 << 20),
                           what=f"writing the label cache {path}", durable=False)
            except OSError as e:
                log.warning("could not write the label cache %s (%s); the labels will be checked again next time",
                            path, e)
    usable = [r for r in records if r.usable]
    n_labelled = sum(bool(len(r.labels)) for r in usable)
    orphans = orphan_label_files(sources, lbs)
    return records, DatasetReport(
        split, n_images=len(records), n_usable=len(usable), n_labelled=n_labelled,
        n_background=len(usable) - n_labelled, n_skipped=len(records) - len(usable),
        n_instances=sum(len(r.labels) for r in usable), n_duplicates_removed=sum(r.n_duplicates for r in usable),
        n_orphan_labels=len(orphans), problems=[p for r in records for p in r.problems]
        + [Problem(f, "label file with no image: not used", WARNING) for f in orphans])
