"""A synthetic detection data set of coloured shapes on textured backgrounds.

The class of an object is its shape, so a tiny model can learn it on a CPU in minutes, and every box is
the exact pixel extent of the shape as drawn (polygons and ellipses are filled without anti-aliasing).
Files depend only on the arguments: the same seed writes byte-identical images and labels.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import cv2
import numpy as np
import yaml

from yolo9kit.files import write_folder

log = logging.getLogger(__name__)

SHAPE_NAMES = ("rectangle", "ellipse", "triangle", "star", "cross", "hexagon", "diamond", "ring")
_MANIFEST = "shapes.json"


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Smooth colour blobs + a gradient + fine grain, so that objects are not on a flat colour."""
    coarse = rng.integers(40, 216, (rng.integers(3, 7), rng.integers(3, 7), 3), dtype=np.uint8)
    image = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC).astype(np.int16)
    ramp = np.linspace(-25, 25, width, dtype=np.float32)[None, :, None] * rng.uniform(-1, 1)
    grain = rng.integers(-12, 13, (height, width, 1), dtype=np.int16)
    return np.clip(image + ramp.astype(np.int16) + grain, 0, 255).astype(np.uint8)


def _polygon(kind: str, cx: float, cy: float, radius: float, angle: float) -> np.ndarray:
    """Vertices (K, 2) of a regular shape centred on (cx, cy), rotated by ``angle`` radians."""
    if kind == "triangle":
        t = angle + np.arange(3) * 2 * np.pi / 3
        r = np.full(3, radius)
    elif kind == "star":
        t = angle + np.arange(10) * np.pi / 5
        r = np.where(np.arange(10) % 2 == 0, radius, radius * 0.45)
    elif kind == "hexagon":
        t = angle + np.arange(6) * np.pi / 3
        r = np.full(6, radius)
    elif kind == "diamond":
        t = angle + np.arange(4) * np.pi / 2
        r = np.array([radius, radius * 0.6, radius, radius * 0.6])
    elif kind == "cross":
        a = radius * 0.33
        pts = np.array([(-a, -radius), (a, -radius), (a, -a), (radius, -a), (radius, a), (a, a), (a, radius),
                        (-a, radius), (-a, a), (-radius, a), (-radius, -a), (-a, -a)])
        c, s = math.cos(angle), math.sin(angle)
        return pts @ np.array([[c, s], [-s, c]]) + (cx, cy)
    else:
        raise ValueError(f"unknown polygon shape {kind!r}")
    return np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], 1)


