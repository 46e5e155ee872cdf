"""What a run reports: callback records, results.csv, settings.yaml, state.yaml, pictures (docs/training.md)."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import datetime
import functools
import io
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from yolo9kit.config import TrainConfig
from yolo9kit.figure import draw_results, plot_labels, save_figure, show_batch, validation_figure_makers
from yolo9kit.files import dump_record, read_record, write_text_atomically
from yolo9kit.train.optim import base_accumulate, scaled_weight_decay, warmup_batches
from yolo9kit.train.step import Trainer, unwrap

if TYPE_CHECKING:
    from yolo9kit.train.loop import EpochStats

LOGGER = logging.getLogger(__name__)

SETTINGS_FILE = "settings.yaml"
STATE_FILE = "state.yaml"  # running, finished, stopped early, interrupted or failed: what yolo9kit.runs reads
ENDED = ("finished", "stopped early")  # the states of a run that ended on its own: what a seed spread counts
RESULTS_COLUMNS = [
    "epoch", "train/box_loss", "train/cls_loss", "train/dfl_loss", "lr/pg0", "lr/pg1", "lr/pg2",
    "metrics/precision", "metrics/recall", "metrics/mAP50", "metrics/mAP50-95", "fitness",
    "peak_allocated", "images_per_s", "epoch_s", "data_s", "val_s",
]
BATCH_PICTURES = 3  # train_batch0.jpg .. train_batch2.jpg, as the official run folder
_DPI = 100  # ~1000 px wide figures: readable, and cheap enough to redraw results.png after every epoch


@dataclass(frozen=True)
class BatchRecord:
    """What ``on_batch`` receives per trained batch, at each read-back (rank 0; the fields: docs/training.md)."""

    epoch: int
    batch_index: int  # in the epoch
    ni: int  # batch_index + epoch * batches_per_epoch
    optimizer_steps: int  # since the run started, this batch's included
    box_loss: float
    cls_loss: float
    dfl_loss: float
    lr_bias: float  # group 0 (results.csv lr/pg0)
    lr_weight: float  # group 1, decayed
    lr_norm_weight: float  # group 2
    momentum: float
    accumulate_steps: int  # loader batches per optimizer step for this batch
    micro_batch_size: int
    peak_allocated: int | None  # peak CUDA bytes since the epoch started; None on other devices
    images_per_s: float  # since the epoch started, all ranks
    epochs: int = 0  # of the run as they stand (a time budget sets them after the first)


@dataclass(frozen=True)
class EpochRecord:
    """What ``on_epoch_end`` receives (rank 0): the results.csv row as fields, metrics None when not validated."""

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
    fitness: float | None  # what best.pt is chosen by
    peak_allocated: int | None
    images_per_s: float
    epoch_s: float  # training only: validation and checkpoints excluded
    data_s: float = 0.0  # of epoch_s, waiting for the loader's batches (the rest computed)
    val_s: float = 0.0  # the validation after the epoch

    @classmethod
    def from_stats(cls, epoch: int, stats: EpochStats, metrics: Mapping[str, float], world_size: int = 1,
                   val_s: float = 0.0) -> EpochRecord:
        """The record of ``epoch`` from the loop's ``stats`` (this rank's images) and the validation (``val_s``)."""
        return cls(epoch, *(float(v) for v in stats.mean_items), *(float(lr) for lr in stats.lrs),
                   *metric_columns(metrics).values(), peak_allocated=stats.peak_allocated,
                   images_per_s=stats.images * world_size / max(stats.seconds, 1e-9), epoch_s=stats.seconds,
                   data_s=stats.data_seconds, val_s=val_s)

    def row(self) -> dict[str, float | int | None]:
        """The results.csv row: ``RESULTS_COLUMNS`` (the official column names, then the kit's) to values."""
        return {column: getattr(self, f.name) for column, f in zip(RESULTS_COLUMNS, dataclasses.fields(self))}


def metric_columns(metrics: Mapping[str, float]) -> dict[str, float | None]:
    """The results.csv metric columns of validation ``metrics`` (keys precision, recall, map50, map50_95, fitness)."""
    keys = zip(RESULTS_COLUMNS[7:12], ("precision", "recall", "map50", "map50_95", "fitness"))  # metrics/... columns
    # float(): numpy or tensor scalars from a custom validate_fn
    return {column: None if metrics.get(k) is None else float(metrics[k]) for column, k in keys}


def call_back(hooks: Sequence[Any], name: str, value: Any) -> None:
    """``hook.name(value)`` for each hook that has it: the loggers, then ``TrainConfig.callbacks``."""
    for method in filter(None, (getattr(hook, name, None) for hook in hooks)):
        method(value)


def append_results(path: Path, record: EpochRecord) -> None:
    """Append one epoch to ``results.csv``, rewritten whole: a failed write (``DiskFullError``) leaves it as it was."""
    old = path.read_text() if path.is_file() else ""
    write_text_atomically(path, old + _csv_text([record.row()], header=not old))


def write_results(path: Path, rows: Sequence[Mapping[str, object]]) -> None:
    """Replace ``results.csv`` with ``rows`` (``EpochRecord.row()`` dicts), atomically."""
    write_text_atomically(path, _csv_text(rows, header=True))


def _csv_text(rows: Sequence[Mapping[str, object]], header: bool) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=RESULTS_COLUMNS)
    if header:
        writer.writeheader()
    writer.writerows({k: f"{v:.6g}" if isinstance(v := row.get(k), float) else "" if v is None else v
                      for k in RESULTS_COLUMNS} for row in rows)
    return out.getvalue()


