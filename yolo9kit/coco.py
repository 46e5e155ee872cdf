"""COCO-format predictions and ground truth, and a pycocotools ``COCOeval`` adapter.

The official ``val_dual.py --save-json`` writes one record per detection::

    {"image_id": int(stem) if the stem is numeric else stem,
     "category_id": COCO80_TO_COCO91[cls] for COCO data, else cls,
     "bbox": [x_topleft, y_topleft, w, h] in original-image pixels, rounded to 3 decimals,
     "score": conf rounded to 5 decimals}

and scores it with pycocotools. The functions here do the same, and can also build the ground
truth JSON from YOLO labels so that any data set (not only COCO) can be scored by ``COCOeval``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

LOGGER = logging.getLogger(__name__)

__all__ = ["COCO80_TO_COCO91", "COCOEVAL_NAMES", "coco_ground_truth", "coco_predictions", "image_id_from_path",
           "is_coco_val", "run_cocoeval"]

# index = 80-class id, value = COCO category id (1..90 without the ten unused ids)
COCO80_TO_COCO91 = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 27, 28, 31, 32, 33,
    34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61,
    62, 63, 64, 65, 67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 84, 85, 86, 87, 88, 89, 90,
]

# the 12 numbers of COCOeval.summarize(), in order (maxDets 100 unless named)
COCOEVAL_NAMES = [
    "AP50-95", "AP50", "AP75", "AP50-95 small", "AP50-95 medium", "AP50-95 large",
    "AR50-95 maxDets1", "AR50-95 maxDets10", "AR50-95 maxDets100", "AR50-95 small", "AR50-95 medium",
    "AR50-95 large",
]


def is_coco_val(val_path: str | Path | Sequence | None) -> bool:
    """True when the validation list is COCO's (its path ends with ``val2017.txt``), as the official check."""
    return isinstance(val_path, (str, Path)) and str(val_path).endswith("val2017.txt")


def image_id_from_path(path: str | Path) -> int | str:
    """COCO image id of an image file: ``int(stem)`` when the stem is numeric, else the stem."""
    stem = Path(path).stem
    return int(stem) if stem.isnumeric() else stem


def coco_predictions(detections, path: str | Path, class_map: Sequence[int] | None = None) -> list[dict]:
    """COCO result records of one image.

    Args:
        detections: (n, 6) ``[x1, y1, x2, y2, conf, cls]`` in original-image pixels (tensor or array).
        path: the image file (its stem gives the image id).
        class_map: class id -> category id (``COCO80_TO_COCO91`` for COCO); None keeps the class id.

    Returns:
        One dict per detection (bbox top-left xywh rounded to 3 decimals, score to 5).
    """
    rows = detections.detach().cpu().numpy() if hasattr(detections, "detach") else np.asarray(detections)
    image_id = image_id_from_path(path)
    records = []
    for x1, y1, x2, y2, conf, cls in rows.tolist():
        category = class_map[int(cls)] if class_map is not None else int(cls)
        bbox = [x1, y1, x2 - x1, y2 - y1]
        records.append({"image_id": image_id, "category_id": category, "bbox": [round(v, 3) for v in bbox],
                        "score": round(conf, 5)})
    return records


def coco_ground_truth(
    images: Iterable[tuple[str | Path, tuple[int, int], np.ndarray]],
    names: Sequence[str],
    class_map: Sequence[int] | None = None,
) -> dict:
    """COCO ground-truth dict from labelled images.

    Args:
        images: (path, (h0, w0), labels) per image; labels (m, 5) ``[cls, x1, y1, x2, y2]`` in
            original-image pixels.
        names: class names (category names).
        class_map: class id -> category id, as for the predictions.

    Returns:
        ``{"images", "annotations", "categories"}``; every annotation has ``iscrowd`` 0 and
        ``area`` = box width x height (COCO's own files use the segment area instead).
    """
    category = (lambda c: class_map[c]) if class_map is not None else (lambda c: c)
    out = {"images": [], "annotations": [],
           "categories": [{"id": category(i), "name": str(n)} for i, n in enumerate(names)]}
    for path, (h0, w0), labels in images:
        image_id = image_id_from_path(path)
        out["images"].append({"id": image_id, "file_name": Path(path).name, "height": int(h0), "width": int(w0)})
        for cls, x1, y1, x2, y2 in np.asarray(labels, dtype=float).reshape(-1, 5).tolist():
            w, h = x2 - x1, y2 - y1
            out["annotations"].append({"id": len(out["annotations"]) + 1, "image_id": image_id,
                                       "category_id": category(int(cls)), "bbox": [x1, y1, w, h],
                                       "area": w * h, "iscrowd": 0})
    return out


def run_cocoeval(ground_truth: dict | str | Path, predictions: list[dict] | str | Path,
                 image_ids: Iterable | None = None) -> dict[str, float]:
    """Score predictions with pycocotools ``COCOeval(..., "bbox")``.

    Args:
        ground_truth: COCO ground-truth dict or JSON path (e.g. ``annotations/instances_val2017.json``).
        predictions: result records or a JSON path of them.
        image_ids: restrict the evaluation to these images (the official code does so for COCO).

    Returns:
        The 12 ``summarize()`` numbers keyed by :data:`COCOEVAL_NAMES` (all 0 when there are no
        predictions). pycocotools' own printout is logged at DEBUG level.
    """
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    if isinstance(predictions, (str, Path)):
        predictions = json.loads(Path(predictions).read_text())
    if not predictions:
        LOGGER.warning("COCOeval: no predictions to score; all 12 numbers are 0")
        return dict.fromkeys(COCOEVAL_NAMES, 0.0)
    printout = io.StringIO()
    with contextlib.redirect_stdout(printout):
        gt = COCO()
        gt.dataset = json.loads(Path(ground_truth).read_text()) if isinstance(ground_truth, (str, Path)) \
            else ground_truth
        gt.createIndex()
        dt = gt.loadRes(predictions)
        evaluator = COCOeval(gt, dt, "bbox")
        if image_ids is not None:
            evaluator.params.imgIds = sorted(set(image_ids))
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    LOGGER.debug(printout.getvalue())
    return {name: float(v) for name, v in zip(COCOEVAL_NAMES, evaluator.stats)}
