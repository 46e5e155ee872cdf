"""Settings as data: frozen dataclasses with the official defaults and why they are what they are.

``TrainConfig`` holds everything ``yolo9kit.train.fit`` needs besides the model and the data. The
hyper-parameter defaults are those of the official ``hyp.scratch-high.yaml`` (lr0 0.01, momentum 0.937,
...); the loss gains live in ``yolo9kit.loss.LossConfig`` and are passed through ``TrainConfig.loss``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AMP_MODES = ("auto", "fp16", "bf16", "off")
OPTIMIZERS = ("SGD", "Adam", "AdamW")
SCHEDULES = ("linear", "cosine", "flat-cosine", "fixed")
CALLBACK_NAMES = ("on_step", "on_epoch_end")

# Augmentation hyper-parameters of the official hyp.scratch-high.yaml (passed to the data layer).
DEFAULT_AUGMENT_HYP: dict[str, float] = {
    "hsv_h": 0.015, "hsv_s": 0.7, "hsv_v": 0.4, "degrees": 0.0, "translate": 0.1, "scale": 0.9,
    "shear": 0.0, "perspective": 0.0, "flipud": 0.0, "fliplr": 0.5, "mosaic": 1.0, "mixup": 0.15,
    "copy_paste": 0.3,
}


@dataclass(frozen=True)
class TrainConfig:
    """How to train. Frozen: make a changed copy with ``dataclasses.replace(config, epochs=10)``.

    Batch vocabulary: ``batch_size`` images come out of the loader per batch (total over all DDP ranks,
    as the official ``--batch-size``); ``micro_batch_size`` images go through one forward/backward
    (a "micro-step", default the whole batch); an optimizer "step" happens every ``accumulate``
    batches. The hyper-parameters assume ``nominal_batch_size`` (64) images per step.
    """

    epochs: int = 100
    batch_size: int = 16
    # The batch the hyper-parameters were tuned for; accumulation makes each step see about this many images.
    nominal_batch_size: int = 64
    # None: official rule max(round(nominal/batch), 1), ramped up from 1 during warmup. An int: that many
    # batches per optimizer step (also ramped from 1 during warmup when accumulate_warmup is True).
    accumulate_steps: int | None = None
    accumulate_warmup: bool = True
    # Split each loader batch into micro-batches of this size (None: no split). OOM back-off halves it.
    micro_batch_size: int | None = None
    imgsz: int = 640
    # "auto": bf16 where the GPU supports it, else fp16; always "off" on CPU (autocast on CPU is slow).
    amp: str = "auto"
    # Speed switches; None means on for CUDA, off on the CPU (see yolo9kit.train.step.fast_settings).
    channels_last: bool | None = None  # channels_last weights and inputs (NHWC convolutions)
    sync_free: bool | None = None  # no host-device sync in the step; losses read every log_interval batches
    fused_optimizer: bool | None = None  # torch's fused SGD/Adam/AdamW
    lean_activations: bool | None = None  # BatchNorm+SiLU keep one activation for backward, not two (~25 % less)
    colour_on_device: bool | None = None  # HSV colour jitter on the training device, not in the loader
    cudnn_benchmark: bool = True  # cudnn autotuning (CUDA only)
    # torch.compile the model's forward: True, or a mode such as "reduce-overhead" (CUDA graphs) or
    # "max-autotune". Off by default: the first step then takes minutes (measured in docs/benchmarks.md).
    compile: bool | str = False
    log_interval: int = 10  # sync-free: batches between read-backs of the losses (progress bar, callbacks)
    optimizer: str = "SGD"
    lr0: float = 0.01
    lrf: float = 0.01  # final LR = lr0 * lrf
    momentum: float = 0.937  # SGD momentum / Adam beta1
    weight_decay: float = 0.0005  # scaled by batch*accumulate/nominal (official)
    schedule: str = "linear"
    warmup_epochs: float = 3.0
    # Official: at least 100 warmup batches, however short the epoch (lower it for tiny CPU runs).
    warmup_min_steps: int = 100
    warmup_momentum: float = 0.8
    warmup_bias_lr: float = 0.1
    ema: bool = True
    ema_decay: float = 0.9999
    ema_tau: float = 2000.0  # EMA decay ramps as decay * (1 - exp(-updates / tau))
    grad_clip: float = 10.0  # max total grad norm after unscaling (official constant); 0 disables
    close_mosaic: int = 0  # turn mosaic off for the last N epochs
    hyp: Mapping[str, float] | None = None  # augmentation dict for the data layer; None = official defaults
    loss: Any = None  # yolo9kit.loss.LossConfig or None (official gains)
    cache: str | None = None  # None | "ram" | "disk"
    workers: int | None = None  # loader processes; None: min(CPUs, batch, 8) (official rule)
    seed: int = 0
    device: str | None = None  # None: first CUDA device, else CPU
    val: bool = True  # validate the EMA every epoch (the last epoch is always validated)
    val_batch_size: int | None = None  # None: 2 x batch size (official)
    project: str = "runs/train"
    name: str = "exp"
    exist_ok: bool = False
    resume: bool | str = False  # True: newest last.pt under project; a path: that checkpoint
    max_nonfinite_steps: int = 10  # stop after this many non-finite losses in a row
    oom_backoff: bool = True  # on CUDA out-of-memory halve the micro-batch and retry
    sync_bn: bool = False  # DDP only: convert BatchNorm to SyncBatchNorm
    progress_bar: bool = True  # tqdm bar per epoch (rank 0)
    patience: int = 100  # stop after this many epochs without a better fitness
    save_period: int = -1  # also save epoch{n}.pt every n epochs when > 0
    # {"on_step": f(StepRecord), "on_epoch_end": g(EpochRecord)} (yolo9kit.train.records; rank 0 only). Not saved.
    callbacks: Mapping[str, Callable[[Any], None]] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        def bad(name: str, expected: str) -> ValueError:
            return ValueError(f"TrainConfig.{name}={getattr(self, name)!r}: expected {expected}")

        if self.epochs < 1:
            raise bad("epochs", "an integer >= 1")
        if self.batch_size < 1:
            raise bad("batch_size", "an integer >= 1 (AutoBatch lives in yolo9kit.memory)")
        if self.accumulate_steps is not None and self.accumulate_steps < 1:
            raise bad("accumulate_steps", "None or an integer >= 1")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise bad("micro_batch_size", "None or an integer >= 1")
        if self.amp not in AMP_MODES:
            raise bad("amp", f"one of {AMP_MODES}")
        if self.optimizer not in OPTIMIZERS:
            raise bad("optimizer", f"one of {OPTIMIZERS}")
        if self.schedule not in SCHEDULES:
            raise bad("schedule", f"one of {SCHEDULES}")
        if self.imgsz < 32 or self.imgsz % 32:
            raise bad("imgsz", "a multiple of 32 (the largest model stride)")
        if self.log_interval < 1:
            raise bad("log_interval", "an integer >= 1")
        if self.max_nonfinite_steps < 1:
            raise bad("max_nonfinite_steps", "an integer >= 1")
        unknown = set(self.callbacks or {}) - set(CALLBACK_NAMES)
        if unknown:
            raise bad("callbacks", f"a dict with keys among {CALLBACK_NAMES}, got {sorted(unknown)}")

    @property
    def augment_hyp(self) -> dict[str, float]:
        """The augmentation hyper-parameters: official defaults updated with ``hyp``."""
        return {**DEFAULT_AUGMENT_HYP, **(self.hyp or {})}

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (numbers, strings, lists, dicts) for checkpoints; callbacks are left out."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "callbacks":
                continue
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value):
                value = {"__dataclass__": type(value).__name__, **dataclasses.asdict(value)}
            elif isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, Path):
                value = str(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], **overrides: Any) -> TrainConfig:
        """Inverse of ``to_dict``; unknown keys are ignored (checkpoints of other versions), ``overrides`` win."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in names}
        loss = kwargs.get("loss")
        if isinstance(loss, Mapping):
            from yolo9kit.loss import LossConfig

            loss = {k: v for k, v in loss.items() if k != "__dataclass__"}
            kwargs["loss"] = LossConfig(**loss)
        kwargs.update(overrides)
        return cls(**kwargs)
