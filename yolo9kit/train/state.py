"""A training process's DDP rank, ``Progress``, random state and the checkpoint that saves and restores them."""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from yolo9kit.models.checkpoint import save_checkpoint
from yolo9kit.train.records import ENDED, read_state
from yolo9kit.train.step import Trainer, scaler_kind, unwrap

LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    """Rank of this process, number of processes, GPU index on this node; rank 0 logs, validates and saves."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    is_main = property(lambda self: self.rank == 0)
    distributed = property(lambda self: self.world_size > 1)


def init_from_env() -> DistInfo:
    """The default process group when launched by torchrun (WORLD_SIZE > 1; nccl on CUDA, else gloo), else rank 0."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return DistInfo()
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return current()


def finish_processes() -> None:
    """After a finished run: each rank waits for the others (rank 0 may still be saving), then the group ends."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def current() -> DistInfo:
    """The DistInfo of the initialised process group (rank 0 of 1 when none)."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistInfo()
    local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank() % max(torch.cuda.device_count(), 1)))
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank)


def wrap_model(model: nn.Module, info: DistInfo, device: torch.device, sync_bn: bool = False) -> nn.Module:
    """SyncBatchNorm (``sync_bn``) and DistributedDataParallel in a DDP run; the model itself otherwise."""
    if not info.distributed:
        return model
    if sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        LOGGER.info("using SyncBatchNorm")
    return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def broadcast_object(value, info: DistInfo):
    """``value`` of rank 0 on every rank."""
    if not info.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@dataclass
class Progress:
    """Where training stands: ``epoch`` being trained, ``ni`` loader batches since the start and ``last_opt_step``
    the ``ni`` of the last optimizer step (official names), the best fitness and the non-finite counts."""

    epoch: int = 0
    ni: int = 0
    last_opt_step: int = -1
    best_fitness: float = 0.0
    best_epoch: int = -1
    nonfinite_in_row: int = 0
    nonfinite_total: int = 0
    oom_events: int = 0
    data_warned: bool = False  # that an epoch waited for its data more than half its time (said once per run)


def capture_rng(device: torch.device) -> dict[str, Any]:
    """Python, NumPy, torch CPU and the CUDA generator of ``device`` (one, restored onto the resuming device)."""
    np_state = np.random.get_state(legacy=False)
    np_state["state"]["key"] = np_state["state"]["key"].tolist()
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np_state, "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    """Inverse of ``capture_rng``: the CUDA state goes to ``device``."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = dict(state["numpy"])
    np_state["state"] = {**np_state["state"], "key": np.asarray(np_state["state"]["key"], dtype=np.uint32)}
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available() and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], torch.cuda.current_device() if device.index is None else device.index)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def increment_path(path: str | Path, exist_ok: bool = False) -> Path:
    """``runs/train/exp`` -> itself if free (or ``exist_ok``), else ``exp2``, ``exp3``, ... (official rule)."""
    candidate = path = Path(path)
    n = 2
    while not exist_ok and candidate.exists():
        candidate, n = path.with_name(f"{path.name}{n}"), n + 1
    return candidate


def find_resume_checkpoint(resume: bool | str | Path, project: str | Path) -> Path:
    """The given checkpoint or run folder's, else the newest last.pt under ``project`` of a run not ended on its own."""
    if resume is True:
        candidates = sorted(Path(project).glob("**/last.pt"), key=lambda p: p.stat().st_mtime)
        if not candidates:
            raise FileNotFoundError(f"resume=True: no last.pt under {project}; pass the checkpoint path instead")
        return ([p for p in candidates if not _ended(p.parent.parent)] or candidates)[-1]
    path = Path(resume) / "weights" / "last.pt" if Path(resume).is_dir() else Path(resume)
    if not path.is_file():
        raise FileNotFoundError(f"resume={resume!r}: {path} does not exist; pass a run folder or a last.pt")
    return path


def _ended(run: Path) -> bool:
    with contextlib.suppress(ValueError):  # a damaged state.yaml: the run may be resumable
        return read_state(run).get("state") in ENDED
    return False


