"""What a run writes besides checkpoints: results.csv, and the numbers shown on the progress bar."""

from __future__ import annotations

import csv
from pathlib import Path

import torch

RESULTS_COLUMNS = [
    "epoch", "train/box_loss", "train/cls_loss", "train/dfl_loss", "lr/pg0", "lr/pg1", "lr/pg2",
    "metrics/precision", "metrics/recall", "metrics/mAP50", "metrics/mAP50-95", "fitness",
    "peak_vram_bytes", "images_per_s", "epoch_s",
]


def append_results(path: Path, row: dict) -> None:
    """Append one epoch to ``results.csv`` (header written when the file is new)."""
    new = not path.exists()
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=RESULTS_COLUMNS, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerow({k: _fmt(row.get(k)) for k in RESULTS_COLUMNS})


def _fmt(value) -> object:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else value


def read_results(path: str | Path):
    """``results.csv`` of a run (or its folder) as a pandas DataFrame."""
    import pandas as pd

    path = Path(path)
    return pd.read_csv(path / "results.csv" if path.is_dir() else path)


def device_memory_bytes(device: torch.device, peak: bool = False) -> int:
    """Allocated (or peak allocated since the last reset) bytes on a CUDA device; 0 on CPU."""
    if device.type != "cuda":
        return 0
    return int(torch.cuda.max_memory_allocated(device) if peak else torch.cuda.memory_allocated(device))


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def bar_text(mean_items: torch.Tensor, memory_bytes: int, images_per_s: float, accumulate: int,
             micro_batch: int) -> str:
    """``box 1.23 cls 4.56 dfl 1.11 mem 3.2G 120 img/s acc 4x16``: the progress-bar postfix."""
    box, cls, dfl = (float(v) for v in mean_items)
    return (f"box {box:.3f} cls {cls:.3f} dfl {dfl:.3f} mem {memory_bytes / 1e9:.3g}G "
            f"{images_per_s:.1f} img/s acc {accumulate}x{micro_batch}")
