"""What a run reports: the per-batch ``BatchRecord`` and per-epoch ``EpochRecord`` given to the callbacks,
results.csv (written from the ``EpochRecord``), state.yaml (how the run ended), and the numbers shown on the
progress bar."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from yolo9kit.files import dump_record, read_record, write_text_atomically

if TYPE_CHECKING:
    from yolo9kit.train.loop import EpochStats

STATE_FILE = "state.yaml"  # running, finished, stopped early, interrupted or failed: what yolo9kit.runs reads
ENDED = ("finished", "stopped early")  # the states of a run that ended on its own: what a seed spread counts
RESULTS_COLUMNS = [
    "epoch", "train/box_loss", "train/cls_loss", "train/dfl_loss", "lr/pg0", "lr/pg1", "lr/pg2",
    "metrics/precision", "metrics/recall", "metrics/mAP50", "metrics/mAP50-95", "fitness",
    "peak_allocated", "images_per_s", "epoch_s",
]


@dataclass(frozen=True)
class BatchRecord:
    """What ``on_batch`` receives after each trained loader batch (rank 0; skipped non-finite batches are not
    reported). The records of ``log_interval`` batches arrive together, at each read-back, in batch order.

    The learning rates are those of the official parameter groups (results.csv ``lr/pg0``, ``pg1``, ``pg2``).

    Attributes:
        epoch: the epoch, counted from 0.
        batch_index: the loader batch within the epoch, counted from 0.
        ni: the integrated batch index, ``batch_index + epoch * batches_per_epoch`` (the x axis of a run;
            a resumed run repeats the batches of the accumulation window it was interrupted in).
        optimizer_steps: optimizer updates made since the run started (including this batch's, if any).
        box_loss, cls_loss, dfl_loss: running means over the epoch's trained batches of the loss terms
            (after the gains, per image as in the official ``loss_items``).
        lr_bias: learning rate of the biases (group 0, no weight decay).
        lr_weight: learning rate of the decayed weights (group 1).
        lr_norm_weight: learning rate of the normalisation-layer weights (group 2, no weight decay).
        momentum: SGD momentum (Adam's beta1) used for this batch.
        accumulate_steps: loader batches per optimizer step in effect for this batch (ramps up in warmup).
        micro_batch_size: images per forward/backward (the whole batch unless it was split).
        peak_allocated: peak allocated CUDA memory since the epoch started, bytes; None when training on
            another device (VRAM is measured on CUDA only).
        images_per_s: training images per second since the epoch started, all ranks together.
    """

    epoch: int
    batch_index: int
    ni: int
    optimizer_steps: int
    box_loss: float
    cls_loss: float
    dfl_loss: float
    lr_bias: float
    lr_weight: float
    lr_norm_weight: float
    momentum: float
    accumulate_steps: int
    micro_batch_size: int
    peak_allocated: int | None
    images_per_s: float


@dataclass(frozen=True)
class EpochRecord:
    """What ``on_epoch_end`` receives after each epoch (rank 0): one results.csv row, see ``row()``.

    Attributes:
        epoch: the epoch, counted from 0.
        box_loss, cls_loss, dfl_loss: means over the epoch's trained batches of the loss terms.
        lr_bias, lr_weight, lr_norm_weight: learning rates of the parameter groups at the end of the epoch
            (results.csv ``lr/pg0``, ``lr/pg1``, ``lr/pg2``).
        precision, recall, map50, map50_95: validation of the EMA (mAP at IoU 0.5 and 0.5:0.95); None when
            the epoch was not validated.
        fitness: the score best.pt is chosen by (by default ``0.1 * map50 + 0.9 * map50_95``); None when not
            validated.
        peak_allocated: peak allocated CUDA memory during the epoch's training, bytes; None when training on
            another device (VRAM is measured on CUDA only).
        images_per_s: training images per second over the epoch, all ranks together.
        epoch_s: seconds of training in the epoch (validation and checkpoints excluded).
    """

    epoch: int
    box_loss: float
    cls_loss: float
    dfl_loss: float
    lr_bias: float
    lr_weight: float
    lr_norm_weight: float
    precision: float | None
    recall: float | None
    map50: float | None
    map50_95: float | None
    fitness: float | None
    peak_allocated: int | None
    images_per_s: float
    epoch_s: float

    @classmethod
    def from_stats(cls, epoch: int, stats: EpochStats, metrics: Mapping[str, float],
                   world_size: int = 1) -> EpochRecord:
        """The record of ``epoch`` from the loop's ``EpochStats`` and the validation ``metrics`` (keys
        ``precision, recall, map50, map50_95, fitness``; empty when not validated). ``stats.images`` counts this
        rank's images, so the throughput is scaled by ``world_size``."""
        box, cls_, dfl = (float(v) for v in stats.mean_items)
        lr_bias, lr_weight, lr_norm_weight = (float(lr) for lr in stats.lrs)
        return cls(epoch=epoch, box_loss=box, cls_loss=cls_, dfl_loss=dfl, lr_bias=lr_bias, lr_weight=lr_weight,
                   lr_norm_weight=lr_norm_weight, precision=_number(metrics, "precision"),
                   recall=_number(metrics, "recall"), map50=_number(metrics, "map50"),
                   map50_95=_number(metrics, "map50_95"), fitness=_number(metrics, "fitness"),
                   peak_allocated=stats.peak_allocated,
                   images_per_s=stats.images * world_size / max(stats.seconds, 1e-9), epoch_s=stats.seconds)

    def row(self) -> dict[str, float | int | None]:
        """The results.csv row: ``RESULTS_COLUMNS`` (the official column names, then the kit's) to values."""
        return {
            "epoch": self.epoch, "train/box_loss": self.box_loss, "train/cls_loss": self.cls_loss,
            "train/dfl_loss": self.dfl_loss, "lr/pg0": self.lr_bias, "lr/pg1": self.lr_weight,
            "lr/pg2": self.lr_norm_weight, "metrics/precision": self.precision, "metrics/recall": self.recall,
            "metrics/mAP50": self.map50, "metrics/mAP50-95": self.map50_95, "fitness": self.fitness,
            "peak_allocated": self.peak_allocated, "images_per_s": self.images_per_s, "epoch_s": self.epoch_s,
        }


def metric_columns(metrics: Mapping[str, float]) -> dict[str, float | None]:
    """The results.csv metric columns of validation ``metrics`` (keys precision, recall, map50, map50_95, fitness)."""
    return {"metrics/precision": _number(metrics, "precision"), "metrics/recall": _number(metrics, "recall"),
            "metrics/mAP50": _number(metrics, "map50"), "metrics/mAP50-95": _number(metrics, "map50_95"),
            "fitness": _number(metrics, "fitness")}


def append_results(path: Path, record: EpochRecord) -> None:
    """Append one epoch to ``results.csv`` (header written when the file is new; None as an empty cell).

    The file is rewritten whole with the new row through ``files.write_file`` (a results file holds a few
    hundred rows at most): a failed write (a full disk, an interrupt) leaves it as it was.

    Raises:
        DiskFullError: not enough space for the file (checked first, or reported by the write).
    """
    old = path.read_text() if path.is_file() else ""
    write_text_atomically(path, old + _csv_text([record.row()], header=not old))


def write_results(path: Path, rows: Sequence[Mapping[str, object]]) -> None:
    """Replace ``results.csv`` with ``rows`` (``EpochRecord.row()`` dicts; missing columns empty), atomically:
    a resumed run writes the rows its checkpoint recorded, dropping those of epochs it did not keep."""
    write_text_atomically(path, _csv_text(rows, header=True))


def _csv_text(rows: Sequence[Mapping[str, object]], header: bool) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=RESULTS_COLUMNS)
    if header:
        writer.writeheader()
    for row in rows:
        writer.writerow({k: _fmt(row.get(k)) for k in RESULTS_COLUMNS})
    return out.getvalue()


