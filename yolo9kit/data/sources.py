"""Finding files: data.yaml, a split's images and label files, and what ``predict`` reads (official ``LoadImages``)."""

from __future__ import annotations

import glob
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from yolo9kit.files import read_record, write_file

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = {".bmp", ".dng", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp", ".pfm"}
VIDEO_SUFFIXES = {".asf", ".avi", ".gif", ".m4v", ".mkv", ".mov", ".mp4", ".mpeg", ".mpg", ".ts", ".wmv"}
MEDIA_SUFFIXES = IMAGE_SUFFIXES | VIDEO_SUFFIXES


def _is_glob(text: str) -> bool:
    return any(ch in text for ch in "*?[")


@dataclass(frozen=True)
class DataConfig:
    """A resolved data.yaml: root ``path``, ``names`` (index = class id), absolute ``sources`` per split."""

    path: Path
    names: list[str]
    sources: dict[str, list[Path]] = field(default_factory=dict)
    yaml_file: Path | None = None

    @property
    def nc(self) -> int:
        return len(self.names)

    def images(self, split: str) -> list[Path]:
        """Image files of ``split``, named by folders (recursive), ``.txt`` list files or globs; sorted, unique."""
        if split not in self.sources:
            raise KeyError(f"split {split!r} is not defined in {self.yaml_file or 'the data config'}; "
                           f"defined: {sorted(self.sources)}")
        files: list[str] = []
        for src in self.sources[split]:
            s = str(src)
            if _is_glob(s) or src.is_dir():
                for g in glob.glob(s, recursive=True) if _is_glob(s) else [s]:
                    files += _walk(g) if os.path.isdir(g) else [g]
            elif src.is_file():
                files += [s] if src.suffix.lower() in IMAGE_SUFFIXES else [str(p) for _, p in _listed(src)]
            else:
                raise FileNotFoundError(f"{src} does not exist: expected an image folder, a .txt list of images or a "
                                        "glob")
        return [Path(f) for f in sorted({f for f in files if os.path.splitext(f)[1].lower() in IMAGE_SUFFIXES})]

    @property
    def train(self) -> list[Path]:
        return self.images("train")

    @property
    def val(self) -> list[Path]:
        return self.images("val")

    @property
    def test(self) -> list[Path]:
        return self.images("test") if "test" in self.sources else []


def load_data_config(data: str | os.PathLike | dict | DataConfig) -> DataConfig:
    """Read a data.yaml (official keys path, train, val, test, names; a relative path is relative to the yaml).

    Args:
        data: the data.yaml path, a dict of its keys (relative to the current folder), or a DataConfig.
    Raises:
        FileNotFoundError: no such file.
        ValueError: not a mapping, train, val or names missing, or bad ``names``.
    """
    if isinstance(data, DataConfig):
        return data
    if isinstance(data, dict):
        raw, yaml_file, base = dict(data), None, Path.cwd()
    else:
        yaml_file = Path(data)
        if not yaml_file.is_file():
            raise FileNotFoundError(f"data config {yaml_file} not found: pass the path of a data.yaml")
        raw, base = read_record(yaml_file), yaml_file.resolve().parent  # RecordError names the file and the line
        if not isinstance(raw, dict):
            raise ValueError(f"{yaml_file}: expected a mapping with train/val/names keys")
    where = yaml_file or "data config"
    missing = [k for k in ("train", "val", "names") if k not in raw]
    if missing:
        raise ValueError(f"{where}: missing required key(s) {missing}; a data.yaml needs train, val and names")
    root = base / os.path.expanduser(str(raw.get("path") or "."))
    sources: dict[str, list[Path]] = {}
    for split in (s for s in ("train", "val", "test") if raw.get(s)):
        for entry in map(str, raw[split] if isinstance(raw[split], (list, tuple)) else [raw[split]]):
            path = root / os.path.expanduser(entry)  # an absolute entry stays as it is
            if not path.exists() and entry.startswith("../") and (root / entry[3:]).exists():
                path = root / entry[3:]  # the official fallback: without the ../
            sources.setdefault(split, []).append(path)
    names = raw["names"]
    if isinstance(names, dict):
        keys = sorted(int(k) for k in names)
        if keys != list(range(len(keys))):
            raise ValueError(f"{where}: 'names' keys must be 0..{len(keys) - 1}, got {keys}")
        names = [names[k] if k in names else names[str(k)] for k in keys]
    elif not isinstance(names, (list, tuple)):
        raise ValueError(f"{where}: 'names' must be a list or a {{id: name}} mapping, got {type(names).__name__}")
    return DataConfig(path=root.resolve(), names=[str(n) for n in names], sources=sources, yaml_file=yaml_file)


def _listed(list_file: Path) -> list[tuple[int, Path]]:
    """(line number, path) per line of a ``.txt`` list, relative to its folder."""
    try:
        lines = list_file.read_text(encoding="utf-8-sig").splitlines()  # a byte-order mark too
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"list file {list_file} could not be read as text ({e}): write one path a line") from e
    return [(number, list_file.parent / Path(line.strip()).expanduser()) for number, line in enumerate(lines, 1)
            if line.strip()]


