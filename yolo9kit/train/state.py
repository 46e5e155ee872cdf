"""Checkpoints of a training run, resume, random-number-generator states and the run folder."""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from yolo9kit.train.step import FIXED_SCALE_GROWTH_INTERVAL, Trainer, scaler_kind, unwrap

LOGGER = logging.getLogger(__name__)


@dataclass
class Progress:
    """Where training stands. ``ni`` counts loader batches since the start (official ``ni``).

    ``epoch`` is the epoch being trained; ``last_opt_step`` is the ``ni`` of the last optimizer step
    (official, starts at -1).
    """

    epoch: int = 0
    ni: int = 0
    last_opt_step: int = -1
    best_fitness: float = 0.0
    best_epoch: int = -1
    nonfinite_in_row: int = 0
    nonfinite_total: int = 0
    oom_events: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Progress:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


def capture_rng(device: torch.device | None = None) -> dict[str, Any]:
    """Python, NumPy, torch CPU and, on CUDA, the training device's generator states, as plain lists/tensors.

    Only the state of ``device`` (the one the run trains on; None: the current CUDA device once CUDA is
    initialised) is kept: a run resumed on a machine with fewer GPUs, or on another GPU index, restores it
    onto its own device (``restore_rng``).
    """
    np_state = np.random.get_state(legacy=False)
    np_state["state"]["key"] = np_state["state"]["key"].tolist()
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np_state, "torch": torch.get_rng_state()}
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    elif device is None and torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Inverse of ``capture_rng``: the CUDA state goes to ``device`` (None: the current CUDA device). A
    checkpoint of an older version holds one state per visible GPU: the one of the same index is used, else
    the first."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = dict(state["numpy"])
    np_state["state"] = {**np_state["state"], "key": np.asarray(np_state["state"]["key"], dtype=np.uint32)}
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is None or not torch.cuda.is_available() or (device is not None and device.type != "cuda"):
        return
    index = torch.cuda.current_device() if device is None or device.index is None else device.index
    cuda = state["cuda"]
    if isinstance(cuda, (list, tuple)):  # one per GPU of the machine that saved it
        cuda = cuda[index] if index < len(cuda) else cuda[0]
    torch.cuda.set_rng_state(cuda, index)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@contextlib.contextmanager
def deterministic_kernels(enabled: bool) -> Iterator[None]:
    """Deterministic algorithms for the block, the previous settings back after it: PyTorch's deterministic
    versions of the ops that add in a varying order on CUDA, cuDNN's deterministic kernels, cuBLAS with a fixed
    workspace (``CUBLAS_WORKSPACE_CONFIG``, read when CUDA starts: a process that already used CUDA keeps its
    own). An op without a deterministic version warns and runs (``warn_only``), as in the official code."""
    if not enabled:
        yield
        return
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                torch.backends.cudnn.deterministic)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.backends.cudnn.deterministic = previous[2]


def increment_path(path: str | Path, exist_ok: bool = False) -> Path:
    """``runs/train/exp`` -> itself if free (or ``exist_ok``), else ``exp2``, ``exp3``, ... (official rule)."""
    path = Path(path)
    if exist_ok or not path.exists():
        return path
    n = 2
    while (candidate := path.with_name(f"{path.name}{n}")).exists():
        n += 1
    return candidate


def find_resume_checkpoint(resume: bool | str | Path, project: str | Path) -> Path:
    """The checkpoint to resume: the given path, or (``resume=True``) the newest ``last.pt`` under ``project``."""
    if resume is True:
        candidates = sorted(Path(project).glob("**/last.pt"), key=lambda p: p.stat().st_mtime)
        if not candidates:
            raise FileNotFoundError(f"resume=True: no last.pt under {project}; pass the checkpoint path instead")
        return candidates[-1]
    path = Path(resume)
    if path.is_dir():
        path = path / "weights" / "last.pt"
    if not path.is_file():
        raise FileNotFoundError(f"resume={resume!r}: {path} does not exist; pass a run folder or a last.pt")
    return path


def run_dir_of(checkpoint: Path) -> Path:
    """Run folder of ``<run>/weights/last.pt``."""
    return checkpoint.parent.parent if checkpoint.parent.name == "weights" else checkpoint.parent


def training_state(trainer: Trainer, progress: Progress, config_dict: dict, rng: dict | None = None,
                   extra: dict | None = None) -> dict[str, Any]:
    """The resumable state, all plain tensors/dicts/lists/numbers/strings (loads with weights_only=True)."""
    return {
        "ema": trainer.ema.ema.state_dict() if trainer.ema else None,
        "ema_updates": trainer.ema.updates if trainer.ema else 0,
        "optimizer": trainer.optimizer.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "scaler_kind": scaler_kind(trainer.amp_dtype),
        "scheduler": {"schedule": config_dict.get("schedule"), "epoch": progress.epoch},
        "progress": progress.to_dict(),
        "micro_batch_size": trainer.micro_batch_size,
        "optimizer_steps": trainer.optimizer_steps,
        "rng": rng if rng is not None else capture_rng(trainer.device),
        "train_config": config_dict,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **(extra or {}),
    }


