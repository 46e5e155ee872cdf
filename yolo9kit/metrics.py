"""Detection metrics as the official code (matching, AP, confusion matrix) and the COCOeval adapter
(docs/validation.md). Detections are rows ``[x1, y1, x2, y2, conf, cls]``, labels ``[cls, x1, y1, x2, y2]``."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from yolo9kit.boxes import box_iou

LOGGER = logging.getLogger(__name__)

# The 10 COCO IoU thresholds 0.50, 0.55, ..., 0.95, as the float32 values the official code compares with.
IOU_THRESHOLDS = torch.linspace(0.5, 0.95, 10)

# index = 80-class id, value = COCO category id: 1..90 without the ten unused ids
COCO80_TO_COCO91 = [i for i in range(1, 91) if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83)]

# the 12 numbers of COCOeval.summarize(), in order (maxDets 100 unless named)
COCOEVAL_NAMES = ["AP50-95", "AP50", "AP75", "AP50-95 small", "AP50-95 medium", "AP50-95 large", "AR50-95 maxDets1",
                  "AR50-95 maxDets10", "AR50-95 maxDets100", "AR50-95 small", "AR50-95 medium", "AR50-95 large"]


def _matches(iou: torch.Tensor, mask: torch.Tensor, resort: bool = False) -> np.ndarray:
    """(label, detection, iou) rows where ``mask`` holds, by IoU, once per detection then once per label."""
    label_index, detection_index = torch.where(mask)
    pairs = torch.cat((torch.stack((label_index, detection_index), 1),
                       iou[label_index, detection_index][:, None]), 1).cpu().numpy()
    if pairs.shape[0] > 1:
        pairs = pairs[pairs[:, 2].argsort()[::-1]]
        pairs = pairs[np.unique(pairs[:, 1], return_index=True)[1]]
        if resort:
            pairs = pairs[pairs[:, 2].argsort()[::-1]]
        pairs = pairs[np.unique(pairs[:, 0], return_index=True)[1]]
    return pairs


def match_predictions(detections: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(N, 10) true-positive flags at each of :data:`IOU_THRESHOLDS`, as the official ``process_batch``: a label
    goes to its first matching detection in NMS order (the most confident), not to the highest IoU."""
    thresholds = IOU_THRESHOLDS.to(detections.device)
    correct = np.zeros((detections.shape[0], thresholds.shape[0]), dtype=bool)
    if detections.shape[0] and labels.shape[0]:
        iou = box_iou(labels[:, 1:5], detections[:, :4])  # (M, N)
        same_class = labels[:, 0:1] == detections[:, 5]
        for k in range(thresholds.shape[0]):
            correct[_matches(iou, (iou >= thresholds[k]) & same_class)[:, 1].astype(int), k] = True
    return torch.from_numpy(correct).to(detections.device)


