"""From the head output to detections: the official NMS and rescaling (docs/validation.md), and the results
``predict`` returns: :class:`Prediction` (one image) and :class:`Predictions` (a run)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import torch
import torchvision
from matplotlib.patches import Rectangle

from yolo9kit.boxes import clip_boxes_xyxy, cxcywh_to_xyxy
from yolo9kit.data.sources import read_frame
from yolo9kit.figure import axes_for
from yolo9kit.files import write_text_atomically

LOGGER = logging.getLogger(__name__)

MAX_WH = 7680  # class c is shifted by c * MAX_WH pixels: class-aware NMS in one torchvision call
MAX_NMS = 30000  # at most this many of the highest scores enter NMS: bounds its O(n^2) cost
SPEED_COLUMNS = ["preprocess_ms", "inference_ms", "nms_ms"]


def non_max_suppression(prediction: torch.Tensor | Sequence[torch.Tensor], conf: float = 0.25, iou: float = 0.45,
                        classes: Sequence[int] | None = None, agnostic: bool = False, multi_label: bool = False,
                        max_det: int = 300, time_limit_s: float | None = None) -> list[torch.Tensor]:
    """Confidence filter and class-aware NMS per image, as the official ``utils/general.py`` one; returns B tensors
    (n, 6) ``[x1, y1, x2, y2, conf, cls]``, by descending conf.

    Args:
        prediction: decoded head output (B, 4+nc, A), boxes cx cy w h in pixels; of a (decoded, raw) pair the first.
        conf, iou: minimum class score (exclusive); IoU above which the lower-scored box of a class is dropped.
        multi_label: a row per (box, class) above ``conf`` (validation), not the best class only.
        time_limit_s: then stop with a warning, the later images empty (None: the official ``2.5 + 0.05 * B``).

    Raises:
        ValueError: ``conf`` or ``iou`` outside [0, 1], a prediction not (B, 4+nc, A).
    """
    if isinstance(prediction, (list, tuple)):
        prediction = prediction[0]
    if not 0 <= conf <= 1:
        raise ValueError(f"conf={conf} is outside [0, 1]; pass a score threshold such as 0.25")
    if not 0 <= iou <= 1:
        raise ValueError(f"iou={iou} is outside [0, 1]; pass an IoU threshold such as 0.45")
    if prediction.ndim != 3 or prediction.shape[1] < 5:
        raise ValueError(f"prediction must be (B, 4+nc, A) with nc >= 1, got shape {tuple(prediction.shape)}")
    batch_size = prediction.shape[0]
    candidates = prediction[:, 4:].amax(1) > conf  # (B, A)
    multi_label = multi_label and prediction.shape[1] > 5  # only with nc > 1
    time_limit = 2.5 + 0.05 * batch_size if time_limit_s is None else time_limit_s
    start = time.time()
    output = [torch.zeros((0, 6), device=prediction.device)] * batch_size
    for index, per_image in enumerate(prediction):
        x = per_image.T[candidates[index]]  # (n, 4+nc) -> rows [x1, y1, x2, y2, conf, cls] above conf, kept classes
        boxes, scores = cxcywh_to_xyxy(x[:, :4]), x[:, 4:]
        if multi_label:
            anchor, cls = (scores > conf).nonzero(as_tuple=False).T
            rows = torch.cat((boxes[anchor], x[anchor, 4 + cls, None], cls[:, None].float()), 1)
        else:
            best, cls = scores.max(1, keepdim=True)
            rows = torch.cat((boxes, best, cls.float()), 1)[best.view(-1) > conf]
        if classes is not None:
            rows = rows[(rows[:, 5:6] == torch.tensor(classes, device=rows.device)).any(1)]
        if not rows.shape[0]:
            continue
        rows = rows[rows[:, 4].argsort(descending=True)[:MAX_NMS]]
        offsets = rows[:, 5:6] * (0 if agnostic else MAX_WH)
        output[index] = rows[torchvision.ops.nms(rows[:, :4] + offsets, rows[:, 4], iou)[:max_det]]
        if time.time() - start > time_limit:
            LOGGER.warning("NMS time limit %.3fs exceeded after image %d of %d; the remaining images get no "
                           "detections (raise conf or lower max_det)", time_limit, index + 1, batch_size)
            break
    return output


def scale_boxes(input_shape_hw: tuple[int, int], boxes_xyxy: torch.Tensor | np.ndarray,
                original_shape_hw: tuple[int, ...], ratio_pad: tuple | None = None):
    """Map xyxy boxes (tensor or array) in place from the letterboxed input to the original image, clipped to it;
    returns them. ``ratio_pad``: ((gain, gain), (pad_w, pad_h)), a loader's ``shapes[i][1]``; None: a centred
    letterbox's."""
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


