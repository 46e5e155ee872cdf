"""Inference on images, as the official ``detect_dual.py``: letterbox, main head, NMS, rescale.

``predict(model, "photos/")`` returns one :class:`Prediction` per image (boxes in original-image
pixels) in a :class:`Predictions` list that also holds the per-image timings and the skipped files.
"""

from __future__ import annotations

import glob
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import torch

from yolo9kit._renamed import NMS_KEYWORDS, SAVE_KEYWORDS, renamed_keywords
from yolo9kit.checkpoint import load_model
from yolo9kit.config import PREDICT_NMS, NMSConfig, SaveConfig
from yolo9kit.detections import SPEED_COLUMNS, Prediction, Predictions, speed_line
from yolo9kit.env import resolve_device
from yolo9kit.models.inference import prepare_model, resolve_half, select_head
from yolo9kit.ops import letterbox, non_max_suppression, scale_boxes

LOGGER = logging.getLogger(__name__)

IMAGE_SUFFIXES = {".bmp", ".dng", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp", ".pfm"}

__all__ = ["IMAGE_SUFFIXES", "SPEED_COLUMNS", "Prediction", "Predictions", "predict", "speed_line"]


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


@renamed_keywords("predict", {"nms": NMSConfig(), "save": SaveConfig()}, **NMS_KEYWORDS, **SAVE_KEYWORDS)
@torch.no_grad()
def predict(model, source, imgsz: int | Sequence[int] = 640, *, nms: NMSConfig | None = None,
            save: SaveConfig | None = None, half: str | bool = "auto", device: str | torch.device | None = None,
            head: str = "main", batch_size: int = 1, deploy: bool = True, compile: bool | str = False) -> Predictions:
    """Detect objects in images, as the official ``detect_dual.py`` (batch 1 by default).

    Each image is read as BGR, letterboxed to ``imgsz`` with the minimal stride-multiple rectangle,
    run through the model; the ``head`` output (the main head by default, as detect_dual.py; GELAN
    models have only that) goes through class-aware NMS with one class per box, and boxes are scaled
    back to the original image and rounded. The caller's model is never moved or cast (see
    :func:`~yolo9kit.models.inference.prepare_model`); its train/eval mode is restored.

    Args:
        model: a DetectionModel, or anything :func:`~yolo9kit.checkpoint.load_model` accepts (checkpoint path,
            model name).
        source: image file, folder (its image files, sorted), glob pattern, BGR numpy image (as
            ``cv2.imread`` gives), or a list of these.
        imgsz: inference size (int or (h, w)), rounded up to a multiple of the model stride.
        nms: an :class:`~yolo9kit.config.NMSConfig`; its unset fields (and None) take
            :data:`~yolo9kit.config.PREDICT_NMS`: conf 0.25, iou 0.45, max_det 1000, as detect_dual.py.
        save: a :class:`~yolo9kit.config.SaveConfig` saying what to write (annotated images, label txt files)
            and where; None writes nothing.
        half: FP16 model and inputs: "auto" on CUDA (where the model also runs channels_last), not on the CPU;
            True or False.
        device: None: the first CUDA device when there is one, else the CPU.
        head: "main" or "aux".
        batch_size: images per forward pass. Above 1 every image is letterboxed to the full ``imgsz``
            (one shape for the batch, as in validation) instead of its minimal rectangle; each image's
            speed row holds its share of the batch's time.
        deploy: run the deployed equivalent (auxiliary branch dropped, Conv+BN fused; built once per
            weights version and cached); the outputs are those of the model within float rounding.
        compile: run the model through ``torch.compile`` (True or a mode; pays off over many images of one
            shape; the first batch then takes seconds to minutes).

    Returns:
        :class:`Predictions` (unreadable inputs are in ``.skipped`` with the reason, not raised).

    Raises:
        FileNotFoundError: a named file, folder or pattern does not exist / matches nothing.
        ValueError: a folder without images, batch_size < 1, or a ``half`` value other than the three.
    """
    import pandas as pd

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    nms = (nms or NMSConfig()).filled(PREDICT_NMS)
    save = save or SaveConfig()
    items = _expand_sources(source)
    model = load_model(model)
    device = resolve_device(device)
    half = resolve_half(half, device)
    was_training, caller_model = model.training, model
    model = prepare_model(model, device, half, deploy=deploy, head=head)
    memory_format = torch.channels_last if device.type == "cuda" and model is not caller_model else \
        torch.contiguous_format  # never change the layout of the caller's own model
    if memory_format is torch.channels_last:
        model = model.to(memory_format=memory_format)
    forward = torch.compile(model, mode=compile if isinstance(compile, str) else None) if compile else model
    stride = max(int(model.stride.max()), 32)
    imgsz = (imgsz, imgsz) if isinstance(imgsz, int) else tuple(imgsz)
    input_size = tuple(math.ceil(s / stride) * stride for s in imgsz)
    if input_size != imgsz:
        LOGGER.warning("imgsz %s is not a multiple of the stride %d: using %s", imgsz, stride, input_size)
    save_dir = Path(save.save_dir) if save.save_dir is not None else None
    if save_dir is not None:
        (save_dir / "labels" if save.txt else save_dir).mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":  # warm-up: the first call pays for cuDNN autotuning and allocations
        forward(torch.zeros(batch_size, 3, *input_size, device=device, dtype=torch.half if half else torch.float))

    results, rows, skipped, pending = [], [], [], []
    try:
        for index, item in enumerate(items):
            t0 = time.perf_counter()
            image, path, reason = _read(item)
            if image is None:
                name = path or f"array #{index}"
                LOGGER.warning("skipping %s: %s", name, reason)
                skipped.append((name, reason))
            else:
                letterboxed = letterbox(image, input_size, stride=stride, auto=batch_size == 1)[0]
                chw = np.ascontiguousarray(letterboxed.transpose((2, 0, 1))[::-1])  # HWC BGR -> CHW RGB
                pending.append((index, image, path, chw, time.perf_counter() - t0))
            if pending and (len(pending) == batch_size or index == len(items) - 1):
                batch_results = _run_batch(model, forward, pending, device, half, memory_format, head, nms)
                for (i, *_), (result, speed) in zip(pending, batch_results):
                    if save_dir is not None:
                        _write_outputs(result, save_dir, i, save)
                    results.append(result)
                    rows.append({"path": result.path or f"array #{i}", **speed})
                pending = []
    finally:
        caller_model.train(was_training)
    speed_frame = pd.DataFrame(rows, columns=["path", "load_ms", *SPEED_COLUMNS])
    return Predictions(results, speed=speed_frame, skipped=skipped, imgsz=imgsz, save_dir=save_dir)


def _run_batch(model, forward, pending: list, device: torch.device, half: bool, memory_format, head: str,
               nms: NMSConfig) -> list[tuple[Prediction, dict]]:
    """One forward pass over the letterboxed images of ``pending``; per image its Prediction and speed row."""
    n = len(pending)
    t1 = _sync(device)
    x = torch.from_numpy(np.stack([chw for *_, chw, _ in pending])).to(device)
    x = ((x.half() if half else x.float()) / 255).contiguous(memory_format=memory_format)
    t2 = _sync(device)
    prediction = select_head(forward(x), head)
    t3 = _sync(device)
    dets = non_max_suppression(prediction, nms.conf, nms.iou, nms.classes, nms.agnostic, max_det=nms.max_det)
    t4 = _sync(device)
    out = []
    for (index, image, path, _, load_s), det in zip(pending, dets):
        det[:, :4] = scale_boxes(x.shape[2:], det[:, :4], image.shape).round()
        det = det.float().cpu().numpy()
        speed = {"load_ms": load_s * 1e3, "preprocess_ms": (t2 - t1) * 1e3 / n,
                 "inference_ms": (t3 - t2) * 1e3 / n, "nms_ms": (t4 - t3) * 1e3 / n}
        result = Prediction(det[:, :4], det[:, 4], det[:, 5].astype(np.int64), list(model.names),
                            tuple(image.shape[:2]), tuple(x.shape[2:]), path, speed,
                            image if path is None else None)
        if LOGGER.isEnabledFor(logging.DEBUG):
            LOGGER.debug("image %d %s: %s, %.1fms", index + 1, path or "array", result.summary(), speed["inference_ms"])
        out.append((result, speed))
    return out


def _write_outputs(result: Prediction, save_dir: Path, index: int, save: SaveConfig) -> None:
    stem = Path(result.path).stem if result.path else f"image{index}"
    if save.txt:
        with open(save_dir / "labels" / f"{stem}.txt", "a") as f:  # appends, as the official code
            f.writelines(line + "\n" for line in result.label_lines(save.conf))
    if save.images:
        result.save(save_dir / (Path(result.path).name if result.path else f"{stem}.jpg"), save.line_width)