def _shape_mask(kind: str, height: int, width: int, cx: float, cy: float, size: float,
                rng: np.random.Generator) -> np.ndarray:
    """Binary mask (H, W) uint8 of one shape; ``size`` is its nominal diameter in pixels."""
    mask = np.zeros((height, width), np.uint8)
    radius = size / 2
    angle = rng.uniform(0, 2 * np.pi)
    if kind == "rectangle":
        aspect = rng.uniform(0.5, 2.0)
        w, h = radius * math.sqrt(aspect), radius / math.sqrt(aspect)
        cv2.rectangle(mask, (round(cx - w), round(cy - h)), (round(cx + w), round(cy + h)), 1, -1)
    elif kind in ("ellipse", "ring"):
        axes = (max(2, round(radius)), max(2, round(radius * rng.uniform(0.5, 1.0))))
        cv2.ellipse(mask, (round(cx), round(cy)), axes, math.degrees(angle), 0, 360, 1, -1, cv2.LINE_8)
        if kind == "ring":
            inner = (max(1, axes[0] // 2), max(1, axes[1] // 2))
            cv2.ellipse(mask, (round(cx), round(cy)), inner, math.degrees(angle), 0, 360, 0, -1, cv2.LINE_8)
    else:
        pts = np.round(_polygon(kind, cx, cy, radius, angle)).astype(np.int32)
        cv2.fillPoly(mask, [pts], 1, cv2.LINE_8)
    return mask


def _draw_image(rng: np.random.Generator, height: int, width: int, num_classes: int,
                max_objects: int) -> tuple[np.ndarray, list[tuple[int, float, float, float, float]]]:
    """One BGR image and its labels ``(class, cx, cy, w, h)`` normalised."""
    image = _background(rng, height, width)
    owner = np.full((height, width), -1, np.int16)  # index of the object that shows at each pixel
    areas: list[int] = []
    labels = []
    short = min(height, width)
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _attempt in range(10):  # overlaps are fine, hiding most of an earlier object is not
            cls = int(rng.integers(num_classes))
            size = rng.uniform(0.12, 0.45) * short
            cx, cy = rng.uniform(0.1, 0.9) * width, rng.uniform(0.1, 0.9) * height
            mask = _shape_mask(SHAPE_NAMES[cls], height, width, cx, cy, size, rng).astype(bool)
            covered = np.bincount(owner[mask] + 1, minlength=len(areas) + 1)[1:]
            visible = np.bincount(owner.ravel() + 1, minlength=len(areas) + 1)[1:]
            if mask.sum() >= 16 and all(v - c >= 0.5 * a for v, c, a in zip(visible, covered, areas)):
                break
        else:
            continue
        ys, xs = np.nonzero(mask)
        colour = rng.integers(0, 256, 3)
        shade = np.clip(colour + rng.integers(-15, 16, (xs.size, 3)), 0, 255).astype(np.uint8)
        image[ys, xs] = shade  # slight texture inside the shape too
        owner[ys, xs] = len(areas)
        areas.append(xs.size)
        x1, x2, y1, y2 = xs.min(), xs.max() + 1, ys.min(), ys.max() + 1  # pixel edges: exact extent
        labels.append((cls, (x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height))
    return image, labels


def _manifest(root: Path) -> dict | None:
    """The settings of the shapes data set in ``root`` (None: there is none)."""
    try:
        return json.loads((root / _MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def make_shapes(root: str | Path, n_train: int = 256, n_val: int = 64, imgsz: int | tuple[int, int] = 320,
                num_classes: int = 4, seed: int = 0, max_objects: int = 6, overwrite: bool = False) -> Path:
    """Write the synthetic shapes data set (JPEG images, YOLO labels, data.yaml) under ``root``.

    Args:
        root: output folder; ``images/{train,val}``, ``labels/{train,val}`` and ``data.yaml`` are written there.
        n_train, n_val: number of images per split.
        imgsz: square side in pixels, or ``(width, height)``.
        num_classes: 1 to 8 shape classes (rectangle, ellipse, triangle, star, cross, hexagon, diamond, ring).
        seed: the same seed (and arguments) gives byte-identical files.
        max_objects: at most this many objects per image (at least one).
        overwrite: write even when ``root`` holds other files (they are replaced), or regenerate when it
            already holds this exact data set. Without it a folder with other files is refused; one holding
            another shapes data set (its manifest says so: it can be made again) is replaced with a warning.

    Returns:
        Path of the written ``data.yaml``.

    Raises:
        FileExistsError: ``root`` holds other files and ``overwrite`` is False.
    """
    if not 1 <= num_classes <= len(SHAPE_NAMES):
        raise ValueError(f"num_classes must be between 1 and {len(SHAPE_NAMES)}, got {num_classes}")
    width, height = (imgsz, imgsz) if isinstance(imgsz, int) else tuple(imgsz)
    if min(width, height) < 32:
        raise ValueError(f"imgsz must be at least 32 pixels, got {imgsz}")
    root = Path(root)
    params = {"n_train": n_train, "n_val": n_val, "width": width, "height": height, "num_classes": num_classes,
              "seed": seed, "max_objects": max_objects, "version": 1}
    yaml_path = root / "data.yaml"
    previous = _manifest(root)
    if not overwrite and yaml_path.is_file() and previous == params:
        log.info("shapes data set already present in %s", root)
        return yaml_path
    if previous is not None and not overwrite:
        # another shapes data set: made again from its settings at any time, so it is replaced, with a word
        log.warning("replacing the shapes data set in %s (made with %s) by one with %s", root,
                    {k: v for k, v in previous.items() if params.get(k) != v}, {k: v for k, v in params.items()
                                                                             if previous.get(k) != v})
        overwrite = True

    def fill(folder: Path) -> None:
        for split_id, (split, count) in enumerate((("train", n_train), ("val", n_val))):
            image_dir, label_dir = folder / "images" / split, folder / "labels" / split
            image_dir.mkdir(parents=True, exist_ok=True)
            label_dir.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                rng = np.random.default_rng([seed, split_id, i])
                image, labels = _draw_image(rng, height, width, num_classes, max_objects)
                if not cv2.imwrite(str(image_dir / f"{i:06d}.jpg"), image, [cv2.IMWRITE_JPEG_QUALITY, 92]):
                    raise OSError(f"could not write {root / 'images' / split / f'{i:06d}.jpg'}")
                lines = "".join(f"{c} {x:.6f} {y:.6f} {w:.6f} {h:.6f}\n" for c, x, y, w, h in labels)
                (label_dir / f"{i:06d}.txt").write_text(lines)
        config = {"path": ".", "train": "images/train", "val": "images/val",
                  "names": list(SHAPE_NAMES[:num_classes])}
        (folder / "data.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (folder / _MANIFEST).write_text(json.dumps(params))

    # written whole in a folder beside ``root`` and moved into place: an interrupted run leaves the old one
    write_folder(root, fill, needed=(n_train + n_val) * (width * height // 4 + 4096), overwrite=overwrite,
                 what="writing the shapes data set")
    log.info("wrote %d train and %d val images to %s", n_train, n_val, root)
    return yaml_path
