"""Detection metrics with the official YOLOv9 semantics: matching, AP, confusion matrix.

* :func:`match_predictions` marks each detection a true positive or not at 10 IoU thresholds
  (0.50:0.05:0.95) with the official tie-breaking.
* :func:`ap_per_class` turns those marks into per-class AP (101-point interpolation), and P/R/F1
  read at the confidence that maximises the smoothed mean F1.
* :class:`ConfusionMatrix` counts (predicted class, true class) pairs at score > 0.25, IoU > 0.45.

Conventions: detections are (N, 6) rows ``[x1, y1, x2, y2, conf, cls]``; labels are (M, 5) rows
``[cls, x1, y1, x2, y2]``, both in the same pixel space.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from yolo9kit.boxes import box_iou

__all__ = ["APResult", "ConfusionMatrix", "IOU_THRESHOLDS", "ap_per_class", "compute_ap", "fitness",
           "match_predictions", "smooth"]

# The 10 COCO IoU thresholds 0.50, 0.55, ..., 0.95, as the float32 values the official code compares with.
IOU_THRESHOLDS = torch.linspace(0.5, 0.95, 10)


def match_predictions(
    detections: torch.Tensor, labels: torch.Tensor, iou_thresholds: torch.Tensor | Sequence[float] | None = None,
) -> torch.Tensor:
    """True-positive flags of detections at each IoU threshold.

    Matches the official ``val_dual.py process_batch``. For each threshold t: all (label, detection)
    pairs of equal class with IoU >= t; pairs sorted by IoU descending, the first pair of each
    detection kept; then, *without re-sorting by IoU*, the first remaining pair of each label in
    order of ascending detection index (so, with NMS output sorted by confidence, a label goes to
    its most confident matching detection, not to its highest-IoU one).

    Args:
        detections: (N, 6) ``[x1, y1, x2, y2, conf, cls]``.
        labels: (M, 5) ``[cls, x1, y1, x2, y2]`` in the same pixel space.
        iou_thresholds: (T,) thresholds; default :data:`IOU_THRESHOLDS`.

    Returns:
        (N, T) bool tensor on the detections' device.
    """
    thresholds = IOU_THRESHOLDS if iou_thresholds is None else torch.as_tensor(iou_thresholds)
    thresholds = thresholds.to(detections.device)
    correct = np.zeros((detections.shape[0], thresholds.shape[0]), dtype=bool)
    if detections.shape[0] and labels.shape[0]:
        iou = box_iou(labels[:, 1:5], detections[:, :4])  # (M, N)
        same_class = labels[:, 0:1] == detections[:, 5]
        for k in range(thresholds.shape[0]):
            label_index, detection_index = torch.where((iou >= thresholds[k]) & same_class)
            if not label_index.shape[0]:
                continue
            pairs = torch.cat((torch.stack((label_index, detection_index), 1),
                               iou[label_index, detection_index][:, None]), 1).cpu().numpy()
            if pairs.shape[0] > 1:
                pairs = pairs[pairs[:, 2].argsort()[::-1]]  # highest IoU first
                pairs = pairs[np.unique(pairs[:, 1], return_index=True)[1]]  # one label per detection
                pairs = pairs[np.unique(pairs[:, 0], return_index=True)[1]]  # one detection per label
            correct[pairs[:, 1].astype(int), k] = True
    return torch.from_numpy(correct).to(detections.device)


def smooth(y: np.ndarray, fraction: float = 0.05) -> np.ndarray:
    """Box-filter ``y`` over an odd window of ``fraction`` of its length, edges padded by repetition."""
    window = round(len(y) * fraction * 2) // 2 + 1
    pad = np.ones(window // 2)
    padded = np.concatenate((pad * y[0], y, pad * y[-1]), 0)
    return np.convolve(padded, np.ones(window) / window, mode="valid")


def compute_ap(recall: np.ndarray, precision: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Average precision of one precision/recall curve, 101-point interpolated.

    Matches the official ``compute_ap`` (method "interp"): sentinels (recall 0, precision 1) and
    (recall 1, precision 0), precision made non-increasing from the right (envelope), the envelope
    linearly interpolated at recall 0, 0.01, ..., 1 and integrated with the trapezoidal rule.

    Returns:
        (ap, envelope precision, recall with sentinels).
    """
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.concatenate(([1.0], precision, [0.0]))
    mpre = np.flip(np.maximum.accumulate(np.flip(mpre)))
    x = np.linspace(0, 1, 101)
    ap = np.trapezoid(np.interp(x, mrec, mpre), x)
    return float(ap), mpre, mrec


class APResult(NamedTuple):
    """Output of :func:`ap_per_class`; the first seven fields are the official return values.

    Per-class arrays have one entry per class present in the labels (``classes``, sorted).
    """

    tp: np.ndarray  # (C,) true positives at the chosen confidence, round(R * n_labels)
    fp: np.ndarray  # (C,) false positives at the chosen confidence
    p: np.ndarray  # (C,) precision at the max-mean-F1 confidence
    r: np.ndarray  # (C,) recall at that confidence
    f1: np.ndarray  # (C,) F1 at that confidence
    ap: np.ndarray  # (C, T) AP per IoU threshold
    classes: np.ndarray  # (C,) int class ids
    px: np.ndarray  # (1000,) confidence (and recall) axis of the curves
    p_curve: np.ndarray  # (C, 1000) precision vs confidence
    r_curve: np.ndarray  # (C, 1000) recall vs confidence
    f1_curve: np.ndarray  # (C, 1000) F1 vs confidence
    pr_curve: np.ndarray  # (C, 1000) precision envelope vs recall at IoU 0.5 (zeros: class never predicted)


