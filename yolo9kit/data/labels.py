"""Checking a split: each image and its label file (official ``verify_image_label``), the report, and the
refusal of a training split that lost its labels. docs/data.md, "Checks", lists every case."""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from yolo9kit.data.sources import DataConfig, orphan_label_files

ERROR, WARNING, INFO = "error", "warning", "info"
MIN_IMAGE_SIDE = 10  # pixels, as in the official checks
PIL_FORMATS = {"BMP", "DNG", "JPEG", "MPO", "PNG", "TIFF", "WEBP", "PFM"}
_TRANSPOSED_ORIENTATIONS = {5, 6, 7, 8}  # EXIF orientations that swap width and height
# how far (a share of the image side) a box may reach past an edge before it is reported: six-decimal labels
# round cx and w to 5e-7 each; converters that clip in pixels land within a pixel of the edge
OVERHANG = 1e-3
# beyond a tenth of the labelled images lost to errors something systematic is wrong (names, format, layout)
MAX_DROPPED_SHARE = 0.10
_PROCEED = "or pass allow_bad_labels=True (TrainConfig, create_dataloader) to train on the images that are left"


class DataError(ValueError):
    """A data set that cannot be used as it is; the message names the data.yaml, the split, the counts and
    what to do."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows in a notebook: the message without the traceback (``%tb`` still prints it)."""
        return [f"\x1b[31mDataError\x1b[0m: {self}"]


@dataclass(frozen=True)
class Problem:
    """One finding: ``error`` leaves the image out, ``warning`` keeps it (something fixed or odd), ``info``
    keeps it as it is."""

    file: str
    reason: str
    severity: str = ERROR


@dataclass
class DatasetReport:
    """What :func:`yolo9kit.data.check` found in one split: the counts (``n_images``, ``n_usable`` = labelled
    + background, ``n_labelled``, ``n_background``, ``n_skipped``, ``n_instances``, ``n_duplicates_removed``,
    ``n_orphan_labels``) and every finding, in file order."""

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

    def to_frame(self):
        """One row per problem: columns file, severity, reason (a pandas DataFrame)."""
        import pandas as pd

        return pd.DataFrame([(p.file, p.severity, p.reason) for p in self.problems],
                            columns=["file", "severity", "reason"])

    def summary(self) -> str:
        orphans = f", {self.n_orphan_labels} label files without an image" if self.n_orphan_labels else ""
        return (f"{self.split}: {self.n_images} images, {self.n_usable} usable ({self.n_labelled} labelled, "
                f"{self.n_background} background), {self.n_skipped} skipped, {self.n_instances} boxes, "
                f"{self.n_duplicates_removed} duplicate rows removed{orphans}, {len(self.problems)} problems")

    def __str__(self) -> str:
        lines = [self.summary()]
        if self.problems:
            width = min(max(len(p.file) for p in self.problems), 80)
            lines.append(f"{'severity':8}  {'file':{width}}  reason")
            lines += [f"{p.severity:8}  {p.file:{width}}  {p.reason}" for p in self.problems]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(p.severity)}</td><td>{html.escape(p.file)}</td>"
                       f"<td>{html.escape(p.reason)}</td></tr>" for p in self.problems)
        table = (f"<table><thead><tr><th>severity</th><th>file</th><th>reason</th></tr></thead>"
                 f"<tbody>{rows}</tbody></table>") if rows else "<p>no problems found</p>"
        return f"<div><p><b>{html.escape(self.summary())}</b></p>{table}</div>"


@dataclass
class ImageRecord:
    """What the check found for one image: ``size`` (w, h) after EXIF orientation, (0, 0) when unreadable;
    ``labels`` (n, 5) ``class cx cy w h``; ``segments`` one (k, 2) polygon per row when the file held
    polygons; ``unnamed_classes`` ids >= nc (the image is left out, a training split refused)."""

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


def exif_size(image: Image.Image) -> tuple[int, int]:
    """(width, height) of a PIL image once its EXIF orientation is applied."""
    w, h = image.size
    try:
        orientation = image.getexif().get(0x0112)
    except Exception:  # a broken EXIF block is not a reason to drop the image
        orientation = None
    return (h, w) if orientation in _TRANSPOSED_ORIENTATIONS else (w, h)