def training_state(trainer: Trainer, progress: Progress, config_dict: dict, rng: dict | None = None,
                   extra: dict | None = None) -> dict[str, Any]:
    """The resumable state, all plain tensors/dicts/lists/numbers/strings (loads with weights_only=True)."""
    ema = trainer.ema
    return {"ema": ema.ema.state_dict() if ema else None, "ema_updates": ema.updates if ema else 0,
            "optimizer": trainer.optimizer.state_dict(), "scaler": trainer.scaler.state_dict(),
            "scaler_kind": scaler_kind(trainer.amp_dtype),
            "scheduler": {"schedule": config_dict.get("schedule"), "epoch": progress.epoch},
            "progress": asdict(progress), "micro_batch_size": trainer.micro_batch_size,
            "optimizer_steps": trainer.optimizer_steps, "rng": rng if rng is not None else capture_rng(trainer.device),
            "train_config": config_dict, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **(extra or {})}


def save_training_checkpoint(path: Path, trainer: Trainer, progress: Progress, config_dict: dict,
                             rng: dict | None = None, extra: dict | None = None) -> Path:
    """Write ``path`` atomically (``yolo9kit.checkpoint.save_checkpoint``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(path, unwrap(trainer.model), **training_state(trainer, progress, config_dict, rng, extra))
    return path


def restore_training_state(ckpt: dict, trainer: Trainer, source: str | Path = "the checkpoint") -> Progress:
    """Load model, EMA, optimizer, scaler and counters of a ``read_checkpoint`` dict into ``trainer`` (not the random
    states); ValueError for no training state, one with NaN or Inf, or one of another model."""
    if "progress" not in ckpt or "optimizer" not in ckpt:
        raise ValueError(f"{source} has no training state (a stripped or foreign file): "
                         "start a new run from it with --weights instead of --resume")
    bad = nonfinite_entries({"model": ckpt.get("model"), "ema": ckpt.get("ema"),
                             "optimizer": (ckpt.get("optimizer") or {}).get("state"),
                             "scaler": {k: v for k, v in (ckpt.get("scaler") or {}).items() if k == "scale"}})
    if bad:
        raise ValueError(f"resume {source}: its training state is not finite ({len(bad)} entries hold NaN or Inf, "
                         f"e.g. {', '.join(bad[:3])}): the run cannot continue from it; resume from an earlier "
                         "checkpoint, or start a new run from its weights (--weights) if those are finite")
    model, weights = unwrap(trainer.model), ckpt["model"]
    own = model.state_dict()
    missing, unexpected = sorted(own.keys() - weights.keys()), sorted(weights.keys() - own.keys())
    reshaped = sorted(k for k in own.keys() & weights.keys() if own[k].shape != weights[k].shape)
    if missing or unexpected or reshaped:
        example = (missing or unexpected or reshaped)[0]
        raise ValueError(f"resume: the checkpoint holds another model than the one to train ({len(missing)} tensors "
                         f"missing, {len(unexpected)} unexpected, {len(reshaped)} of another shape, e.g. {example}); "
                         "resume with the run's model (the CLI rebuilds it from the checkpoint)")
    model.load_state_dict(weights)
    if trainer.ema is not None and ckpt.get("ema") is not None:
        trainer.ema.ema.load_state_dict(ckpt["ema"])
        trainer.ema.updates = int(ckpt.get("ema_updates", 0))
    trainer.optimizer.load_state_dict(ckpt["optimizer"])
    # another kind's scaler state is never inherited: an fp16 run would take the fixed scale of 1
    saved, kind = ckpt.get("scaler_kind"), scaler_kind(trainer.amp_dtype)
    if saved == kind and ckpt.get("scaler"):
        trainer.scaler.load_state_dict(ckpt["scaler"])
    elif saved != kind:
        LOGGER.info("resume: the checkpoint's loss scaler is %s, this run's is %s: it starts afresh", saved, kind)
    trainer.micro_batch_size = ckpt.get("micro_batch_size", trainer.micro_batch_size)
    trainer.optimizer_steps = int(ckpt.get("optimizer_steps", 0))
    return Progress(**ckpt["progress"])


def nonfinite_entries(value: Any, where: str = "") -> list[str]:
    """Key paths of the NaN or Inf floats (tensors, numbers) in nested dicts and lists, read back at once."""
    found = list(_floats(value, where))
    finite = torch.stack([torch.isfinite(v).all() for _, v in found]).cpu().tolist() if found else []
    return [k for (k, _), ok in zip(found, finite) if not ok]


def _floats(value: Any, where: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
        yield where, value
    elif isinstance(value, float):
        yield where, torch.tensor(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _floats(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _floats(v, f"{where}.{i}")
