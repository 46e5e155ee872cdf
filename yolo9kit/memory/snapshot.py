"""CUDA memory snapshots for PyTorch's memory visualiser, and a per-step VRAM trace for dashboards."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from yolo9kit.files import write_file


def _require_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} records the CUDA caching allocator and needs a CUDA device "
                           "(torch.cuda.is_available() is False); on the CPU use "
                           "yolo9kit.memory.estimate(...) for a breakdown of the step's memory")


@contextlib.contextmanager
def record_memory_history(path: str | Path, *, max_entries: int = 100_000) -> Iterator[Path]:
    """Record every CUDA allocation (with stack traces) inside the block, then write a snapshot file
    to ``path`` for https://pytorch.org/memory_viz (drag the file onto the page; it runs locally).

    Wraps ``torch.cuda.memory._record_memory_history`` / ``_dump_snapshot`` (private PyTorch API, the
    documented way to take snapshots) and stops recording even if the block raises.
    """
    _require_cuda("record_memory_history")
    path = Path(path)
    torch.cuda.memory._record_memory_history(max_entries=max_entries)
    try:
        yield path
    finally:
        try:  # written whole through files.write_file (a snapshot of a long run takes hundreds of MB)
            write_file(path, lambda tmp: torch.cuda.memory._dump_snapshot(str(tmp)), needed=max_entries * 2048,
                       what=f"writing the memory snapshot {path}")
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)


def export_snapshot(path: str | Path, fn: Callable[..., Any], *args: Any, max_entries: int = 100_000,
                    **kwargs: Any) -> Path:
    """Run ``fn(*args, **kwargs)`` (e.g. a few training steps) while recording, write the snapshot to
    ``path`` (a .pickle for the memory visualiser) and return the path. CUDA only."""
    with record_memory_history(path, max_entries=max_entries) as out:
        fn(*args, **kwargs)
    return out


class VramSampler:
    """Per-batch VRAM trace: call it once per batch (it is a valid ``on_batch`` training callback).

    Each call records ``torch.cuda.memory_allocated`` / ``memory_reserved`` / ``max_memory_allocated``
    (bytes) with the batch index of the callback's ``BatchRecord`` (``ni``), or a count when called without
    one. Without CUDA it records zeros and ``available`` is False, so a dashboard can use it on
    any machine.
    """

    def __init__(self, device: int | str | torch.device | None = None) -> None:
        self.available = torch.cuda.is_available()
        self.device = device if device is not None else (torch.cuda.current_device() if self.available else None)
        self.rows: list[dict[str, float]] = []

    def __call__(self, record: Any = None) -> dict[str, float]:
        step = len(self.rows) if record is None else int(record.ni)
        if self.available:
            row = {"step": step, "allocated": torch.cuda.memory_allocated(self.device),
                   "reserved": torch.cuda.memory_reserved(self.device),
                   "max_allocated": torch.cuda.max_memory_allocated(self.device)}
        else:
            row = {"step": step, "allocated": 0, "reserved": 0, "max_allocated": 0}
        self.rows.append(row)
        return row

    def frame(self) -> pd.DataFrame:
        """The trace as a DataFrame (columns step, allocated, reserved, max_allocated; bytes)."""
        return pd.DataFrame(self.rows, columns=["step", "allocated", "reserved", "max_allocated"])

    def reset(self) -> None:
        self.rows.clear()
