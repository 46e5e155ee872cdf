"""Convert COCO-format detection annotations to YOLO labels."""

from __future__ import annotations

import json
import logging
import math
import os
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import yaml

from yolo9kit.files import write_folder, write_text_atomically

log = logging.getLogger(__name__)


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


def coco_to_yolo(json_path: str | Path, out_dir: str | Path, images_dir: str | Path | None = None,
                 split: str = "train", overwrite: bool = False, holdout: float = 0.2) -> CocoConversion:
    """Write one YOLO label file per COCO image, a list file of the images and a data.yaml: a self-contained
    data set that trains as it is.

    COCO category ids (any integers) become classes 0..K-1 in increasing id order; ``bbox`` [x, y, w, h]
    (top-left, pixels) becomes normalised ``cx cy w h``. A box partly outside its image is clipped to it; one
    wholly outside, or of zero or negative size, is dropped and named in ``skipped``; ``iscrowd`` annotations
    are skipped and counted. A non-finite number refuses the file. Labels go to
    ``out_dir/labels/<split>/<file_name>.txt`` (the image's ``file_name`` with its sub-folders, so that
    ``a/img1.jpg`` and ``b/img1.jpg`` keep their own labels). The images stay in ``images_dir`` (default
    ``out_dir/images/<split>``); from another folder each one is linked into ``out_dir/images/<split>/`` (a hard
    link, else a symbolic one), where the loader looks for the labels beside it. An image the JSON names that
    is not in ``images_dir`` is left out and named in ``skipped``. ``<split>.txt`` lists the images; for the
    train split a share ``holdout`` of them (at least one of two or more, drawn with a fixed seed) goes to
    ``val.txt`` instead, a validation split of images the model does not train on (``holdout=0``: validation
    uses the training images, as before). The labels are written whole, or not at all (``files.write_folder``).

    Raises:
        ValueError: ``holdout`` outside [0, 1); the JSON is not valid, lacks images/annotations/categories
            fields, holds a non-finite number, an image of non-positive size, a ``file_name`` outside the
            folder (absolute or with ``..``) or two images of one ``file_name``; the message names the file and
            the entry.
        FileExistsError: ``out_dir/labels/<split>`` holds files or ``out_dir/data.yaml`` exists, and
            ``overwrite`` is False.
    """
    json_path, out_dir = Path(json_path), Path(out_dir)
    if not 0 <= holdout < 1:
        raise ValueError(f"holdout={holdout!r}: expected a share of the images in [0, 1)")
    label_dir, yaml_path = out_dir / "labels" / split, out_dir / "data.yaml"
    if not overwrite and yaml_path.exists():
        raise FileExistsError(f"{yaml_path} exists: converting into {out_dir} would overwrite it; choose an empty "
                              "folder or pass overwrite (--overwrite)")
    try:
        coco = json.loads(json_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{json_path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from e
    _require(isinstance(coco, dict), json_path, "the top level must be an object")
    for key in ("images", "annotations", "categories"):
        _require(isinstance(coco.get(key), list), json_path, f"missing list '{key}'")
    try:
        cats = sorted(coco["categories"], key=lambda c: int(c["id"]))
        cat_to_class = {int(c["id"]): i for i, c in enumerate(cats)}
        names = [str(c.get("name", c["id"])) for c in cats]
        images = {int(im["id"]): (str(im["file_name"]), float(im["width"]), float(im["height"]))
                  for im in coco["images"]}
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{json_path}: malformed COCO annotations: a category needs 'id' and an image needs "
                         f"'id', 'file_name', 'width' and 'height' ({type(e).__name__}: {e})") from e
    label_files = _label_files(images, json_path)
    result = CocoConversion(yaml_path, names, [int(c["id"]) for c in cats])
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
        row, why = _yolo_row(cat_to_class[cat], x, y, w, h, *images[image_id][1:])
        if row is None:
            result.n_invalid_skipped += 1
            result.skipped.append(f"annotation {k} ({images[image_id][0]}): {why}")
            continue
        rows[image_id].append(row)
    for line in result.skipped:
        log.warning("%s: %s: dropped", json_path, line)

    def fill(folder: Path) -> None:
        for image_id, relative in label_files.items():
            target = folder / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("".join(r + "\n" for r in rows[image_id]))

    write_folder(label_dir, fill, needed=sum(len(r) + 1 for rs in rows.values() for r in rs) + 4096 * len(images),
                 overwrite=overwrite, what=f"writing the labels of {json_path.name}")
    result.n_boxes = sum(len(rows[image_id]) for image_id in label_files)
    result.n_images = len(images)
    placed = _place_images(images, out_dir / "images" / split, Path(images_dir) if images_dir else None, result)
    val = _held_out(sorted(placed), holdout) if split == "train" else []
    result.n_val = len(val)
    lists = {split: [i for i in sorted(placed) if i not in set(val)], **({"val": val} if val else {})}
    for name, ids in lists.items():
        write_text_atomically(out_dir / f"{name}.txt", "".join(f"./images/{split}/{placed[i]}\n" for i in ids))
    config = {"path": str(out_dir.resolve()), split: f"{split}.txt"}
    if split == "train":
        config["val"] = "val.txt" if val else "train.txt"
    config["names"] = names
    write_text_atomically(yaml_path, yaml.safe_dump(config, sort_keys=False), inputs=[json_path])
    log.info("converted %d images, %d boxes (%d crowd skipped, %d dropped) from %s", result.n_images, result.n_boxes,
             result.n_crowd_skipped, result.n_invalid_skipped, json_path)
    return result


def _place_images(images: dict[int, tuple[str, float, float]], placed_dir: Path, images_dir: Path | None,
                  result: CocoConversion) -> dict[int, str]:
    """{image id: its file name under ``placed_dir``} for the images found: in ``placed_dir`` itself, or in
    ``images_dir``, linked into ``placed_dir`` (hard link, else symbolic). The others are recorded as skipped."""
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
            if target.exists() or target.is_symlink():
                target.unlink()  # a link of an earlier conversion (data.yaml existed: overwrite was given)
            try:
                os.link(source, target)
            except OSError:  # another file system, or links not allowed: a symbolic link
                os.symlink(source.resolve(), target)
        out[image_id] = relative
    if result.n_missing_images:
        log.warning("%d of %d images are not in %s and were left out", result.n_missing_images, len(images),
                    images_dir or placed_dir)
    return out


def _held_out(ids: list[int], holdout: float) -> list[int]:
    """The image ids held out for validation: a share ``holdout`` of them, at least one of two or more."""
    if holdout == 0 or len(ids) < 2:
        return []
    count = min(max(round(len(ids) * holdout), 1), len(ids) - 1)
    return sorted(random.Random(0).sample(ids, count))


def _label_files(images: dict[int, tuple[str, float, float]], json_path: Path) -> dict[int, PurePosixPath]:
    """Each image's label file, relative to the labels folder: its ``file_name`` with ``.txt``."""
    seen: dict[PurePosixPath, int] = {}
    out = {}
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
        out[image_id] = label
    return out


def _yolo_row(cls: int, x: float, y: float, w: float, h: float, width: float, height: float
              ) -> tuple[str | None, str]:
    """The label row of a COCO box clipped to its image, or (None, why it is dropped)."""
    if w <= 0 or h <= 0:
        return None, f"box of size {w} x {h} (zero or negative)"
    x1, y1, x2, y2 = max(x, 0.0), max(y, 0.0), min(x + w, width), min(y + h, height)
    if x2 <= x1 or y2 <= y1:
        return None, f"box [{x}, {y}, {w}, {h}] lies wholly outside the {width:g} x {height:g} image"
    cx, cy, bw, bh = (x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height
    return f"{cls} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}", ""
