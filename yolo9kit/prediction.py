"""Inference on images and videos, as the official ``detect_dual.py``: letterbox, main head, NMS, rescale.

``predict(model, "photos/")`` returns one :class:`Prediction` per image or video frame (boxes in
original-image pixels) in a :class:`Predictions` list that also holds the per-image timings and the skipped
files. Videos are decoded one frame at a time and their annotated copies written as they go.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import torch

from yolo9kit.config import PREDICT_NMS, NMSConfig, SaveConfig
from yolo9kit.data.media import VIDEO_SUFFIXES, VideoReader, expand_sources, is_video
from yolo9kit.detections import SPEED_COLUMNS, Prediction, Predictions, speed_line
from yolo9kit.env import parse_device, resolve_device
from yolo9kit.files import refuse_own_input, replace_durably, temporary_path, write_text_atomically
from yolo9kit.models import load_model
from yolo9kit.models.deploy import inference_layout, max_stride, prepare_model, resolve_half, select_head
from yolo9kit.ops import letterbox, non_max_suppression, scale_boxes

LOGGER = logging.getLogger(__name__)

IMAGE_SUFFIXES = {".bmp", ".dng", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp", ".pfm"}

__all__ = ["IMAGE_SUFFIXES", "SPEED_COLUMNS", "VIDEO_SUFFIXES", "Prediction", "Predictions", "predict",
           "speed_line"]


BACKENDS = ("torch", "onnxruntime", "openvino")


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


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # kernels are asynchronous: wait so the timer measures them
    return time.perf_counter()


@torch.no_grad()
def predict(model, source, imgsz: int | Sequence[int] = 640, *, nms: NMSConfig | None = None,
            save: SaveConfig | None = None, half: str | bool = "auto", device: str | torch.device | None = None,
            head: str = "main", batch_size: int = 1, deploy: bool = True, compile: bool | str = False,
            vid_stride: int = 1, backend: str = "torch") -> Predictions:
    """Detect objects in images and videos, as the official ``detect_dual.py`` (batch 1 by default).

    Each image or video frame is read as BGR, letterboxed to ``imgsz`` with the minimal stride-multiple
    rectangle, run through the model; the ``head`` output (the main head by default, as detect_dual.py;
    GELAN models have only that) goes through class-aware NMS with one class per box, and boxes are scaled
    back to the original image and rounded. The caller's model is never moved or cast (see
    :func:`~yolo9kit.models.deploy.prepare_model`); its train/eval mode is restored.

    A video is decoded one frame at a time (never held in memory as a whole); with ``save`` its annotated
    copy ``<stem>.mp4`` (mp4v, the frame size of the source) is written frame by frame and closed even when
    the run stops early, and label files are ``labels/<stem>_<frame>.txt``.

    Args:
        model: a DetectionModel, or anything :func:`~yolo9kit.models.load_model` accepts (checkpoint path,
            model name).
        source: image or video file, folder (its image and video files, sorted; not its sub-folders), glob
            pattern, ``.txt`` file listing image or video paths one a line (relative to the list's folder),
            BGR numpy image (as ``cv2.imread`` gives), or a list of these.
        imgsz: inference size (int or (h, w)), rounded up to a multiple of the model stride.
        nms: an :class:`~yolo9kit.config.NMSConfig`; its unset fields (and None) take
            :data:`~yolo9kit.config.PREDICT_NMS`: conf 0.25, iou 0.45, max_det 1000, as detect_dual.py.
        save: a :class:`~yolo9kit.config.SaveConfig` saying what to write (annotated images and videos, label
            txt files) and where; None writes nothing.
        half: FP16 model and inputs: "auto" on CUDA, not on the CPU; True or False. (The deployed copy runs
            channels_last on CUDA and where oneDNN runs the CPU convolutions.)
        device: None: the first CUDA device when there is one, else the CPU.
        head: "main" or "aux".
        batch_size: images per forward pass. Above 1 every image is letterboxed to the full ``imgsz``
            (one shape for the batch, as in validation) instead of its minimal rectangle; each image's
            speed row holds its share of the batch's time.
        deploy: run the deployed equivalent (auxiliary branch dropped, Conv+BN fused; built once per
            weights version and cached); the outputs are those of the model within float rounding.
        compile: run the model through ``torch.compile`` (True or a mode; pays off over many images of one
            shape; the first batch then takes seconds to minutes).
        vid_stride: keep every k-th frame of a video (official ``--vid-stride``): frames k-1, 2k-1, ...
            (0-based), ``frames // k`` of them; the annotated video plays at the source's fps / k, so it
            lasts as long as the source.
        backend: "torch", or "onnxruntime" / "openvino": the deployed model exported in memory (as
            ``export`` writes it) and run by ONNX Runtime (``export_onnx.OnnxRuntimeForward``; the export
            extra) or OpenVINO (``export_onnx.OpenVinoForward``; the openvino extra) on the CPU. Its input has
            the one export size, so every image is letterboxed to the full ``imgsz``, as with a batch above 1;
            the main head, float32, the same NMS and results.

    Returns:
        :class:`Predictions`, one per image or kept video frame (``Prediction.frame`` is the frame's index).
        Unreadable inputs (a corrupt image or video, a file a ``.txt`` list names that does not exist) are in
        ``.skipped`` with the reason, not raised; a video whose decoding stops early keeps the frames read.

    Raises:
        FileNotFoundError: a named file, folder or pattern does not exist / matches nothing.
        ValueError: a folder without images or videos, a list file naming none, batch_size or vid_stride
            < 1, a ``half`` value other than the three, or an exported backend asked for a GPU, FP16, the
            auxiliary head, compilation or the undeployed model.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {BACKENDS}")
    onnx = backend != "torch"  # an exported model
    if onnx and (parse_device(device or "cpu").type != "cpu" or half is True or head != "main" or compile
                 or not deploy):
        raise ValueError(f"backend={backend!r} runs the deployed model's main head in float32 on the CPU: leave "
                         "device, half, head, compile and deploy at their defaults (or device='cpu')")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if vid_stride < 1:
        raise ValueError(f"vid_stride must be >= 1 (keep every k-th video frame), got {vid_stride}")
    nms = (nms or NMSConfig()).filled(PREDICT_NMS)
    save = save or SaveConfig()
    items, skipped = expand_sources(source)
    model = load_model(model)
    device = resolve_device("cpu" if onnx else device)
    half = resolve_half(half, device)
    was_training, caller_model = model.training, model
    model = prepare_model(model, device, half, deploy=deploy, head=head)
    memory_format = torch.contiguous_format if onnx else \
        inference_layout(model, device, own_copy=model is not caller_model)
    if memory_format is torch.channels_last and model is not caller_model:
        model = model.to(memory_format=memory_format)
    forward = torch.compile(model, mode=compile if isinstance(compile, str) else None) if compile else model
    stride = max_stride(model)
    imgsz = (imgsz, imgsz) if isinstance(imgsz, int) else tuple(imgsz)
    input_size = tuple(math.ceil(s / stride) * stride for s in imgsz)
    if input_size != imgsz:
        LOGGER.warning("imgsz %s is not a multiple of the stride %d: using %s", imgsz, stride, input_size)
    if onnx:
        from yolo9kit.export_onnx import OnnxRuntimeForward, OpenVinoForward

        forward = (OnnxRuntimeForward if backend == "onnxruntime" else OpenVinoForward)(caller_model, input_size)
    save_dir = Path(save.save_dir) if save.save_dir is not None else None
    if save_dir is not None:
        (save_dir / "labels" if save.txt else save_dir).mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":  # warm-up: the first call pays for cuDNN autotuning and allocations
        forward(_as_input(torch.zeros(batch_size, 3, *input_size, dtype=torch.uint8), device, half, memory_format))

    run = _Run(model, forward, device, half, memory_format, head, nms, save, save_dir)
    try:
        pending = []
        for index, image, path, frame, read_s in _inputs(items, vid_stride, skipped, run.videos):
            t0 = time.perf_counter()
            letterboxed = letterbox(image, input_size, stride=stride, auto=batch_size == 1 and not onnx)[0]
            chw = np.ascontiguousarray(letterboxed.transpose((2, 0, 1))[::-1])  # HWC BGR -> CHW RGB
            pending.append((index, image, path, frame, chw, read_s + time.perf_counter() - t0))
            if len(pending) == batch_size:
                run.batch(pending)
                pending = []
        if pending:
            run.batch(pending)
    finally:
        run.close()
        caller_model.train(was_training)
    return Predictions(run.results, speed=run.speed_frame(), skipped=skipped, imgsz=imgsz, save_dir=save_dir)


def _inputs(items: list, vid_stride: int, skipped: list, videos: dict):
    """(index, BGR image, path or None, frame or None, seconds to read it) per image and kept video frame.

    Unreadable inputs go to ``skipped`` with the reason; ``videos`` gets each opened video's reader (the
    writer needs its fps). A video is decoded frame by frame as the caller asks for the next one.
    """
    for index, item in enumerate(items):
        if is_video(item):
            reader = VideoReader(str(item), vid_stride)
            if reader.error:
                _skip(skipped, str(item), reader.error)
                continue
            videos[str(item)] = reader
            for frame, image, read_s in reader:
                yield index, image, str(item), frame, read_s
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


class _Run:
    """The state of one ``predict`` call: results, speed rows, the open video writer."""

    def __init__(self, model, forward, device, half, memory_format, head, nms, save, save_dir) -> None:
        self.model, self.forward, self.device, self.half = model, forward, device, half
        self.memory_format, self.head, self.nms, self.save, self.save_dir = memory_format, head, nms, save, save_dir
        self.results: list[Prediction] = []
        self.rows: list[dict] = []
        self.videos: dict[str, VideoReader] = {}
        self.writer: tuple | None = None  # (source, cv2.VideoWriter, temporary file, the video's path)

    def batch(self, pending: list) -> None:
        for (index, image, *_), (result, speed) in zip(pending, _run_batch(
                self.model, self.forward, pending, self.device, self.half, self.memory_format, self.head, self.nms)):
            if self.save_dir is not None:
                self.write(result, index, image)
            if result.frame is not None:
                result.image = None  # a video frame is decoded again when drawn: a long video never fills the RAM
            self.results.append(result)
            name = result.path or f"array #{index}"
            self.rows.append({"path": name, **speed})

    def write(self, result: Prediction, index: int, image: np.ndarray) -> None:
        if result.frame is None:
            _write_outputs(result, self.save_dir, index, self.save)
            return
        stem = f"{Path(result.path).stem}_{result.frame}"
        if self.save.txt:
            _append_labels(self.save_dir / "labels" / f"{stem}.txt", result, self.save.conf)
        if self.save.images:
            result.image = image
            self._writer_for(result.path, image).write(result.annotated(self.save.line_width))

    def _writer_for(self, path: str, image: np.ndarray) -> cv2.VideoWriter:
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

    def close(self) -> None:
        """Finish the video being written and move it into place: a run stopped by an error, Ctrl-C or (from
        the command line) SIGTERM leaves a playable file of the frames so far; a killed one leaves only its
        temporary file (removed by the next write there), never a video without its index."""
        if self.writer is not None:
            _, writer, tmp, out = self.writer
            self.writer = None
            writer.release()
            if tmp.exists():
                replace_durably(tmp, out)

    def speed_frame(self):
        import pandas as pd

        frame = pd.DataFrame(self.rows, columns=["path", "load_ms", *SPEED_COLUMNS])
        if any(result.frame is not None for result in self.results):  # None for images: JSON null, not NaN
            frame.insert(1, "frame", pd.Series([result.frame for result in self.results], dtype=object))
        return frame


def _run_batch(model, forward, pending: list, device: torch.device, half: bool, memory_format, head: str,
               nms: NMSConfig) -> list[tuple[Prediction, dict]]:
    """One forward pass over the letterboxed images of ``pending``; per image its Prediction and speed row."""
    n = len(pending)
    t1 = _sync(device)
    x = _as_input(torch.from_numpy(np.stack([chw for *_, chw, _ in pending])), device, half, memory_format)
    t2 = _sync(device)
    prediction = select_head(forward(x), head)
    t3 = _sync(device)
    dets = non_max_suppression(prediction, nms.conf, nms.iou, nms.classes, nms.agnostic, max_det=nms.max_det)
    t4 = _sync(device)
    out = []
    for (index, image, path, frame, _, load_s), det in zip(pending, dets):
        det[:, :4] = scale_boxes(x.shape[2:], det[:, :4], image.shape).round()
        det = det.float().cpu().numpy()
        speed = {"load_ms": load_s * 1e3, "preprocess_ms": (t2 - t1) * 1e3 / n,
                 "inference_ms": (t3 - t2) * 1e3 / n, "nms_ms": (t4 - t3) * 1e3 / n}
        result = Prediction(det[:, :4], det[:, 4], det[:, 5].astype(np.int64), list(model.names),
                            tuple(image.shape[:2]), tuple(x.shape[2:]), path, speed,
                            image if path is None else None, frame=frame)
        if LOGGER.isEnabledFor(logging.DEBUG):
            where = f"{path} frame {frame}" if frame is not None else path or "array"
            LOGGER.debug("image %d %s: %s, %.1fms", index + 1, where, result.summary(), speed["inference_ms"])
        out.append((result, speed))
    return out


def _as_input(images: torch.Tensor, device: torch.device, half: bool, memory_format) -> torch.Tensor:
    """uint8 (B, 3, H, W) RGB -> the model's input on ``device``: FP16 or FP32 in [0, 1], in ``memory_format``
    (the warm-up goes through here too, so that cuDNN tunes the layout the images arrive in)."""
    x = images.to(device)
    return ((x.half() if half else x.float()) / 255).contiguous(memory_format=memory_format)


def _append_labels(path: Path, result: Prediction, conf: bool) -> None:
    """Add the result's label lines to ``path`` (appended, as the official code does; the file is rewritten
    whole through ``files.write_file``, never left half-written)."""
    old = path.read_text() if path.is_file() else ""
    write_text_atomically(path, old + "".join(line + "\n" for line in result.label_lines(conf)),
                          inputs=[result.path] if result.path else [])


def _write_outputs(result: Prediction, save_dir: Path, index: int, save: SaveConfig) -> None:
    stem = Path(result.path).stem if result.path else f"image{index}"
    if save.txt:
        _append_labels(save_dir / "labels" / f"{stem}.txt", result, save.conf)
    if save.images:
        result.save(save_dir / (Path(result.path).name if result.path else f"{stem}.jpg"), save.line_width,
                    inputs=[result.path] if result.path else ())
