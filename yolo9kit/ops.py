"""Post-processing operations shared by prediction and validation.

* :func:`non_max_suppression` turns the decoded head output ``(B, 4+nc, A)`` into per-image
  detection rows ``[x1, y1, x2, y2, conf, cls]`` (official semantics, parity-tested).
* :func:`scale_boxes` maps boxes from the letterboxed network input back to the original image.
* :func:`letterbox` is the data layer's letterbox (resize + pad to a stride multiple), re-exported so
  that inference code needs one import.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np
import torch
import torchvision

from yolo9kit.boxes import clip_boxes_xyxy, cxcywh_to_xyxy
from yolo9kit.data.images import letterbox  # re-exported: inference code needs one import

LOGGER = logging.getLogger(__name__)

# Boxes of class c are shifted by c * MAX_WH pixels before one batched torchvision NMS call, so that
# boxes of different classes never overlap: class-aware NMS in a single kernel launch.
MAX_WH = 7680
# At most this many candidates (highest scores) enter torchvision.ops.nms: bounds its O(n^2) cost.
MAX_NMS = 30000

__all__ = ["MAX_NMS", "MAX_WH", "letterbox", "non_max_suppression", "scale_boxes"]


def non_max_suppression(
    prediction: torch.Tensor | Sequence[torch.Tensor],
    conf: float = 0.25,
    iou: float = 0.45,
    classes: Sequence[int] | None = None,
    agnostic: bool = False,
    multi_label: bool = False,
    max_det: int = 300,
    time_limit_s: float | None = None,
) -> list[torch.Tensor]:
    """Confidence filter + class-aware NMS, per image.

    Matches the official ``utils/general.py non_max_suppression`` (no masks, no a-priori labels,
    merge-NMS off): candidates need a class score ``> conf``; with ``multi_label`` (only when
    nc > 1) every (anchor, class) pair above the threshold becomes a row, otherwise the best class
    only; rows are sorted by score (at most 30000 kept), offset by ``class * 7680`` (0 when
    ``agnostic``) and passed to ``torchvision.ops.nms``; the first ``max_det`` survive. If the loop
    takes longer than ``2.5 + 0.05 * B`` seconds it stops with a logged warning, leaving the
    remaining images empty (as the official code does).

    Args:
        prediction: decoded head output (B, 4+nc, A): cx, cy, w, h in input pixels, then class
            scores in [0, 1]. A list/tuple means (decoded, raw) and its element 0 is used.
        conf: minimum class score (strictly greater), in [0, 1] (official ``conf_thres``).
        iou: IoU above which the lower-scored box of the same class is suppressed, in [0, 1] (``iou_thres``).
        classes: keep only these class indices (None keeps all).
        agnostic: suppress across classes.
        multi_label: one row per (box, class) above ``conf`` (validation setting).
        max_det: maximum rows per image.
        time_limit_s: stop after this many seconds (None: the official ``2.5 + 0.05 * B``).

    Returns:
        B tensors (n, 6) float ``[x1, y1, x2, y2, conf, cls]`` on the prediction's device, sorted by
        descending conf.
    """
    if isinstance(prediction, (list, tuple)):
        prediction = prediction[0]
    if not 0 <= conf <= 1:
        raise ValueError(f"conf={conf} is outside [0, 1]; pass a score threshold such as 0.25")
    if not 0 <= iou <= 1:
        raise ValueError(f"iou={iou} is outside [0, 1]; pass an IoU threshold such as 0.45")
    if prediction.ndim != 3 or prediction.shape[1] < 5:
        raise ValueError(f"prediction must be (B, 4+nc, A) with nc >= 1, got shape {tuple(prediction.shape)}")

    batch_size, nc = prediction.shape[0], prediction.shape[1] - 4
    candidates = prediction[:, 4:].amax(1) > conf  # (B, A)
    multi_label = multi_label and nc > 1
    time_limit = 2.5 + 0.05 * batch_size if time_limit_s is None else time_limit_s
    start = time.time()
    output = [torch.zeros((0, 6), device=prediction.device)] * batch_size
    for index, per_image in enumerate(prediction):
        rows = per_image.T[candidates[index]]  # (n, 4+nc)
        if not rows.shape[0]:
            continue
        boxes_xyxy, scores = cxcywh_to_xyxy(rows[:, :4]), rows[:, 4:]
        if multi_label:
            anchor, cls = (scores > conf).nonzero(as_tuple=False).T
            rows = torch.cat((boxes_xyxy[anchor], rows[anchor, 4 + cls, None], cls[:, None].float()), 1)
        else:
            best, cls = scores.max(1, keepdim=True)
            rows = torch.cat((boxes_xyxy, best, cls.float()), 1)[best.view(-1) > conf]
        if classes is not None:
            rows = rows[(rows[:, 5:6] == torch.tensor(classes, device=rows.device)).any(1)]
        if not rows.shape[0]:
            continue
        rows = rows[rows[:, 4].argsort(descending=True)[:MAX_NMS]]
        offsets = rows[:, 5:6] * (0 if agnostic else MAX_WH)
        keep = torchvision.ops.nms(rows[:, :4] + offsets, rows[:, 4], iou)[:max_det]
        output[index] = rows[keep]
        if time.time() - start > time_limit:
            LOGGER.warning("NMS time limit %.3fs exceeded after image %d of %d; the remaining images get no "
                           "detections (raise conf or lower max_det)", time_limit, index + 1, batch_size)
            break
    return output


def scale_boxes(
    input_shape_hw: tuple[int, int],
    boxes_xyxy: torch.Tensor | np.ndarray,
    original_shape_hw: tuple[int, int],
    ratio_pad: tuple | None = None,
):
    """Map xyxy boxes in place from the letterboxed network input back to the original image.

    Matches the official ``scale_boxes``: without ``ratio_pad`` the gain and the (centred) padding
    are recomputed from the two shapes; with ``ratio_pad = ((gain_h, gain_w), (pad_w, pad_h))`` (the
    data loader's ``shapes[i][1]``) those values are used. Subtract the padding, divide by the
    gain, clip to the original image.

    Args:
        input_shape_hw: (h, w) of the network input the boxes are in.
        boxes_xyxy: (N, 4+) boxes in input pixels; modified in place.
        original_shape_hw: (h0, w0) of the original image (extra entries such as channels ignored).
        ratio_pad: optional ((gain, gain), (pad_w, pad_h)).

    Returns:
        The same boxes object, now in original-image pixels.
    """
    if ratio_pad is None:
        gain = min(input_shape_hw[0] / original_shape_hw[0], input_shape_hw[1] / original_shape_hw[1])
        pad = ((input_shape_hw[1] - original_shape_hw[1] * gain) / 2,
               (input_shape_hw[0] - original_shape_hw[0] * gain) / 2)
    else:
        gain, pad = ratio_pad[0][0], ratio_pad[1]
    boxes_xyxy[:, [0, 2]] -= pad[0]
    boxes_xyxy[:, [1, 3]] -= pad[1]
    boxes_xyxy[:, :4] /= gain
    clip_boxes_xyxy(boxes_xyxy, tuple(original_shape_hw[:2]))
    return boxes_xyxy