@dataclass
class Prediction:
    """Detections of one image, in original-image pixels."""

    boxes: np.ndarray  # (n, 4) float32 xyxy, rounded to whole pixels
    scores: np.ndarray  # (n,) float32
    classes: np.ndarray  # (n,) int64
    names: list[str]  # the model's class names
    orig_shape: tuple[int, int]  # (h0, w0)
    input_shape: tuple[int, int]  # (h, w) fed to the network
    path: str | None = None  # the image or video file, None for an array
    speed: dict[str, float] = field(default_factory=dict)  # milliseconds per stage
    image: np.ndarray | None = field(default=None, repr=False)  # BGR, kept only for an array
    frame: int | None = None  # the 0-based frame index in the video ``path``, None for an image

    def __len__(self) -> int:
        return len(self.boxes)

    def to_frame(self):
        """A DataFrame, one row per detection: x1, y1, x2, y2, conf, class, name."""
        return pd.DataFrame({**dict(zip(("x1", "y1", "x2", "y2"), self.boxes.T)), "conf": self.scores,
                             "class": self.classes, "name": [self.names[int(c)] for c in self.classes]})

    def summary(self) -> str:
        """``640x480: 4 persons, 1 bus`` (input h x w, count per class), as the official line."""
        counts = [f"{n} {self.names[c]}{'s' * (n > 1)}"
                  for c, n in zip(*(a.tolist() for a in np.unique(self.classes, return_counts=True)))]
        return f"{self.input_shape[0]:g}x{self.input_shape[1]:g}: {', '.join(counts) or '(no detections)'}"

    def label_lines(self, save_conf: bool = False) -> list[str]:
        """YOLO label lines ``cls cx cy w h [conf]``, normalised, printed with %g."""
        h0, w0 = self.orig_shape
        boxes = self.boxes.astype(np.float32)
        centre_size = np.concatenate(((boxes[:, :2] + boxes[:, 2:]) / 2, boxes[:, 2:] - boxes[:, :2]), 1)
        rows = zip(self.classes.tolist(), (centre_size / np.float32([w0, h0, w0, h0])).tolist(), self.scores.tolist())
        return [" ".join(f"{v:g}" for v in (cls, *xywh, conf)[:6 if save_conf else 5]) for cls, xywh, conf in rows]

    def _bgr(self) -> np.ndarray:
        if self.image is not None:
            return self.image
        # a video frame is not kept in memory: decoded again
        image = read_frame(str(self.path), self.frame) if self.frame is not None else cv2.imread(str(self.path))
        if image is None:
            where = f"frame {self.frame} of {self.path}" if self.frame is not None else self.path
            raise FileNotFoundError(f"cannot re-read {where} to draw it")
        return image

    def annotated(self, line_width: int | None = None) -> np.ndarray:
        """The original image (BGR) with boxes and ``name conf`` labels; ``line_width`` None scales with it."""
        image = self._bgr().copy()
        lw = line_width or max(round(sum(image.shape[:2]) / 2 * 0.003), 2)
        scale, thickness = lw / 3, max(lw - 1, 1)
        for (x1, y1, x2, y2), conf, cls in zip(self.boxes.astype(int).tolist(), self.scores, self.classes):
            color = _color(int(cls))
            cv2.rectangle(image, (x1, y1), (x2, y2), color, lw, cv2.LINE_AA)
            text = f"{self.names[int(cls)]} {conf:.2f}"
            (tw, th), _ = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, thickness)
            top, bottom = (y1 - th - 3, y1) if y1 - th - 3 >= 0 else (y1, y1 + th + 3)  # above the box, else inside
            cv2.rectangle(image, (x1, top), (x1 + tw, bottom), color, -1, cv2.LINE_AA)
            cv2.putText(image, text, (x1, bottom - 2), cv2.FONT_HERSHEY_SIMPLEX, scale, (255, 255, 255), thickness,
                        cv2.LINE_AA)
        return image

    def plot(self, ax=None, line_width: float = 2.0):
        """Matplotlib figure of the image with its boxes (returns the figure; shows inline in Jupyter)."""
        _, ax = axes_for(ax, (6, 6 * self.orig_shape[0] / max(self.orig_shape[1], 1)))
        ax.imshow(self._bgr()[..., ::-1])
        for (x1, y1, x2, y2), conf, cls in zip(self.boxes.tolist(), self.scores, self.classes):
            color = tuple(c / 255 for c in _color(int(cls))[::-1])
            ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor=color, linewidth=line_width))
            ax.text(x1, y1, f"{self.names[int(cls)]} {conf:.2f}", color="white", fontsize=8, va="bottom",
                    bbox={"facecolor": color, "edgecolor": "none", "pad": 1})
        ax.set_axis_off()
        name = Path(self.path).name if self.path else "image"
        name += f" frame {self.frame}" if self.frame is not None else ""
        ax.set_title(f"{name}, input {self.summary()}", fontsize=10)
        return ax.figure

    def save(self, path: str | Path, line_width: int | None = None, *, inputs: tuple = ()) -> Path:
        """Write the annotated image, whole or not at all, never over one of ``inputs``; the suffix gives the format
        (ValueError when OpenCV writes no such format)."""
        path = Path(path)
        ok, encoded = cv2.imencode(path.suffix or ".jpg", self.annotated(line_width))
        if not ok:
            raise ValueError(f"cannot write {path}: {path.suffix or '(no suffix)'} is not an image format OpenCV "
                             "writes (use .jpg or .png)")
        write_text_atomically(path, encoded.tobytes(), inputs=inputs)
        return path