def _walk(folder: str | Path) -> Iterator[str]:
    """The files under ``folder``, following links but each real folder once (no loop round a link)."""
    seen = set()
    for dirpath, dirs, files in os.walk(folder, followlinks=True):
        st = os.stat(dirpath)
        if (st.st_dev, st.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        yield from (os.path.join(dirpath, f) for f in files)


def label_path(image_path: str | os.PathLike) -> Path:
    """Label file of an image: the last ``/images/`` in the path becomes ``/labels/``, the suffix ``.txt``."""
    head, sep, tail = str(image_path).rpartition(f"{os.sep}images{os.sep}")
    s = f"{head}{os.sep}labels{os.sep}{tail}" if sep else tail
    return Path(os.path.splitext(s)[0] + ".txt")


def orphan_label_files(sources: list[Path], label_files: list[str]) -> list[str]:
    """Label files no image has in the ``labels`` twin of each image folder of ``sources`` (docs/data.md)."""
    orphans: set[str] = set()
    for src in sources:
        folder = label_path(src / "image.jpg").parent
        if not _is_glob(str(src)) and src.is_dir() and folder != src and folder.is_dir():
            orphans |= {os.path.normpath(f) for f in _walk(folder)
                        if f.endswith(".txt") and os.path.basename(f) != "classes.txt"}
    return sorted(orphans - {os.path.normpath(f) for f in label_files})


def is_video(item) -> bool:
    return isinstance(item, (str, Path)) and Path(item).suffix.lower() in VIDEO_SUFFIXES


def _media_in(folder: Path) -> list[str]:
    """The image and video files of ``folder`` (not of its sub-folders), sorted."""
    return sorted(str(p) for p in folder.iterdir() if p.is_file() and p.suffix.lower() in MEDIA_SUFFIXES)


def expand_sources(source) -> tuple[list[str | np.ndarray], list[tuple[str, str]]]:
    """(paths and arrays, ``(list_file:line, reason)`` per listed file that does not exist) of a ``source``
    (docs/validation.md, "Sources"): an image or video file, folder, glob, ``.txt`` list, BGR array, or a list.

    Raises:
        FileNotFoundError: a named file, folder or pattern does not exist or matches nothing.
        ValueError: a folder without images or videos, a list file that names none, nothing to read.
        TypeError: a torch tensor.
    """
    out, skipped = [], []
    for item in source if isinstance(source, (list, tuple)) else [source]:
        if isinstance(item, np.ndarray):
            out.append(item)
            continue
        if type(item).__module__.startswith("torch"):  # str() of a tensor is not a path
            raise TypeError(f"a {type(item).__name__} is not an image source: pass a BGR numpy image (H, W, 3) uint8, "
                            "as cv2.imread gives (for an RGB CHW tensor: t.permute(1, 2, 0).flip(-1).numpy()), a "
                            "file, folder, glob pattern or .txt list, or a list of these")
        text = str(item)
        path = Path(text).expanduser()
        if _is_glob(text):
            matches = sorted(glob.glob(text, recursive=True))
            if not matches:
                raise FileNotFoundError(f"no files match the pattern {text}")
            out += [m for m in matches if Path(m).is_file()]
        elif path.is_dir():
            files = _media_in(path)
            if not files:
                raise ValueError(f"no images found in folder {text}, nor videos (looked for "
                                 f"{', '.join(sorted(MEDIA_SUFFIXES))})")
            out += files
        elif path.is_file() and path.suffix.lower() == ".txt":  # a listed file that does not exist goes to skipped
            found = len(out) + len(skipped)
            for number, listed in _listed(path):
                if listed.exists():
                    out += _media_in(listed) if listed.is_dir() else [str(listed)]
                else:
                    log.warning("skipping %s:%d: %s does not exist", path, number, listed)
                    skipped.append((f"{path}:{number}", f"the listed file {listed} does not exist"))
            if len(out) + len(skipped) == found:
                raise ValueError(f"list file {path} names no image or video: write one path a line")
        elif path.is_file():
            out.append(str(path))
        else:
            raise FileNotFoundError(f"source {text} does not exist: pass an image or video file, a folder, a glob "
                                    "pattern, a .txt list of files or a numpy image")
    if not out and not skipped:
        raise ValueError(f"no images or videos to predict on in {source!r}")
    return out, skipped


class VideoReader:
    """Frames k-1, 2k-1, ... of a video for ``vid_stride`` k (official); ``error`` is "" when it opened."""

    def __init__(self, path: str, vid_stride: int = 1) -> None:
        if vid_stride < 1:
            raise ValueError(f"vid_stride must be >= 1 (every k-th frame of a video), got {vid_stride}")
        self.path, self.vid_stride = path, vid_stride
        self._capture = cv2.VideoCapture(path)
        self.error = "" if self._capture.isOpened() else "OpenCV could not open it as a video (corrupt or no codec)"
        self.fps = fps if np.isfinite(fps := self._capture.get(cv2.CAP_PROP_FPS)) and fps > 0 else 30.0  # official
        self.frame_count = int(self._capture.get(cv2.CAP_PROP_FRAME_COUNT)) if not self.error else 0
        self.size = (int(self._capture.get(cv2.CAP_PROP_FRAME_WIDTH)),
                     int(self._capture.get(cv2.CAP_PROP_FRAME_HEIGHT)))
        self.frames_read = 0

    def __iter__(self) -> Iterator[tuple[int, np.ndarray, float]]:
        """(frame index, BGR image, seconds spent decoding it) per kept frame."""
        index = -1
        try:
            while not self.error:
                t0 = time.perf_counter()
                for _ in range(self.vid_stride):
                    index += 1
                    if not self._capture.grab():
                        return
                ok, image = self._capture.retrieve()
                if not ok or image is None:
                    return
                self.frames_read += 1
                yield index, image, time.perf_counter() - t0
        finally:
            self._capture.release()


def read_frame(path: str, frame: int) -> np.ndarray | None:
    """Frame ``frame`` (0-based) of a video as a BGR image, or None when it cannot be decoded."""
    capture = cv2.VideoCapture(path)
    capture.set(cv2.CAP_PROP_POS_FRAMES, frame)
    ok, image = capture.read()
    capture.release()
    return image if ok else None


def write_video(images, path: str | Path, fps: float = 10.0) -> Path:
    """Write image files (all of one size) as the frames of an mp4v video at ``path``: a clip to predict on.

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
