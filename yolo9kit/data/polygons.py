"""Polygon (segment) labels in augmentation: re-boxing after the affine, and copy-paste
(official ``utils/augmentations.py`` random_perspective and copy_paste)."""

from __future__ import annotations

import numpy as np


def resample_polygon(points: np.ndarray, n: int = 1000) -> np.ndarray:
    """(k, 2) closed polygon -> (n, 2) points evenly spaced in vertex index (official resample_segments)."""
    closed = np.concatenate([points, points[:1]], 0)
    x = np.linspace(0, len(closed) - 1, n)
    xp = np.arange(len(closed))
    return np.stack([np.interp(x, xp, closed[:, 0]), np.interp(x, xp, closed[:, 1])], 1)


def polygon_box(points: np.ndarray, width: int, height: int) -> np.ndarray:
    """Box (4,) xyxy of the polygon points that lie inside the image (official segment2box); zeros if none."""
    x, y = points[:, 0], points[:, 1]
    inside = (x >= 0) & (y >= 0) & (x <= width) & (y <= height)
    if not inside.any():
        return np.zeros(4)
    x, y = x[inside], y[inside]
    return np.array([x.min(), y.min(), x.max(), y.max()])


def transform_polygon_boxes(polygons: list, M: np.ndarray, width: int, height: int) -> dict[int, np.ndarray]:
    """For each row with a polygon: resample to 1000 points, map through M, box the part inside the image."""
    boxes = {}
    for row, poly in enumerate(polygons):
        if poly is None:
            continue
        xy = np.ones((1000, 3))
        xy[:, :2] = resample_polygon(poly)
        xy = xy @ M.T
        boxes[row] = polygon_box(xy[:, :2] / xy[:, 2:3], width, height)
    return boxes


def box_ioa(boxes1: np.ndarray, boxes2: np.ndarray, eps: float = 1e-7) -> np.ndarray:
    """(n, m) intersection over the area of each boxes2 box (official bbox_ioa)."""
    x1 = np.maximum(boxes1[:, None, 0], boxes2[None, :, 0])
    y1 = np.maximum(boxes1[:, None, 1], boxes2[None, :, 1])
    x2 = np.minimum(boxes1[:, None, 2], boxes2[None, :, 2])
    y2 = np.minimum(boxes1[:, None, 3], boxes2[None, :, 3])
    inter = (x2 - x1).clip(0) * (y2 - y1).clip(0)
    area2 = (boxes2[:, 2] - boxes2[:, 0]) * (boxes2[:, 3] - boxes2[:, 1])
    return inter / (area2[None] + eps)


def copy_paste(labels: np.ndarray, polygons: list, p: float, rng: np.random.Generator,
               canvas_width: int) -> tuple[np.ndarray, list, list[np.ndarray]]:
    """Choose polygons to mirror left-right and paste (official copy_paste semantics, on label level).

    Rows whose mirrored box covers less than 30 % of every existing box are candidates; round(p * n) of them
    are chosen. Their mirrored labels and polygons are appended.

    Args:
        labels: (n, 5) ``cls x1 y1 x2 y2`` canvas pixels.
        polygons: per row a (k, 2) polygon in canvas pixels, or None for a box-only row.
        canvas_width: the mirror is x -> canvas_width - x.

    Returns:
        (labels, polygons, pasted polygons in canvas pixels: the regions to fill from the mirrored image).
    """
    rows = [i for i, poly in enumerate(polygons) if poly is not None]
    if not p or not rows:
        return labels, polygons, []
    b = labels[rows, 1:5]
    mirrored = np.stack([canvas_width - b[:, 2], b[:, 1], canvas_width - b[:, 0], b[:, 3]], 1)
    candidates = [rows[k] for k in np.flatnonzero((box_ioa(mirrored, labels[:, 1:5]) < 0.30).all(1))]
    chosen = rng.permutation(candidates)[:round(p * len(candidates))] if candidates else []
    new_rows, pasted = [], []
    for j in chosen:
        poly = polygons[j].copy()
        poly[:, 0] = canvas_width - poly[:, 0]
        x1, x2 = canvas_width - labels[j, 3], canvas_width - labels[j, 1]
        new_rows.append([labels[j, 0], x1, labels[j, 2], x2, labels[j, 4]])
        pasted.append(poly)
    if not new_rows:
        return labels, polygons, []
    return np.concatenate([labels, np.array(new_rows)], 0), [*polygons, *pasted], pasted
