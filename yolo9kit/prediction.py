"""Inference on images, as the official ``detect_dual.py``: letterbox, main head, NMS, rescale.

``predict(model, "photos/")`` returns one :class:`Prediction` per image (boxes in original-image
pixels) in a :class:`Predictions` list that also holds the per-image timings and the skipped files.
"""

from __future__ import annotations

import copy
import glob
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from yolo9kit.env import resolve_device
from yolo9kit.ops import letterbox, non_max_suppression, scale_boxes

LOGGER = logging.getLogger(__name__)

IMAGE_SUFFIXES = {".bmp", ".dng", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp", ".pfm"}
SPEED_COLUMNS = ["preprocess_ms", "inference_ms", "nms_ms"]

__all__ = ["Prediction", "Predictions", "load_model", "predict", "prepare_model", "resolve_device", "select_head"]


@dataclass
class Prediction:
    """Detections of one image, in original-image pixels.

    Attributes:
        boxes: (n, 4) float32 xyxy, rounded to whole pixels (as detect_dual.py).
        scores: (n,) float32 confidences. classes: (n,) int64 class ids.
        names: class names of the model. orig_shape: (h0, w0). input_shape: (h, w) fed to the network.
        path: the image file, or None for an array source. speed: milliseconds per stage.
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

    def __len__(self) -> int:
        return len(self.boxes)

    def to_frame(self):
        """A pandas DataFrame, one row per detection: x1, y1, x2, y2, conf, class, name."""
        import pandas as pd

        return pd.DataFrame({"x1": self.boxes[:, 0], "y1": self.boxes[:, 1], "x2": self.boxes[:, 2],
                             "y2": self.boxes[:, 3], "conf": self.scores, "class": self.classes,
                             "name": [self.names[int(c)] for c in self.classes]})

    def summary(self) -> str:
        """``640x480 4 persons, 1 bus, `` as the official per-image line (network input size first)."""
        text = f"{self.input_shape[0]:g}x{self.input_shape[1]:g} "
        for c in np.unique(self.classes):
            n = int((self.classes == c).sum())
            text += f"{n} {self.names[int(c)]}{'s' * (n > 1)}, "
        return text if len(self) else text + "(no detections), "

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
        image = cv2.imread(str(self.path)) if self.path else None
        if image is None:
            raise FileNotFoundError(f"cannot re-read {self.path} to draw it")
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

        from yolo9kit.plots.metrics import new_figure

        if ax is None:
            h0, w0 = self.orig_shape
            ax = new_figure((8, 8 * h0 / max(w0, 1))).add_subplot()
        fig = ax.figure
        ax.imshow(self._bgr()[..., ::-1])
        for (x1, y1, x2, y2), conf, cls in zip(self.boxes.tolist(), self.scores, self.classes):
            color = tuple(c / 255 for c in _color(int(cls))[::-1])
            ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor=color, linewidth=line_width))
            ax.text(x1, y1, f"{self.names[int(cls)]} {conf:.2f}", color="white", fontsize=8, va="bottom",
                    bbox=dict(facecolor=color, edgecolor="none", pad=1))
        ax.set_axis_off()
        ax.set_title(Path(self.path).name if self.path else "image")
        return fig

    def save(self, path: str | Path, line_width: int | None = None) -> Path:
        """Write the annotated image; the format follows the suffix."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not cv2.imwrite(str(path), self.annotated(line_width)):
            raise OSError(f"could not write {path}: check the folder and that the suffix is an image format")
        return path


class Predictions(list):
    """List of :class:`Prediction` with the run's timings and skipped inputs.

    Attributes:
        speed: DataFrame, one row per image: path, load_ms (read + letterbox), preprocess_ms,
            inference_ms, nms_ms (the last three are what the official Speed line averages).
        skipped: (source, reason) for inputs that could not be read.
        imgsz: (h, w) requested size. save_dir: where outputs were written, or None.
    """

    def __init__(self, items=(), *, speed=None, skipped=(), imgsz=(640, 640), save_dir=None):
        super().__init__(items)
        self.speed, self.skipped, self.imgsz, self.save_dir = speed, list(skipped), imgsz, save_dir

    def to_frame(self):
        """All detections as one DataFrame with a ``path`` (or image index) column."""
        import pandas as pd

        frames = [p.to_frame().assign(image=p.path or i) for i, p in enumerate(self)]
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


def load_model(weights: Any):
    """A DetectionModel from a model object, a kit checkpoint, an official .pt, or a model name.

    A kit checkpoint uses its EMA weights when present; an official file is loaded without its code.
    A registered model name (``yolov9-t``) builds a randomly initialised model, for smoke tests only.
    """
    if isinstance(weights, torch.nn.Module):
        return weights
    path = Path(str(weights))
    if path.is_file():
        from yolo9kit.checkpoint import CheckpointError, load_checkpoint
        from yolo9kit.models import load_official_checkpoint

        try:
            return load_checkpoint(path)
        except CheckpointError as kit_error:
            try:
                return load_official_checkpoint(path)
            except Exception as official_error:
                raise ValueError(f"{path}: neither a yolo9kit checkpoint ({kit_error}) nor an official YOLOv9 "
                                 f"checkpoint ({official_error})") from official_error
    from yolo9kit.models import create_model, list_models

    if str(weights) in list_models():
        LOGGER.warning("%s: no weights file given, using a randomly initialised model", weights)
        return create_model(str(weights))
    raise FileNotFoundError(f"weights {weights} not found: pass a checkpoint path or one of {', '.join(list_models())}")


def prepare_model(model: torch.nn.Module, device: torch.device, half: bool, deploy: bool = False,
                  head: str = "main") -> torch.nn.Module:
    """The model on ``device`` in FP16 (``half``) or FP32, in eval mode; ``deploy`` fuses it for speed.

    Casting happens on a copy: casting in place would round the caller's weights (the trainer's EMA
    model, for instance) to FP16 for good. The caller restores ``model.train(...)`` when it is the same.
    """
    if deploy and hasattr(model, "yaml"):
        from yolo9kit.models.deploy import deploy_for_inference

        model = deploy_for_inference(model, head)
    dtype = torch.float16 if half else torch.float32
    first = next(model.parameters(), None)
    if first is not None and first.dtype != dtype:
        model = copy.deepcopy(model).to(dtype)
    return model.to(device).eval()


def select_head(output, head: str = "main") -> torch.Tensor:
    """The decoded (B, 4+nc, A) prediction of ``head`` ("main" or "aux") from an eval-mode forward."""
    if head not in ("main", "aux"):
        raise ValueError(f"head must be 'main' or 'aux', got {head!r}")
    if isinstance(output, torch.Tensor):
        if head == "aux":
            raise ValueError("this model has a single head (GELAN); head='aux' needs a dual-head YOLOv9 model")
        return output
    chosen = getattr(output, head)
    if chosen is None:
        raise ValueError("this model has no auxiliary head (GELAN / converted); use head='main'")
    return chosen


def _color(index: int) -> tuple[int, int, int]:
    palette = ("FF3838", "FF9D97", "FF701F", "FFB21D", "CFD231", "48F90A", "92CC17", "3DDB86", "1A9334", "00D4BB",
               "2C99A8", "00C2FF", "344593", "6473FF", "0018EC", "8438FF", "520085", "CB38FF", "FF95C8", "FF37C7")
    h = palette[index % len(palette)]
    return int(h[4:6], 16), int(h[2:4], 16), int(h[0:2], 16)  # BGR


def _expand_sources(source) -> list[str | np.ndarray]:
    """Files (as given), folders (sorted image files inside), globs (sorted), arrays; errors name the input."""
    items = source if isinstance(source, (list, tuple)) else [source]
    out: list[str | np.ndarray] = []
    for item in items:
        if isinstance(item, np.ndarray):
            out.append(item)
            continue
        text = str(item)
        if any(ch in text for ch in "*?["):
            matches = sorted(glob.glob(text, recursive=True))
            if not matches:
                raise FileNotFoundError(f"no files match the pattern {text}")
            out += [m for m in matches if Path(m).is_file()]
        elif Path(text).is_dir():
            files = sorted(str(p) for p in Path(text).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                raise ValueError(f"no images found in folder {text} (looked for {', '.join(sorted(IMAGE_SUFFIXES))})")
            out += files
        elif Path(text).is_file():
            out.append(text)
        else:
            raise FileNotFoundError(f"image source {text} does not exist: pass an image file, a folder, a glob "
                                    "pattern or a numpy image")
    if not out:
        raise ValueError(f"no images to predict on in {source!r}")
    return out


def _read(item) -> tuple[np.ndarray | None, str | None, str]:
    """(BGR image or None, path or None, reason when None)."""
    if isinstance(item, np.ndarray):
        if item.ndim != 3 or item.shape[2] != 3 or item.dtype != np.uint8:
            return None, None, f"numpy image must be (H, W, 3) uint8 BGR, got {item.shape} {item.dtype}"
        return item, None, ""
    if Path(item).suffix.lower() not in IMAGE_SUFFIXES:
        return None, item, f"not an image file (suffix {Path(item).suffix or 'none'}; videos are not supported)"
    image = cv2.imread(item)
    if image is None:
        return None, item, "OpenCV could not decode it (corrupt or not an image)"
    return image, item, ""


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # kernels are asynchronous: wait so the timer measures them
    return time.perf_counter()


@torch.no_grad()
def predict(model, source, imgsz: int | Sequence[int] = 640, conf: float = 0.25, iou: float = 0.45,
            max_det: int = 1000, classes: Sequence[int] | None = None, agnostic: bool = False, half: bool = False,
            device: str | torch.device | None = None, save_dir: str | Path | None = None, save_txt: bool = False,
            save_conf: bool = False, save_images: bool = True, head: str = "main", deploy: bool = True,
            line_width: int | None = None) -> Predictions:
    """Detect objects in images, as the official ``detect_dual.py`` (batch 1).

    Each image is read as BGR, letterboxed to ``imgsz`` with the minimal stride-multiple rectangle,
    run through the model; the ``head`` output (the main head by default, as detect_dual.py; GELAN
    models have only that) goes through class-aware NMS with one class per box, and boxes are scaled
    back to the original image and rounded.

    Args:
        model: a DetectionModel, or anything :func:`load_model` accepts (checkpoint path, model name).
        source: image file, folder (its image files, sorted), glob pattern, BGR numpy image (as
            ``cv2.imread`` gives), or a list of these.
        imgsz: inference size (int or (h, w)), rounded up to a multiple of the model stride.
        conf, iou, max_det, classes, agnostic: NMS settings (see :func:`yolo9kit.ops.non_max_suppression`).
        half: FP16 model and inputs. device: None picks CUDA when available.
        save_dir: when given, annotated images (``save_images``) and, with ``save_txt``,
            ``labels/<stem>.txt`` lines ``cls cx cy w h [conf]`` are written there.
        head: "main" or "aux". line_width: box line width in saved images (None: scaled to the image).
        deploy: run the deployed equivalent (auxiliary branch dropped, Conv+BN fused; built once per
            weights version and cached); the outputs are those of the model within float rounding.

    Returns:
        :class:`Predictions` (unreadable inputs are in ``.skipped`` with the reason, not raised).

    Raises:
        FileNotFoundError: a named file, folder or pattern does not exist / matches nothing.
        ValueError: a folder without images.
    """
    import pandas as pd

    items = _expand_sources(source)
    model = load_model(model)
    device = resolve_device(device)
    was_training, caller_model = model.training, model
    model = prepare_model(model, device, half, deploy=deploy, head=head)
    stride = max(int(model.stride.max()), 32)
    imgsz = (imgsz, imgsz) if isinstance(imgsz, int) else tuple(imgsz)
    input_size = tuple(math.ceil(s / stride) * stride for s in imgsz)
    if input_size != imgsz:
        LOGGER.warning("imgsz %s is not a multiple of the stride %d: using %s", imgsz, stride, input_size)
    save_dir = Path(save_dir) if save_dir is not None else None
    if save_dir is not None:
        (save_dir / "labels" if save_txt else save_dir).mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":  # warm-up: the first call pays for cuDNN autotuning and allocations
        model(torch.zeros(1, 3, *input_size, device=device, dtype=torch.half if half else torch.float))

    results, rows, skipped = [], [], []
    try:
        for index, item in enumerate(items):
            t0 = time.perf_counter()
            image, path, reason = _read(item)
            if image is None:
                name = path or f"array #{index}"
                LOGGER.warning("skipping %s: %s", name, reason)
                skipped.append((name, reason))
                continue
            letterboxed = letterbox(image, input_size, stride=stride, auto=True)[0]
            chw = np.ascontiguousarray(letterboxed.transpose((2, 0, 1))[::-1])  # HWC BGR -> CHW RGB
            t1 = _sync(device)
            x = torch.from_numpy(chw).to(device)
            x = (x.half() if half else x.float()) / 255
            x = x[None]
            t2 = _sync(device)
            prediction = select_head(model(x), head)
            t3 = _sync(device)
            det = non_max_suppression(prediction, conf, iou, classes, agnostic, max_det=max_det)[0]
            t4 = _sync(device)
            det[:, :4] = scale_boxes(x.shape[2:], det[:, :4], image.shape).round()
            det = det.float().cpu().numpy()
            speed = {"load_ms": (t1 - t0) * 1e3, "preprocess_ms": (t2 - t1) * 1e3,
                     "inference_ms": (t3 - t2) * 1e3, "nms_ms": (t4 - t3) * 1e3}
            result = Prediction(det[:, :4], det[:, 4], det[:, 5].astype(np.int64), list(model.names),
                                tuple(image.shape[:2]), tuple(x.shape[2:]), path, speed,
                                image if path is None else None)
            LOGGER.debug("image %d/%d %s: %s%.1fms", index + 1, len(items), path or "array", result.summary(),
                         speed["inference_ms"])
            if save_dir is not None:
                _write_outputs(result, save_dir, index, save_txt, save_conf, save_images, line_width)
            results.append(result)
            rows.append({"path": path or f"array #{index}", **speed})
    finally:
        caller_model.train(was_training)
    speed_frame = pd.DataFrame(rows, columns=["path", "load_ms", *SPEED_COLUMNS])
    return Predictions(results, speed=speed_frame, skipped=skipped, imgsz=imgsz, save_dir=save_dir)


def _write_outputs(result: Prediction, save_dir: Path, index: int, save_txt: bool, save_conf: bool,
                   save_images: bool, line_width: int | None) -> None:
    stem = Path(result.path).stem if result.path else f"image{index}"
    if save_txt:
        with open(save_dir / "labels" / f"{stem}.txt", "a") as f:  # appends, as the official code
            f.writelines(line + "\n" for line in result.label_lines(save_conf))
    if save_images:
        result.save(save_dir / (Path(result.path).name if result.path else f"{stem}.jpg"), line_width)