class Predictions(list):
    """List of :class:`Prediction` with ``speed`` (DataFrame per image or frame: path, frame for videos, load_ms,
    :data:`SPEED_COLUMNS`), ``skipped`` ((source, reason) of unreadable inputs), ``imgsz`` and ``save_dir``."""

    def __init__(self, items=(), *, speed=None, skipped=(), imgsz=(640, 640), save_dir=None):
        super().__init__(items)
        self.speed, self.skipped, self.imgsz, self.save_dir = speed, list(skipped), imgsz, save_dir

    def to_frame(self):
        """All detections in one DataFrame with an ``image`` column (path or index) and, for videos, ``frame``."""
        videos = any(p.frame is not None for p in self)
        frames = [p.to_frame().assign(image=p.path or i, **({"frame": p.frame} if videos else {}))
                  for i, p in enumerate(self)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
            columns=["x1", "y1", "x2", "y2", "conf", "class", "name", "image"])

    def speed_line(self) -> str:
        """The official Speed line: mean ms per image."""
        means = [float(self.speed[c].mean()) if self.speed is not None and len(self.speed) else 0.0
                 for c in SPEED_COLUMNS]
        return speed_line(means, (1, 3, *self.imgsz))


def speed_line(ms_per_image: Sequence[float], shape: tuple[int, ...]) -> str:
    """``Speed: 1.0ms pre-process, 2.0ms inference, 3.0ms NMS per image at shape (1, 3, 640, 640)``."""
    pre, inference, nms = ms_per_image
    return f"Speed: {pre:.1f}ms pre-process, {inference:.1f}ms inference, {nms:.1f}ms NMS per image at shape {shape}"


def _color(index: int) -> tuple[int, int, int]:
    palette = ("FF3838", "FF9D97", "FF701F", "FFB21D", "CFD231", "48F90A", "92CC17", "3DDB86", "1A9334", "00D4BB",
               "2C99A8", "00C2FF", "344593", "6473FF", "0018EC", "8438FF", "520085", "CB38FF", "FF95C8", "FF37C7")
    h = palette[index % len(palette)]
    return int(h[4:6], 16), int(h[2:4], 16), int(h[0:2], 16)  # BGR
