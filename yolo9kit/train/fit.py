"""``fit``: set-up, the epoch loop, validation of the EMA, checkpoints, resume and interrupts.

Nothing is lost at any instant: the end of an epoch is written in an order that no crash breaks
(``_commit``: best.pt, epoch<n>.pt, last.pt as the commit point, then the results.csv row); SIGTERM and
SIGINT stop at the next batch and save last.pt (``StopSignals``); each epoch starts only when the disk has
room for the checkpoints it ends with. The run folder's bookkeeping is in ``yolo9kit.train.rundir``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from yolo9kit.config import StepConfig, TrainConfig
from yolo9kit.cpu import set_cpu_threads
from yolo9kit.env import resolve_device
from yolo9kit.train import ddp
from yolo9kit.train.guards import Interrupted, NonFiniteLossError, NonFiniteWeightsError, StopSignals, stopped_by
from yolo9kit.train.inputs import EMAValidation, ValidateFn, check_classes, class_names, make_loader, set_epoch_data
from yolo9kit.train.loggers import RunLoggers
from yolo9kit.train.loop import EpochStats, train_one_epoch
from yolo9kit.train.optim import warmup_batches
from yolo9kit.train.pictures import RunPictures
from yolo9kit.train.records import EpochRecord, append_results, metric_columns, write_results
from yolo9kit.train.rundir import (
    RunFolder,
    check_resume_model,
    check_space_for_epoch,
    close_failed,
    close_run,
    data_record,
    earns_best,
    epoch_files,
    open_run,
    resume_data,
    settle_settings,
    training_images,
    write_settings,
)
from yolo9kit.train.state import (
    Progress,
    capture_rng,
    deterministic_kernels,
    nonfinite_weights,
    restore_rng,
    restore_training_state,
    save_training_checkpoint,
    seed_everything,
)
from yolo9kit.train.step import Trainer, build_trainer, cudnn_autotune, describe_step, place_model, unwrap

LOGGER = logging.getLogger(__name__)


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
    # What stopped the run before its last epoch: "SIGINT" or "SIGTERM" (last.pt saved; the CLI exits 130 or 143),
    # or "KeyboardInterrupt" raised by code, e.g. a callback's planned stop. None: it ran out (or on patience).
    interrupted_by: str | None = None

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
    dist: ddp.DistInfo
    run_dir: Path | None
    validate_fn: ValidateFn | None
    extra: dict[str, Any]
    results: list[dict] = field(default_factory=list)
    auto_batch: Any = None  # memory.plan.AutoBatch when the batch was chosen from the estimate
    pictures: RunPictures = field(default_factory=lambda: RunPictures(None, None))  # the run folder's pictures


@dataclass
class _Position:
    """Where the epoch loop is: what an interrupt has to save."""

    phase: str = "training"  # "training", "validating", "committing" (writing the epoch's files), "committed"
    epoch: int = 0
    rng_epoch_start: dict | None = None
    stats: EpochStats | None = None
    metrics: dict = field(default_factory=dict)


def fit(model: nn.Module | str, data: str | Path | Mapping | None, config: TrainConfig, *,
        loss_fn: Callable | None = None, train_loader: Iterable | None = None,
        val_loader: Iterable | None = None, validate_fn: ValidateFn | None = None) -> FitResult:
    """Train ``model`` on ``data`` (a data.yaml path or dict) as the official train_dual.py does.

    Args:
        model: a ``DetectionModel`` (any nn.Module with a matching ``loss_fn`` works), or a model name /
            yaml / checkpoint path, built for the data's classes with the run's seed (``create_model``). A module
            keeps its weights: a ``create_model`` one has those of its own ``seed`` (0 unless given).
        data: data.yaml path or dict; may be None when both loaders (and ``validate_fn``) are given, or when
            resuming (the run's recorded data.yaml).
        config: the TrainConfig. ``config.run.resume`` continues a run from its ``last.pt``; the settings that
            cannot change mid-run must be the run's (``rundir.FIXED_ON_RESUME``), a larger ``epochs`` extends it.
        loss_fn: ``(outputs, targets) -> (loss, loss_items (3,))``; default ``DetectionLoss(model, config.optim.loss)``.
        train_loader / val_loader: ready loaders (default: built by ``yolo9kit.data.create_dataloader``).
        validate_fn: ``ema_model -> {"precision", "recall", "map50", "map50_95", "fitness"}``; default
            ``yolo9kit.validate.evaluate`` on the val loader.

    Returns:
        FitResult; the run folder holds weights/last.pt, weights/best.pt, results.csv, settings.yaml and, with
        ``config.run.plots``, the pictures of ``yolo9kit.train.pictures``. A run stopped by
        SIGINT/SIGTERM or a ``KeyboardInterrupt`` returns with ``interrupted_by`` set, after saving last.pt.

    Raises:
        NonFiniteLossError: too many non-finite losses in a row, or an epoch of them (last.pt is kept).
        DiskFullError: no room for the next checkpoints (checked before each epoch and each save).
        ValueError: a resume that changes what cannot change (named in the message).
    """
    dist = ddp.current()
    folder = open_run(config, dist)
    try:
        if folder.ckpt is not None:
            data = resume_data(data, folder)
        config = settle_settings(config, folder, training_images(data, train_loader))
        if isinstance(model, (str, Path)):
            from yolo9kit.zoo import create_model

            model = create_model(model, names=class_names(data, config.pipeline.single_cls), seed=config.run.seed)
        if folder.ckpt is not None:
            check_resume_model(model, folder)
        check_classes(model, data, single_cls=config.pipeline.single_cls)
        run = _set_up(model, data, config, folder, loss_fn, validate_fn)
        if train_loader is None:
            train_loader = make_loader(data, "train", run.config, dist, run.trainer.device)
        if run.validate_fn is None and data is not None and dist.is_main:
            half = run.trainer.step.amp != "off" and run.trainer.device.type == "cuda"  # FP16 eval: CUDA only
            run.validate_fn = EMAValidation(data, val_loader or make_loader(data, "val", run.config, dist),
                                            run.config, device=run.trainer.device, half=half)
        _open_records(run, folder, data, train_loader)  # every check passed: from here on the run writes
        if folder.ckpt:  # the random states restored last, so that nothing of the set-up consumes them
            restore_rng(folder.ckpt["rng"], run.trainer.device)
            LOGGER.info("resuming %s in epoch %d of %d", folder.path, run.progress.epoch + 1, config.epochs)
        interrupted_by = _epochs(run, train_loader, folder.loggers)
    except NonFiniteLossError as e:
        close_failed(folder, e)
        raise e.in_run(run.run_dir) from None  # the loop knows no folder; the message names where last.pt is
    except BaseException as e:
        close_failed(folder, e)
        raise
    trainer, progress = run.trainer, run.progress
    close_run(folder, interrupted_by, progress.epoch, config.epochs)  # state.yaml says how it ended
    return FitResult(unwrap(trainer.model), trainer.ema.ema if trainer.ema else None, folder.path, progress.epoch,
                     progress.best_fitness, progress.best_epoch, interrupted=interrupted_by is not None,
                     results=run.results, optimizer_steps=trainer.optimizer_steps,
                     nonfinite_batches=progress.nonfinite_total, oom_events=trainer.oom_events,
                     micro_batch_size=trainer.micro_batch_size, step=trainer.step, auto_batch=run.auto_batch,
                     interrupted_by=interrupted_by)


def _set_up(model: nn.Module, data, config: TrainConfig, folder: RunFolder, loss_fn: Callable | None,
            validate_fn: ValidateFn | None) -> _Run:
    """The device, the batch, the trainer (restored when resuming) and the run record."""
    dist = ddp.current()
    set_cpu_threads()  # at most the cores this process may use
    device = resolve_device(f"cuda:{dist.local_rank}" if dist.distributed and torch.cuda.is_available()
                            else config.run.device)
    config, auto_batch = _size_batch(config, model, device, dist, folder.ckpt, loss_fn)
    seed_everything(config.run.seed + dist.rank)
    # frozen, on the device and in the step's layout before DDP: its reducer waits for the gradients of the
    # trainable parameters and lays out its buckets from their strides
    place_model(model, describe_step(config, model, device, dist.world_size), device)
    model = ddp.wrap_model(model, dist, device, config.run.sync_bn)
    trainer = build_trainer(model, config, loss_fn=loss_fn, device=device, world_size=dist.world_size)
    progress = restore_training_state(folder.ckpt, trainer, folder.checkpoint) if folder.ckpt else Progress()
    return _Run(config, trainer, progress, dist, folder.path, validate_fn, {"data": data_record(data)},
                results=list(folder.ckpt.get("results", [])) if folder.ckpt else [], auto_batch=auto_batch)


def _open_records(run: _Run, folder: RunFolder, data, loader: Iterable) -> None:
    """The run begun (``RunFolder.begin``): auto_batch.json, settings.yaml, the loggers, the pictures (``plots``)."""
    folder.begin()
    if run.auto_batch is not None and folder.path is not None:
        folder.files.append(run.auto_batch.save(folder.path))  # removed with the folder if the run fails early
    write_settings(folder, run.config, run.trainer, data, len(loader))  # type: ignore[arg-type]
    folder.loggers = RunLoggers.open(run.config, run.run_dir, folder.ckpt is not None, folder.files)
    if run.config.run.plots and run.run_dir is not None:
        names = getattr(getattr(loader, "dataset", None), "names", None) or \
            getattr(unwrap(run.trainer.model), "names", None)
        run.pictures = RunPictures(run.run_dir, names, folder.files)
        run.pictures.labels(loader)


def _size_batch(config: TrainConfig, model: nn.Module, device: torch.device, dist: ddp.DistInfo,
                ckpt: dict | None, loss_fn: Callable | None) -> tuple[TrainConfig, Any]:
    """``batch_size="auto"``: the planned batch (``yolo9kit.memory.plan.choose_batch``); a resumed run keeps the
    batch it started with (the data order depends on it)."""
    if config.batch_size != "auto":
        return config, None
    if ckpt is not None and isinstance(ckpt.get("train_config", {}).get("batch_size"), int):
        return dataclasses.replace(config, batch_size=ckpt["train_config"]["batch_size"]), None
    from yolo9kit.memory.plan import choose_batch

    return choose_batch(config, unwrap(model), device, dist.world_size, loss_fn=loss_fn)


def _epochs(run: _Run, loader: Iterable, loggers: RunLoggers) -> str | None:
    """The epoch loop; returns what interrupted it (``FitResult.interrupted_by``), None when it ran out."""
    config, progress = run.config, run.progress
    nb = len(loader)  # type: ignore[arg-type]
    warmup = warmup_batches(config, nb)
    at = _Position(epoch=progress.epoch)
    with StopSignals(install=not run.dist.distributed) as signals, \
            cudnn_autotune(run.trainer.device, config.step.cudnn_benchmark and not config.run.deterministic), \
            deterministic_kernels(config.run.deterministic):
        try:
            _validate_unvalidated_end(run)
            for epoch in range(progress.epoch, config.epochs):
                at = _Position("training", epoch)
                progress.epoch = epoch
                _check_space(run, epoch)
                set_epoch_data(loader, config, epoch)
                at.rng_epoch_start = capture_rng(run.trainer.device)
                batches = run.pictures.batches(loader, epoch)  # keeps the first ones to draw (config.run.plots)
                at.stats = train_one_epoch(run.trainer, batches, config, progress, batches_per_epoch=nb,
                                           warmup=warmup, start_batch=progress.ni - epoch * nb,
                                           on_batch=_callback(config, "on_batch", run), interrupt=signals.pending,
                                           progress_bar=run.dist.is_main and config.run.progress_bar)
                at.phase = "validating"  # the epoch is trained: an interrupt from here on keeps it
                if run.auto_batch is not None:
                    run.auto_batch.record_measured_peak(run.trainer.device, at.stats.peak_allocated, run.run_dir)
                with signals.raising():  # validation has no batch to stop at: a signal stops it at once
                    at.metrics = _validate(run, epoch)
                at.phase = "committing"  # signals wait until the epoch's files are written
                record = _commit(run, at, nb)
                at.phase = "committed"
                run.pictures.epoch_end(run.results)  # after the commit: never in the epoch's time
                loggers.epoch(run.results)
                stop = _after_epoch(run, epoch, record)
                if signals.received:
                    LOGGER.warning("%s: stopped after epoch %d, saved in last.pt", signals.received, epoch + 1)
                    return signals.received
                if stop:
                    break
            run.pictures.validation(run.validate_fn)  # the run ended (or stopped early): its last validation
        except KeyboardInterrupt as e:
            reason = e.reason if isinstance(e, Interrupted) else "KeyboardInterrupt"
            _save_interrupted(run, at, nb, reason)
            return reason
    return None


def _save_interrupted(run: _Run, at: _Position, nb: int, reason: str) -> None:
    """Save what an interrupt at ``at`` leaves: inside an epoch, last.pt at the start of its unfinished
    accumulation window (where resume continues, with the epoch's random state); during validation, the
    trained epoch without its metrics; while committing, the epoch again (the writes are idempotent)."""
    progress = run.progress
    if at.phase == "committed":  # a callback's planned stop: last.pt already holds this epoch
        return
    if at.phase == "training":
        progress.ni = max(progress.last_opt_step + 1, progress.epoch * nb)
        LOGGER.warning("%s in epoch %d of %d, after %d of its %d batches: saving last.pt", stopped_by(reason),
                       progress.epoch + 1, run.config.epochs, progress.ni - progress.epoch * nb, nb)
        if run.dist.is_main and run.run_dir:
            _save(run, "last.pt", at.rng_epoch_start)
        return
    if at.phase == "validating":
        LOGGER.warning("%s during the validation of epoch %d: saving the epoch without its metrics",
                       stopped_by(reason), at.epoch + 1)
        at.metrics = {}
    _commit(run, at, nb)


def _validate(run: _Run, epoch: int) -> dict[str, float]:
    """The EMA's metrics (every epoch with ``config.run.val``, always after the last one); {} when not validated."""
    final = epoch + 1 == run.config.epochs
    if run.dist.is_main and run.validate_fn and (run.config.run.val or final):
        return dict(run.validate_fn(_eval_model(run.trainer)))
    return {}


def _commit(run: _Run, at: _Position, nb: int) -> EpochRecord:
    """Record the trained epoch ``at.epoch`` in an order that no crash can break.

    1. the new state in memory (progress, the results row, the best fitness);
    2. best.pt when the EMA is at least as good as before: before last.pt, which records that fitness, so a
       crash between the two never leaves a last.pt that believes in a best.pt that was not written;
    3. epoch<n>.pt (``save_period``);
    4. last.pt, the commit point: a resume starts from what it records;
    5. the results.csv row: a resume rewrites results.csv from last.pt, so a crash before the row (or
       after it, before last.pt) leaves no missing or doubled epoch.

    Each file is written atomically after a free-space check (``save_checkpoint``).
    """
    config, progress, epoch = run.config, run.progress, at.epoch
    record = EpochRecord.from_stats(epoch, at.stats, at.metrics, run.dist.world_size)
    progress.epoch, progress.ni = epoch + 1, (epoch + 1) * nb
    if not run.dist.is_main:
        return record
    if not run.results or run.results[-1]["epoch"] != epoch:
        run.results.append(record.row())  # plain rows: checkpoints load with weights_only=True
    is_best = earns_best(at.metrics.get("fitness"), run.progress.best_fitness, run.run_dir)
    if is_best:
        progress.best_fitness, progress.best_epoch = float(at.metrics["fitness"]), epoch
    if run.run_dir:
        rng = capture_rng(run.trainer.device)
        for name in epoch_files(config, epoch, is_best):
            _save(run, name, rng)
        append_results(run.run_dir / "results.csv", record)
    return record


def _validate_unvalidated_end(run: _Run) -> None:
    """A run whose last epoch was saved without its metrics (stopped during its validation) is validated when
    it resumes: its results row, best.pt and last.pt as a finished validation would have left them."""
    config, progress = run.config, run.progress
    if progress.epoch != config.epochs or not run.results or not run.dist.is_main or run.validate_fn is None:
        return
    last = run.results[-1]
    if last.get("fitness") is not None or last.get("epoch") != progress.epoch - 1:
        return
    LOGGER.info("epoch %d was saved before its validation finished: validating it now", progress.epoch)
    metrics = dict(run.validate_fn(_eval_model(run.trainer)))
    last.update(metric_columns(metrics))
    files = ["last.pt"]
    if earns_best(metrics.get("fitness"), progress.best_fitness, run.run_dir):
        progress.best_fitness, progress.best_epoch = float(metrics["fitness"]), progress.epoch - 1
        files.insert(0, "best.pt")
    if run.run_dir:
        rng = capture_rng(run.trainer.device)
        for name in files:
            _save(run, name, rng)
        write_results(run.run_dir / "results.csv", run.results)


def _check_space(run: _Run, epoch: int) -> None:
    """Before an epoch: room for the checkpoints it may end with, so that a full disk does not cost an epoch."""
    if run.dist.is_main and run.run_dir:
        check_space_for_epoch(run.run_dir, run.trainer, epoch_files(run.config, epoch, run.validate_fn is not None))


def _after_epoch(run: _Run, epoch: int, record: EpochRecord) -> bool:
    """``on_epoch_end``, then early stopping on ``patience``; True = stop (all ranks agree)."""
    config, progress, dist = run.config, run.progress, run.dist
    stop = False
    if dist.is_main:
        callback = _callback(config, "on_epoch_end", run)
        if callback:
            callback(record)
        stop = progress.best_epoch >= 0 and epoch - progress.best_epoch >= config.run.patience
        if stop:
            LOGGER.info("early stop: no better fitness for %d epochs (best epoch %d)", config.run.patience,
                        progress.best_epoch + 1)
    return bool(ddp.broadcast_object(stop, dist))


def _save(run: _Run, name: str, rng: dict | None) -> None:
    """One checkpoint of the run; never of non-finite weights (``NonFiniteWeightsError``, nothing written)."""
    bad = nonfinite_weights(run.trainer)
    if bad:
        raise NonFiniteWeightsError(run.run_dir, f"epoch {run.progress.epoch}, {name}", bad)
    extra = {**run.extra, "results": run.results}
    save_training_checkpoint(run.run_dir / "weights" / name, run.trainer, run.progress, run.config.to_dict(),
                             rng=rng, extra=extra)


def _eval_model(trainer: Trainer) -> nn.Module:
    return trainer.ema.ema if trainer.ema is not None else unwrap(trainer.model)


def _callback(config: TrainConfig, name: str, run: _Run) -> Callable[[Any], None] | None:
    return (config.run.callbacks or {}).get(name) if run.dist.is_main else None