def checkpoint_bytes(trainer: Trainer) -> int:
    """About the size of a training checkpoint of ``trainer``, in bytes: model, EMA and optimizer state (before
    the first step, SGD momentum is one copy of the parameters and Adam's moments two), plus the file's
    overhead (``yolo9kit.checkpoint.estimate_checkpoint_bytes``)."""
    from yolo9kit.checkpoint import estimate_checkpoint_bytes

    model = unwrap(trainer.model)
    parts: list = [model.state_dict(), trainer.ema.ema.state_dict() if trainer.ema else {}]
    optimizer = trainer.optimizer
    if optimizer.state:
        parts.append(optimizer.state_dict()["state"])
    else:
        copies = 2 if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) else 1
        parts += [[p for group in optimizer.param_groups for p in group["params"]]] * copies
    return estimate_checkpoint_bytes(parts)


def save_training_checkpoint(path: Path, trainer: Trainer, progress: Progress, config_dict: dict,
                             rng: dict | None = None, extra: dict | None = None) -> Path:
    """Write ``path`` atomically through ``yolo9kit.checkpoint.save_checkpoint`` (temp file + rename)."""
    from yolo9kit.checkpoint import save_checkpoint

    path.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(path, unwrap(trainer.model), **training_state(trainer, progress, config_dict, rng, extra))
    return path


def restore_training_state(ckpt: dict, trainer: Trainer, source: str | Path = "the checkpoint") -> Progress:
    """Load model, EMA, optimizer, scaler and counters from a ``read_checkpoint`` dict into ``trainer``.

    RNG states are not restored here: the loop restores them right before the first batch it trains.

    Raises:
        ValueError: no training state, or one that is not finite (NaN or Inf in the weights, the EMA, the
            optimizer state or the loss scaler: a resume would train from it); ``source`` names the file.
    """
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
    _load_model_weights(unwrap(trainer.model), ckpt["model"])
    if trainer.ema is not None and ckpt.get("ema") is not None:
        trainer.ema.ema.load_state_dict(ckpt["ema"])
        trainer.ema.updates = int(ckpt.get("ema_updates", 0))
    trainer.optimizer.load_state_dict(ckpt["optimizer"])
    _restore_scaler(trainer, ckpt.get("scaler") or {}, ckpt.get("scaler_kind"))
    trainer.micro_batch_size = ckpt.get("micro_batch_size", trainer.micro_batch_size)
    trainer.optimizer_steps = int(ckpt.get("optimizer_steps", 0))
    return Progress.from_dict(ckpt["progress"])




def nonfinite_entries(value: Any, where: str = "") -> list[str]:
    """Key paths of the floating-point tensors and numbers in nested dicts/lists that are NaN or Inf."""
    if isinstance(value, torch.Tensor):
        return [where] if value.is_floating_point() and not bool(torch.isfinite(value).all()) else []
    if isinstance(value, float):
        return [] if np.isfinite(value) else [where]
    if isinstance(value, dict):
        return [w for k, v in value.items() for w in nonfinite_entries(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, (list, tuple)):
        return [w for i, v in enumerate(value) for w in nonfinite_entries(v, f"{where}.{i}")]
    return []


def nonfinite_weights(trainer: Trainer) -> list[str]:
    """Names of the model's and the EMA's floating-point tensors that hold NaN or Inf (one read-back)."""
    named = [(f"model.{k}", v) for k, v in unwrap(trainer.model).state_dict().items()]
    if trainer.ema is not None:
        named += [(f"ema.{k}", v) for k, v in trainer.ema.ema.state_dict().items()]
    named = [(k, v) for k, v in named if v.is_floating_point() and v.numel()]
    if not named:
        return []
    finite = torch.stack([torch.isfinite(v).all() for _, v in named]).cpu()  # a sync: once per checkpoint
    return [k for (k, _), ok in zip(named, finite.tolist()) if not ok]


def _restore_scaler(trainer: Trainer, state: dict, saved_kind: str | None) -> None:
    """The saved GradScaler state when it is of the kind this run uses; otherwise the run's own fresh scaler.

    A kind is what the scaler does (``scaler_kind``): dynamic fp16 loss scaling, a fixed scale of 1 (the
    step's skip of non-finite steps without fp16) or nothing. Another kind's state is never inherited: an fp16 run
    resumed from a bf16 state would otherwise train at scale 1 with a growth interval of 2**30,
    fp16 without loss scaling, and a disabled scaler's empty state cannot be loaded into an enabled one.
    """
    saved_kind = saved_kind or _kind_of_state(state)
    kind = scaler_kind(trainer.amp_dtype)
    if saved_kind == kind and state:
        trainer.scaler.load_state_dict(state)
    elif saved_kind != kind:
        LOGGER.info("resume: the checkpoint's loss scaler is %s, this run's is %s: it starts afresh", saved_kind, kind)


def _kind_of_state(state: dict) -> str:
    """The ``scaler_kind`` of a scaler state saved before the kind was recorded."""
    if not state:
        return "off"
    return "fixed" if state.get("growth_interval", 0) >= FIXED_SCALE_GROWTH_INTERVAL else "dynamic"


def _load_model_weights(model: torch.nn.Module, weights: dict) -> None:
    """``load_state_dict`` with a short message when the checkpoint is of another architecture."""
    own = model.state_dict()
    missing, unexpected = sorted(own.keys() - weights.keys()), sorted(weights.keys() - own.keys())
    reshaped = sorted(k for k in own.keys() & weights.keys() if own[k].shape != weights[k].shape)
    if missing or unexpected or reshaped:
        example = (missing or unexpected or reshaped)[0]
        raise ValueError(f"resume: the checkpoint holds another model than the one to train ({len(missing)} tensors "
                         f"missing, {len(unexpected)} unexpected, {len(reshaped)} of another shape, e.g. {example}); "
                         "resume with the run's model (the CLI rebuilds it from the checkpoint)")
    model.load_state_dict(weights)
