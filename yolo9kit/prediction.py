"""Inference on images and videos as the official ``detect_dual.py`` (docs/validation.md); a video is decoded,
predicted and written one frame at a time."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import torch

from yolo9kit.config import PREDICT_NMS, NMSConfig, SaveConfig
from yolo9kit.data import letterbox, preprocess_images
from yolo9kit.data.sources import IMAGE_SUFFIXES, VIDEO_SUFFIXES, VideoReader, expand_sources, is_video
from yolo9kit.detections import SPEED_COLUMNS, Prediction, Predictions, scale_boxes
from yolo9kit.env import load_extra, parse_device, resolve_device
from yolo9kit.files import refuse_own_input, replace_durably, temporary_path, write_text_atomically
from yolo9kit.models import load_model
from yolo9kit.models.deploy import max_stride, resolve_half
from yolo9kit.validate import detect_batch, prepare

LOGGER = logging.getLogger(__name__)

BACKENDS = ("torch", "onnxruntime", "openvino")


@torch.no_grad()
def predict(model, source, imgsz: int | Sequence[int] = 640, *, nms: NMSConfig | None = None,
            save: SaveConfig | None = None, half: str | bool = "auto", device: str | torch.device | None = None,
            head: str = "main", batch_size: int = 1, deploy: bool = True, compile: bool | str = False,
            vid_stride: int = 1, backend: str = "torch",
            on_result: Callable[[Prediction, int, int], None] | None = None) -> Predictions:
    """Detect objects in images and videos, as the official ``detect_dual.py``.

    Args:
        model: a DetectionModel or what :func:`~yolo9kit.models.load_model` takes; never moved or cast (a copy runs).
        source: image or video file, folder, glob, ``.txt`` list of paths, BGR numpy image, or a list of these.
        imgsz: int or (h, w), rounded up to a multiple of the stride; nms: unset fields take ``PREDICT_NMS``.
        save: what to write where (None: nothing); device, head: as :func:`~yolo9kit.validate.evaluate`.
        half: as ``evaluate``'s, but "auto" is bf16 on a CPU that computes it in hardware (docs/benchmarks.md).
        batch_size: images per forward pass; above 1 each is letterboxed to the full ``imgsz``.
        deploy: run the deployed equivalent (auxiliary branch dropped, Conv+BN fused); compile: True or a mode.
        vid_stride: keep every k-th video frame: frames k-1, 2k-1, ... (0-based).
        backend: "torch", or "onnxruntime" / "openvino": the exported model on the CPU at the full ``imgsz``.
        on_result: called with each Prediction once done, its input's number (from 1) and the number of inputs.

    Returns:
        A Prediction per image or kept video frame; the inputs that could not be read in ``.skipped``, with why.

    Raises:
        FileNotFoundError: a named source that does not exist. ValueError: no images or videos, a bad setting.
    """
    _check(backend, device, half, head, compile, deploy, batch_size, vid_stride)
    onnx = backend != "torch"  # an exported model
    items, skipped = expand_sources(source)
    model = load_model(model)
    device = resolve_device("cpu" if onnx else device)
    dtype = resolve_half(half, device, cpu_bf16=not onnx)
    was_training = model.training
    run_model, dtype, nhwc = prepare(model, device, dtype, nhwc=not onnx, deploy=deploy, head=head)
    forward = torch.compile(run_model, mode=compile if isinstance(compile, str) else None) if compile else run_model
    imgsz, stride = (imgsz, imgsz) if isinstance(imgsz, int) else tuple(imgsz), max_stride(run_model)
    input_size = tuple(math.ceil(s / stride) * stride for s in imgsz)
    if input_size != imgsz:
        LOGGER.warning("imgsz %s is not a multiple of the stride %d: using %s", imgsz, stride, input_size)
    if onnx:  # an extra runs it (the export extra's onnxruntime, the openvino extra)
        extra = "export" if backend == "onnxruntime" else backend
        forward = load_extra("yolo9kit.backends", backend, extra)(model, input_size)
    report = (lambda result, index: on_result(result, index + 1, len(items))) if on_result else None
    save = save or SaveConfig()
    save_dir = Path(save.save_dir) if save.save_dir is not None else None
    run = _Run(run_model, forward, device, dtype, nhwc, head, input_size, batch_size == 1 and not onnx,
               (nms or NMSConfig()).filled(PREDICT_NMS), save, save_dir, report)
    try:
        run.predict_all(items, vid_stride, skipped, batch_size)
    finally:
        run.close()
        model.train(was_training)
    speed = pd.DataFrame(run.rows, columns=["path", "load_ms", *SPEED_COLUMNS])
    if any(result.frame is not None for result in run.results):  # None for images: JSON null, not NaN
        speed.insert(1, "frame", pd.Series([result.frame for result in run.results], dtype=object))
    return Predictions(run.results, speed=speed, skipped=skipped, imgsz=imgsz, save_dir=run.save_dir)


def _check(backend, device, half, head, compile, deploy, batch_size: int, vid_stride: int) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {BACKENDS}")
    if backend != "torch" and (parse_device(device or "cpu").type != "cpu" or half is True or head != "main"
                               or compile or not deploy):
        raise ValueError(f"backend={backend!r} runs the deployed model's main head in float32 on the CPU: leave "
                         "device, half, head, compile and deploy at their defaults (or device='cpu')")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if vid_stride < 1:
        raise ValueError(f"vid_stride must be >= 1 (keep every k-th video frame), got {vid_stride}")


def _read(item) -> tuple[np.ndarray | None, str | None, str]:
    """(BGR image or None, path or None, reason when None)."""
    if isinstance(item, np.ndarray):
        if item.ndim != 3 or item.shape[2] != 3 or item.dtype != np.uint8:
            return None, None, f"numpy image must be (H, W, 3) uint8 BGR, got {item.shape} {item.dtype}"
        if item.size == 0:
            return None, None, f"empty image ({item.shape[0]} x {item.shape[1]} pixels)"
        return item, None, ""
    if Path(item).suffix.lower() not in IMAGE_SUFFIXES:
        return None, item, (f"neither an image nor a video file (suffix {Path(item).suffix or 'none'}; images: "
                            f"{', '.join(sorted(IMAGE_SUFFIXES))}; videos: {', '.join(sorted(VIDEO_SUFFIXES))})")
    image = cv2.imread(item)
    if image is None:
        return None, item, "OpenCV could not decode it (corrupt or not an image)"
    return image, item, ""


def _inputs(items: list, vid_stride: int, skipped: list, videos: dict):
    """(index, BGR image, path or None, frame or None, seconds to read it) per image and kept video frame;
    unreadable inputs go to ``skipped``, each video's reader to ``videos`` (the writer needs its fps)."""
    for index, item in enumerate(items):
        if is_video(item):
            reader = videos[str(item)] = VideoReader(str(item), vid_stride)
            if reader.error:
                _skip(skipped, str(item), reader.error)
                continue
            yield from ((index, image, str(item), frame, read_s) for frame, image, read_s in reader)
            if reader.frames_read == 0:
                _skip(skipped, str(item), "no frame could be decoded (empty or corrupt video)")
            elif reader.frames_read < reader.frame_count // vid_stride:
                LOGGER.warning("%s: decoding stopped after %d of the %d frames its header announces; the frames "
                               "read are kept", item, reader.frames_read, reader.frame_count // vid_stride)
            continue
        t0 = time.perf_counter()
        image, path, reason = _read(item)
        if image is None:
            _skip(skipped, path or f"array #{index}", reason)
            continue
        yield index, image, path, None, time.perf_counter() - t0


def _skip(skipped: list, name: str, reason: str) -> None:
    LOGGER.warning("skipping %s: %s", name, reason)
    skipped.append((name, reason))


@dataclass
class _Run:
    """One ``predict`` call: how the model runs, what is written, what was found."""

    model: torch.nn.Module  # the prepared model: class names and stride
    forward: Callable  # that model, compiled, or the exported one
    device: torch.device
    dtype: torch.dtype  # of the input
    nhwc: bool  # channels_last input
    head: str
    input_size: tuple[int, int]
    auto: bool  # letterbox to the minimal stride-multiple rectangle, not the full input size
    nms: NMSConfig
    save: SaveConfig
    save_dir: Path | None
    report: Callable | None  # (result, input index) -> None
    results: list[Prediction] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    videos: dict[str, VideoReader] = field(default_factory=dict)
    writer: tuple | None = None  # (source, cv2.VideoWriter, temporary file, the video's path)

    def predict_all(self, items: list, vid_stride: int, skipped: list, batch_size: int) -> None:
        if self.save_dir is not None:
            (self.save_dir / "labels" if self.save.txt else self.save_dir).mkdir(parents=True, exist_ok=True)
        if self.device.type == "cuda":  # warm-up: the first call pays for cuDNN autotuning and allocations
            self.forward(preprocess_images(torch.zeros(batch_size, 3, *self.input_size, dtype=torch.uint8), self.device,
                                           self.dtype, self.nhwc))
        pending = []
        for index, image, path, frame, read_s in _inputs(items, vid_stride, skipped, self.videos):
            t0 = time.perf_counter()
            letterboxed = letterbox(image, self.input_size, stride=max_stride(self.model), auto=self.auto)[0]
            chw = np.ascontiguousarray(letterboxed.transpose((2, 0, 1))[::-1])  # HWC BGR -> CHW RGB
            pending.append((index, image, path, frame, chw, read_s + time.perf_counter() - t0))
            if len(pending) == batch_size:
                self.batch(pending)
                pending = []
        if pending:
            self.batch(pending)

    def batch(self, pending: list) -> None:
        """One forward pass over the letterboxed images of ``pending``: a Prediction per image, written and kept."""
        images = torch.from_numpy(np.stack([chw for *_, chw, _ in pending]))
        x, dets, times = detect_batch(self.forward, images, self.device, self.dtype, self.nhwc, self.head, self.nms)
        for (index, image, path, frame, _, load_s), det in zip(pending, dets):
            det[:, :4] = scale_boxes(x.shape[2:], det[:, :4], image.shape).round()
            det = det.float().cpu().numpy()
            speed = {"load_ms": load_s * 1e3} | {k: t * 1e3 / len(pending) for k, t in zip(SPEED_COLUMNS, times)}
            result = Prediction(det[:, :4], det[:, 4], det[:, 5].astype(np.int64), list(self.model.names),
                                tuple(image.shape[:2]), tuple(x.shape[2:]), path, speed,
                                image if path is None else None, frame=frame)
            if self.save_dir is not None:
                _write_outputs(self, result, index, image)
            if result.frame is not None:
                result.image = None  # a video frame is decoded again when drawn: a long video never fills the RAM
            self.results.append(result)
            self.rows.append({"path": result.path or f"array #{index}", **result.speed})
            if self.report is not None:
                self.report(result, index)

    def writer_for(self, path: str, image: np.ndarray) -> cv2.VideoWriter:
        if self.writer is not None and self.writer[0] == path:
            return self.writer[1]
        self.close()
        reader = self.videos[path]
        out = self.save_dir / f"{Path(path).stem}.mp4"  # .mp4 whatever the source format, as the official code
        refuse_own_input(out, [path])
        tmp = temporary_path(out, keep_suffix=True)  # moved over ``out`` when complete (close)
        # the kept frames at fps / k: the annotated video lasts as long as the source
        writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter_fourcc(*"mp4v"), reader.fps / reader.vid_stride,
                                 (image.shape[1], image.shape[0]))
        if not writer.isOpened():
            raise OSError(f"could not open {out} for writing an mp4v video: check that the folder is writable and "
                          "that this OpenCV build has a video writer (opencv-python-headless has)")
        self.writer = (path, writer, tmp, out)
        return writer

    def close(self) -> None:  # a run stopped by an error, Ctrl-C or SIGTERM leaves a playable video of its frames
        if self.writer is not None:
            _, writer, tmp, out = self.writer
            self.writer = None
            writer.release()
            if tmp.exists():
                replace_durably(tmp, out)


def _write_outputs(run: _Run, result: Prediction, index: int, image: np.ndarray) -> None:
    """Append the result's label lines (as the official code) and write its annotated image or video frame."""
    stem = Path(result.path).stem if result.path else f"image{index}"
    stem += f"_{result.frame}" if result.frame is not None else ""
    inputs = [result.path] if result.path else []
    if run.save.txt:
        path = run.save_dir / "labels" / f"{stem}.txt"
        old = path.read_text() if path.is_file() else ""
        write_text_atomically(path, old + "".join(f"{line}\n" for line in result.label_lines(run.save.conf)),
                              inputs=inputs)
    if run.save.images and result.frame is None:
        result.save(run.save_dir / (Path(result.path).name if result.path else f"{stem}.jpg"), run.save.line_width,
                    inputs=inputs)
    elif run.save.images:
        result.image = image
        run.writer_for(result.path, image).write(result.annotated(run.save.line_width))