def _to_numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def ap_per_class(tp, conf, pred_cls, target_cls, eps: float = 1e-16) -> APResult:
    """Per-class AP at every IoU threshold, plus P, R, F1 at the best mean-F1 confidence.

    Matches the official ``utils/metrics.py ap_per_class``: detections sorted by confidence
    (descending); for each class with labels, cumulative TP/FP; recall = TP / (n_labels + eps),
    precision = TP / (TP + FP); AP per column by :func:`compute_ap`. Precision/recall are also
    sampled at 1000 confidences (linspace 0..1; recall left-filled 0, precision 1) and P, R, F1 are
    read at the confidence index maximising the box-smoothed (fraction 0.1) mean-over-classes F1.
    Classes with labels but no predictions get zeros.

    Args:
        tp: (N, T) bool true-positive flags (from :func:`match_predictions`).
        conf: (N,) detection scores.
        pred_cls: (N,) predicted class ids.
        target_cls: (L,) class ids of all labels.

    Returns:
        :class:`APResult`.
    """
    tp, conf, pred_cls, target_cls = map(_to_numpy, (tp, conf, pred_cls, target_cls))
    if tp.ndim == 1:
        tp = tp[:, None]
    order = np.argsort(-conf)
    tp, conf, pred_cls = tp[order], conf[order], pred_cls[order]
    classes, n_labels = np.unique(target_cls, return_counts=True)
    num_classes = classes.shape[0]

    px = np.linspace(0, 1, 1000)
    ap = np.zeros((num_classes, tp.shape[1]))
    p_curve, r_curve, pr_curve = (np.zeros((num_classes, 1000)) for _ in range(3))
    for ci, c in enumerate(classes):
        mask = pred_cls == c
        if mask.sum() == 0 or n_labels[ci] == 0:
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
    """Model fitness used to pick the best checkpoint: 0.1 * mAP50 + 0.9 * mAP50-95 (P, R weigh 0)."""
    return 0.1 * map50 + 0.9 * map50_95


class ConfusionMatrix:
    """(nc+1) x (nc+1) counts; rows = predicted class, columns = true class, last = background.

    Matches the official ``utils/metrics.py ConfusionMatrix`` (conf 0.25, IoU 0.45): detections with
    score > conf are matched one-to-one to labels with IoU > iou_thres (highest IoU first, unique per
    detection then per label, regardless of class). A label with exactly one match adds to
    [predicted class, true class], any other label to [background, true class]. Unmatched detections
    add to [predicted class, background], but only when the image had at least one match.
    """

    def __init__(self, nc: int, conf: float = 0.25, iou_thres: float = 0.45):
        self.matrix = np.zeros((nc + 1, nc + 1))
        self.nc, self.conf, self.iou_thres = nc, conf, iou_thres

    def process_batch(self, detections: torch.Tensor | None, labels: torch.Tensor) -> None:
        """Add one image.

        Args:
            detections: (N, 6) ``[x1, y1, x2, y2, conf, cls]``, or None when the image has none (then
                ``labels`` may be just the (M,) class ids).
            labels: (M, 5) ``[cls, x1, y1, x2, y2]``.
        """
        if detections is None:
            for gc in (labels[:, 0] if labels.ndim == 2 else labels).int().tolist():
                self.matrix[self.nc, gc] += 1
            return
        detections = detections[detections[:, 4] > self.conf]
        gt_classes = labels[:, 0].int().tolist()
        detection_classes = detections[:, 5].int().tolist()
        iou = box_iou(labels[:, 1:5], detections[:, :4])
        label_index, detection_index = torch.where(iou > self.iou_thres)
        if label_index.shape[0]:
            matches = torch.cat((torch.stack((label_index, detection_index), 1),
                                 iou[label_index, detection_index][:, None]), 1).cpu().numpy()
            if matches.shape[0] > 1:
                matches = matches[matches[:, 2].argsort()[::-1]]
                matches = matches[np.unique(matches[:, 1], return_index=True)[1]]
                matches = matches[matches[:, 2].argsort()[::-1]]
                matches = matches[np.unique(matches[:, 0], return_index=True)[1]]
        else:
            matches = np.zeros((0, 3))
        any_match = matches.shape[0] > 0
        matched_label, matched_detection = matches[:, 0].astype(int), matches[:, 1].astype(int)
        for i, gc in enumerate(gt_classes):
            hit = matched_label == i
            if any_match and hit.sum() == 1:
                self.matrix[detection_classes[int(matched_detection[hit][0])], gc] += 1
            else:
                self.matrix[self.nc, gc] += 1
        if any_match:
            for i, dc in enumerate(detection_classes):
                if not (matched_detection == i).any():
                    self.matrix[dc, self.nc] += 1

    def tp_fp(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-class true positives (diagonal) and false positives (row sum minus diagonal)."""
        tp = self.matrix.diagonal()
        fp = self.matrix.sum(1) - tp
        return tp[:-1], fp[:-1]
