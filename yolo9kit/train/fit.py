"""``fit``: set-up, loaders, the epoch loop, EMA validation, checkpoints, resume, interrupts (docs/faults.md)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from yolo9kit.config import StepConfig, TrainConfig
from yolo9kit.data import create_dataloader, set_mosaic
from yolo9kit.env import resolve_device, set_cpu_threads
from yolo9kit.memory.plan import choose_batch
from yolo9kit.models import create_model
from yolo9kit.train import guards, records, rundir, state
from yolo9kit.train.guards import Interrupted, NonFiniteLossError, NonFiniteWeightsError, StopSignals, stopped_by
from yolo9kit.train.loop import EpochStats, train_one_epoch
from yolo9kit.train.optim import warmup_batches
from yolo9kit.train.records import EpochRecord, RunPictures
from yolo9kit.train.rundir import RunFolder
from yolo9kit.train.state import DistInfo, Progress
from yolo9kit.train.step import Trainer, build_trainer, cudnn_autotune, describe_step, place_model, unwrap
from yolo9kit.validate import evaluate

LOGGER = logging.getLogger(__name__)

ValidateFn = Callable[[nn.Module], Mapping[str, float]]


@dataclass
class FitResult:
    """What ``fit`` returns. ``model`` is the trained model, ``ema`` its EMA (what best.pt/last.pt predict with)."""

    model: nn.Module
    ema: nn.Module | None
    save_dir: Path | None
    epochs_completed: int
    best_fitness: float
    best_epoch: int
    interrupted: bool = False
    results: list[dict] = field(default_factory=list)  # one row per epoch, the columns of results.csv
    optimizer_steps: int = 0
    nonfinite_batches: int = 0
    oom_events: int = 0
    micro_batch_size: int | None = None
    step: StepConfig | None = None  # the step the run trained with (resolved for its device)
    auto_batch: Any = None  # batch_size="auto": the memory.plan.AutoBatch record (also auto_batch.json)
    interrupted_by: str | None = None  # "SIGINT", "SIGTERM", "KeyboardInterrupt" (raised by code); None: not stopped

    @property
    def last(self) -> Path | None:
        return self.save_dir / "weights" / "last.pt" if self.save_dir else None

    @property
    def best(self) -> Path | None:
        return self.save_dir / "weights" / "best.pt" if self.save_dir else None


@dataclass
class _Run:
    """The pieces ``fit`` threads through its helpers."""

    config: TrainConfig
    trainer: Trainer
    progress: Progress
    dist: DistInfo
    folder: RunFolder
    validate_fn: ValidateFn | None
    extra: dict[str, Any]
    results: list[dict] = field(default_factory=list)
    auto_batch: Any = None  # FitResult.auto_batch
    pictures: RunPictures = field(default_factory=lambda: RunPictures(None, None, []))
    val_result: Any = None  # the last ValResult of the default validation (the validation pictures are drawn from it)

    @property
    def run_dir(self) -> Path | None:  # None exactly on the ranks that do not write (DDP rank > 0)
        return self.folder.path


@dataclass
class _Position:
    """Where the epoch loop is: what an interrupt has to save."""

    phase: str = "training"  # "training", "validating", "committing" (writing the epoch's files), "committed"
    epoch: int = 0
    rng_epoch_start: dict | None = None
    stats: EpochStats | None = None
    metrics: dict = field(default_factory=dict)
    val_s: float = 0.0


def fit(model: nn.Module | str, data: str | Path | Mapping | None, config: TrainConfig, *,
        loss_fn: Callable | None = None, train_loader: Iterable | None = None,
        val_loader: Iterable | None = None, validate_fn: ValidateFn | None = None) -> FitResult:
    """Train ``model`` on ``data`` as the official train_dual.py does (docs/training.md).

    Args:
        model: a ``DetectionModel`` (any module with a matching ``loss_fn``), or a name, yaml or checkpoint to build.
        data: data.yaml path or dict; None with both loaders given, or when resuming (the run's data).
        config: the settings; ``config.run.resume`` continues a run from its last.pt.
        loss_fn: ``(outputs, targets) -> (loss, loss_items (3,))``; default ``DetectionLoss``.
        train_loader: a ready training loader (default: built from ``data``).
        val_loader: a ready validation loader (default: built from ``data``).
        validate_fn: ``ema_model -> {"precision", "recall", "map50", "map50_95", "fitness"}``; default ``evaluate``.

    Returns:
        FitResult; after SIGINT, SIGTERM or a ``KeyboardInterrupt``, with ``interrupted_by`` set and last.pt saved.

    Raises:
        NonFiniteLossError: too many non-finite losses in a row, or an epoch of them (last.pt is kept).
        DiskFullError: no room for the next checkpoints (checked before each epoch and each save).
        ValueError: a resume that changes what cannot change, or a model of other classes (named).
    """
    dist = state.current()
    folder = rundir.open_run(config, dist)
    try:
        data = rundir.resume_data(data, folder)  # the data itself for a new run
        config = rundir.settle_settings(config, folder, rundir.training_images(data, train_loader))
        if isinstance(model, (str, Path)):
            names = rundir.class_names(data, config.pipeline.single_cls)
            model = create_model(model, names=names, seed=config.run.seed)
        if folder.ckpt is not None:
            rundir.check_resume_model(model, folder)
        rundir.check_classes(model, data, single_cls=config.pipeline.single_cls)
        run = _set_up(model, data, config, dist, folder, loss_fn, validate_fn)
        if train_loader is None:
            train_loader = make_loader(data, "train", run.config, dist, run.trainer.device)
        if run.validate_fn is None and data is not None and dist.is_main:
            loader = val_loader or make_loader(data, "val", run.config, dist)
            run.validate_fn = functools.partial(_validate_ema, run, data, loader)
        _open_records(run, data, train_loader)  # every check passed: from here on the run writes
        interrupted_by = _epochs(run, train_loader)
    except BaseException as e:
        rundir.close_failed(folder, e)
        if isinstance(e, NonFiniteLossError):  # the loop knows no folder; the message names where last.pt is
            e.run_dir, e.args = folder.path, (e.args[0] + guards.last_good(folder.path),)
            raise e from None
        raise
    trainer, progress = run.trainer, run.progress
    ended = "interrupted" if interrupted_by else "finished" if progress.epoch == run.config.epochs else "stopped early"
    reason = interrupted_by or ("patience" if ended == "stopped early" else None)
    rundir.close_run(folder, ended, reason, progress.epoch, run.config.epochs)  # epochs: a time budget may set them
    return FitResult(unwrap(trainer.model), trainer.ema.ema if trainer.ema else None, folder.path, progress.epoch,
                     progress.best_fitness, progress.best_epoch, interrupted=interrupted_by is not None,
                     results=run.results, optimizer_steps=trainer.optimizer_steps,
                     nonfinite_batches=progress.nonfinite_total, oom_events=trainer.oom_events,
                     micro_batch_size=trainer.micro_batch_size, step=trainer.step, auto_batch=run.auto_batch,
                     interrupted_by=interrupted_by)


def _set_up(model: nn.Module, data, config: TrainConfig, dist: DistInfo, folder: RunFolder,
            loss_fn: Callable | None, validate_fn: ValidateFn | None) -> _Run:
    """The device, the batch, the trainer (restored when resuming) and the run record."""
    set_cpu_threads()  # at most the cores this process may use
    device = resolve_device(f"cuda:{dist.local_rank}" if dist.distributed and torch.cuda.is_available()
                            else config.run.device)
    auto_batch = None
    if config.batch_size == "auto":
        saved = (folder.ckpt or {}).get("train_config", {}).get("batch_size")
        if isinstance(saved, int):  # a resumed run keeps its batch: the data order depends on it
            config = dataclasses.replace(config, batch_size=saved)
        else:
            config, auto_batch = choose_batch(config, unwrap(model), device, dist.world_size, loss_fn=loss_fn)
    state.seed_everything(config.run.seed + dist.rank)
    # frozen, on the device and in the step's layout before DDP, whose buckets follow the trainable parameters
    place_model(model, describe_step(config, model, device, dist.world_size), device)
    model = state.wrap_model(model, dist, device, config.run.sync_bn)
    trainer = build_trainer(model, config, loss_fn=loss_fn, device=device, world_size=dist.world_size)
    progress = state.restore_training_state(folder.ckpt, trainer, folder.checkpoint) if folder.ckpt else Progress()
    return _Run(config, trainer, progress, dist, folder, validate_fn, {"data": records.data_record(data)},
                results=list(folder.ckpt.get("results", [])) if folder.ckpt else [], auto_batch=auto_batch)


def _open_records(run: _Run, data, loader: Iterable) -> None:
    """The run begun: auto_batch.json, settings.yaml, the callbacks (loggers), the pictures (``plots``)."""
    folder, config = run.folder, run.config
    if folder.path is None:  # rank > 0 writes nothing and calls no callback
        return
    folder.begin()
    if run.auto_batch is not None:
        folder.files.append(run.auto_batch.save(folder.path))  # removed with the folder if the run fails early
    nb = len(loader)  # type: ignore[arg-type]
    records.write_settings(folder.path, config, run.trainer, data, nb, folder.recipe, folder.files)
    loggers = [logger(config, folder.path, folder.ckpt is not None, folder.files) for logger in folder.loggers]
    folder.callbacks = [*loggers, SimpleNamespace(**(config.run.callbacks or {}))]  # the loggers read settings.yaml
    if config.run.plots:
        names = getattr(getattr(loader, "dataset", None), "names", None) or \
            getattr(unwrap(run.trainer.model), "names", None)
        run.pictures = RunPictures(folder.path, names, folder.files)
        run.pictures.labels(loader)


def _epochs(run: _Run, loader: Iterable) -> str | None:
    """The epoch loop; returns what interrupted it (``FitResult.interrupted_by``), None when it ran out."""
    config, progress = run.config, run.progress
    if run.folder.ckpt:  # the random states restored last, so that nothing of the set-up consumes them
        state.restore_rng(run.folder.ckpt["rng"], run.trainer.device)
        LOGGER.info("resuming %s in epoch %d of %d", run.run_dir, progress.epoch + 1, config.epochs)
    nb = len(loader)  # type: ignore[arg-type]
    at = _Position(epoch=progress.epoch)
    hooks = [hook for hook in run.folder.callbacks if getattr(hook, "on_batch", None)]
    on_batch = functools.partial(records.call_back, hooks, "on_batch") if hooks else None
    with StopSignals(install=not run.dist.distributed) as signals, \
            cudnn_autotune(run.trainer.device, deterministic=config.run.deterministic):
        try:
            _validate_unvalidated_end(run)
            first, started = progress.epoch, time.monotonic()
            for epoch in itertools.takewhile(lambda e: e < run.config.epochs, itertools.count(first)):
                config, at = run.config, _Position("training", epoch)  # config: a time budget sets its epochs
                progress.epoch = epoch
                if run.run_dir:  # room for the epoch's checkpoints: a full disk costs no epoch
                    names = rundir.epoch_files(config, epoch, run.validate_fn is not None)
                    rundir.check_space_for_epoch(run.run_dir, run.trainer, names)
                set_epoch_data(loader, config, epoch)
                at.rng_epoch_start = state.capture_rng(run.trainer.device)
                batches = run.pictures.batches(loader, epoch)  # keeps the first ones to draw (config.run.plots)
                at.stats = train_one_epoch(run.trainer, batches, config, progress, batches_per_epoch=nb,
                                           warmup=warmup_batches(config, nb), start_batch=progress.ni - epoch * nb,
                                           on_batch=on_batch, interrupt=lambda: signals.received,
                                           progress_bar=run.dist.is_main and config.run.progress_bar)
                at.phase = "validating"  # the epoch is trained: an interrupt from here on keeps it
                if run.auto_batch is not None:
                    run.auto_batch.record_measured_peak(run.trainer.device, at.stats.peak_allocated, run.run_dir)
                start = time.perf_counter()
                with signals.raising():  # validation has no batch to stop at: a signal stops it at once
                    at.metrics = _validate(run, epoch)
                    _fit_the_time(run, epoch, first, started)
                    at.metrics = at.metrics or _validate(run, epoch)  # a time budget that ends the run here
                at.val_s = time.perf_counter() - start
                at.phase = "committing"  # signals wait until the epoch's files are written
                record = _commit(run, at, nb)
                at.phase = "committed"
                stop = _after_epoch(run, epoch, record)
                if signals.received:
                    LOGGER.warning("%s: stopped after epoch %d, saved in last.pt", signals.received, epoch + 1)
                    return signals.received
                if stop:
                    break
            run.pictures.validation(run.val_result, custom=run.validate_fn is not None)  # of the last validation
        except KeyboardInterrupt as e:
            reason = e.reason if isinstance(e, Interrupted) else "KeyboardInterrupt"
            _save_interrupted(run, at, nb, reason)
            return reason
    return None


def _save_interrupted(run: _Run, at: _Position, nb: int, reason: str) -> None:
    """Save what an interrupt at ``at`` leaves (docs/faults.md): in training, last.pt at the start of the unfinished
    accumulation window; in validation, the epoch without metrics; in a commit, the commit."""
    progress = run.progress
    if at.phase == "training":
        progress.ni = max(progress.last_opt_step + 1, progress.epoch * nb)
        LOGGER.warning("%s in epoch %d of %d, after %d of its %d batches: saving last.pt", stopped_by(reason),
                       progress.epoch + 1, run.config.epochs, progress.ni - progress.epoch * nb, nb)
        if run.run_dir:
            _save(run, "last.pt", at.rng_epoch_start)
    elif at.phase == "validating":
        LOGGER.warning("%s during the validation of epoch %d: saving the epoch without its metrics",
                       stopped_by(reason), at.epoch + 1)
        at.metrics = {}
    if at.phase in ("validating", "committing"):  # "committed": a callback's planned stop, last.pt holds the epoch
        _commit(run, at, nb)


def _fit_the_time(run: _Run, epoch: int, first: int, started: float) -> None:
    """``time``: the epochs that fit at the pace so far, after this process's first epoch; later only fewer."""
    config, folder = run.config, run.folder
    if config.time is None:
        return
    now = time.monotonic()
    left = config.time * 3600 - folder.earlier_s - (now - folder.started)  # the earlier parts of a resumed run too
    pace = (now - started) / (epoch + 1 - first)
    epochs = state.broadcast_object(epoch + 1 + max(int(left / pace), 0), run.dist)
    if epochs != config.epochs and (epoch == first or epochs < config.epochs):
        run.config = config.replace(epochs=epochs)
        LOGGER.info("time %.3g h: %.1f s per epoch so far, %.1f min left: %d epochs in all (the learning-rate schedule "
                    "and close_mosaic follow)", config.time, pace, max(left, 0) / 60, epochs)


def _validate(run: _Run, epoch: int) -> dict[str, float]:
    """The EMA's metrics (every epoch with ``config.run.val``, always after the last one); {} when not validated."""
    if not (run.dist.is_main and run.validate_fn and (run.config.run.val or epoch + 1 == run.config.epochs)):
        return {}
    trainer = run.trainer
    return dict(run.validate_fn(trainer.ema.ema if trainer.ema is not None else unwrap(trainer.model)))


def _commit(run: _Run, at: _Position, nb: int) -> EpochRecord:
    """Record the trained epoch in the order no crash breaks (docs/faults.md): memory, checkpoints, results.csv."""
    record = EpochRecord.from_stats(at.epoch, at.stats, at.metrics, run.dist.world_size, at.val_s)
    run.progress.epoch, run.progress.ni = at.epoch + 1, (at.epoch + 1) * nb
    if run.run_dir:
        if not run.results or run.results[-1]["epoch"] != at.epoch:
            run.results.append(record.row())  # plain rows: checkpoints load with weights_only=True
        _keep(run, at.epoch, at.metrics)
        records.append_results(run.run_dir / "results.csv", record)
    return record


def _keep(run: _Run, epoch: int, metrics: dict, period: bool = True) -> None:
    """best.pt when ``metrics`` earn it, epoch<n>.pt (``period``), then last.pt: the commit point. Rank 0 only."""
    fitness, best_so_far = metrics.get("fitness"), run.progress.best_fitness
    # above the best so far; equal when positive (official); 0 (nothing detected) only without a best.pt
    best = fitness is not None and (fitness > best_so_far or fitness == best_so_far and (
        fitness > 0 or not (run.run_dir / "weights" / "best.pt").exists()))
    if best:
        run.progress.best_fitness, run.progress.best_epoch = float(metrics["fitness"]), epoch
    rng = state.capture_rng(run.trainer.device)
    for name in rundir.epoch_files(run.config, epoch, best, period):
        _save(run, name, rng)


def _validate_unvalidated_end(run: _Run) -> None:
    """A run whose last epoch was saved without its metrics (stopped in its validation) is validated on resume."""
    progress, last = run.progress, run.results[-1] if run.results else {}
    if progress.epoch != run.config.epochs or not run.run_dir or run.validate_fn is None or \
            last.get("fitness") is not None or last.get("epoch") != progress.epoch - 1:
        return
    LOGGER.info("epoch %d was saved before its validation finished: validating it now", progress.epoch)
    metrics = _validate(run, progress.epoch - 1)
    last.update(records.metric_columns(metrics))
    _keep(run, progress.epoch - 1, metrics, period=False)
    records.write_results(run.run_dir / "results.csv", run.results)


def _after_epoch(run: _Run, epoch: int, record: EpochRecord) -> bool:
    """The pictures, ``on_epoch_end``, then early stopping on ``patience``; True = stop (all ranks agree)."""
    config, progress = run.config, run.progress
    run.pictures.epoch_end(run.results)  # after the commit: never in the epoch's time
    stop = False
    if run.dist.is_main:
        records.call_back(run.folder.callbacks, "on_epoch_end", record)
        stop = progress.best_epoch >= 0 and epoch - progress.best_epoch >= config.run.patience
        if stop:
            LOGGER.info("early stop: no better fitness for %d epochs (best epoch %d)", config.run.patience,
                        progress.best_epoch + 1)
    return bool(state.broadcast_object(stop, run.dist))


def _save(run: _Run, name: str, rng: dict | None) -> None:
    """One checkpoint of the run; never of non-finite weights (``NonFiniteWeightsError``, nothing written)."""
    trainer = run.trainer
    bad = state.nonfinite_entries({"model": unwrap(trainer.model).state_dict(),
                                   **({"ema": trainer.ema.ema.state_dict()} if trainer.ema is not None else {})})
    if bad:
        raise NonFiniteWeightsError(run.run_dir, f"epoch {run.progress.epoch}, {name}", bad)
    state.save_training_checkpoint(run.run_dir / "weights" / name, trainer, run.progress, run.config.to_dict(),
                                   rng=rng, extra={**run.extra, "results": run.results})


def make_loader(data, split: str, config: TrainConfig, dist: DistInfo, device: torch.device | None = None):
    """The ``split`` loader: train augmented, this rank's part of the batch (colour jitter on ``device`` with
    ``colour_on_device``, default on CUDA); val rect, twice the batch (rank 0 only)."""
    d = config.pipeline
    common = dict(imgsz=config.step.imgsz, workers=d.workers, cache=d.cache, single_cls=d.single_cls)
    if split != "train":
        return create_dataloader(data, split, batch_size=2 * config.batch_size, augment=False, **common)
    on_device = (device is not None and device.type == "cuda") if d.colour_on_device is None else d.colour_on_device
    return create_dataloader(data, "train", batch_size=config.batch_size // dist.world_size, augment=True,
                             hyp=d.augment_hyp, seed=config.run.seed,  # one seed: the ranks split one order
                             distributed=dist.distributed, colour_device=device if on_device else None,
                             allow_bad_labels=d.allow_bad_labels, rect=d.rect, min_items=d.min_items, **common)


def set_epoch_data(loader, config: TrainConfig, epoch: int) -> None:
    """The loader's epoch (its order and augmentation); mosaic off for the last ``close_mosaic`` epochs."""
    if hasattr(loader, "set_epoch"):  # yolo9kit loaders
        loader.set_epoch(epoch)
    elif hasattr(getattr(loader, "sampler", None), "set_epoch"):  # a plain DataLoader with a DistributedSampler
        loader.sampler.set_epoch(epoch)
    close = config.pipeline.close_mosaic
    if close and epoch >= config.epochs - close and hasattr(loader, "dataset"):  # >=: a resumed run closes it too
        if getattr(loader.dataset, "mosaic", True):
            LOGGER.info("closing mosaic for the last %d epochs", close)
        set_mosaic(loader, False)


def _validate_ema(run: _Run, data, loader, model: nn.Module) -> dict[str, float]:
    """The default validation: ``evaluate`` of the EMA ``model`` on the val loader (FP16 with AMP on CUDA), returning
    the metrics fit records; ``run.val_result`` keeps the ``ValResult``."""
    c, device = run.config, run.trainer.device
    r = run.val_result = evaluate(model, data, dataloader=loader, imgsz=c.step.imgsz, device=device,
                                  half=run.trainer.step.amp != "off" and device.type == "cuda",
                                  single_cls=c.pipeline.single_cls, progress_bar=c.run.progress_bar)
    return {k: float(getattr(r, k)) for k in ("precision", "recall", "map50", "map50_95", "fitness")}