def smooth(y: np.ndarray, fraction: float = 0.05) -> np.ndarray:
    """Box-filter ``y`` over an odd window of ``fraction`` of its length, edges padded by repetition."""
    window = round(len(y) * fraction * 2) // 2 + 1
    pad = np.ones(window // 2)
    return np.convolve(np.concatenate((pad * y[0], y, pad * y[-1]), 0), np.ones(window) / window, mode="valid")


def compute_ap(recall: np.ndarray, precision: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(AP 101-point interpolated as the official ``compute_ap``, envelope precision, recall with sentinels)."""
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.concatenate(([1.0], precision, [0.0]))
    mpre = np.flip(np.maximum.accumulate(np.flip(mpre)))
    x = np.linspace(0, 1, 101)
    return float(np.trapezoid(np.interp(x, mrec, mpre), x)), mpre, mrec


class APResult(NamedTuple):
    """Output of :func:`ap_per_class`, one row per labelled class."""

    tp: np.ndarray  # (C,) true positives at the chosen confidence, round(R * n_labels)
    fp: np.ndarray  # (C,) false positives at the chosen confidence
    p: np.ndarray  # (C,) precision at the max-mean-F1 confidence
    r: np.ndarray  # (C,) recall at that confidence
    f1: np.ndarray  # (C,) F1 at that confidence
    ap: np.ndarray  # (C, T) AP per IoU threshold
    classes: np.ndarray  # (C,) int class ids, sorted
    px: np.ndarray  # (1000,) confidence (and recall) axis of the curves
    p_curve: np.ndarray  # (C, 1000) precision vs confidence
    r_curve: np.ndarray  # (C, 1000) recall vs confidence
    f1_curve: np.ndarray  # (C, 1000) F1 vs confidence
    pr_curve: np.ndarray  # (C, 1000) precision envelope vs recall at IoU 0.5 (zeros: class never predicted)


def _to_numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def ap_per_class(tp, conf, pred_cls, target_cls) -> APResult:
    """Per-class AP at every IoU threshold, and P, R, F1 at the best mean-F1 confidence, as the official code:
    ``tp`` (N, T) flags of :func:`match_predictions`, ``conf`` and ``pred_cls`` per detection, ``target_cls`` per
    label. Classes with labels but no predictions get zeros."""
    eps = 1e-16
    tp, conf, pred_cls, target_cls = map(_to_numpy, (tp, conf, pred_cls, target_cls))
    order = np.argsort(-conf)
    tp, conf, pred_cls = tp[order], conf[order], pred_cls[order]
    classes, n_labels = np.unique(target_cls, return_counts=True)
    num_classes = classes.shape[0]
    px = np.linspace(0, 1, 1000)
    ap = np.zeros((num_classes, tp.shape[1]))
    p_curve, r_curve, pr_curve = (np.zeros((num_classes, 1000)) for _ in range(3))
    for ci, c in enumerate(classes):
        mask = pred_cls == c
        if not mask.any():
            continue
        fp_cum = (1 - tp[mask]).cumsum(0)
        tp_cum = tp[mask].cumsum(0)
        recall = tp_cum / (n_labels[ci] + eps)
        precision = tp_cum / (tp_cum + fp_cum)
        # np.interp needs increasing x: confidences decrease, so interpolate on their negatives
        r_curve[ci] = np.interp(-px, -conf[mask], recall[:, 0], left=0)
        p_curve[ci] = np.interp(-px, -conf[mask], precision[:, 0], left=1)
        for j in range(tp.shape[1]):
            ap[ci, j], mpre, mrec = compute_ap(recall[:, j], precision[:, j])
            if j == 0:
                pr_curve[ci] = np.interp(px, mrec, mpre)
    f1_curve = 2 * p_curve * r_curve / (p_curve + r_curve + eps)
    best = smooth(f1_curve.mean(0), 0.1).argmax() if num_classes else 0
    p, r, f1 = p_curve[:, best], r_curve[:, best], f1_curve[:, best]
    tp_out = (r * n_labels).round()
    fp_out = (tp_out / (p + eps) - tp_out).round()
    return APResult(tp_out, fp_out, p, r, f1, ap, classes.astype(int), px, p_curve, r_curve, f1_curve, pr_curve)


def fitness(map50: float, map50_95: float) -> float:
    """What picks the best checkpoint: 0.1 * mAP50 + 0.9 * mAP50-95."""
    return 0.1 * map50 + 0.9 * map50_95


class ConfusionMatrix:
    """(nc+1) x (nc+1) counts as the official one: rows predicted, columns true, the last background; unmatched
    detections count only in an image with at least one match (official rule)."""

    def __init__(self, nc: int, conf: float = 0.25, iou_thres: float = 0.45):
        self.matrix = np.zeros((nc + 1, nc + 1))
        self.nc, self.conf, self.iou_thres = nc, conf, iou_thres

    def process_batch(self, detections: torch.Tensor | None, labels: torch.Tensor) -> None:
        """Add one image; ``detections`` None: it has none (``labels`` may then be the class ids alone)."""
        if detections is None:
            for gc in (labels[:, 0] if labels.ndim == 2 else labels).int().tolist():
                self.matrix[self.nc, gc] += 1
            return
        detections = detections[detections[:, 4] > self.conf]
        detection_classes = detections[:, 5].int().tolist()
        iou = box_iou(labels[:, 1:5], detections[:, :4])
        matches = _matches(iou, iou > self.iou_thres, resort=True)
        any_match = matches.shape[0] > 0
        matched_label, matched_detection = matches[:, 0].astype(int), matches[:, 1].astype(int)
        for i, gc in enumerate(labels[:, 0].int().tolist()):
            hit = matched_label == i
            row = detection_classes[int(matched_detection[hit][0])] if any_match and hit.sum() == 1 else self.nc
            self.matrix[row, gc] += 1
        for i, dc in enumerate(detection_classes if any_match else ()):
            if not (matched_detection == i).any():
                self.matrix[dc, self.nc] += 1


def is_coco_val(val_path: str | Path | Sequence | None) -> bool:
    """True for COCO's validation list (a path ending with ``val2017.txt``), as the official check."""
    return isinstance(val_path, (str, Path)) and str(val_path).endswith("val2017.txt")


def image_id_from_path(path: str | Path) -> int | str:
    """``int(stem)`` when the stem is numeric, else the stem."""
    stem = Path(path).stem
    return int(stem) if stem.isnumeric() else stem


def coco_predictions(detections, path: str | Path, class_map: Sequence[int] | None = None) -> list[dict]:
    """COCO result records of one image's detections (original-image pixels), as ``val_dual.py --save-json``;
    ``class_map``: class id -> category id (``COCO80_TO_COCO91`` for COCO), None keeps the class id."""
    image_id = image_id_from_path(path)
    return [{"image_id": image_id, "category_id": class_map[int(cls)] if class_map is not None else int(cls),
             "bbox": [round(v, 3) for v in (x1, y1, x2 - x1, y2 - y1)], "score": round(conf, 5)}
            for x1, y1, x2, y2, conf, cls in _to_numpy(detections).tolist()]


def coco_ground_truth(images: Iterable[tuple[str | Path, tuple[int, int], np.ndarray]], names: Sequence[str],
                      class_map: Sequence[int] | None = None) -> dict:
    """COCO ground truth of (path, (h0, w0), labels in original pixels) per image; ``class_map`` as in
    :func:`coco_predictions`."""
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


def run_cocoeval(ground_truth: dict | str | Path, predictions: list[dict], image_ids: Iterable) -> dict[str, float]:
    """The 12 numbers of pycocotools ``COCOeval(..., "bbox")`` of the images ``image_ids``, keyed by
    :data:`COCOEVAL_NAMES` (all 0 without predictions); the ground truth as a dict or a JSON path."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    if not predictions:
        LOGGER.warning("COCOeval: no predictions to score; all 12 numbers are 0")
        return dict.fromkeys(COCOEVAL_NAMES, 0.0)
    printout = io.StringIO()
    with contextlib.redirect_stdout(printout):
        gt = COCO()
        gt.dataset = json.loads(Path(ground_truth).read_text()) if isinstance(ground_truth, (str, Path)) \
            else ground_truth
        gt.createIndex()
        evaluator = COCOeval(gt, gt.loadRes(predictions), "bbox")
        evaluator.params.imgIds = sorted(set(image_ids))
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    LOGGER.debug(printout.getvalue())
    return {name: float(v) for name, v in zip(COCOEVAL_NAMES, evaluator.stats)}