def _jpeg_trailing_bytes(path: str) -> int | None:
    """Bytes after the end-of-image marker; None when there is none or the image does not decode fully."""
    data = Path(path).read_bytes()  # only for the rare JPEG that does not end with its marker
    end = data.rfind(b"\xff\xd9")
    if end < 0:
        return None
    try:
        with Image.open(path) as im:
            im.load()  # a truncated scan raises here, even when an EXIF thumbnail holds an end marker
    except Exception:  # PIL raises many types for damaged data
        return None
    return len(data) - end - 2


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
        trailing = _jpeg_trailing_bytes(path)
        if trailing is None:
            return (0, 0), "corrupt or truncated JPEG (no end-of-image marker)", None
        note = (f"{trailing} bytes after the JPEG end-of-image marker: ignored when decoding "
                f"(the file is left as it is)")
    try:
        with Image.open(path) as im:
            im.verify()
        with Image.open(path) as im:
            size, fmt = exif_size(im), im.format
    except Exception as e:  # PIL raises many types for unreadable files
        return (0, 0), f"unreadable image ({type(e).__name__}: {e})", None
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
        try:
            values = np.array([float(v) for v in row], np.float64)
        except ValueError:
            bad = next(v for v in row if not _is_float(v))
            return boxes, segments, f"line {i}: non-numeric value {bad!r}"
        if not np.isfinite(values).all():
            return boxes, segments, f"line {i}: non-finite value"
        cls = values[0]
        if cls != int(cls) or not 0 <= cls < nc:
            return boxes, segments, f"line {i}: class id {row[0]} outside 0..{nc - 1} (nc={nc})"
        if is_polygon:
            pts = values[1:].reshape(-1, 2)
            segments.append(pts.astype(np.float32))
            (x1, y1), (x2, y2) = pts.min(0), pts.max(0)
            coords = np.array([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1])
            raw = pts.ravel()
        else:
            coords = raw = values[1:]
        if (raw < 0).any() or (raw > 1).any():  # official rule; boxes overhanging an edge are clipped later
            return boxes, segments, f"line {i}: coordinates outside [0, 1] ({' '.join(row[1:5])}...)"
        boxes.append(np.concatenate([[cls], coords]))
    return np.array(boxes, np.float32).reshape(-1, 5), segments, None


def _unnamed_classes(rows: list[list[str]], nc: int) -> tuple[int, ...]:
    """Whole-number class ids >= ``nc`` in the first column (what a short ``names`` list leaves unnamed)."""
    ids = set()
    for row in rows:
        value = float(row[0]) if _is_float(row[0]) else np.nan
        if np.isfinite(value) and value == int(value) and value >= nc:
            ids.add(int(value))
    return tuple(sorted(ids))


def _is_float(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _rows_noted(lb_file: str, mask: np.ndarray, what: str) -> Problem:
    return Problem(lb_file, f"{what} (line {', '.join(str(i + 1) for i in np.flatnonzero(mask))})", WARNING)


def check_image_label(im_file: str | Path, lb_file: str | Path, nc: int) -> ImageRecord:
    """Check one image and its label file; never raises for bad content (the record holds the problems)."""
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
        rec.unnamed_classes = _unnamed_classes(rows, nc)
        return rec
    if segments:
        rec.problems.append(Problem(lb_file, f"{len(segments)} polygons read as their bounding boxes", INFO))
    cx, cy, w, h = boxes[:, 1], boxes[:, 2], boxes[:, 3], boxes[:, 4]
    overhang = (cx - w / 2 < -OVERHANG) | (cx + w / 2 > 1 + OVERHANG) | (cy - h / 2 < -OVERHANG) | \
        (cy + h / 2 > 1 + OVERHANG)
    if overhang.any():  # training clips the box to the image: what it learns is not the box in the file
        rec.problems.append(_rows_noted(lb_file, overhang, "box reaches past the image edge, training clips it to "
                                                           "the image"))
    zero = (boxes[:, 3] <= 0) | (boxes[:, 4] <= 0)
    if zero.any():
        rec.problems.append(_rows_noted(lb_file, zero, "zero-size box removed"))
        boxes = boxes[~zero]
        segments = [s for s, z in zip(segments, zero) if not z] if segments else []
    _, first = np.unique(boxes, axis=0, return_index=True)
    if len(first) < len(boxes):
        keep = np.sort(first)
        rec.n_duplicates = len(boxes) - len(keep)
        rec.problems.append(Problem(lb_file, f"{rec.n_duplicates} duplicate rows removed", WARNING))
        boxes = boxes[keep]
        segments = [segments[i] for i in keep] if segments else []
    rec.labels, rec.segments = boxes, segments
    return rec


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
        report.n_labelled += bool(len(r.labels))
    report.n_background = report.n_usable - report.n_labelled
    orphans = orphan_label_files(sources, [r.lb_file for r in records]) if sources else []
    report.n_orphan_labels = len(orphans)
    report.problems += [Problem(f, "label file with no image: not used", WARNING) for f in orphans]
    return report


def check_command(config: DataConfig, split: str) -> str:
    """What a shell user runs to see every problem of ``split`` (a Python call for a dict config)."""
    if config.yaml_file is None:
        return f"yolo9kit.data.check(data, split={split!r})"
    return f"python -m yolo9kit data check {config.yaml_file} --split {split}"


def refuse_bad_labels(config: DataConfig, split: str, report: DatasetReport, records: list[ImageRecord]) -> None:
    """Raise :class:`DataError` for unnamed class ids (official assert), no box at all (official "no labels
    found"), or more than :data:`MAX_DROPPED_SHARE` of the non-background images lost to errors."""
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
