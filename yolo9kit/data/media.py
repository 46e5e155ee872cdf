"""What ``predict`` reads: the files a ``source`` names (images, videos, folders, globs, ``.txt`` lists of
them) and the frames of a video, read one at a time.

The rules follow the official ``LoadImages`` (the ``--source`` loader of ``detect_dual.py``): a folder gives
its image and video files (not its sub-folders), a glob is expanded recursively and sorted, a file is taken
as it is, a video is read frame by frame and ``vid_stride`` keeps every k-th frame. Two differences, both
for a clearer run: a list keeps the order it was given in (the official loader sorts it and puts every image
before every video), and a ``.txt`` file is read as a list of images and videos, one path a line (relative
paths and ``./`` are relative to the list's folder, as in a data.yaml list), where ``detect_dual.py`` would
open it as a list of camera streams.
"""

from __future__ import annotations

import glob
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np

from yolo9kit.data.sources import IMAGE_SUFFIXES
from yolo9kit.files import write_file

LOGGER = logging.getLogger(__name__)

# the official VID_FORMATS
VIDEO_SUFFIXES = {".asf", ".avi", ".gif", ".m4v", ".mkv", ".mov", ".mp4", ".mpeg", ".mpg", ".ts", ".wmv"}
LIST_SUFFIX = ".txt"

__all__ = ["LIST_SUFFIX", "VIDEO_SUFFIXES", "VideoReader", "expand_sources", "is_video", "read_frame", "write_video"]


def is_video(item) -> bool:
    """True for a path (str or Path) whose suffix is a video format."""
    return isinstance(item, (str, Path)) and Path(item).suffix.lower() in VIDEO_SUFFIXES


def _media_in(folder: Path) -> list[str]:
    """The image and video files of ``folder`` (not recursive), sorted by name."""
    suffixes = IMAGE_SUFFIXES | VIDEO_SUFFIXES
    return sorted(str(p) for p in folder.iterdir() if p.is_file() and p.suffix.lower() in suffixes)


def _read_list(list_file: Path, skipped: list[tuple[str, str]]) -> list[str]:
    """The paths a ``.txt`` list names, one a line; a line naming no file is recorded in ``skipped``."""
    try:
        lines = list_file.read_text(encoding="utf-8-sig").splitlines()  # a byte-order mark too
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"list file {list_file} could not be read as text ({e}): a source .txt file must list "
                         "one image or video path a line") from e
    out: list[str] = []
    for number, line in enumerate(lines, 1):
        entry = line.strip()
        if not entry:
            continue
        path = Path(entry[2:] if entry.startswith("./") else entry).expanduser()
        path = path if path.is_absolute() else list_file.parent / path
        if path.is_dir():
            out += _media_in(path)
        elif path.is_file():
            out.append(str(path))
        else:
            where = f"{list_file}:{number}"
            LOGGER.warning("skipping %s: %s does not exist", where, path)
            skipped.append((where, f"the listed file {path} does not exist"))
    if not out and not skipped:
        raise ValueError(f"list file {list_file} names no image or video: write one path a line")
    return out


def expand_sources(source) -> tuple[list[str | np.ndarray], list[tuple[str, str]]]:
    """The inputs ``source`` names, in order, and the listed files that are missing.

    Args:
        source: an image or video file, a folder, a glob pattern, a ``.txt`` list file, a BGR numpy image,
            or a list of these.

    Returns:
        (inputs: file paths and arrays, skipped: ``(list_file:line, reason)`` for each listed file that
        does not exist). Files of another format stay in the inputs; the reader skips them with the reason.

    Raises:
        FileNotFoundError: a named file, folder or pattern does not exist or matches nothing.
        ValueError: a folder without images or videos, a list file that names none, nothing at all to read.
    """
    items = source if isinstance(source, (list, tuple)) else [source]
    out: list[str | np.ndarray] = []
    skipped: list[tuple[str, str]] = []
    for item in items:
        if isinstance(item, np.ndarray):
            out.append(item)
            continue
        if type(item).__module__.startswith("torch"):  # str() of a tensor is not a path
            raise TypeError(f"a {type(item).__name__} is not an image source: pass a BGR numpy image (H, W, 3) uint8, "
                            "as cv2.imread gives (for an RGB CHW tensor: t.permute(1, 2, 0).flip(-1).numpy()), a "
                            "file, folder, glob pattern or .txt list, or a list of these")
        text = str(item)
        path = Path(text).expanduser()
        if any(ch in text for ch in "*?["):
            matches = sorted(glob.glob(text, recursive=True))
            if not matches:
                raise FileNotFoundError(f"no files match the pattern {text}")
            out += [m for m in matches if Path(m).is_file()]
        elif path.is_dir():
            files = _media_in(path)
            if not files:
                raise ValueError(f"no images found in folder {text}, nor videos (looked for "
                                 f"{', '.join(sorted(IMAGE_SUFFIXES | VIDEO_SUFFIXES))})")
            out += files
        elif path.is_file() and path.suffix.lower() == LIST_SUFFIX:
            out += _read_list(path, skipped)
        elif path.is_file():
            out.append(str(path))
        else:
            raise FileNotFoundError(f"source {text} does not exist: pass an image or video file, a folder, a glob "
                                    "pattern, a .txt list of files or a numpy image")
    if not out and not skipped:
        raise ValueError(f"no images or videos to predict on in {source!r}")
    return out, skipped


