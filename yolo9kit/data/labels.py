"""Per-image checks: can the image be read, and is its label file valid (official ``utils/dataloaders.py``
verify_image_label)?

Each image is checked once; the result (labels, size, problems) goes to the label cache.

A JPEG with bytes after its end-of-image marker (some cameras and editors append data) is kept with a
warning: OpenCV and PIL stop decoding at the marker, so the pixels are those of the image, and the file is
never rewritten. (The official loader re-saves such a file in place at quality 100, which changes the
user's file and, by re-encoding, its pixels.) A JPEG that ends before its marker is truncated: an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from yolo9kit.data.report import ERROR, INFO, WARNING, Problem

MIN_IMAGE_SIDE = 10  # pixels, as in the official checks
PIL_FORMATS = {"BMP", "DNG", "JPEG", "MPO", "PNG", "TIFF", "WEBP", "PFM"}
_TRANSPOSED_ORIENTATIONS = {5, 6, 7, 8}  # EXIF orientations that swap width and height


@dataclass
class ImageRecord:
    """What the check found for one image.

    Attributes:
        im_file, lb_file: paths (strings).
        size: (width, height) after EXIF orientation; (0, 0) when unreadable.
        labels: (n, 5) float32 rows ``class cx cy w h`` normalised.
        segments: polygons (k, 2) normalised, one per label row, when the file held polygons (else []).
        problems: findings for this image.
        n_duplicates: duplicate rows removed.
        unnamed_classes: class ids of the label file that ``names`` does not name (>= nc); the image is
            left out, and a training split with any of them refuses to open (``yolo9kit.data.guard``).
    """

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
    """Bytes after the end-of-image marker of a JPEG that does not end with one; None when it has no marker
    before its end or when the image does not decode completely (a truncated file)."""
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
    if head == b"\xff\xd8" and tail != b"\xff\xd9":
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


# how far (a share of the image side) a box may reach past an edge before it is reported: six-decimal labels
# round cx and w to 5e-7 each; converters that clip in pixels land within a pixel of the edge
OVERHANG = 1e-3


def _parse_rows(rows: list[list[str]], nc: int) -> tuple[np.ndarray, list[np.ndarray], str | None]:
    """Parse split label lines into (n, 5) boxes and polygons; returns an error reason instead when invalid."""
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
            x1, y1 = pts.min(0)
            x2, y2 = pts.max(0)
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
        try:
            value = float(row[0])
        except ValueError:
            continue
        if np.isfinite(value) and value == int(value) and value >= nc:
            ids.add(int(value))
    return tuple(sorted(ids))


def _is_float(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def check_image_label(im_file: str | Path, lb_file: str | Path, nc: int) -> ImageRecord:
    """Check one image and its label file; never raises for bad content (the record holds the problems)."""
    im_file, lb_file = str(im_file), str(lb_file)
    rec = ImageRecord(im_file, lb_file)
    rec.size, reason, note = _check_image(im_file)
    if reason:
        rec.problems.append(Problem(im_file, reason, ERROR))
        return rec
    if note:
        rec.problems.append(Problem(im_file, note, WARNING))
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
        rows_txt = ", ".join(str(i + 1) for i in np.flatnonzero(overhang))
        rec.problems.append(Problem(lb_file, f"box reaches past the image edge, training clips it to the image "
                                             f"(line {rows_txt})", WARNING))
    zero = (boxes[:, 3] <= 0) | (boxes[:, 4] <= 0)
    if zero.any():
        rows_txt = ", ".join(str(i + 1) for i in np.flatnonzero(zero))
        rec.problems.append(Problem(lb_file, f"zero-size box removed (line {rows_txt})", WARNING))
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
