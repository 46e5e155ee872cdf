"""``fit``: set-up, the epoch loop, validation of the EMA, checkpoints, resume and interrupts."""

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
from yolo9kit.train import ddp
from yolo9kit.train.ema import unwrap
from yolo9kit.train.loop import EpochStats, train_one_epoch
from yolo9kit.train.optim import warmup_steps
from yolo9kit.train.records import EpochRecord, append_results
from yolo9kit.train.state import (
    Progress,
    capture_rng,
    find_resume_checkpoint,
    increment_path,
    restore_rng,
    restore_training_state,
    run_dir_of,
    save_training_checkpoint,
    seed_everything,
)
from yolo9kit.train.step import Trainer, build_trainer, resolve_device

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
    nonfinite_steps: int = 0
    oom_events: int = 0
    micro_batch_size: int | None = None
    step: StepConfig | None = None  # the step the run trained with (resolved for its device)
    auto_batch: Any = None  # batch_size="auto": the memory.autobatch.AutoBatch record (also auto_batch.json)

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
    auto_batch: Any = None  # memory.autobatch.AutoBatch when the batch was chosen from the estimate


def fit(model: nn.Module | str, data: str | Path | Mapping | None, config: TrainConfig, *,
        loss_fn: Callable | None = None, train_loader: Iterable | None = None,
        val_loader: Iterable | None = None, validate_fn: ValidateFn | None = None) -> FitResult:
    """Train ``model`` on ``data`` (a data.yaml path or dict) as the official train_dual.py does.

    Args:
        model: a ``DetectionModel`` (any nn.Module with a matching ``loss_fn`` works), or a model name /
            yaml / checkpoint path, built for the data's classes (``yolo9kit.train.weights.model_for_data``).
        data: data.yaml path or dict; may be None when both loaders (and ``validate_fn``) are given.
        config: the TrainConfig. ``config.resume`` continues a run from its ``last.pt``.
        loss_fn: ``(outputs, targets) -> (loss, loss_items (3,))``; default ``DetectionLoss(model, config.loss)``.
        train_loader / val_loader: ready loaders (default: built by ``yolo9kit.data.create_dataloader``).
        validate_fn: ``ema_model -> {"precision", "recall", "map50", "map", "fitness"}``; default
            ``yolo9kit.validate.evaluate`` on the val loader.

    Returns:
        FitResult; the run folder holds weights/last.pt, weights/best.pt and results.csv.

    Raises:
        NonFiniteLossError: too many non-finite losses in a row (the last good last.pt is kept).
    """
    if isinstance(model, (str, Path)):
        from yolo9kit.train.weights import model_for_data

        model = model_for_data(str(model), data)
    _check_classes(model, data)
    dist = ddp.current()
    device = resolve_device(f"cuda:{dist.local_rank}" if dist.distributed and torch.cuda.is_available()
                            else config.device)
    ckpt, run_dir = _prepare_run(config, dist)
    config, auto_batch = _size_batch(config, model, device, dist, ckpt, loss_fn)
    seed_everything(config.seed + dist.rank)
    model.to(device)
    model = ddp.wrap_model(model, dist, device, config.sync_bn)
    trainer = build_trainer(model, config, loss_fn=loss_fn, device=device, world_size=dist.world_size)
    progress = restore_training_state(ckpt, trainer) if ckpt else Progress()
    if train_loader is None:
        train_loader = _make_loader(data, "train", config, dist, device)
    if validate_fn is None and data is not None and dist.is_main:
        validate_fn = _default_validate(data, val_loader or _make_loader(data, "val", config, dist), config,
                                        device=device, half=trainer.step.amp != "off")
    extra = {"data": str(data) if isinstance(data, (str, Path)) else None}
    run = _Run(config, trainer, progress, dist, run_dir, validate_fn, extra, auto_batch=auto_batch)
    if auto_batch is not None and run_dir is not None:
        auto_batch.save(run_dir)
    if ckpt:
        run.results = list(ckpt.get("results", []))
        restore_rng(ckpt["rng"])  # last, so that nothing of the set-up consumes the restored states
        LOGGER.info("resuming %s at epoch %d, batch %d", run_dir, progress.epoch, progress.ni)
    interrupted = _epochs(run, train_loader)
    return FitResult(unwrap(trainer.model), trainer.ema.ema if trainer.ema else None, run_dir, progress.epoch,
                     progress.best_fitness, progress.best_epoch, interrupted, run.results,
                     trainer.optimizer_steps, progress.nonfinite_total, trainer.oom_events, trainer.micro_batch_size,
                     trainer.step, auto_batch)


