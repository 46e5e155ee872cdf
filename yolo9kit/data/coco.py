"""Convert COCO-format detection annotations to YOLO labels."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

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


def _require(cond: bool, json_path: Path, what: str) -> None:
    if not cond:
        raise ValueError(f"{json_path}: malformed COCO annotations: {what}")


def coco_to_yolo(json_path: str | Path, out_dir: str | Path, images_dir: str | Path | None = None,
                 split: str = "train") -> CocoConversion:
    """Write one YOLO label file per COCO image and a data.yaml.

    COCO category ids (any integers) become classes 0..K-1 in increasing id order; ``bbox`` [x, y, w, h]
    (top-left, pixels) becomes normalised ``cx cy w h``; ``iscrowd`` annotations are skipped and counted,
    as are boxes with non-positive size. Labels go to ``out_dir/labels/<split>/<image stem>.txt`` and the
    data.yaml points ``<split>`` (and ``val`` when split is train) at ``images_dir`` (default
    ``out_dir/images/<split>``, where the image files are expected).

    Raises:
        ValueError: the JSON is not valid or lacks images/annotations/categories fields; the message names
            the file and the missing part.
    """
    json_path, out_dir = Path(json_path), Path(out_dir)
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
    result = CocoConversion(out_dir / "data.yaml", names, [int(c["id"]) for c in cats])
    rows = defaultdict(list)
    for k, ann in enumerate(coco["annotations"]):
        try:
            image_id, cat, (x, y, w, h) = int(ann["image_id"]), int(ann["category_id"]), map(float, ann["bbox"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{json_path}: annotation {k} needs image_id, category_id and bbox [x, y, w, h] "
                             f"({type(e).__name__}: {e})") from e
        _require(image_id in images, json_path, f"annotation {k} refers to unknown image id {image_id}")
        _require(cat in cat_to_class, json_path, f"annotation {k} refers to unknown category id {cat}")
        if ann.get("iscrowd", 0):
            result.n_crowd_skipped += 1
            continue
        _, iw, ih = images[image_id]
        if w <= 0 or h <= 0:
            result.n_invalid_skipped += 1
            result.skipped.append(f"annotation {k}: non-positive box size")
            continue
        cx, cy = min(max((x + w / 2) / iw, 0.0), 1.0), min(max((y + h / 2) / ih, 0.0), 1.0)
        rows[image_id].append(f"{cat_to_class[cat]} {cx:.6f} {cy:.6f} {min(w / iw, 1.0):.6f} {min(h / ih, 1.0):.6f}")
    label_dir = out_dir / "labels" / split
    label_dir.mkdir(parents=True, exist_ok=True)
    for image_id, (file_name, _, _) in images.items():
        (label_dir / (Path(file_name).stem + ".txt")).write_text("".join(r + "\n" for r in rows[image_id]))
        result.n_boxes += len(rows[image_id])
    result.n_images = len(images)
    images_dir = Path(images_dir) if images_dir is not None else out_dir / "images" / split
    config = {"path": str(out_dir.resolve()), split: str(images_dir.resolve())}
    if split == "train":
        config["val"] = config["train"]
    config["names"] = names
    result.yaml_path.write_text(yaml.safe_dump(config, sort_keys=False))
    log.info("converted %d images, %d boxes (%d crowd skipped) from %s", result.n_images, result.n_boxes,
             result.n_crowd_skipped, json_path)
    return result
