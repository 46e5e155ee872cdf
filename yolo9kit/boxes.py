"""Box functions; every name says its formats: ``xyxy`` corners (pixels unless ``_norm``), ``cxcywh`` centre and
size (label files: normalised to [0, 1]), ``ltrb`` distances from an anchor point (grid units). Targets are
``(N, 6)`` rows ``[image_index, class, cx, cy, w, h]`` normalised to [0, 1]."""

from __future__ import annotations

import math

import numpy as np
import torch

Array = torch.Tensor | np.ndarray


def cxcywh_to_xyxy(boxes: Array) -> Array:
    """Convert (..., 4) centre/size boxes to corners. Works on tensors and arrays."""
    out = boxes.clone() if isinstance(boxes, torch.Tensor) else np.copy(boxes)
    half = boxes[..., 2:4] / 2
    out[..., 0:2] = boxes[..., 0:2] - half
    out[..., 2:4] = boxes[..., 0:2] + half
    return out


def box_iou(boxes1_xyxy: torch.Tensor, boxes2_xyxy: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Pairwise IoU of (N, 4) and (M, 4) xyxy boxes -> (N, M), as the official ``box_iou`` (eps on the union)."""
    a1, a2 = boxes1_xyxy[:, None, :2], boxes1_xyxy[:, None, 2:]
    b1, b2 = boxes2_xyxy[None, :, :2], boxes2_xyxy[None, :, 2:]
    inter = (torch.min(a2, b2) - torch.max(a1, b1)).clamp(0).prod(2)
    area1, area2 = (a2 - a1).prod(2), (b2 - b1).prod(2)
    return inter / (area1 + area2 - inter + eps)


def bbox_ciou(box1_xyxy: torch.Tensor, box2_xyxy: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Element-wise Complete-IoU of (..., 4) xyxy boxes (broadcasting) -> (..., 1), as the official
    ``bbox_iou(..., xywh=False, CIoU=True)``: eps on the heights only, ``alpha`` without gradient."""
    b1_x1, b1_y1, b1_x2, b1_y2 = box1_xyxy.chunk(4, -1)
    b2_x1, b2_y1, b2_x2, b2_y2 = box2_xyxy.chunk(4, -1)
    w1, h1 = b1_x2 - b1_x1, b1_y2 - b1_y1 + eps
    w2, h2 = b2_x2 - b2_x1, b2_y2 - b2_y1 + eps
    inter_w = (torch.min(b1_x2, b2_x2) - torch.max(b1_x1, b2_x1)).clamp(0)
    inter = inter_w * (torch.min(b1_y2, b2_y2) - torch.max(b1_y1, b2_y1)).clamp(0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    enclose_w = torch.max(b1_x2, b2_x2) - torch.min(b1_x1, b2_x1)
    enclose_h = torch.max(b1_y2, b2_y2) - torch.min(b1_y1, b2_y1)
    diag_sq = enclose_w**2 + enclose_h**2 + eps
    centre_dist_sq = ((b2_x1 + b2_x2 - b1_x1 - b1_x2) ** 2 + (b2_y1 + b2_y2 - b1_y1 - b1_y2) ** 2) / 4
    v = (4 / math.pi**2) * torch.pow(torch.atan(w2 / h2) - torch.atan(w1 / h1), 2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (centre_dist_sq / diag_sq + v * alpha)


def make_anchors(feature_shapes: list[tuple[int, int]], strides: list[float] | torch.Tensor, offset: float = 0.5,
                 dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(points (A, 2) x, y in grid units of their level, stride_per_point (A, 1)) of the (H_i, W_i)
    ``feature_shapes`` and input-pixel ``strides`` of the levels, row-major, levels concatenated; ``offset`` 0.5
    puts each point in the centre of its cell."""
    points, stride_per_point = [], []
    for (h, w), stride in zip(feature_shapes, strides):
        sx = torch.arange(w, dtype=dtype, device=device) + offset
        sy = torch.arange(h, dtype=dtype, device=device) + offset
        grid_y, grid_x = torch.meshgrid(sy, sx, indexing="ij")
        points.append(torch.stack((grid_x, grid_y), -1).view(-1, 2))
        stride_per_point.append(torch.full((h * w, 1), float(stride), dtype=dtype, device=device))
    return torch.cat(points), torch.cat(stride_per_point)


def ltrb_to_xyxy(distances_ltrb: torch.Tensor, points: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Distances (left, top, right, bottom) from anchor points -> corner boxes, same units."""
    lt, rb = distances_ltrb.chunk(2, dim)
    return torch.cat((points - lt, points + rb), dim)


def ltrb_to_cxcywh(distances_ltrb: torch.Tensor, points: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Distances from anchor points -> centre/size boxes, same units (the official head decode)."""
    x1y1, x2y2 = ltrb_to_xyxy(distances_ltrb, points, dim).chunk(2, dim)
    return torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), dim)


def xyxy_to_ltrb(points: torch.Tensor, boxes_xyxy: torch.Tensor, max_distance: float) -> torch.Tensor:
    """Corner boxes -> distances from anchor points, clamped to [0, max_distance] (the DFL targets)."""
    x1y1, x2y2 = boxes_xyxy.chunk(2, -1)
    return torch.cat((points - x1y1, x2y2 - points), -1).clamp(0, max_distance)


def clip_boxes_xyxy(boxes_xyxy: Array, shape_hw: tuple[int, int]) -> Array:
    """Clip (N, 4) xyxy boxes in place to an image of shape (h, w); returns the same object."""
    h, w = shape_hw
    boxes_xyxy[..., [0, 2]] = boxes_xyxy[..., [0, 2]].clip(0, w)
    boxes_xyxy[..., [1, 3]] = boxes_xyxy[..., [1, 3]].clip(0, h)
    return boxes_xyxy
