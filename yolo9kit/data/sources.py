"""data.yaml parsing and image/label file discovery (the official format: ``utils/general.py`` check_dataset,
``utils/dataloaders.py`` LoadImagesAndLabels.__init__ and img2label_paths)."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from yolo9kit.files import read_record

IMAGE_SUFFIXES = {".bmp", ".dng", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp", ".pfm"}
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class DataConfig:
    """A resolved data.yaml.

    Attributes:
        path: data set root; relative entries are joined to it.
        names: class names, index = class id.
        nc: number of classes (always ``len(names)``, as in the official code).
        sources: per split, the entries as written (folders, list files, globs), resolved to absolute paths.
        yaml_file: the file read, or None for a dict.
    """

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
    """Read a data.yaml (path or dict) with the official keys: path, train, val, test, names (list or dict).

    A relative ``path`` is resolved against the yaml file's folder (the current directory for a dict);
    a ``nc`` key is ignored, ``nc = len(names)``.
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
        if any(ch in s for ch in "*?["):
            for g in glob.glob(s, recursive=True):
                files += _walk_images(Path(g)) if os.path.isdir(g) else [g]
        elif src.is_dir():
            files += _walk_images(src)
        elif src.is_file():
            if src.suffix.lower() in IMAGE_SUFFIXES:
                files.append(s)
                continue
            parent = src.parent
            for line in src.read_text(encoding="utf-8-sig").splitlines():  # a byte-order mark too
                line = line.strip()
                if line:
                    p = Path(line)
                    files.append(str(parent / line[2:]) if line.startswith("./") else
                                 str(p if p.is_absolute() else parent / p))
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
    """Label files under the ``labels`` twin of each image folder of ``sources`` that no image has.

    Only folder sources are searched (recursively, as their images are): a ``.txt`` list or a glob may
    share its label folder with other splits, whose labels are not orphans; a folder whose path has no
    ``images`` part keeps its labels beside the images, among other text files. ``classes.txt`` (written
    by labelImg) is not a label file.
    """
    expected = {os.path.normpath(f) for f in label_files}
    orphans: set[str] = set()
    for src in sources:
        if any(ch in str(src) for ch in "*?[") or not src.is_dir():
            continue
        folder = label_path(src / "image.jpg").parent
        if folder == src or not folder.is_dir():
            continue
        for dirpath, files in _walk(folder):
            orphans |= {path for path in (os.path.normpath(os.path.join(dirpath, f)) for f in files
                                          if f.endswith(".txt") and f != "classes.txt") if path not in expected}
    return sorted(orphans)
