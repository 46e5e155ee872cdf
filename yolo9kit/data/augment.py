"""Official training augmentations, each tile warped once into the output (docs/data.md, "Why it is fast")."""

from __future__ import annotations

import math

import cv2
import numpy as np

from yolo9kit.config.train import Hyp


def random_affine_matrix(rng: np.random.Generator, hyp: Hyp, in_size: tuple[int, int],
                         out_size: tuple[int, int]) -> tuple[np.ndarray, float]:
    """(M, zoom): official random_perspective's M = T @ S @ R @ P @ C from ``in_size`` (w, h) to ``out_size``."""
    C = translation(-in_size[0] / 2, -in_size[1] / 2)
    P = np.eye(3)
    P[2, :2] = rng.uniform(-hyp.perspective, hyp.perspective, 2)
    angle, s = rng.uniform(-hyp.degrees, hyp.degrees), rng.uniform(1 - hyp.scale, 1 + hyp.scale)
    R = np.vstack([cv2.getRotationMatrix2D(angle=angle, center=(0, 0), scale=s), [0, 0, 1]])
    S = np.eye(3)
    S[0, 1], S[1, 0] = np.tan(np.radians(rng.uniform(-hyp.shear, hyp.shear, 2)))
    T = translation(rng.uniform(0.5 - hyp.translate, 0.5 + hyp.translate) * out_size[0],
                    rng.uniform(0.5 - hyp.translate, 0.5 + hyp.translate) * out_size[1])
    return T @ S @ R @ P @ C, s


def translation(dx: float, dy: float) -> np.ndarray:
    return np.array([[1, 0, dx], [0, 1, dy], [0, 0, 1.0]])


def resize_matrix(src_w: int, src_h: int, dst_w: float, dst_h: float) -> np.ndarray:
    """Pixel-centre mapping of cv2.resize from a (src_w, src_h) image to (dst_w, dst_h)."""
    sx, sy = dst_w / src_w, dst_h / src_h
    return np.array([[sx, 0, 0.5 * sx - 0.5], [0, sy, 0.5 * sy - 0.5], [0, 0, 1.0]])


