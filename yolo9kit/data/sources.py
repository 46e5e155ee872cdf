"""Every file discovery: data.yaml and the images of a split (official ``check_dataset``, ``img2label_paths``),
the label file of an image, and what ``predict`` reads (official ``LoadImages``; docs/validation.md says
where the kit differs)."""

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
SPLITS = ("train", "val", "test")


def _is_glob(text: str) -> bool:
    return any(ch in text for ch in "*?[")


@dataclass(frozen=True)
class DataConfig:
    """A resolved data.yaml: ``path`` (root), ``names`` (index = class id), ``sources`` (per split, the
    entries as absolute paths), ``yaml_file`` (None for a dict); ``nc`` is ``len(names)``."""

    path: Path
    names: list[str]
    sources: dict[str, list[Path]] = field(default_factory=dict)
    yaml_file: Path | None = None

    @property
    def nc(self) -> int:
        return len(self.names)

    def images(self, split: str) -> list[Path]:
        """Sorted image files of ``split`` (folders searched recursively, list files read, globs expanded)."""
        if split not in self.sources:
            raise KeyError(f"split {split!r} is not defined in {self.yaml_file or 'the data config'}; "
                           f"defined: {sorted(self.sources)}")
        return list_images(self.sources[split])

    @property
    def train(self) -> list[Path]:
        return self.images("train")

    @property
    def val(self) -> list[Path]:
        return self.images("val")

    @property
    def test(self) -> list[Path]:
        return self.images("test") if "test" in self.sources else []


def _names_list(names, where: str) -> list[str]:
    if isinstance(names, dict):
        keys = sorted(int(k) for k in names)
        if keys != list(range(len(keys))):
            raise ValueError(f"{where}: 'names' keys must be 0..{len(keys) - 1}, got {keys}")
        return [str(names[k] if k in names else names[str(k)]) for k in keys]
    if isinstance(names, (list, tuple)):
        return [str(n) for n in names]
    raise ValueError(f"{where}: 'names' must be a list or a {{id: name}} mapping, got {type(names).__name__}")


def _resolve(entry: str | os.PathLike, root: Path) -> Path:
    p = Path(os.path.expanduser(str(entry)))
    if p.is_absolute():
        return p
    candidate = root / p
    if not candidate.exists() and str(entry).startswith("../"):  # official fallback: drop the ../
        alt = root / str(entry)[3:]
        if alt.exists():
            return alt
    return candidate


def load_data_config(data: str | os.PathLike | dict | DataConfig) -> DataConfig:
    """Read a data.yaml with the official keys path (relative: to the yaml's folder, or the current one for a
    dict), train, val, test and names (list or dict); ``nc`` is ignored.

    Args:
        data: the data.yaml path, a dict of its keys, or a DataConfig (returned as it is).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a mapping, a required key (train, val, names) missing, or bad ``names``.
    """
    if isinstance(data, DataConfig):
        return data
    yaml_file = None
    if isinstance(data, dict):
        raw, where, base = dict(data), "data config", Path.cwd()
    else:
        yaml_file = Path(data)
        if not yaml_file.is_file():
            raise FileNotFoundError(f"data config {yaml_file} not found: pass the path of a data.yaml")
        raw = read_record(yaml_file)  # RecordError (a ValueError) names the file and the line
        if not isinstance(raw, dict):
            raise ValueError(f"{yaml_file}: expected a mapping with train/val/names keys")
        where, base = str(yaml_file), yaml_file.resolve().parent
    missing = [k for k in ("train", "val", "names") if k not in raw]
    if missing:
        raise ValueError(f"{where}: missing required key(s) {missing}; a data.yaml needs train, val and names")
    root = Path(os.path.expanduser(str(raw.get("path") or ".")))
    root = root if root.is_absolute() else (base / root)
    sources = {}
    for split in SPLITS:
        entry = raw.get(split)
        if entry:
            entries = entry if isinstance(entry, (list, tuple)) else [entry]
            sources[split] = [_resolve(e, root) for e in entries]
    return DataConfig(path=root.resolve(), names=_names_list(raw["names"], where), sources=sources,
                      yaml_file=yaml_file)


def _listed(list_file: Path) -> list[tuple[int, Path]]:
    """(line number, path) per line of a ``.txt`` list; relative paths (``./x`` too) are relative to its folder."""
    try:
        lines = list_file.read_text(encoding="utf-8-sig").splitlines()  # a byte-order mark too
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"list file {list_file} could not be read as text ({e}): write one path a line") from e
    out = []
    for number, line in enumerate(lines, 1):
        entry = line.strip()
        if entry:
            path = Path(entry[2:] if entry.startswith("./") else entry).expanduser()
            out.append((number, path if path.is_absolute() else list_file.parent / path))
    return out


def _walk(folder: Path) -> Iterator[tuple[str, list[str]]]:
    """``os.walk`` following links, each real folder once: a link back up the tree is not followed round."""
    seen = set()
    for dirpath, dirs, files in os.walk(folder, followlinks=True):
        st = os.stat(dirpath)
        if (st.st_dev, st.st_ino) in seen:
            dirs[:] = []  # nor what is below it
            continue
        seen.add((st.st_dev, st.st_ino))
        yield dirpath, files


