"""Detection results: :class:`Prediction` (one image) and :class:`Predictions` (a run), with drawing,
label lines and the per-stage speed table. ``yolo9kit.prediction.predict`` makes them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import torch

from yolo9kit.files import write_bytes_atomically

SPEED_COLUMNS = ["preprocess_ms", "inference_ms", "nms_ms"]


@dataclass
class Prediction:
    """Detections of one image, in original-image pixels.

    Attributes:
        boxes: (n, 4) float32 xyxy, rounded to whole pixels (as detect_dual.py).
        scores: (n,) float32 confidences. classes: (n,) int64 class ids.
        names: class names of the model. orig_shape: (h0, w0). input_shape: (h, w) fed to the network.
        path: the image or video file, or None for an array source. speed: milliseconds per stage.
        frame: the frame's 0-based index in the video ``path``, None for an image.
    """

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    names: list[str]
    orig_shape: tuple[int, int]
    input_shape: tuple[int, int]
    path: str | None = None
    speed: dict[str, float] = field(default_factory=dict)
    image: np.ndarray | None = field(default=None, repr=False)  # BGR, kept only for array sources
    frame: int | None = None

    def __len__(self) -> int:
        return len(self.boxes)

    def to_frame(self):
        """A pandas DataFrame, one row per detection: x1, y1, x2, y2, conf, class, name."""
        import pandas as pd

        return pd.DataFrame({"x1": self.boxes[:, 0], "y1": self.boxes[:, 1], "x2": self.boxes[:, 2],
                             "y2": self.boxes[:, 3], "conf": self.scores, "class": self.classes,
                             "name": [self.names[int(c)] for c in self.classes]})

    def summary(self) -> str:
        """``640x480: 4 persons, 1 bus``: the network input size (h x w), then the count of each class found.

        The official per-image line without its trailing comma; ``640x480: (no detections)`` when empty.
        """
        counts = [f"{n} {self.names[c]}{'s' * (n > 1)}"
                  for c, n in zip(*(a.tolist() for a in np.unique(self.classes, return_counts=True)))]
        return f"{self.input_shape[0]:g}x{self.input_shape[1]:g}: {', '.join(counts) or '(no detections)'}"

    def label_lines(self, save_conf: bool = False) -> list[str]:
        """YOLO label lines ``cls cx cy w h [conf]`` normalised by the original size, printed with %g."""
        h0, w0 = self.orig_shape
        gain = torch.tensor([w0, h0, w0, h0], dtype=torch.float32)
        boxes = torch.from_numpy(self.boxes.astype(np.float32))
        centre_size = torch.cat(((boxes[:, :2] + boxes[:, 2:]) / 2, boxes[:, 2:] - boxes[:, :2]), 1) / gain
        lines = []
        for cls, xywh, conf in zip(self.classes.tolist(), centre_size.tolist(), self.scores.tolist()):
            row = (cls, *xywh, conf) if save_conf else (cls, *xywh)
            lines.append(("%g " * len(row)).rstrip() % row)
        return lines

    def _bgr(self) -> np.ndarray:
        if self.image is not None:
            return self.image
        if self.frame is not None and self.path:
            from yolo9kit.data.sources import read_frame

            image = read_frame(str(self.path), self.frame)  # a video frame is not kept in memory: decode it again
        else:
            image = cv2.imread(str(self.path)) if self.path else None
        if image is None:
            where = f"frame {self.frame} of {self.path}" if self.frame is not None else self.path
            raise FileNotFoundError(f"cannot re-read {where} to draw it")
        return image

    def annotated(self, line_width: int | None = None) -> np.ndarray:
        """The original image (BGR) with boxes and ``name conf`` labels drawn.

        ``line_width`` None scales with the image (0.3 % of its mean side, at least 2 px).
        """
        image = self._bgr().copy()
        lw = line_width or max(round(sum(image.shape[:2]) / 2 * 0.003), 2)
        scale, thickness = lw / 3, max(lw - 1, 1)
        for (x1, y1, x2, y2), conf, cls in zip(self.boxes.astype(int).tolist(), self.scores, self.classes):
            color = _color(int(cls))
            cv2.rectangle(image, (x1, y1), (x2, y2), color, lw, cv2.LINE_AA)
            text = f"{self.names[int(cls)]} {conf:.2f}"
            (tw, th), _ = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, thickness)
            outside = y1 - th - 3 >= 0  # label above the box when it fits, else inside its top edge
            top, bottom = (y1 - th - 3, y1) if outside else (y1, y1 + th + 3)
            cv2.rectangle(image, (x1, top), (x1 + tw, bottom), color, -1, cv2.LINE_AA)
            cv2.putText(image, text, (x1, bottom - 2), cv2.FONT_HERSHEY_SIMPLEX, scale, (255, 255, 255), thickness,
                        cv2.LINE_AA)
        return image

    def plot(self, ax=None, line_width: float = 2.0):
        """Matplotlib figure of the image with its boxes (returns the figure; shows inline in Jupyter)."""
        from matplotlib.patches import Rectangle

        from yolo9kit.figure import new_figure

        if ax is None:
            h0, w0 = self.orig_shape
            ax = new_figure((6, 6 * h0 / max(w0, 1))).add_subplot()
        fig = ax.figure
        ax.imshow(self._bgr()[..., ::-1])
        for (x1, y1, x2, y2), conf, cls in zip(self.boxes.tolist(), self.scores, self.classes):
            color = tuple(c / 255 for c in _color(int(cls))[::-1])
            ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor=color, linewidth=line_width))
            ax.text(x1, y1, f"{self.names[int(cls)]} {conf:.2f}", color="white", fontsize=8, va="bottom",
                    bbox=dict(facecolor=color, edgecolor="none", pad=1))
        ax.set_axis_off()
        name = Path(self.path).name if self.path else "image"
        name += f" frame {self.frame}" if self.frame is not None else ""
        ax.set_title(f"{name}, input {self.summary()}", fontsize=10)
        return fig

    def save(self, path: str | Path, line_width: int | None = None, *, inputs: tuple = ()) -> Path:
        """Write the annotated image (``files.write_file``: whole or not at all, never over one of ``inputs``);
        the format follows the suffix.

        Raises:
            ValueError: the suffix is not an image format OpenCV writes.
            DiskFullError: no room for the file.
        """
        path = Path(path)
        ok, encoded = cv2.imencode(path.suffix or ".jpg", self.annotated(line_width))
        if not ok:
            raise ValueError(f"cannot write {path}: {path.suffix or '(no suffix)'} is not an image format OpenCV "
                             "writes (use .jpg or .png)")
        write_bytes_atomically(path, encoded.tobytes(), inputs=inputs)
        return path


class Predictions(list):
    """List of :class:`Prediction` with the run's timings and skipped inputs.

    Attributes:
        speed: DataFrame, one row per image or video frame: path, frame (only when a video was read: the
            frame's index, None for images), load_ms (read or decode + letterbox), preprocess_ms,
            inference_ms, nms_ms (the last three are what the official Speed line averages).
        skipped: (source, reason) for inputs that could not be read.
        imgsz: (h, w) requested size. save_dir: where outputs were written, or None.
    """

    def __init__(self, items=(), *, speed=None, skipped=(), imgsz=(640, 640), save_dir=None):
        super().__init__(items)
        self.speed, self.skipped, self.imgsz, self.save_dir = speed, list(skipped), imgsz, save_dir

    def to_frame(self):
        """All detections as one DataFrame with an ``image`` column (path or index) and, for videos, ``frame``."""
        import pandas as pd

        videos = any(p.frame is not None for p in self)  # a frame column only when there are video frames
        frames = [p.to_frame().assign(image=p.path or i, **({"frame": p.frame} if videos else {}))
                  for i, p in enumerate(self)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
            columns=["x1", "y1", "x2", "y2", "conf", "class", "name", "image"])

    def speed_line(self) -> str:
        """The official closing line: mean ms per image for pre-process, inference and NMS."""
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