def mapped_corners(A: np.ndarray, x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    """(4, 2) corners of the rectangle [x0, x1] x [y0, y1] mapped by A."""
    xy = np.array([[x0, y0, 1], [x1, y0, 1], [x0, y1, 1], [x1, y1, 1]], np.float64) @ A.T
    return xy[:, :2] / xy[:, 2:3]


def place(out: np.ndarray, src: np.ndarray, A: np.ndarray, perspective: bool = False) -> None:
    """Warp ``src`` by ``A`` (src pixels -> out pixels) into ``out`` in place, over its bounding rectangle only."""
    H, W = out.shape[:2]
    if not perspective and not A[[0, 1, 2, 2], [1, 0, 0, 1]].any() and A[0, 0] > 0 and A[1, 1] > 0:
        # a positive scale + translate: crop + cv2.resize + paste (faster), within half a pixel
        px, py = _axis_plan(A[0, 0], A[0, 2], src.shape[1], W), _axis_plan(A[1, 1], A[1, 2], src.shape[0], H)
        if px is None or py is None:
            return
        (i0, i1, c0, c1, lx, ox), (j0, j1, r0, r1, ly, oy) = px, py
        crop = src[r0:r1, c0:c1]
        if (lx, ly) != (c1 - c0, r1 - r0):
            crop = cv2.resize(crop, (lx, ly), interpolation=cv2.INTER_LINEAR)
        k0, k1, m0, m1 = max(i0 - ox, 0), min(i1 - ox, lx), max(j0 - oy, 0), min(j1 - oy, ly)
        if k1 > k0 and m1 > m0:
            out[m0 + oy:m1 + oy, k0 + ox:k1 + ox] = crop[m0:m1, k0:k1]
        return
    h, w = src.shape[:2]
    xy = mapped_corners(A, -0.5, -0.5, w - 0.5, h - 0.5)
    x0, y0 = max(int(math.floor(xy[:, 0].min())), 0), max(int(math.floor(xy[:, 1].min())), 0)
    x1, y1 = min(int(math.ceil(xy[:, 0].max())) + 1, W), min(int(math.ceil(xy[:, 1].max())) + 1, H)
    if x1 <= x0 or y1 <= y0:
        return
    B = translation(-x0, -y0) @ A
    warp, B = (cv2.warpPerspective, B) if perspective else (cv2.warpAffine, B[:2])
    warp(src, B, (x1 - x0, y1 - y0), dst=out[y0:y1, x0:x1], flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_TRANSPARENT)


def _axis_plan(a: float, b: float, n_src: int, n_out: int) -> tuple[int, int, int, int, int, int] | None:
    """x_out = a * x_src + b: output [i0, i1), source crop [c0, c1), resized length, its offset; or None."""
    i0, i1 = max(math.ceil(a * -0.5 + b), 0), min(math.ceil(a * (n_src - 0.5) + b), n_out)
    if i1 <= i0:
        return None
    c0, c1 = max(math.floor((i0 - b) / a), 0), min(math.ceil((i1 - 1 - b) / a) + 2, n_src)
    offset = min(round(a * (c0 - 0.5) + b + 0.5), i0)  # output index of resized pixel 0
    length = max(round((c1 - c0) * a), i1 - offset, 1)  # cover [i0, i1) fully: no seam between tiles
    return i0, i1, c0, c1, length, offset


def flip_image(image: np.ndarray, lr: bool, ud: bool) -> np.ndarray:
    """np.fliplr / np.flipud as one OpenCV call (a contiguous copy)."""
    return cv2.flip(image, -1 if lr and ud else 1 if lr else 0) if lr or ud else image


def hsv_gains(rng: np.random.Generator, hyp: Hyp) -> np.ndarray | None:
    """Gains for H, S, V: 1 + U(-1, 1) * (hsv_h, hsv_s, hsv_v) (official augment_hsv), or None."""
    gains = [hyp.hsv_h, hyp.hsv_s, hyp.hsv_v]
    return rng.uniform(-1, 1, 3) * gains + 1 if any(gains) else None


def bgr_to_rgb(image_bgr: np.ndarray, gains: np.ndarray | None) -> np.ndarray:
    """BGR -> RGB, through the HSV jitter when ``gains`` is given (docs/data.md, "Why it is fast")."""
    if gains is None:
        return cv2.cvtColor(image_bgr, cv2.COLOR_BGR2RGB)
    hsv = cv2.cvtColor(image_bgr, cv2.COLOR_BGR2HSV)
    m = np.c_[np.diag(gains), np.full(3, -0.5 + 1e-4)]  # round(y - 0.5 + 1e-4) == floor(y): truncation
    cv2.transform(hsv, m, dst=hsv)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


def mixup(image: np.ndarray, labels: np.ndarray, image2: np.ndarray, labels2: np.ndarray,
          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Blend two images with r ~ Beta(32, 32) and keep both label sets (official mixup)."""
    r = rng.beta(32.0, 32.0)
    image = cv2.addWeighted(image, r, image2, 1 - r, -0.5)  # -0.5: the official truncation, bar exact .5 ties
    return image, np.concatenate([labels, labels2], 0)


# labels from here on: (n, 5) rows ``cls x1 y1 x2 y2`` in pixels
def box_candidates(box1: np.ndarray, box2: np.ndarray, wh_thr: float = 2, ar_thr: float = 100,
                   area_thr: float = 0.1, eps: float = 1e-16) -> np.ndarray:
    """Official box_candidates: which (4, n) xyxy boxes stay after the warp (size, area ratio, aspect ratio)."""
    w1, h1 = box1[2] - box1[0], box1[3] - box1[1]
    w2, h2 = box2[2] - box2[0], box2[3] - box2[1]
    ar = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (ar < ar_thr)


def affine_labels(labels: np.ndarray, M: np.ndarray, zoom: float, width: int, height: int,
                  polygons: list | None = None) -> np.ndarray:
    """The random affine on pixel labels, lost boxes dropped (official); rows with a polygon are boxed from it."""
    n = len(labels)
    if not n:
        return labels
    xy = np.c_[labels[:, [1, 2, 3, 4, 1, 4, 3, 2]].reshape(n * 4, 2), np.ones(n * 4)] @ M.T  # 4 corners a box
    xy = (xy[:, :2] / xy[:, 2:3]).reshape(n, 8)
    x, y = xy[:, [0, 2, 4, 6]], xy[:, [1, 3, 5, 7]]
    new = np.stack([x.min(1), y.min(1), x.max(1), y.max(1)], 1).clip(0, [width, height, width, height])
    reboxed = False
    for row, poly in enumerate(polygons or []):
        if poly is None:
            continue
        closed = np.concatenate([poly, poly[:1]], 0)  # official resample_segments (1000 points) and segment2box
        t, tp = np.linspace(0, len(closed) - 1, 1000), np.arange(len(closed))
        xy = np.c_[np.interp(t, tp, closed[:, 0]), np.interp(t, tp, closed[:, 1]), np.ones(1000)] @ M.T
        x, y = xy[:, 0] / xy[:, 2], xy[:, 1] / xy[:, 2]
        inside = (x >= 0) & (y >= 0) & (x <= width) & (y <= height)
        x, y = x[inside], y[inside]
        new[row] = np.array([x.min(), y.min(), x.max(), y.max()]) if inside.any() else np.zeros(4)
        reboxed = True
    keep = box_candidates(labels[:, 1:5].T * zoom, new.T, area_thr=0.01 if reboxed else 0.10)
    keep &= (labels[:, 3] > labels[:, 1]) & (labels[:, 4] > labels[:, 2])  # docs/data.md, "Deliberate differences"
    labels = labels[keep]
    labels[:, 1:5] = new[keep]
    return labels


def copy_paste(labels: np.ndarray, polygons: list, p: float, rng: np.random.Generator,
               canvas_width: int) -> tuple[np.ndarray, list, list[np.ndarray]]:
    """Official copy_paste (docs/data.md); ``polygons``: per row (k, 2) pixels or None -> (labels, polygons, pasted)."""
    rows = [i for i, poly in enumerate(polygons) if poly is not None]
    if not p or not rows:
        return labels, polygons, []
    b = labels[rows, 1:5]
    mirrored = np.stack([canvas_width - b[:, 2], b[:, 1], canvas_width - b[:, 0], b[:, 3]], 1)[:, None]
    boxes = labels[None, :, 1:5]
    # official bbox_ioa: (candidates, boxes) intersection over the area of each box
    inter = ((np.minimum(mirrored[..., 2], boxes[..., 2]) - np.maximum(mirrored[..., 0], boxes[..., 0])).clip(0)
             * (np.minimum(mirrored[..., 3], boxes[..., 3]) - np.maximum(mirrored[..., 1], boxes[..., 1])).clip(0))
    ioa = inter / ((boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1]) + 1e-7)
    candidates = [rows[k] for k in np.flatnonzero((ioa < 0.30).all(1))]
    chosen = rng.permutation(candidates)[:round(p * len(candidates))] if candidates else []
    if not len(chosen):
        return labels, polygons, []
    new = labels[chosen]
    new[:, [1, 3]] = canvas_width - new[:, [3, 1]]
    pasted = [np.c_[canvas_width - polygons[j][:, 0], polygons[j][:, 1]] for j in chosen]
    return np.concatenate([labels, new], 0), [*polygons, *pasted], pasted


def xyxy_to_cxcywh_norm(labels: np.ndarray, width: int, height: int, eps: float = 1e-3) -> np.ndarray:
    """Pixel xyxy -> normalised cxcywh, clipped to the image minus ``eps`` (official xyxy2xywhn)."""
    out = labels.astype(np.float32, copy=True)
    x1, x2 = labels[:, 1].clip(0, width - eps), labels[:, 3].clip(0, width - eps)
    y1, y2 = labels[:, 2].clip(0, height - eps), labels[:, 4].clip(0, height - eps)
    out[:, 1], out[:, 2] = (x1 + x2) / 2 / width, (y1 + y2) / 2 / height
    out[:, 3], out[:, 4] = (x2 - x1) / width, (y2 - y1) / height
    return out


def cxcywh_norm_to_xyxy(labels: np.ndarray, w: float, h: float, padw: float = 0, padh: float = 0) -> np.ndarray:
    """Normalised cxcywh -> pixel xyxy in an image of size (w, h), shifted by the padding."""
    out = labels.astype(np.float64, copy=True)
    out[:, 1], out[:, 3] = w * (labels[:, 1] - labels[:, 3] / 2) + padw, w * (labels[:, 1] + labels[:, 3] / 2) + padw
    out[:, 2], out[:, 4] = h * (labels[:, 2] - labels[:, 4] / 2) + padh, h * (labels[:, 2] + labels[:, 4] / 2) + padh
    return out