def _size_batch(config: TrainConfig, model: nn.Module, device: torch.device, dist: ddp.DistInfo,
                ckpt: dict | None, loss_fn: Callable | None) -> tuple[TrainConfig, Any]:
    """``batch_size="auto"``: the planned batch (``yolo9kit.memory.autobatch``); a resumed run keeps the
    batch it started with (the data order depends on it)."""
    if config.batch_size != "auto":
        return config, None
    if ckpt is not None and isinstance(ckpt.get("train_config", {}).get("batch_size"), int):
        return dataclasses.replace(config, batch_size=ckpt["train_config"]["batch_size"]), None
    from yolo9kit.memory.autobatch import choose_batch

    return choose_batch(config, unwrap(model), device, dist.world_size, loss_fn=loss_fn)


def _check_classes(model: nn.Module, data) -> None:
    """The model must predict as many classes as the data has (official: an assert on the largest label)."""
    if data is None or not hasattr(model, "nc"):
        return
    from yolo9kit.data import load_data_config

    names = load_data_config(data).names
    if int(model.nc) != len(names):
        raise ValueError(f"the model predicts {model.nc} classes but {data} has {len(names)} ({names[:5]}...): "
                         f"build it with create_model(name, num_classes={len(names)}) or pass the model name to fit")


def _epochs(run: _Run, loader: Iterable) -> bool:
    """The epoch loop; returns True when stopped by KeyboardInterrupt (after saving last.pt)."""
    config, progress, trainer = run.config, run.progress, run.trainer
    nb = len(loader)  # type: ignore[arg-type]
    warmup = warmup_steps(config, nb)
    rng_epoch_start, in_epoch = None, False
    try:
        for epoch in range(progress.epoch, config.epochs):
            progress.epoch = epoch
            _set_epoch_data(loader, config, epoch)
            rng_epoch_start, in_epoch = capture_rng(), True
            stats = train_one_epoch(trainer, loader, config, progress, batches_per_epoch=nb, warmup=warmup,
                                    start_batch=progress.ni - epoch * nb, on_step=_callback(config, "on_step", run),
                                    show=run.dist.is_main and config.progress_bar, run_dir=run.run_dir)
            in_epoch = False
            _record_measured_peak(run, stats)
            progress.epoch, progress.ni = epoch + 1, (epoch + 1) * nb
            if _end_epoch(run, epoch, stats):
                break
    except KeyboardInterrupt:
        if in_epoch:  # resume restarts the unfinished accumulation window with the epoch's data order
            progress.ni = max(progress.last_opt_step + 1, progress.epoch * nb)
        LOGGER.warning("interrupted at epoch %d batch %d: saving last.pt", progress.epoch,
                       progress.ni - progress.epoch * nb)
        if run.dist.is_main and run.run_dir:
            _save(run, "last.pt", rng_epoch_start if in_epoch else None)
        return True
    return False


def _record_measured_peak(run: _Run, stats: EpochStats) -> None:
    """batch_size="auto" on CUDA: the peak of the first epoch's steps beside the prediction (auto_batch.json)."""
    auto, device = run.auto_batch, run.trainer.device
    if auto is None or auto.measured_peak_allocated is not None or device.type != "cuda":
        return
    auto.measured_peak_allocated = int(stats.peak_memory_bytes)
    auto.measured_peak_reserved = int(torch.cuda.max_memory_reserved(device))
    if run.run_dir is not None:
        auto.save(run.run_dir)


def _end_epoch(run: _Run, epoch: int, stats: EpochStats) -> bool:
    """Validate the EMA, log results.csv, save last/best, call on_epoch_end; True = stop early."""
    config, progress, dist = run.config, run.progress, run.dist
    stop = False
    if dist.is_main:
        final = epoch + 1 == config.epochs
        metrics = dict(run.validate_fn(_eval_model(run.trainer))) if run.validate_fn and (config.val or final) else {}
        record = EpochRecord.from_stats(epoch, stats, metrics, dist.world_size)
        run.results.append(record.row())  # plain rows: checkpoints load with weights_only=True
        fitness = metrics.get("fitness")
        is_best = fitness is not None and fitness >= progress.best_fitness
        if is_best:
            progress.best_fitness, progress.best_epoch = float(fitness), epoch
        if run.run_dir:
            append_results(run.run_dir / "results.csv", record)
            rng = capture_rng()
            _save(run, "last.pt", rng)
            if is_best:
                _save(run, "best.pt", rng)
            if config.save_period > 0 and (epoch + 1) % config.save_period == 0:
                _save(run, f"epoch{epoch}.pt", rng)
        callback = _callback(config, "on_epoch_end", run)
        if callback:
            callback(record)
        stop = progress.best_epoch >= 0 and epoch - progress.best_epoch >= config.patience
        if stop:
            LOGGER.info("early stop: no better fitness for %d epochs (best epoch %d)", config.patience,
                        progress.best_epoch)
    return bool(ddp.broadcast_object(stop, dist))


