"""Making data sets: the synthetic shapes data set (docs/data.md) and COCO annotations converted to YOLO."""

from __future__ import annotations

import json
import logging
import math
import os
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import cv2
import numpy as np
import yaml

from yolo9kit.files import write_folder, write_text_atomically

log = logging.getLogger(__name__)

SHAPE_NAMES = ("rectangle", "ellipse", "triangle", "star", "cross", "hexagon", "diamond", "ring")
_MANIFEST = "shapes.json"


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    coarse = rng.integers(40, 216, (rng.integers(3, 7), rng.integers(3, 7), 3), dtype=np.uint8)
    image = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC).astype(np.int16)
    ramp = np.linspace(-25, 25, width, dtype=np.float32)[None, :, None] * rng.uniform(-1, 1)
    grain = rng.integers(-12, 13, (height, width, 1), dtype=np.int16)
    return np.clip(image + ramp.astype(np.int16) + grain, 0, 255).astype(np.uint8)


def _shape_mask(kind: str, height: int, width: int, cx: float, cy: float, size: float,
                rng: np.random.Generator) -> np.ndarray:
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
    elif kind == "cross":
        a, c, s = radius * 0.33, math.cos(angle), math.sin(angle)
        pts = np.array([(-a, -radius), (a, -radius), (a, -a), (radius, -a), (radius, a), (a, a), (a, radius),
                        (-a, radius), (-a, a), (-radius, a), (-radius, -a), (-a, -a)])
        cv2.fillPoly(mask, [np.round(pts @ np.array([[c, s], [-s, c]]) + (cx, cy)).astype(np.int32)], 1, cv2.LINE_8)
    else:  # a regular polygon; its radii repeat round the vertices
        n, radii = {"triangle": (3, [radius]), "star": (10, [radius, radius * 0.45]), "hexagon": (6, [radius]),
                    "diamond": (4, [radius, radius * 0.6])}[kind]
        t, r = angle + np.arange(n) * 2 * np.pi / n, np.resize(radii, n)
        pts = np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], 1)
        cv2.fillPoly(mask, [np.round(pts).astype(np.int32)], 1, cv2.LINE_8)
    return mask