def read_results(path: str | Path) -> pd.DataFrame:
    """``results.csv`` of a run (or its folder) as a DataFrame."""
    path = Path(path)
    return pd.read_csv(path / "results.csv" if path.is_dir() else path)


def write_state(folder: Path, state: str, reason: str | None, epochs_done: int | None, epochs: int | None,
                wall_s: float) -> Path | None:
    """``state.yaml``: how the run stands or ended, why, epochs, wall time, when, which process; None if not written."""
    record = {"state": state, "reason": reason, "epochs_done": epochs_done, "epochs": epochs,
              "wall_s": round(wall_s, 1), "pid": os.getpid(),
              "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    path = folder / STATE_FILE
    try:
        write_text_atomically(path, dump_record(record))
    except OSError as e:
        LOGGER.warning("%s: not written (%s)", path, e)
        return None
    return path


def read_state(folder: Path) -> dict:
    """``state.yaml`` of a run folder ({} when there is none); ``RecordError`` naming a refused file."""
    path = folder / STATE_FILE
    value = read_record(path) if path.is_file() else None
    return value if isinstance(value, dict) else {}


def data_record(data: Any) -> str | None:
    """The data path a checkpoint records: absolute, so that a resume works from any folder."""
    return str(Path(data).resolve()) if isinstance(data, (str, Path)) else None


def write_settings(run_dir: Path, config: TrainConfig, trainer: Trainer, data: Any, batches_per_epoch: int,
                   recipe: str, written: list[Path]) -> None:
    """``settings.yaml``: the settings, the resolved step, what training derives from them, the augmentation, the
    loss, the data; rewritten on resume, a failed write a warning; ``written`` receives the file."""
    settings = {
        "model": str(getattr(unwrap(trainer.model), "name", "model")),  # as save_checkpoint names it
        "train_config": config.to_dict(), "step": trainer.step.to_dict(),
        "derived": {"device": str(trainer.device), "world_size": trainer.world_size,
                    "batches_per_epoch": batches_per_epoch, "accumulate_steps": base_accumulate(config),
                    "weight_decay": scaled_weight_decay(config),
                    "warmup_batches": warmup_batches(config, batches_per_epoch),
                    "cpu_threads": torch.get_num_threads(), "recipe": recipe},
        "hyp": config.pipeline.augment_hyp, "loss": dataclasses.asdict(config.optim.loss),
        "data": data if isinstance(data, dict) else data_record(data),
    }
    path = run_dir / SETTINGS_FILE
    try:
        write_text_atomically(path, dump_record(_plain(settings)))
    except OSError as e:
        LOGGER.warning("%s: not written (%s); training goes on", path, e)
        return
    if path not in written:
        written.append(path)


def _plain(value: Any) -> Any:
    """Numbers, strings, lists and dicts only (what ``yaml.safe_dump`` writes); anything else by its name."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    return getattr(value, "__name__", None) or str(value)


class RunPictures:
    """The run folder's pictures (``TrainConfig.plots``) into ``run_dir`` (None: none), boxes and axes labelled
    with the class ``names``; ``written`` receives each file. A picture that fails is a warning naming it."""

    def __init__(self, run_dir: Path | None, names: Sequence[str] | Mapping[int, str] | None, written: list[Path]):
        self.run_dir, self.written = run_dir, written
        if isinstance(names, Mapping):  # {id: name} as in a data.yaml
            names = [str(names[k]) for k in sorted(names)]
        self.names = list(names) if names is not None else None
        self.pending: list[tuple[int, tuple]] = []  # (index, first images of a batch) to draw after the epoch

    def draw(self, name: str, make: Callable[[], Any]) -> None:
        """Save ``make()`` (a figure) as ``run_dir/name``; on any error a warning naming it."""
        path, figure = self.run_dir / name, None
        try:
            figure = make()
            save_figure(figure, path, _DPI)  # in one step: a failed save keeps the previous picture
            if path not in self.written:
                self.written.append(path)
        except Exception as e:  # noqa: BLE001 - any plotting error: the picture is lost, the run is not
            LOGGER.warning("%s: picture not drawn (%s: %s); training goes on without it", path, type(e).__name__, e)
        finally:
            with contextlib.suppress(Exception):  # frees it now, not at the next garbage collection
                figure.clear()

    def labels(self, loader: Iterable) -> None:
        """``labels.jpg`` from the training dataset's labels; a resumed run keeps the one it started with."""
        labels = getattr(getattr(loader, "dataset", None), "labels", None)
        if self.run_dir is not None and labels is not None and not (self.run_dir / "labels.jpg").exists():
            self.draw("labels.jpg", lambda: plot_labels(labels, self.names))

    def batches(self, loader: Iterable, epoch: int) -> Iterator:
        """The batches of ``epoch``; of the first, copies of the first ones are kept to draw after the epoch."""
        for i, batch in enumerate(loader):
            if self.run_dir is not None and epoch == 0 and i < BATCH_PICTURES:
                try:  # copies: the loop may reuse or change the batch
                    images, targets = batch[0][:16], batch[1][batch[1][:, 0] < 16]
                    self.pending.append((i, tuple(x.clone() if hasattr(x, "clone") else x.copy()
                                                  for x in (images, targets))))
                except Exception as e:  # noqa: BLE001 - a batch the picture cannot read is still trained on
                    LOGGER.warning("%s: picture not drawn (%s: %s); training goes on without it",
                                   self.run_dir / f"train_batch{i}.jpg", type(e).__name__, e)
            yield batch

    def epoch_end(self, rows: list[dict]) -> None:
        """After an epoch: the batches kept in it, and ``results.png`` from the results rows so far."""
        pending, self.pending = self.pending, []
        for i, batch in pending:
            self.draw(f"train_batch{i}.jpg", functools.partial(show_batch, batch, self.names, tile_inches=2.5,
                                                                title=f"training batch {i}"))
        if self.run_dir is not None and rows:
            self.draw("results.png", lambda: draw_results(pd.DataFrame(rows)))

    def validation(self, result: Any, custom: bool) -> None:
        """The confusion matrix and PR, F1, P, R curves of the last default validation (``custom``: none kept)."""
        if self.run_dir is None or result is None:
            if self.run_dir is not None and custom:
                LOGGER.info("no validation pictures: a custom validation function keeps no ValResult")
            return
        names = self.names or result.names
        for name, make in validation_figure_makers(result.confusion_matrix, result.ap_result, names).items():
            self.draw(name, make)
