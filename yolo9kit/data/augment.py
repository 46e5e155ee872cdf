"""Training augmentations with the semantics of the official ``utils/dataloaders.py`` load_mosaic and
``utils/augmentations.py`` random_perspective, box_candidates, mixup and augment_hsv, written for speed.

The official pipeline builds a 2s x 2s mosaic canvas, warps it to s x s, converts to HSV and back, then
flips. Here each source tile is warped once, straight into the s x s output, by the product of its
placement, the random affine and the flip (one 3x3 matrix per tile): the same geometry and the same box
arithmetic, without the canvas or the extra copies. Boxes follow the official arithmetic exactly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import cv2
import numpy as np

from yolo9kit.config.train import check_augment_hyp
from yolo9kit.data.polygons import transform_polygon_boxes


@dataclass(frozen=True)
class Hyp:
    """Augmentation hyper-parameters; defaults are the official hyp.scratch-high.yaml values."""

    hsv_h: float = 0.015  # hue gain fraction
    hsv_s: float = 0.7  # saturation gain fraction
    hsv_v: float = 0.4  # value gain fraction
    degrees: float = 0.0  # rotation, +/- degrees
    translate: float = 0.1  # +/- fraction of the output size
    scale: float = 0.9  # zoom drawn from [1 - scale, 1 + scale]
    shear: float = 0.0  # +/- degrees
    perspective: float = 0.0  # +/- fraction (0 keeps the warp affine)
    flipud: float = 0.0  # probability
    fliplr: float = 0.5  # probability
    mosaic: float = 1.0  # probability, while mosaic is enabled
    mixup: float = 0.15  # probability, inside the mosaic path only
    copy_paste: float = 0.3  # probability per polygon; acts only on polygon labels, inside mosaics

    def __post_init__(self) -> None:
        check_augment_hyp(asdict(self), "Hyp")

    @classmethod
    def from_dict(cls, hyp: dict | Hyp | None) -> Hyp:
        """Build from a dict such as an official hyp yaml; unknown keys (lr0, box, ...) are ignored."""
        if hyp is None or isinstance(hyp, Hyp):
            return hyp or cls()
        known = set(asdict(cls()))
        return cls(**{k: float(v) for k, v in hyp.items() if k in known})


def random_affine_matrix(rng: np.random.Generator, hyp: Hyp, in_size: tuple[int, int],
                         out_size: tuple[int, int]) -> tuple[np.ndarray, float]:
    """The random_perspective matrix M = T @ S @ R @ P @ C (official order and distributions).

    Args:
        in_size: (width, height) of the image being warped (the mosaic canvas, or the letterboxed image).
        out_size: (width, height) of the output.

    Returns:
        (M (3, 3) float64 mapping input pixels to output pixels, zoom factor s).
    """
    C = np.eye(3)
    C[0, 2], C[1, 2] = -in_size[0] / 2, -in_size[1] / 2
    P = np.eye(3)
    P[2, 0], P[2, 1] = rng.uniform(-hyp.perspective, hyp.perspective, 2)
    R = np.eye(3)
    angle = rng.uniform(-hyp.degrees, hyp.degrees)
    s = rng.uniform(1 - hyp.scale, 1 + hyp.scale)
    R[:2] = cv2.getRotationMatrix2D(angle=angle, center=(0, 0), scale=s)
    S = np.eye(3)
    S[0, 1], S[1, 0] = np.tan(np.radians(rng.uniform(-hyp.shear, hyp.shear, 2)))
    T = np.eye(3)
    T[0, 2] = rng.uniform(0.5 - hyp.translate, 0.5 + hyp.translate) * out_size[0]
    T[1, 2] = rng.uniform(0.5 - hyp.translate, 0.5 + hyp.translate) * out_size[1]
    return T @ S @ R @ P @ C, s


def flip_matrix(width: int, height: int, lr: bool, ud: bool) -> np.ndarray:
    """Pixel-index flip (x -> W - 1 - x), the same as np.fliplr / np.flipud of the warped image."""
    F = np.eye(3)
    if lr:
        F[0, 0], F[0, 2] = -1, width - 1
    if ud:
        F[1, 1], F[1, 2] = -1, height - 1
    return F


def translation(dx: float, dy: float) -> np.ndarray:
    T = np.eye(3)
    T[0, 2], T[1, 2] = dx, dy
    return T


def inverse_scale_translate(A: np.ndarray) -> np.ndarray:
    """Inverse of a 3x3 scale-and-translate matrix, without a general solver (it runs per tile)."""
    sx, sy = A[0, 0], A[1, 1]
    return np.array([[1 / sx, 0, -A[0, 2] / sx], [0, 1 / sy, -A[1, 2] / sy], [0, 0, 1.0]])


def resize_matrix(src_w: int, src_h: int, dst_w: float, dst_h: float) -> np.ndarray:
    """Pixel-centre mapping of cv2.resize from a (src_w, src_h) image to (dst_w, dst_h)."""
    sx, sy = dst_w / src_w, dst_h / src_h
    return np.array([[sx, 0, 0.5 * sx - 0.5], [0, sy, 0.5 * sy - 0.5], [0, 0, 1.0]])


def warp_into(out: np.ndarray, src: np.ndarray, A: np.ndarray, perspective: bool = False) -> None:
    """Write ``src`` warped by ``A`` (3x3, src pixels -> out pixels) into ``out``, in place, bilinear.

    Only the bounding rectangle of the warped source is computed, and pixels that do not come from the
    source keep their value (BORDER_TRANSPARENT), so several tiles can be warped into one output.
    """
    h, w = src.shape[:2]
    H, W = out.shape[:2]
    corners = np.array([[-0.5, -0.5, 1], [w - 0.5, -0.5, 1], [-0.5, h - 0.5, 1], [w - 0.5, h - 0.5, 1]]) @ A.T
    xy = corners[:, :2] / corners[:, 2:3]
    x0, y0 = max(int(math.floor(xy[:, 0].min())), 0), max(int(math.floor(xy[:, 1].min())), 0)
    x1, y1 = min(int(math.ceil(xy[:, 0].max())) + 1, W), min(int(math.ceil(xy[:, 1].max())) + 1, H)
    if x1 <= x0 or y1 <= y0:
        return
    B = translation(-x0, -y0) @ A
    roi = out[y0:y1, x0:x1]
    if perspective:
        cv2.warpPerspective(src, B, (x1 - x0, y1 - y0), dst=roi, flags=cv2.INTER_LINEAR,
                            borderMode=cv2.BORDER_TRANSPARENT)
    else:
        cv2.warpAffine(src, B[:2], (x1 - x0, y1 - y0), dst=roi, flags=cv2.INTER_LINEAR,
                       borderMode=cv2.BORDER_TRANSPARENT)


def is_scale_translate(A: np.ndarray) -> bool:
    """True when A only scales (positively) and translates: then a resize and a paste do the warp."""
    return A[0, 1] == 0 and A[1, 0] == 0 and A[2, 0] == 0 and A[2, 1] == 0 and A[0, 0] > 0 and A[1, 1] > 0


def _axis_plan(a: float, b: float, n_src: int, n_out: int) -> tuple[int, int, int, int, int, int] | None:
    """For x_out = a * x_src + b along one axis: output range [i0, i1), source crop [c0, c1), resized length
    and the offset of the resized crop in the output; None when nothing lands in the output."""
    i0 = max(math.ceil(a * -0.5 + b), 0)
    i1 = min(math.ceil(a * (n_src - 0.5) + b), n_out)
    if i1 <= i0:
        return None
    c0 = max(math.floor((i0 - b) / a), 0)
    c1 = min(math.ceil((i1 - 1 - b) / a) + 2, n_src)
    offset = min(round(a * (c0 - 0.5) + b + 0.5), i0)  # output index of resized pixel 0
    length = max(round((c1 - c0) * a), i1 - offset, 1)  # cover [i0, i1) fully: no seam between tiles
    return i0, i1, c0, c1, length, offset


def paste_scaled(out: np.ndarray, src: np.ndarray, A: np.ndarray) -> None:
    """Same as :func:`warp_into` for a scale-and-translate A, done as crop + cv2.resize + paste.

    A resize costs several times less than a general warp per pixel. The result lands within half a
    pixel of the exact warp (integer placement, scale rounded to whole pixels of the resized crop).
    """
    H, W = out.shape[:2]
    px = _axis_plan(A[0, 0], A[0, 2], src.shape[1], W)
    py = _axis_plan(A[1, 1], A[1, 2], src.shape[0], H)
    if px is None or py is None:
        return
    (i0, i1, c0, c1, lx, ox), (j0, j1, r0, r1, ly, oy) = px, py
    crop = src[r0:r1, c0:c1]
    if (lx, ly) != (c1 - c0, r1 - r0):
        crop = cv2.resize(crop, (lx, ly), interpolation=cv2.INTER_LINEAR)
    k0, k1 = max(i0 - ox, 0), min(i1 - ox, lx)
    m0, m1 = max(j0 - oy, 0), min(j1 - oy, ly)
    if k1 > k0 and m1 > m0:
        out[m0 + oy:m1 + oy, k0 + ox:k1 + ox] = crop[m0:m1, k0:k1]


def place(out: np.ndarray, src: np.ndarray, A: np.ndarray, perspective: bool = False) -> None:
    """Warp ``src`` by ``A`` into ``out`` (fast path for scale + translate, the default hyp)."""
    if not perspective and is_scale_translate(A):
        paste_scaled(out, src, A)
    else:
        warp_into(out, src, A, perspective)


def flip_image(image: np.ndarray, lr: bool, ud: bool) -> np.ndarray:
    """np.fliplr / np.flipud as one OpenCV call (a contiguous copy)."""
    if lr and ud:
        return cv2.flip(image, -1)
    if lr or ud:
        return cv2.flip(image, 1 if lr else 0)
    return image


def visible(A: np.ndarray, w: float, h: float, out_w: int, out_h: int) -> bool:
    """Does the rectangle [0, w] x [0, h] mapped by A overlap the output?"""
    corners = np.array([[0, 0, 1], [w, 0, 1], [0, h, 1], [w, h, 1]], np.float64) @ A.T
    xy = corners[:, :2] / corners[:, 2:3]
    return bool(xy[:, 0].max() > 0 and xy[:, 0].min() < out_w and xy[:, 1].max() > 0 and xy[:, 1].min() < out_h)


def transform_boxes(boxes_xyxy: np.ndarray, M: np.ndarray, width: int, height: int) -> np.ndarray:
    """Map boxes by their 4 corners through M, take the enclosing box, clip to the output (official)."""
    n = len(boxes_xyxy)
    xy = np.ones((n * 4, 3))
    xy[:, :2] = boxes_xyxy[:, [0, 1, 2, 3, 0, 3, 2, 1]].reshape(n * 4, 2)
    xy = xy @ M.T
    xy = (xy[:, :2] / xy[:, 2:3]).reshape(n, 8)
    x, y = xy[:, [0, 2, 4, 6]], xy[:, [1, 3, 5, 7]]
    new = np.stack([x.min(1), y.min(1), x.max(1), y.max(1)], 1)
    new[:, [0, 2]] = new[:, [0, 2]].clip(0, width)
    new[:, [1, 3]] = new[:, [1, 3]].clip(0, height)
    return new


def box_candidates(box1: np.ndarray, box2: np.ndarray, wh_thr: float = 2, ar_thr: float = 100,
                   area_thr: float = 0.1, eps: float = 1e-16) -> np.ndarray:
    """Keep boxes wider and taller than ``wh_thr`` px, with area ratio after/before above ``area_thr`` and
    aspect ratio below ``ar_thr``; matches the official box_candidates. Boxes are (4, n) xyxy."""
    w1, h1 = box1[2] - box1[0], box1[3] - box1[1]
    w2, h2 = box2[2] - box2[0], box2[3] - box2[1]
    ar = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (ar < ar_thr)


def affine_labels(labels: np.ndarray, M: np.ndarray, zoom: float, width: int, height: int,
                  polygons: list | None = None) -> np.ndarray:
    """Apply the random affine to (n, 5) ``cls x1 y1 x2 y2`` pixel labels and drop lost boxes (official).

    Rows with a polygon (``polygons[i]`` not None, canvas pixels) are re-boxed from the transformed
    polygon, and the area threshold drops to 0.01 as in the official code when polygons are present.
    """
    if not len(labels):
        return labels
    new = transform_boxes(labels[:, 1:5], M, width, height)
    boxes = transform_polygon_boxes(polygons, M, width, height) if polygons else {}
    for row, box in boxes.items():
        new[row] = box
    keep = box_candidates(labels[:, 1:5].T * zoom, new.T, area_thr=0.01 if boxes else 0.10)
    # An object wholly outside the mosaic canvas has a zero-size clipped box, but its clipped polygon is a
    # line along the canvas edge that a rotation turns into a box of nothing; the official code keeps it.
    keep &= (labels[:, 3] > labels[:, 1]) & (labels[:, 4] > labels[:, 2])
    labels = labels[keep]
    labels[:, 1:5] = new[keep]
    return labels


def flip_labels(labels: np.ndarray, width: int, height: int, lr: bool, ud: bool) -> np.ndarray:
    """Mirror (n, 5) pixel xyxy labels the way the image was flipped."""
    if lr:
        labels[:, [1, 3]] = width - labels[:, [3, 1]]
    if ud:
        labels[:, [2, 4]] = height - labels[:, [4, 2]]
    return labels


def hsv_gains(rng: np.random.Generator, hyp: Hyp) -> np.ndarray | None:
    """Random (3,) gains for H, S, V: 1 + U(-1, 1) * (hsv_h, hsv_s, hsv_v) (official augment_hsv), or None."""
    if not (hyp.hsv_h or hyp.hsv_s or hyp.hsv_v):
        return None
    return rng.uniform(-1, 1, 3) * [hyp.hsv_h, hyp.hsv_s, hyp.hsv_v] + 1


def bgr_to_rgb(image_bgr: np.ndarray, gains: np.ndarray | None) -> np.ndarray:
    """BGR -> RGB, through the HSV jitter when ``gains`` is given.

    The official code maps each HSV channel through a table: hue ``(x * g) % 180``, saturation and value
    ``clip(x * g, 0, 255)``, all truncated to uint8. Here one ``cv2.transform`` computes ``floor(x * g)``
    with saturation (a few times faster than three look-ups); a hue past 179 is left for the HSV->RGB
    conversion, which wraps hue modulo 180 itself, so the colours are the same.
    """
    if gains is None:
        return cv2.cvtColor(image_bgr, cv2.COLOR_BGR2RGB)
    hsv = cv2.cvtColor(image_bgr, cv2.COLOR_BGR2HSV)
    m = np.zeros((3, 4))
    m[[0, 1, 2], [0, 1, 2]] = gains
    m[:, 3] = -0.5 + 1e-4  # round(y - 0.5 + 1e-4) == floor(y): truncation like astype(uint8)
    cv2.transform(hsv, m, dst=hsv)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


def mixup(image: np.ndarray, labels: np.ndarray, image2: np.ndarray, labels2: np.ndarray,
          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Blend two images with r ~ Beta(32, 32) and keep both label sets (official mixup).

    The official code truncates ``img * r + img2 * (1 - r)`` to uint8; ``addWeighted`` with -0.5 rounds
    to the same value (except on exact .5 ties) without the float64 temporaries.
    """
    r = rng.beta(32.0, 32.0)
    image = cv2.addWeighted(image, r, image2, 1 - r, -0.5)
    return image, np.concatenate([labels, labels2], 0)