def _save(run: _Run, name: str, rng: dict | None) -> None:
    extra = {**run.extra, "results": run.results}
    save_training_checkpoint(run.run_dir / "weights" / name, run.trainer, run.progress, run.config.to_dict(),
                             rng=rng, extra=extra)


def _eval_model(trainer: Trainer) -> nn.Module:
    return trainer.ema.ema if trainer.ema is not None else unwrap(trainer.model)


def _callback(config: TrainConfig, name: str, run: _Run) -> Callable[[Any], None] | None:
    return (config.callbacks or {}).get(name) if run.dist.is_main else None


def _prepare_run(config: TrainConfig, dist: ddp.DistInfo) -> tuple[dict | None, Path | None]:
    """Checkpoint to resume (or None) and the run folder (rank 0 creates it; others get None)."""
    ckpt = None
    if config.resume:
        from yolo9kit.checkpoint import read_checkpoint

        path = find_resume_checkpoint(config.resume, config.project)
        ckpt = read_checkpoint(path)
        run_dir = run_dir_of(path)
    else:
        run_dir = increment_path(Path(config.project) / config.name, config.exist_ok) if dist.is_main else None
        run_dir = ddp.broadcast_object(run_dir, dist)
    if dist.is_main:
        (run_dir / "weights").mkdir(parents=True, exist_ok=True)
        LOGGER.info("run folder %s", run_dir)
    return ckpt, run_dir if dist.is_main else None


def _make_loader(data, split: str, config: TrainConfig, dist: ddp.DistInfo, device: torch.device | None = None):
    """Loaders of ``yolo9kit.data``: train = augmented, shuffled, per-rank batch; val = rect, 2 x batch.

    The training loader applies the HSV colour jitter on ``device`` when ``config.colour_on_device``
    (default: when it is a CUDA device)."""
    from yolo9kit.data import create_dataloader

    if split == "train":
        on_device = config.colour_on_device
        on_device = (device is not None and device.type == "cuda") if on_device is None else on_device
        return create_dataloader(data, "train", imgsz=config.imgsz, batch_size=config.batch_size // dist.world_size,
                                 augment=True, workers=config.workers, cache=config.cache, hyp=config.augment_hyp,
                                 seed=config.seed, distributed=dist.distributed,  # same seed: ranks split one order
                                 colour_device=device if on_device else None, allow_bad_labels=config.allow_bad_labels)
    return create_dataloader(data, split, imgsz=config.imgsz,
                             batch_size=config.val_batch_size or 2 * config.batch_size,  # rank 0 validates alone
                             augment=False, workers=config.workers, cache=config.cache)


def _set_epoch_data(loader, config: TrainConfig, epoch: int) -> None:
    """DistributedSampler epoch; mosaic off for the last ``close_mosaic`` epochs (>= so a resumed run also closes)."""
    sampler = getattr(loader, "sampler", None)
    if hasattr(loader, "set_epoch"):  # yolo9kit loaders: order and augmentation depend on (seed, epoch) only
        loader.set_epoch(epoch)
    elif hasattr(sampler, "set_epoch"):  # a plain DataLoader with a DistributedSampler
        sampler.set_epoch(epoch)
    if config.close_mosaic and epoch >= config.epochs - config.close_mosaic and hasattr(loader, "dataset"):
        from yolo9kit.data import set_mosaic

        if getattr(loader.dataset, "mosaic", True):
            LOGGER.info("closing mosaic for the last %d epochs", config.close_mosaic)
        set_mosaic(loader, False)


def _default_validate(data, loader, config: TrainConfig, device: torch.device, half: bool) -> ValidateFn:
    def validate(model: nn.Module) -> dict[str, float]:
        from yolo9kit.validate import evaluate

        r = evaluate(model, data, dataloader=loader, imgsz=config.imgsz, half=half, device=device)
        return {"precision": float(r.mp), "recall": float(r.mr), "map50": float(r.map50), "map": float(r.map),
                "fitness": float(r.fitness)}

    return validate