class VideoReader:
    """The frames of one video file, decoded one at a time (never the whole video in memory).

    As the official ``LoadImages``: with ``vid_stride`` k the reader grabs k frames and decodes the last,
    so it yields frames k-1, 2k-1, ... (0-based), ``frame_count // k`` of them.

    Attributes:
        path: the file. error: why it cannot be read ("" when it opened). fps: frames per second of the
        file (30 when the file does not say). frame_count: frames the file announces (an estimate for some
        containers). size: (width, height) in pixels.
    """

    def __init__(self, path: str, vid_stride: int = 1) -> None:
        if vid_stride < 1:
            raise ValueError(f"vid_stride must be >= 1 (every k-th frame of a video), got {vid_stride}")
        self.path, self.vid_stride = path, vid_stride
        self._capture = cv2.VideoCapture(path)
        self.error = "" if self._capture.isOpened() else "OpenCV could not open it as a video (corrupt or no codec)"
        fps = self._capture.get(cv2.CAP_PROP_FPS) if not self.error else 0.0
        self.fps = fps if fps and np.isfinite(fps) and fps > 0 else 30.0  # the official fallback
        self.frame_count = int(self._capture.get(cv2.CAP_PROP_FRAME_COUNT)) if not self.error else 0
        self.size = (int(self._capture.get(cv2.CAP_PROP_FRAME_WIDTH)),
                     int(self._capture.get(cv2.CAP_PROP_FRAME_HEIGHT)))
        self.frames_read = 0

    def __iter__(self) -> Iterator[tuple[int, np.ndarray, float]]:
        """(0-based frame index, BGR image (H, W, 3) uint8, seconds spent decoding it) per kept frame."""
        index = -1
        try:
            while not self.error:
                t0 = time.perf_counter()
                grabbed = True
                for _ in range(self.vid_stride):
                    grabbed = self._capture.grab()
                    index += 1
                    if not grabbed:
                        break
                ok, image = self._capture.retrieve() if grabbed else (False, None)
                if not ok or image is None:
                    return
                self.frames_read += 1
                yield index, image, time.perf_counter() - t0
        finally:
            self.close()

    def close(self) -> None:
        self._capture.release()


def read_frame(path: str, frame: int) -> np.ndarray | None:
    """Frame ``frame`` (0-based) of a video as a BGR image, or None when it cannot be decoded."""
    capture = cv2.VideoCapture(path)
    try:
        capture.set(cv2.CAP_PROP_POS_FRAMES, frame)
        ok, image = capture.read()
        return image if ok else None
    finally:
        capture.release()


def write_video(images, path: str | Path, fps: float = 10.0) -> Path:
    """Write image files (all the size of the first) as an mp4 video, one frame each: a clip to predict on.

    Args:
        images: image paths, in frame order.
        path: the .mp4 file to write (mp4v, lossy: the frames read back are close to, not equal to, the images).
        fps: frames per second.

    Returns:
        ``path``.

    Raises:
        ValueError: no images, an image that cannot be read, or one of another size (each named).
        OSError: OpenCV cannot open a writer for ``path``.
    """
    images, path = [str(i) for i in images], Path(path)
    if not images:
        raise ValueError(f"write_video({path}): no images given")
    first = cv2.imread(images[0])
    if first is None:
        raise ValueError(f"{images[0]}: not a readable image")
    height, width = first.shape[:2]

    def write(tmp: Path) -> None:
        writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
        if not writer.isOpened():
            raise OSError(f"{path}: OpenCV could not open an mp4v video writer there")
        try:
            for name in images:
                frame = cv2.imread(name)
                if frame is None or frame.shape[:2] != (height, width):
                    raise ValueError(f"{name}: " + ("not a readable image" if frame is None else
                                     f"{frame.shape[1]}x{frame.shape[0]}, the video is {width}x{height}"))
                writer.write(frame)
        finally:
            writer.release()

    # estimated from the frames' raw size: mp4v keeps well under a tenth of it
    write_file(path, write, needed=len(images) * width * height * 3 // 10, inputs=images, keep_suffix=True)
    return path