def xyxy_to_cxcywh_norm(labels: np.ndarray, width: int, height: int, eps: float = 1e-3) -> np.ndarray:
    """(n, 5) pixel xyxy -> normalised cxcywh, clipped to the image minus ``eps`` (official xyxy2xywhn)."""
    out = labels.astype(np.float32, copy=True)
    x1, x2 = labels[:, 1].clip(0, width - eps), labels[:, 3].clip(0, width - eps)
    y1, y2 = labels[:, 2].clip(0, height - eps), labels[:, 4].clip(0, height - eps)
    out[:, 1], out[:, 2] = (x1 + x2) / 2 / width, (y1 + y2) / 2 / height
    out[:, 3], out[:, 4] = (x2 - x1) / width, (y2 - y1) / height
    return out


def cxcywh_norm_to_xyxy(labels: np.ndarray, w: float, h: float, padw: float = 0, padh: float = 0) -> np.ndarray:
    """(n, 5) normalised cxcywh -> pixel xyxy in an image of size (w, h), shifted by the padding."""
    out = labels.astype(np.float64, copy=True)
    out[:, 1] = w * (labels[:, 1] - labels[:, 3] / 2) + padw
    out[:, 2] = h * (labels[:, 2] - labels[:, 4] / 2) + padh
    out[:, 3] = w * (labels[:, 1] + labels[:, 3] / 2) + padw
    out[:, 4] = h * (labels[:, 2] + labels[:, 4] / 2) + padh
    return out
