"""The run folder: where a run starts or resumes, what a resume may change, the leftovers of killed writes,
and room on the disk for an epoch's checkpoints (docs/training.md, the run folder; docs/faults.md)."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yolo9kit.config import TrainConfig
from yolo9kit.config.declare import KEEP, declarations
from yolo9kit.config.recipe import choose_recipe
from yolo9kit.files import (
    FolderInUseError,
    FolderLock,
    RecordError,
    check_free_space,
    read_record,
    remove_stale_temporaries,
)
from yolo9kit.train import ddp
from yolo9kit.train.loggers import RunLoggers, check_loggers
from yolo9kit.train.records import read_state, write_results, write_state
from yolo9kit.train.state import checkpoint_bytes, find_resume_checkpoint, increment_path, run_dir_of
from yolo9kit.train.step import Trainer, unwrap

LOGGER = logging.getLogger(__name__)

# TrainConfig fields a resumed run keeps (declared resume=KEEP): they decide the data order, the schedule, the
# loss or what is trained, so a change would silently give a run that is neither the old one nor a new one.
# The others (epochs, patience, device, workers, cache, validation, the speed and memory switches) may change.
FIXED_ON_RESUME = tuple(name for name, (_, declared) in declarations(TrainConfig).items() if declared.resume == KEEP)
# Room for a results.csv row, auto_batch.json and the file system's own blocks, besides the checkpoints.
_SMALL_FILES_BYTES = 1 << 20


@dataclass
class RunFolder:
    """Where a run writes. ``path`` is None on the ranks that do not write (DDP rank > 0)."""

    path: Path | None
    ckpt: dict | None = None  # the checkpoint resumed from
    checkpoint: Path | None = None  # its file
    new: bool = False  # made by this run: removed again when the run fails before writing into it
    made: Path | None = None  # the topmost folder this run created (the project folder too, when it was new)
    # settings.yaml, auto_batch.json and the pictures this run wrote: removed with a new folder when the run
    # fails before its first checkpoint (a failed start leaves nothing behind)
    files: list[Path] = field(default_factory=list)
    lock: FolderLock | None = None  # held while the run writes (one process per run folder)
    recipe: str = ""  # which recipe the run trains with and why (settle_settings), for settings.yaml
    started: float = field(default_factory=time.monotonic)  # this process's part of the wall time
    earlier_s: float = 0.0  # the wall time of the parts before a resume (from their state.yaml)
    loggers: RunLoggers = field(default_factory=RunLoggers)  # opened with settings.yaml, closed with state.yaml
    begun: bool = False  # its checks passed and it writes into the folder (``begin``)

    def begin(self) -> None:
        """Once every check passed (rank 0): the temporary files of killed saves removed, a resumed run's
        results.csv rewritten from the rows its last.pt recorded (an earlier run's set aside), state.yaml
        "running"."""
        if self.path is None:
            return
        for folder in (self.path, self.path / "weights"):
            remove_stale_temporaries(folder)
        if self.ckpt is not None:
            _reconcile_results(self.path / "results.csv", self.ckpt)
            try:  # a damaged state.yaml never blocks a resume: it is rewritten now
                wall_s = read_state(self.path).get("wall_s") or 0.0
                self.earlier_s = wall_s if isinstance(wall_s, (int, float)) else 0.0
            except RecordError:
                pass
        elif not self.new:
            _set_aside_results(self.path / "results.csv")
        self.begun = True
        record_state(self, "running")


def open_run(config: TrainConfig, dist: ddp.DistInfo) -> RunFolder:
    """The checkpoint to resume (or None) and the run folder; rank 0 creates it (``weights/`` comes with the
    first save, so a run that fails early leaves no empty weights folder) and holds its lock (``FolderLock``:
    a second run into the same folder, e.g. two ``--exist-ok`` runs at once, is refused naming the first).
    Nothing the folder holds changes before ``RunFolder.begin``: a run refused by its checks leaves it as it was.

    Raises:
        FolderInUseError: another live process writes into the run folder.
    """
    if config.run.resume:
        from yolo9kit.checkpoint import read_checkpoint

        path = find_resume_checkpoint(config.run.resume, config.run.project)
        run = RunFolder(run_dir_of(path), read_checkpoint(path), path)
    else:
        where = config.run
        run_dir = increment_path(Path(where.project) / where.name, where.exist_ok) if dist.is_main else None
        run = RunFolder(ddp.broadcast_object(run_dir, dist))
    if not dist.is_main:
        return RunFolder(None, run.ckpt, run.checkpoint)
    run.new = not run.path.exists()
    run.made = _first_missing(run.path)
    run.path.mkdir(parents=True, exist_ok=True)
    try:
        run.lock = FolderLock(run.path, "a training run").acquire()  # before anything in the folder is touched
    except FolderInUseError:
        if run.new:
            run.path.rmdir()
        raise
    return run


def record_state(run: RunFolder, state: str, reason: str | None = None, epochs_done: int | None = None,
                 epochs: int | None = None) -> None:
    """``state.yaml`` with the wall time of all the run's parts, once the run has begun (a refused run leaves it)."""
    if run.path is None or not run.begun or not run.path.is_dir():
        return
    path = write_state(run.path, state, reason, epochs_done, epochs, run.earlier_s + time.monotonic() - run.started)
    if path is not None and run.new and path not in run.files:
        run.files.append(path)


def _set_aside_results(path: Path) -> None:
    """A new run in an existing folder (``exist_ok``) starts its own results.csv; the earlier one is kept as
    ``results.previous.csv`` (else its rows would be continued by this run's epochs as one run)."""
    if not path.is_file():
        return
    kept = path.with_name("results.previous.csv")
    path.replace(kept)
    LOGGER.warning("%s is an earlier run's: kept as %s, this run writes its own", path, kept.name)


def _first_missing(path: Path) -> Path | None:
    """The topmost of ``path`` and its parents that does not exist yet (None: it exists)."""
    missing = [p for p in [path, *path.parents] if not p.exists()]
    return missing[-1] if missing else None


def _reconcile_results(path: Path, ckpt: dict) -> None:
    """results.csv := the rows last.pt recorded (a crash after a row and before last.pt leaves one too many)."""
    rows = ckpt.get("results")
    if rows is None or (not rows and not path.exists()):  # a checkpoint of an older kit: nothing to go by
        return
    before = _count_rows(path)
    write_results(path, rows)
    if before is not None and before != len(rows):
        LOGGER.warning("%s: %d rows, the checkpoint records %d epochs: rewritten from the checkpoint", path, before,
                       len(rows))


def _count_rows(path: Path) -> int | None:
    try:
        return max(len(path.read_text().splitlines()) - 1, 0)
    except OSError:
        return None


def close_run(run: RunFolder, interrupted_by: str | None = None, epochs_done: int | None = None,
              epochs: int | None = None) -> None:
    """After a run that returned: how it ended in ``state.yaml``, its loggers closed, then its lock released."""
    state = "interrupted" if interrupted_by else "finished" if epochs_done == epochs else "stopped early"
    record_state(run, state, interrupted_by or ("patience" if state == "stopped early" else None), epochs_done,
                 epochs)
    try:
        run.loggers.close(state)
    finally:  # also when Ctrl-C ends the loggers' wait
        if run.lock is not None:
            run.lock.release()


def close_failed(run: RunFolder, error: BaseException) -> None:
    """After a failed run: remove an empty ``weights/``, and the run folder when this run made it and it is empty
    (the loggers are closed and the lock released first); a begun run's folder says why in ``state.yaml``."""
    if run.path is None:
        return
    state = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
    try:
        run.loggers.close(state)
    finally:  # also when Ctrl-C ends the loggers' wait
        if run.lock is not None:
            run.lock.release()
    weights = run.path / "weights"
    if run.new and not (weights.is_dir() and any(weights.iterdir())):
        for path in run.files:
            path.unlink(missing_ok=True)
    folders = [run.path / "weights"]
    if run.new and run.made is not None:  # the run folder and the parents this run made (runs/train/)
        folders += [run.path, *(p for p in run.path.parents if run.made == p or run.made in p.parents)]
    for folder in folders:
        try:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        except OSError:  # not ours to insist on: the error that ended the run matters more
            pass
    reason = f"{type(error).__name__}: {error}".splitlines()[0][:300] if str(error) else type(error).__name__
    record_state(run, state, reason)


def settle_settings(config: TrainConfig, run: RunFolder, images: int | None) -> TrainConfig:
    """The settings the run trains with: its recipe decided for ``images`` training images (``choose_recipe``;
    a resumed run keeps its own), said in the log and in settings.yaml; the loggers and a resume checked."""
    config, run.recipe = choose_recipe(config, images, run.ckpt.get("train_config", {}) if run.ckpt else None)
    if run.path is not None:
        LOGGER.info("%s", run.recipe)  # the first line of a run's output
        LOGGER.info("run folder %s", run.path)
        check_loggers(config)
    if run.ckpt is not None:
        check_resume(config, run)
    if config.optim.label_smoothing:
        LOGGER.warning("label_smoothing=%g changes nothing: the official dual loss computes smoothed BCE targets "
                       "and never uses them, and the kit follows it (docs/training.md)", config.optim.label_smoothing)
    return config


def check_resume(config: TrainConfig, run: RunFolder) -> None:
    """Refuse a resumed run whose ``config`` changes what cannot change mid-run (``FIXED_ON_RESUME``); accept
    a new ``epochs`` of at least the epochs done.

    A larger ``epochs`` extends the run, also a finished one: the learning rate then follows the schedule of
    the new total from the epoch reached (official train_dual.py evaluates its LambdaLR from ``epochs`` the
    same way, so the rate jumps to the new curve), and ``close_mosaic`` counts from the new end.

    Raises:
        ValueError: the changed fields (old and new values) or an ``epochs`` below the epochs done.
    """
    ckpt, path = run.ckpt or {}, run.checkpoint
    saved = ckpt.get("train_config", {})
    ours = config.to_dict()
    try:  # the saved values in today's form (an older run's loss None is the official LossConfig)
        theirs = {k: v for k, v in TrainConfig.from_dict(saved).to_dict().items() if k in saved}
    except (TypeError, ValueError):
        theirs = saved
    changed = [f"{k} {saved[k]!r} -> {ours[k]!r}" for k in FIXED_ON_RESUME
               if k in theirs and not (k == "batch_size" and ours[k] == "auto") and ours[k] != theirs[k]]
    if changed:
        raise ValueError(f"resume {path}: {', '.join(changed)}: these cannot change in the middle of a run; "
                         "resume with the run's settings (TrainConfig.from_dict(read_checkpoint(path)"
                         "['train_config'], resume=path, epochs=...)) or start a new run from its weights")
    done = int(ckpt.get("progress", {}).get("epoch", 0))
    if config.epochs < done:
        raise ValueError(f"resume {path}: epochs={config.epochs}, but the run has trained {done} epochs already; "
                         f"pass epochs of at least {done} (more to train further)")
    if config.epochs == done:
        LOGGER.info("%s: all %d epochs are trained, nothing to resume; pass a larger epochs to train more", path,
                    done)
    elif config.epochs != saved.get("epochs", config.epochs):
        LOGGER.info("%s: training to %d epochs instead of %d; the learning rate follows the schedule of %d epochs "
                    "from epoch %d", path, config.epochs, saved["epochs"], config.epochs, done + 1)


def check_resume_model(model: Any, run: RunFolder) -> None:
    """The model to resume must predict the run's classes, under the run's names, and be the one its folder's
    settings.yaml names (a last.pt copied from another run is refused).

    Raises:
        ValueError: another number of classes, other names or another model (both named).
    """
    saved = (run.ckpt or {}).get("model_config") or {}
    try:
        trains = read_record(run.path / SETTINGS_FILE).get("model") if run.path else None
    except (OSError, ValueError, AttributeError):  # none (an older kit's run), or damaged (RecordError)
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
    """The data of a resumed run: the recorded one when ``data`` is None; a path must name the recorded file
    (moved data is accepted when the recorded file is gone).

    Raises:
        ValueError: another data.yaml than the run's.
    """
    recorded = (run.ckpt or {}).get("data")
    if data is None or recorded is None or not isinstance(data, (str, Path)):
        return recorded if data is None else data
    if Path(recorded).exists() and Path(data).resolve() != Path(recorded).resolve():
        raise ValueError(f"resume {run.checkpoint}: the run trains on {recorded}, not {data}: the data cannot "
                         "change in the middle of a run (leave it out, or start a new run from the weights)")
    return data


def training_images(data: Any, loader: Any = None) -> int | None:
    """Training images per epoch: the given loader's dataset, else the data.yaml's train split (None: unknown,
    or the split cannot be listed; the loader built from it then says why)."""
    if loader is not None:
        dataset = getattr(loader, "dataset", None)
        return len(dataset) if hasattr(dataset, "__len__") else None
    if data is None:
        return None
    from yolo9kit.data import load_data_config

    try:
        return len(load_data_config(data).images("train"))
    except (KeyError, OSError, ValueError):
        return None


def data_record(data: Any) -> str | None:
    """The data path a checkpoint records: absolute, so that a resume works from any folder."""
    return str(Path(data).resolve()) if isinstance(data, (str, Path)) else None


def epoch_files(config: TrainConfig, epoch: int, best: bool) -> list[str]:
    """The checkpoints an epoch ends with, in the order they are written (last.pt last: the commit point).

    ``save_period`` N > 0: epoch<e>.pt for the 0-based epochs e with e % N == 0 (0, N, 2N, ...), the official
    rule and names (train_dual.py saves ``epoch{epoch}.pt`` when ``epoch % save_period == 0``)."""
    period = config.run.save_period > 0 and epoch % config.run.save_period == 0
    return ["best.pt"] * best + [f"epoch{epoch}.pt"] * period + ["last.pt"]


def earns_best(fitness: float | None, best_fitness: float, run_dir: Path | None) -> bool:
    """Does an epoch's fitness earn best.pt? Above the best so far; equal to it when positive (official ties);
    a fitness of 0 (nothing detected: an untrained or broken model) only when there is no best.pt yet."""
    if fitness is None:
        return False
    have_best = run_dir is not None and (run_dir / "weights" / "best.pt").exists()
    return fitness > best_fitness or (fitness == best_fitness and (fitness > 0 or not have_best))


def check_space_for_epoch(run_dir: Path, trainer: Trainer, names: list[str]) -> None:
    """Before training an epoch: is there room for the checkpoints it ends with (``names``, written in that
    order, each through a temporary file)? The peak is one temporary file plus the files new so far.

    Raises:
        DiskFullError: naming the folder and the space needed; nothing has been written.
    """
    weights = run_dir / "weights"
    size = checkpoint_bytes(trainer)
    new_before_last = sum(not (weights / name).exists() for name in names[:-1])
    needed = size * (1 + new_before_last) + _SMALL_FILES_BYTES
    check_free_space(weights, needed, f"the checkpoints of the next epoch ({', '.join(names)}, "
                     f"about {size / 1e6:.3g} MB each)")


SETTINGS_FILE = "settings.yaml"


def write_settings(run: RunFolder, config: TrainConfig, trainer: Trainer, data: Any, batches_per_epoch: int) -> None:
    """``settings.yaml``: the settings the run trains with, as a person reads them back.

    ``train_config`` is ``TrainConfig.to_dict()`` (an automatic batch resolved); ``step`` the training step
    resolved for the device (amp, the speed switches); ``derived`` what the training computes from them (the
    accumulation after warmup, the scaled weight decay, the warmup batches, which recipe and why); ``hyp`` the
    augmentation and ``loss`` the loss settings in effect, defaults included; ``data`` the data.yaml. Rewritten
    when a run resumes (its settings may change there: epochs, patience, device, ...). A failed write is a warning.
    """
    if run.path is None:
        return
    import torch

    from yolo9kit.files import dump_record, write_text_atomically
    from yolo9kit.train.optim import base_accumulate, scaled_weight_decay, warmup_batches

    step = trainer.step.to_dict() if getattr(trainer, "step", None) is not None else None
    settings = {
        "model": str(getattr(unwrap(trainer.model), "name", "model")),  # as save_checkpoint names it
        "train_config": config.to_dict(), "step": step,
        "derived": {"device": str(trainer.device), "world_size": trainer.world_size,
                    "batches_per_epoch": batches_per_epoch, "accumulate_steps": base_accumulate(config),
                    "weight_decay": scaled_weight_decay(config),
                    "warmup_batches": warmup_batches(config, batches_per_epoch),
                    "cpu_threads": torch.get_num_threads(), "recipe": run.recipe},
        "hyp": config.pipeline.augment_hyp, "loss": dataclasses.asdict(config.optim.loss),
        "data": data if isinstance(data, dict) else data_record(data),
    }
    path = run.path / SETTINGS_FILE
    try:
        write_text_atomically(path, dump_record(_plain(settings)))
    except OSError as e:
        LOGGER.warning("%s: not written (%s); training goes on", path, e)
        return
    if path not in run.files:
        run.files.append(path)


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