def _walk_images(folder: Path) -> list[str]:
    return [os.path.join(dirpath, f) for dirpath, files in _walk(folder) for f in files
            if os.path.splitext(f)[1].lower() in IMAGE_SUFFIXES]


def list_images(sources: list[Path]) -> list[Path]:
    """Image files named by folders (recursive), ``.txt`` list files or glob patterns; sorted, unique."""
    files: list[str] = []
    for src in sources:
        s = str(src)
        if _is_glob(s):
            for g in glob.glob(s, recursive=True):
                files += _walk_images(Path(g)) if os.path.isdir(g) else [g]
        elif src.is_dir():
            files += _walk_images(src)
        elif src.is_file():
            files += [s] if src.suffix.lower() in IMAGE_SUFFIXES else [str(p) for _, p in _listed(src)]
        else:
            raise FileNotFoundError(f"{src} does not exist: expected an image folder, a .txt list of images or a glob")
    unique = sorted({f for f in files if os.path.splitext(f)[1].lower() in IMAGE_SUFFIXES})
    return [Path(f) for f in unique]


def label_path(image_path: str | os.PathLike) -> Path:
    """Label file of an image: the last ``/images/`` in the path becomes ``/labels/``, the suffix ``.txt``."""
    s = str(image_path)
    a, b = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    if a in s:
        head, _, tail = s.rpartition(a)
        s = head + b + tail
    return Path(os.path.splitext(s)[0] + ".txt")


def orphan_label_files(sources: list[Path], label_files: list[str]) -> list[str]:
    """Label files (not labelImg's ``classes.txt``) that no image has, under the ``labels`` twin of each image
    folder of ``sources``; a list or a glob may share its label folder with other splits: not searched."""
    expected = {os.path.normpath(f) for f in label_files}
    orphans: set[str] = set()
    for src in sources:
        if _is_glob(str(src)) or not src.is_dir():
            continue
        folder = label_path(src / "image.jpg").parent
        if folder == src or not folder.is_dir():
            continue
        for dirpath, files in _walk(folder):
            orphans |= {path for path in (os.path.normpath(os.path.join(dirpath, f)) for f in files
                                          if f.endswith(".txt") and f != "classes.txt") if path not in expected}
    return sorted(orphans)


def is_video(item) -> bool:
    """True for a path (str or Path) whose suffix is a video format."""
    return isinstance(item, (str, Path)) and Path(item).suffix.lower() in VIDEO_SUFFIXES


def _media_in(folder: Path) -> list[str]:
    """The image and video files of ``folder`` (not of its sub-folders), sorted."""
    suffixes = IMAGE_SUFFIXES | VIDEO_SUFFIXES
    return sorted(str(p) for p in folder.iterdir() if p.is_file() and p.suffix.lower() in suffixes)


def _read_list(list_file: Path, skipped: list[tuple[str, str]]) -> list[str]:
    """The files a ``.txt`` list names; a line naming no file is recorded in ``skipped``."""
    out: list[str] = []
    for number, path in _listed(list_file):
        if path.is_dir():
            out += _media_in(path)
        elif path.is_file():
            out.append(str(path))
        else:
            log.warning("skipping %s:%d: %s does not exist", list_file, number, path)
            skipped.append((f"{list_file}:{number}", f"the listed file {path} does not exist"))
    if not out and not skipped:
        raise ValueError(f"list file {list_file} names no image or video: write one path a line")
    return out


def expand_sources(source) -> tuple[list[str | np.ndarray], list[tuple[str, str]]]:
    """The inputs ``source`` names, in order, and the listed files that are missing.

    Args:
        source: an image or video file, a folder, a glob, a ``.txt`` list, a BGR numpy image, or a list of these.

    Returns:
        (paths and arrays, ``(list_file:line, reason)`` per listed file that does not exist).

    Raises:
        FileNotFoundError: a named file, folder or pattern does not exist or matches nothing.
        ValueError: a folder without images or videos, a list file that names none, nothing to read.
        TypeError: a torch tensor.
    """
    out: list[str | np.ndarray] = []
    skipped: list[tuple[str, str]] = []
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
                                 f"{', '.join(sorted(IMAGE_SUFFIXES | VIDEO_SUFFIXES))})")
            out += files
        elif path.is_file():
            out += _read_list(path, skipped) if path.suffix.lower() == ".txt" else [str(path)]
        else:
            raise FileNotFoundError(f"source {text} does not exist: pass an image or video file, a folder, a glob "
                                    "pattern, a .txt list of files or a numpy image")
    if not out and not skipped:
        raise ValueError(f"no images or videos to predict on in {source!r}")
    return out, skipped


class VideoReader:
    """The frames of one video, decoded one at a time; with ``vid_stride`` k, frames k-1, 2k-1, ... (official
    ``LoadImages``). ``error`` says why it cannot be read ("" when it opened); ``frame_count`` is what the file
    announces (an estimate for some containers)."""

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
    """Write image files (all the size of the first) as an mp4v video, one frame each: a clip to predict on.

    Args:
        images: image paths, in frame order.
        path: the .mp4 file to write (lossy: the frames read back are close to the images, not equal).
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
