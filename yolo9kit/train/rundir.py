"""The run folder: start or resume, the checks before it writes, loggers, the end, room for checkpoints."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from yolo9kit.config import TrainConfig
from yolo9kit.config.recipe import choose_recipe
from yolo9kit.config.step import KEEP, settings
from yolo9kit.data import load_data_config
from yolo9kit.env import load_extra
from yolo9kit.files import FolderInUseError, FolderLock, check_free_space, read_record, remove_stale_temporaries
from yolo9kit.models.checkpoint import estimate_checkpoint_bytes, read_checkpoint
from yolo9kit.train.records import SETTINGS_FILE, call_back, read_state, write_results, write_state
from yolo9kit.train.state import DistInfo, broadcast_object, find_resume_checkpoint, increment_path
from yolo9kit.train.step import Trainer, unwrap

LOGGER = logging.getLogger(__name__)

# The settings a resumed run keeps (declared resume=KEEP): the data order, the schedule, the loss, what is trained.
FIXED_ON_RESUME = tuple(name for name, (_, _, declared) in settings(TrainConfig).items() if declared.resume == KEEP)
_SMALL_FILES_BYTES = 1 << 20  # room for a results.csv row, auto_batch.json and the file system's own blocks


@dataclass
class RunFolder:
    """Where a run writes. ``path`` is None on the ranks that do not write (DDP rank > 0)."""

    path: Path | None
    ckpt: dict | None = None  # the checkpoint resumed from
    checkpoint: Path | None = None  # its file
    made: Path | None = None  # the topmost folder this run created (the project folder too), None: it existed
    files: list[Path] = field(default_factory=list)  # written by this run: removed with a new folder on a failed start
    lock: FolderLock | None = None  # held while the run writes (one process per run folder)
    recipe: str = ""  # which recipe and why (settle_settings), for settings.yaml
    started: float = field(default_factory=time.monotonic)  # this process's part of the wall time
    earlier_s: float = 0.0  # the wall time of the parts before a resume (their state.yaml)
    loggers: list[Any] = field(default_factory=list)  # the logger classes of TrainConfig.loggers (entry points)
    callbacks: list[Any] = field(default_factory=list)  # the started loggers, then TrainConfig.callbacks
    begun: bool = False  # its checks passed and it writes into the folder (``begin``)

    def begin(self) -> None:
        """Once every check passed: killed saves' temporaries removed, a resumed run's results.csv rewritten from
        its last.pt (a new run's predecessor kept as results.previous.csv), state.yaml "running". Rank 0 only."""
        for folder in (self.path, self.path / "weights"):
            remove_stale_temporaries(folder)
        results = self.path / "results.csv"
        if self.ckpt is not None:
            rows = self.ckpt.get("results") or []
            before = max(len(results.read_text().splitlines()) - 1, 0) if results.is_file() else None
            if rows or results.exists():
                write_results(results, rows)  # a crash after a row and before last.pt leaves one too many
            if before is not None and before != len(rows):
                LOGGER.warning("%s: %d rows, the checkpoint records %d epochs: rewritten from the checkpoint", results,
                               before, len(rows))
            with contextlib.suppress(ValueError):  # a damaged state.yaml (RecordError) never blocks a resume
                wall_s = read_state(self.path).get("wall_s") or 0.0
                self.earlier_s = wall_s if isinstance(wall_s, (int, float)) else 0.0
        elif self.made is None and results.is_file():
            results.replace(results.with_name("results.previous.csv"))
            LOGGER.warning("%s is an earlier run's: kept as results.previous.csv, this run writes its own", results)
        self.begun = True
        record_state(self, "running")


def open_run(config: TrainConfig, dist: DistInfo) -> RunFolder:
    """The run folder (rank 0 creates and locks it: ``FolderInUseError`` when another live process writes into
    it; nothing in it changes before ``begin``) and its checkpoint."""
    if config.run.resume:
        path = find_resume_checkpoint(config.run.resume, config.run.project)
        run_dir = path.parent.parent if path.parent.name == "weights" else path.parent
        run = RunFolder(run_dir, read_checkpoint(path), path)
    else:
        where = config.run
        run_dir = increment_path(Path(where.project) / where.name, where.exist_ok) if dist.is_main else None
        run = RunFolder(broadcast_object(run_dir, dist))
    if not dist.is_main:
        return RunFolder(None, run.ckpt, run.checkpoint)
    run.made = _first_missing(run.path)  # new: removed again when the run fails before writing into it
    run.path.mkdir(parents=True, exist_ok=True)
    try:
        run.lock = FolderLock(run.path, "a training run").acquire()  # before anything in the folder is touched
    except FolderInUseError:
        if run.made is not None:
            run.path.rmdir()
        raise
    return run


def _first_missing(path: Path) -> Path | None:
    """The topmost of ``path`` and its parents that does not exist yet (None: it exists)."""
    missing = [p for p in [path, *path.parents] if not p.exists()]
    return missing[-1] if missing else None


def record_state(run: RunFolder, state: str, reason: str | None = None, epochs_done: int | None = None,
                 epochs: int | None = None) -> None:
    """``state.yaml`` with the wall time of all the run's parts, once the run has begun."""
    if not run.begun or not run.path.is_dir():  # begun: rank 0 only
        return
    path = write_state(run.path, state, reason, epochs_done, epochs, run.earlier_s + time.monotonic() - run.started)
    if path is not None and run.made is not None and path not in run.files:
        run.files.append(path)


def close_run(run: RunFolder, state: str, reason: str | None = None, epochs_done: int | None = None,
              epochs: int | None = None) -> None:
    """How the run ended in state.yaml, ``on_run_end``, the lock released."""
    record_state(run, state, reason, epochs_done, epochs)
    try:
        call_back(run.callbacks, "on_run_end", state)
    finally:  # also when Ctrl-C ends a logger's wait
        if run.lock is not None:
            run.lock.release()


def close_failed(run: RunFolder, error: BaseException) -> None:
    """After a failed run: as ``close_run``; a new folder without weights is removed with what the run wrote."""
    if run.path is None:
        return
    reason = f"{type(error).__name__}: {error}".splitlines()[0][:300] if str(error) else type(error).__name__
    close_run(run, "interrupted" if isinstance(error, KeyboardInterrupt) else "failed", reason)
    weights = run.path / "weights"
    if run.made is not None and not (weights.is_dir() and any(weights.iterdir())):
        for path in run.files:
            path.unlink(missing_ok=True)
    folders = [weights]
    if run.made is not None:  # the run folder and the parents this run made (runs/train/)
        folders += [run.path, *(p for p in run.path.parents if run.made == p or run.made in p.parents)]
    for folder in folders:
        with contextlib.suppress(OSError):  # not ours to insist on: the error that ended the run matters more
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()


def settle_settings(config: TrainConfig, run: RunFolder, images: int | None) -> TrainConfig:
    """The settings the run trains with (its recipe for ``images`` training images, a resumed run's own) and its
    loggers; a resume may change no ``FIXED_ON_RESUME`` setting (docs/training.md, resume). A ValueError names a
    logger that is not installed, the changed fields or an ``epochs`` below the epochs done."""
    ckpt, path = run.ckpt, run.checkpoint
    saved = ckpt.get("train_config", {}) if ckpt is not None else None
    config, run.recipe = choose_recipe(config, images, saved)
    if run.path is not None:
        LOGGER.info("%s", run.recipe)  # the first line of a run's output
        LOGGER.info("run folder %s", run.path)
        run.loggers = [load_extra("yolo9kit.loggers", name, name, package=name) for name in config.run.loggers]
        if config.run.mlflow_uri and "mlflow" not in config.run.loggers:
            LOGGER.warning("mlflow_uri %s: nothing is logged there without loggers=('mlflow',) (--loggers mlflow)",
                           config.run.mlflow_uri)
    if ckpt is None:
        return config
    changed = [f"{k} {old!r} -> {new!r}" for k, (old, new) in resume_conflicts(saved, config).items()]
    if changed:
        raise ValueError(f"resume {path}: {', '.join(changed)}: these cannot change in the middle of a run; "
                         "resume with the run's settings (TrainConfig.from_dict(read_checkpoint(path)"
                         "['train_config'], resume=path, epochs=...)) or start a new run from its weights")
    done = int(ckpt.get("progress", {}).get("epoch", 0))
    if config.epochs < done:
        raise ValueError(f"resume {path}: epochs={config.epochs}, but the run has trained {done} epochs already; "
                         f"pass epochs of at least {done} (more to train further)")
    if config.epochs == done:
        LOGGER.info("%s: all %d epochs are trained, nothing to resume; pass a larger epochs to train more", path, done)
    elif config.epochs != saved.get("epochs", config.epochs):
        LOGGER.info("%s: training to %d epochs instead of %d; the learning rate follows the schedule of %d epochs "
                    "from epoch %d", path, config.epochs, saved["epochs"], config.epochs, done + 1)
    return config


def resume_conflicts(saved: dict, config: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """{setting: (the run's ``saved`` value, ``config``'s)} for each setting a resume keeps (``FIXED_ON_RESUME``)
    that ``config`` changes (the train command asks it too); an automatic batch size is the run's."""
    ours, theirs = config.to_dict(), TrainConfig.from_dict(saved).to_dict()  # theirs: in today's form
    return {k: (saved[k], ours[k]) for k in FIXED_ON_RESUME
            if k in saved and ours[k] != theirs[k] and not (k == "batch_size" and ours[k] == "auto")}


def check_resume_model(model: Any, run: RunFolder) -> None:
    """ValueError unless ``model`` predicts the run's classes by name and is its settings.yaml's model."""
    saved = (run.ckpt or {}).get("model_config") or {}
    try:
        trains = read_record(run.path / SETTINGS_FILE).get("model") if run.path else None
    except (OSError, ValueError, AttributeError):  # none, or damaged (RecordError)
        trains = None
    if trains is not None and saved.get("name") is not None and saved["name"] != trains:
        raise ValueError(f"resume {run.checkpoint}: it holds a {saved['name']} model, but the run in {run.path} "
                         f"trains {trains} (its {SETTINGS_FILE}): a checkpoint of another run; resume the run's own "
                         f"last.pt, or start a new run from this one (--weights {run.checkpoint})")
    nc, names = saved.get("nc"), saved.get("names")
    ours_nc, ours_names = getattr(model, "nc", None), list(getattr(model, "names", []) or [])
    if nc is not None and ours_nc is not None and int(ours_nc) != int(nc):
        raise ValueError(f"resume {run.checkpoint}: the model predicts {ours_nc} classes, the run {nc}: resume with "
                         "the run's model (the command line rebuilds it from the checkpoint)")
    if names is not None and ours_names and list(names) != ours_names:
        raise ValueError(f"resume {run.checkpoint}: the model's class names {ours_names[:5]} are not the run's "
                         f"{list(names)[:5]}: resume with the run's model")


def resume_data(data: Any, run: RunFolder) -> Any:
    """The data of a resumed run: the recorded one when ``data`` is None; a path names it (or it moved), and
    another data.yaml than the run's is a ValueError."""
    recorded = (run.ckpt or {}).get("data")
    if data is None or recorded is None or not isinstance(data, (str, Path)):
        return recorded if data is None else data
    if Path(recorded).exists() and Path(data).resolve() != Path(recorded).resolve():
        raise ValueError(f"resume {run.checkpoint}: the run trains on {recorded}, not {data}: the data cannot "
                         "change in the middle of a run (leave it out, or start a new run from the weights)")
    return data


def training_images(data: Any, loader: Any = None) -> int | None:
    """Training images per epoch: the given loader's dataset, else the data.yaml's train split (None: unknown)."""
    if loader is not None:
        dataset = getattr(loader, "dataset", None)
        return len(dataset) if hasattr(dataset, "__len__") else None
    try:
        return None if data is None else len(load_data_config(data).images("train"))
    except (KeyError, OSError, ValueError):  # the loader built from it says why
        return None


def class_names(data, single_cls: bool = False) -> list[str]:
    """The data.yaml's class names; with ``single_cls`` one, named "item" unless the data has a single name."""
    names = list(load_data_config(data).names)
    return (names if len(names) == 1 else ["item"]) if single_cls else names


def check_classes(model: Any, data, single_cls: bool = False) -> None:
    """ValueError unless ``model`` predicts as many classes as ``data`` (one with ``single_cls``), saying how."""
    if data is None or not hasattr(model, "nc"):
        return
    names = class_names(data, single_cls)
    if int(model.nc) != len(names):
        how = "names=class_names(data, single_cls=True)" if single_cls else f"num_classes={len(names)}"
        raise ValueError(f"{'single_cls: ' if single_cls else ''}the model predicts {model.nc} classes but {data} has "
                         f"{len(names)} ({names[:5]}): build it with create_model(name, {how}) or pass the model name "
                         "to fit")


def epoch_files(config: TrainConfig, epoch: int, best: bool, period: bool = True) -> list[str]:
    """The checkpoints an epoch ends with, last.pt (the commit point) last; epoch<e>.pt when ``period`` and due."""
    period = period and config.run.save_period > 0 and epoch % config.run.save_period == 0
    return ["best.pt"] * best + [f"epoch{epoch}.pt"] * period + ["last.pt"]


def check_space_for_epoch(run_dir: Path, trainer: Trainer, names: list[str]) -> None:
    """Room for the checkpoints ``names`` an epoch ends with: one temporary file plus the files new so far (else a
    DiskFullError naming the folder and the space needed, before anything is written)."""
    # model, EMA and optimizer state: before the first step SGD's momentum is one copy of the weights, Adam's two
    parts: list = [unwrap(trainer.model).state_dict(), trainer.ema.ema.state_dict() if trainer.ema else {}]
    optimizer = trainer.optimizer
    if optimizer.state:
        parts.append(optimizer.state_dict()["state"])
    else:
        copies = 2 if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) else 1
        parts += [[p for group in optimizer.param_groups for p in group["params"]]] * copies
    weights, size = run_dir / "weights", estimate_checkpoint_bytes(parts)
    needed = size * (1 + sum(not (weights / name).exists() for name in names[:-1])) + _SMALL_FILES_BYTES
    check_free_space(weights, needed, f"the checkpoints of the next epoch ({', '.join(names)}, "
                     f"about {size / 1e6:.3g} MB each)")