def _number(metrics: Mapping[str, float], key: str) -> float | None:
    value = metrics.get(key)
    return None if value is None else float(value)  # numpy or tensor scalars from a custom validate_fn


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


def read_peak_allocated(device: torch.device) -> int | None:
    """Peak allocated bytes on a CUDA device since the last reset; None on other devices (not measured)."""
    return device_memory_bytes(device, peak=True) if device.type == "cuda" else None


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def bar_text(mean_items: torch.Tensor, peak_allocated: int, images_per_s: float, accumulate: int,
             micro_batch: int) -> str:
    """``box 1.23 cls 4.56 dfl 1.11 mem 3.2G 120 img/s acc 4x16``: the progress-bar postfix."""
    box, cls, dfl = (float(v) for v in mean_items)
    return (f"box {box:.3f} cls {cls:.3f} dfl {dfl:.3f} mem {peak_allocated / 1e9:.3g}G "
            f"{images_per_s:.1f} img/s acc {accumulate}x{micro_batch}")


def write_state(folder: Path, state: str, reason: str | None, epochs_done: int | None, epochs: int | None,
                wall_s: float) -> Path | None:
    """``state.yaml`` of a run folder: ``state`` ("running", "finished", "stopped early", "interrupted",
    "failed"), ``reason`` (what stopped or failed it, one line), the epochs done of the planned, the wall time of
    all the run's parts, when it was written and by which process. A run killed outright leaves "running"
    behind (``yolo9kit.runs`` tells it from a live one by the folder's lock). A failed write is a warning (the
    run's own files matter more) and returns None."""
    import datetime
    import logging
    import os

    record = {"state": state, "reason": reason, "epochs_done": epochs_done, "epochs": epochs,
              "wall_s": round(wall_s, 1), "pid": os.getpid(),
              "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    path = folder / STATE_FILE
    try:
        write_text_atomically(path, dump_record(record))
    except OSError as e:
        logging.getLogger(__name__).warning("%s: not written (%s)", path, e)
        return None
    return path


def read_state(folder: Path) -> dict:
    """``state.yaml`` of a run folder as a dict ({} when it is missing or holds no mapping).

    Raises:
        RecordError: the file is refused (too large, aliases, not YAML), naming it.
    """
    path = folder / STATE_FILE
    value = read_record(path) if path.is_file() else None
    return value if isinstance(value, dict) else {}