def _draw_image(rng: np.random.Generator, height: int, width: int, num_classes: int,
                max_objects: int) -> tuple[np.ndarray, list[tuple[int, float, float, float, float]]]:
    """One BGR image and its labels ``(class, cx, cy, w, h)`` normalised."""
    image = _background(rng, height, width)
    owner = np.full((height, width), -1, np.int16)  # index of the object that shows at each pixel
    areas, labels = [], []
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
        shade = np.clip(rng.integers(0, 256, 3) + rng.integers(-15, 16, (xs.size, 3)), 0, 255)
        image[ys, xs] = shade.astype(np.uint8)  # a random colour, slightly textured
        owner[ys, xs] = len(areas)
        areas.append(xs.size)
        x1, x2, y1, y2 = xs.min(), xs.max() + 1, ys.min(), ys.max() + 1  # pixel edges: exact extent
        labels.append((cls, (x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height))
    return image, labels


def _write_shapes(folder: Path, root: Path, params: dict) -> None:
    """The shapes data set of ``params`` into ``folder``, the temporary twin of ``root``."""
    for split_id, split in enumerate(("train", "val")):
        image_dir, label_dir = folder / "images" / split, folder / "labels" / split
        image_dir.mkdir(parents=True, exist_ok=True)
        label_dir.mkdir(parents=True, exist_ok=True)
        for i in range(params[f"n_{split}"]):
            rng = np.random.default_rng([params["seed"], split_id, i])
            image, labels = _draw_image(rng, params["height"], params["width"], params["num_classes"],
                                        params["max_objects"])
            if not cv2.imwrite(str(image_dir / f"{i:06d}.jpg"), image, [cv2.IMWRITE_JPEG_QUALITY, 92]):
                raise OSError(f"could not write {root / 'images' / split / f'{i:06d}.jpg'}")
            (label_dir / f"{i:06d}.txt").write_text("".join(f"{c} {x:.6f} {y:.6f} {w:.6f} {h:.6f}\n"
                                                            for c, x, y, w, h in labels))
    config = {"path": ".", "train": "images/train", "val": "images/val",
              "names": list(SHAPE_NAMES[:params["num_classes"]])}
    (folder / "data.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (folder / _MANIFEST).write_text(json.dumps(params))


def make_shapes(root: str | Path, n_train: int = 256, n_val: int = 64, imgsz: int | tuple[int, int] = 320,
                num_classes: int = 4, seed: int = 0, max_objects: int = 6, overwrite: bool = False) -> Path:
    """Write the synthetic shapes data set (``images/``, ``labels/``, ``data.yaml``) under ``root``: the data.yaml path.

    Args:
        n_train, n_val, max_objects: images per split, at most this many objects per image (at least one).
        imgsz: square side in pixels, or ``(width, height)``; num_classes: 1 to 8 (``SHAPE_NAMES``); seed.
        overwrite: replace other files in ``root`` (without it another shapes data set is replaced, with a warning).
    Raises:
        FileExistsError: ``root`` holds other files and ``overwrite`` is False.
        ValueError: ``num_classes`` or ``imgsz`` out of range.
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
    try:
        previous = json.loads((root / _MANIFEST).read_text())
    except (OSError, ValueError):
        previous = None
    if not overwrite and yaml_path.is_file() and previous == params:
        log.info("shapes data set already present in %s", root)
        return yaml_path
    if previous is not None and not overwrite:  # made again from its settings at any time: replaced, with a word
        log.warning("replacing the shapes data set in %s (made with %s) by one with %s", root,
                    {k: v for k, v in previous.items() if params.get(k) != v}, {k: v for k, v in params.items()
                                                                             if previous.get(k) != v})
        overwrite = True
    write_folder(root, lambda folder: _write_shapes(folder, root, params), overwrite=overwrite,
                 needed=(n_train + n_val) * (width * height // 4 + 4096), what="writing the shapes data set")
    log.info("wrote %d train and %d val images to %s", n_train, n_val, root)
    return yaml_path


@dataclass
class CocoConversion:
    """Result of :func:`coco_to_yolo`: the data.yaml written, class names and counts."""

    yaml_path: Path
    names: list[str]
    category_ids: list[int]  # COCO category id of each class index
    n_images: int = 0
    n_boxes: int = 0
    n_crowd_skipped: int = 0
    n_invalid_skipped: int = 0
    skipped: list[str] = field(default_factory=list)
    n_missing_images: int = 0  # images the JSON names that are not in the images folder (in ``skipped``)
    n_val: int = 0  # images held out for validation (``holdout``); 0: validation uses the converted split


def _require(cond: bool, json_path: Path, what: str) -> None:
    if not cond:
        raise ValueError(f"{json_path}: malformed COCO annotations: {what}")


def _read_coco(json_path: Path) -> tuple[dict, list[dict], dict[int, tuple[str, float, float]], dict]:
    """The JSON, its categories in id order, ``{image id: (file_name, width, height)}``, ``{image id: label file}``."""
    try:
        coco = json.loads(json_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{json_path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from e
    _require(isinstance(coco, dict), json_path, "the top level must be an object")
    for key in ("images", "annotations", "categories"):
        _require(isinstance(coco.get(key), list), json_path, f"missing list '{key}'")
    try:
        cats = sorted(coco["categories"], key=lambda c: int(c["id"]))
        images = {int(im["id"]): (str(im["file_name"]), float(im["width"]), float(im["height"]))
                  for im in coco["images"]}
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{json_path}: malformed COCO annotations: a category needs 'id' and an image needs "
                         f"'id', 'file_name', 'width' and 'height' ({type(e).__name__}: {e})") from e
    seen: dict[PurePosixPath, int] = {}
    for image_id, (file_name, width, height) in images.items():
        _require(math.isfinite(width) and math.isfinite(height) and width > 0 and height > 0, json_path,
                 f"image {image_id} ({file_name}) has a non-positive or non-finite size {width} x {height}")
        relative = PurePosixPath(file_name.replace("\\", "/"))
        _require(not relative.is_absolute() and ".." not in relative.parts and relative.name, json_path,
                 f"image {image_id} has file_name {file_name!r}, which is not inside the images folder")
        label = relative.with_suffix(".txt")
        _require(label not in seen, json_path, f"images {seen.get(label)} and {image_id} both have the label file "
                                               f"{label} (file names {file_name!r}): give them distinct names")
        seen[label] = image_id
    return coco, cats, images, {image_id: label for label, image_id in seen.items()}


def _label_rows(coco: dict, cat_to_class: dict[int, int], images: dict, json_path: Path,
                result: CocoConversion) -> dict[int, list[str]]:
    """``{image id: label rows}``; crowd and unusable boxes are counted (and named) in ``result``."""
    rows = defaultdict(list)
    for k, ann in enumerate(coco["annotations"]):
        try:
            image_id, cat, (x, y, w, h) = int(ann["image_id"]), int(ann["category_id"]), map(float, ann["bbox"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{json_path}: annotation {k} needs image_id, category_id and bbox [x, y, w, h] "
                             f"({type(e).__name__}: {e})") from e
        _require(image_id in images, json_path, f"annotation {k} refers to unknown image id {image_id}")
        _require(cat in cat_to_class, json_path, f"annotation {k} refers to unknown category id {cat}")
        _require(all(math.isfinite(v) for v in (x, y, w, h)), json_path,
                 f"annotation {k} has a non-finite bbox {[x, y, w, h]}")
        if ann.get("iscrowd", 0):
            result.n_crowd_skipped += 1
            continue
        file_name, width, height = images[image_id]
        x1, y1, x2, y2 = max(x, 0.0), max(y, 0.0), min(x + w, width), min(y + h, height)  # clipped to the image
        why = (f"box of size {w} x {h} (zero or negative)" if w <= 0 or h <= 0 else
               f"box [{x}, {y}, {w}, {h}] lies wholly outside the {width:g} x {height:g} image"
               if x2 <= x1 or y2 <= y1 else "")
        if why:
            result.n_invalid_skipped += 1
            result.skipped.append(f"annotation {k} ({file_name}): {why}")
            log.warning("%s: %s: dropped", json_path, result.skipped[-1])
            continue
        cx, cy, bw, bh = (x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height
        rows[image_id].append(f"{cat_to_class[cat]} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}")
    return rows


def coco_to_yolo(json_path: str | Path, out_dir: str | Path, images_dir: str | Path | None = None,
                 split: str = "train", overwrite: bool = False, holdout: float = 0.2) -> CocoConversion:
    """Convert COCO annotations into a YOLO data set in ``out_dir`` that trains as it is (docs/data.md).

    Args:
        images_dir: where the images are (linked into ``out_dir/images/<split>``); default that folder.
        split: the split the images make; overwrite: replace an earlier conversion.
        holdout: share of a train split held out for validation (0: validate on the training images).
    Raises:
        ValueError: ``holdout`` outside [0, 1) or malformed annotations (named).
        FileExistsError: a data.yaml exists there and ``overwrite`` is False.
    """
    json_path, out_dir = Path(json_path), Path(out_dir)
    if not 0 <= holdout < 1:
        raise ValueError(f"holdout={holdout!r}: expected a share of the images in [0, 1)")
    label_dir, yaml_path = out_dir / "labels" / split, out_dir / "data.yaml"
    if not overwrite and yaml_path.exists():
        raise FileExistsError(f"{yaml_path} exists: converting into {out_dir} would overwrite it; choose an empty "
                              "folder or pass overwrite (--overwrite)")
    coco, cats, images, label_files = _read_coco(json_path)
    result = CocoConversion(yaml_path, [str(c.get("name", c["id"])) for c in cats], [int(c["id"]) for c in cats])
    rows = _label_rows(coco, {cat: i for i, cat in enumerate(result.category_ids)}, images, json_path, result)

    def fill(folder: Path) -> None:
        for image_id, relative in label_files.items():
            target = folder / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("".join(r + "\n" for r in rows[image_id]))

    write_folder(label_dir, fill, needed=sum(len(r) + 1 for rs in rows.values() for r in rs) + 4096 * len(images),
                 overwrite=overwrite, what=f"writing the labels of {json_path.name}")
    result.n_boxes, result.n_images = sum(len(rows[image_id]) for image_id in label_files), len(images)
    placed = _place_images(images, out_dir / "images" / split, Path(images_dir) if images_dir else None, result)
    n_val = min(max(round(len(placed) * holdout), 1), len(placed) - 1) if holdout and len(placed) > 1 else 0
    val = sorted(random.Random(0).sample(sorted(placed), n_val)) if split == "train" else []
    result.n_val = len(val)
    for name, ids in {split: [i for i in sorted(placed) if i not in set(val)], **({"val": val} if val else {})}.items():
        write_text_atomically(out_dir / f"{name}.txt", "".join(f"./images/{split}/{placed[i]}\n" for i in ids))
    val_entry = {"val": "val.txt" if val else "train.txt"} if split == "train" else {}
    config = {"path": str(out_dir.resolve()), split: f"{split}.txt", **val_entry, "names": result.names}
    write_text_atomically(yaml_path, yaml.safe_dump(config, sort_keys=False), inputs=[json_path])
    log.info("converted %d images, %d boxes (%d crowd skipped, %d dropped) from %s", result.n_images, result.n_boxes,
             result.n_crowd_skipped, result.n_invalid_skipped, json_path)
    return result


def _place_images(images: dict[int, tuple[str, float, float]], placed_dir: Path, images_dir: Path | None,
                  result: CocoConversion) -> dict[int, str]:
    """{image id: file name under ``placed_dir``} of the images found (linked from ``images_dir``)."""
    out = {}
    for image_id, (file_name, _, _) in images.items():
        relative = file_name.replace("\\", "/")
        target = placed_dir / relative
        source = (images_dir / relative) if images_dir is not None else target
        if not source.is_file():
            result.n_missing_images += 1
            result.skipped.append(f"image {image_id} ({file_name}): not found in {source.parent}, left out")
            continue
        if source.resolve() != target.resolve():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)  # a link of an earlier conversion (data.yaml existed: overwrite was given)
            try:
                os.link(source, target)
            except OSError:  # another file system, or links not allowed: a symbolic link
                os.symlink(source.resolve(), target)
        out[image_id] = relative
    if result.n_missing_images:
        log.warning("%d of %d images are not in %s and were left out", result.n_missing_images, len(images),
                    images_dir or placed_dir)
    return out
