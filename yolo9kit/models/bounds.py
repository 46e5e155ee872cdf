"""Bounds on a model that a file describes, checked before anything is allocated.

A checkpoint's zip archive is checked by its directory first (``check_archive``: no entry may unpack to far
more than it takes in the file).

A checkpoint carries its layer table (the kit's ``model_config``, the official file's pickled ``yaml``): a
2 KB file can ask for a model of tens of GB. Before a model is built from a file, its table is checked
row by row (``table_problem``: layer count, repeats, widths, classes), then built on the ``meta`` device
(shapes only, no memory) and its parameter bytes plus the bytes of every layer's output in the stride probe
(batch 1, 256 x 256) compared with a limit (``check_model_size``).

The limit, ``MAX_MODEL_BYTES`` (4 GiB), is about 12 times the largest official model (yolov9-e: 0.28 GB of
parameters and 0.07 GB of probe outputs); ``max_model_bytes=`` (``--max-model-gib`` on the command line)
raises it for a model that really is that large.
"""

from __future__ import annotations

from typing import Any

import torch

# Bounds on a layer table, checked before it is built. The largest official model (yolov9-e) has 50 layers,
# repeats of 1 (3 with depth_multiple 1), layer widths up to 1024 before the width multiple; LVIS has 1203
# classes. A file past these asks for something no YOLOv9 is (or is damaged).
MAX_LAYERS = 400
MAX_REPEATS = 64  # a row's repeats times depth_multiple, and a block's own repeat argument
MAX_MULTIPLE = 4.0  # depth_multiple and width_multiple
MAX_CHANNELS = 16384  # any integer argument of a layer row (widths, hidden widths, kernel sizes)
MAX_CLASSES = 100_000
MAX_MODEL_BYTES = 4 << 30  # parameters plus the probe's layer outputs, float32
# torch.save stores its archive entries uncompressed: what entries may unpack to beyond their size in the file
MAX_UNPACKED_EXTRA_BYTES = 64 << 20


class ModelSizeError(ValueError):
    """A layer table past the bounds; the message names the source, the figure and the limit."""


def table_problem(table: Any, nc: Any) -> str | None:
    """What is wrong with a layer table (the ``backbone``/``head`` dict) before it is built; None: within the
    bounds. ``nc``: the classes it is built for."""
    if not isinstance(table, dict):
        return "has no layer table"
    if isinstance(nc, bool) or not isinstance(nc, int) or not 1 <= nc <= MAX_CLASSES:
        return f"nc={nc!r}: expected 1 to {MAX_CLASSES} classes"
    rows = [*(table.get("backbone") or []), *(table.get("head") or [])]
    if not 1 <= len(rows) <= MAX_LAYERS:
        return f"has {len(rows)} layer rows: expected 1 to {MAX_LAYERS}"
    for key in ("depth_multiple", "width_multiple"):
        value = table.get(key, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_MULTIPLE:
            return f"{key}={value!r}: expected a number in (0, {MAX_MULTIPLE}]"
    for i, row in enumerate(rows):
        if not (isinstance(row, (list, tuple)) and len(row) == 4):
            return f"layer {i} {row!r}: expected [from, repeats, module, args]"
        n, depth = row[1], table.get("depth_multiple", 1.0)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1 or round(n * depth) > MAX_REPEATS:
            return f"layer {i}: {n!r} repeats (times depth_multiple): expected 1 to {MAX_REPEATS}"
        widths = [abs(v) for v in _ints(row[3])]
        if widths and max(widths) * max(table.get("width_multiple", 1.0), 1.0) > MAX_CHANNELS:
            return f"layer {i}: argument {max(widths)}: expected layer widths up to {MAX_CHANNELS}"
    return None


def check_model_size(table: dict, nc: int, source: str, max_model_bytes: int | None = None,
                     names: list | None = None) -> None:
    """Build ``table`` on the meta device and refuse it when its parameters and the probe's layer outputs
    take more than ``max_model_bytes`` (default ``MAX_MODEL_BYTES``).

    Raises:
        ModelSizeError: past the bounds of ``table_problem`` or past the byte limit (figures named).
        LayerTableError: a row that cannot be built.
    """
    from yolo9kit.models.model import DetectionModel

    limit = MAX_MODEL_BYTES if max_model_bytes is None else int(max_model_bytes)
    problem = table_problem(table, nc)
    if problem:
        raise ModelSizeError(f"{source}: the layer table {problem}")
    outputs: list[int] = []

    def record(_module, _args, output) -> None:
        for t in output if isinstance(output, (list, tuple)) else [output]:
            if isinstance(t, torch.Tensor):
                outputs.append(t.numel() * 4)

    with torch.device("meta"):
        shell = DetectionModel(table, nc=nc, names=names, probe=False, source=source)
        hooks = [layer.register_forward_hook(record) for layer in shell.model]
        try:
            shell._probe_strides()
        finally:
            for hook in hooks:
                hook.remove()
    parameters = sum(p.numel() * 4 for p in shell.parameters())
    if parameters + sum(outputs) > limit:
        raise ModelSizeError(
            f"{source}: the model it describes takes {parameters / 2**30:.2f} GiB of parameters and "
            f"{sum(outputs) / 2**30:.2f} GiB of layer outputs for one 256 x 256 image, more than the limit of "
            f"{limit / 2**30:.2f} GiB (the largest official YOLOv9, yolov9-e, takes 0.33); if the file is yours and "
            "the model really is that large, raise it (max_model_bytes=, --max-model-gib)")


def check_archive(path) -> None:
    """A checkpoint's zip archive read by its directory before any entry is: entries that unpack to more than
    they take in the file (torch.save never compresses) are refused beyond ``MAX_UNPACKED_EXTRA_BYTES``, so a
    small file cannot unpack to gigabytes. Files that are not zip archives are left to the loader.

    Raises:
        ModelSizeError: naming the entry, its size in the file and what it would unpack to.
    """
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (OSError, zipfile.BadZipFile):
        return
    extra = sum(max(e.file_size - e.compress_size, 0) for e in entries)
    if extra > MAX_UNPACKED_EXTRA_BYTES:
        worst = max(entries, key=lambda e: e.file_size - e.compress_size)
        raise ModelSizeError(
            f"{path}: its entry {worst.filename} takes {worst.compress_size / 2**20:.1f} MiB in the file and would "
            f"unpack to {worst.file_size / 2**20:.1f} MiB ({extra / 2**20:.0f} MiB more than the file holds in all); "
            "torch.save writes entries uncompressed: the file was made by something else, refusing to read it")


def _ints(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [i for v in value for i in _ints(v)]
    return []
