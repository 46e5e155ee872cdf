"""Training settings: frozen dataclasses with the official defaults and why they are what they are.

``TrainConfig`` holds everything ``yolo9kit.train.fit`` needs besides the model and the data. The
hyper-parameter defaults are those of the official ``hyp.scratch-high.yaml`` (lr0 0.01, momentum 0.937,
...); the loss gains are a ``LossConfig``, passed through ``TrainConfig.loss`` (``yolo9kit.loss`` re-exports
it beside the loss it configures).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AMP_MODES = ("auto", "fp16", "bf16", "off")
ACTIVATION_CHECKPOINTING = ("backbone", "all")  # or a list of layer indices
# Head-room kept below a card's capacity when sizing a batch: validation runs at 2x the batch in eval mode
# (no saved activations, but its own peak), the number of objects per image changes the assigner's memory,
# and the allocator fragments over an epoch (YOLOv5 went from 0.9 to 0.8 of the card for this reason;
# Ultralytics keeps 0.4 free).
DEFAULT_MARGIN = 0.10
OPTIMIZERS = ("SGD", "Adam", "AdamW")
SCHEDULES = ("linear", "cosine", "flat-cosine", "fixed")
CALLBACK_NAMES = ("on_step", "on_epoch_end")
# What ``freeze`` accepts: None/0, the first N layers, "backbone", or layer indices (yolo9kit.models.freeze).
Freeze = int | str | Sequence[int] | None

# Augmentation hyper-parameters of the official hyp.scratch-high.yaml (passed to the data layer).
DEFAULT_AUGMENT_HYP: dict[str, float] = {
    "hsv_h": 0.015, "hsv_s": 0.7, "hsv_v": 0.4, "degrees": 0.0, "translate": 0.1, "scale": 0.9,
    "shear": 0.0, "perspective": 0.0, "flipud": 0.0, "fliplr": 0.5, "mosaic": 1.0, "mixup": 0.15,
    "copy_paste": 0.3,
}


@dataclass(frozen=True)
class LossConfig:
    """Loss settings. Defaults are the official values.

    The official ``ComputeLoss`` hard-codes the gains and the auxiliary weight in its ``__call__``
    (``loss[0] *= 7.5``, ``loss[1] *= 0.5``, ``loss[2] *= 1.5``, ``*= 0.25`` for the aux head) and
    ignores the identically valued ``box`` / ``cls`` / ``dfl`` keys of ``hyp.scratch-high.yaml``;
    it builds the assigner with topk 10, alpha 0.5, beta 6.0 (overridable there only through the
    environment variables ``YOLOM``/``YOLOA``/``YOLOB``). Here they are plain fields.
    """

    box_gain: float = 7.5  # weight of the CIoU box loss
    cls_gain: float = 0.5  # weight of the BCE class loss
    dfl_gain: float = 1.5  # weight of the distribution focal loss
    aux_weight: float = 0.25  # the auxiliary (PGI) head's share; the main head counts 1
    topk: int = 10  # candidate anchors per GT in the assigner
    alpha: float = 0.5  # class-score exponent of the alignment metric
    beta: float = 6.0  # CIoU exponent of the alignment metric
    eps: float = 1e-9  # assigner in-box margin and normalisation epsilon
    cls_pos_weight: float = 1.0  # BCE pos_weight (hyp cls_pw)
    # Most (image, GT, anchor) pairs the assigner works on at once. The official assigner peaks at
    # ~100 bytes per pair for the whole batch (4 GB for 16 images of 640 with 300 objects each); ours
    # at ~25 bytes per pair of a chunk, so this default bounds it near 250 MB however crowded the
    # images (docs/loss.md has the measurements). None: the whole batch at once.
    max_assign_chunk: int | None = 8_388_608

    def replace(self, **changes: Any) -> LossConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class TrainConfig:
    """How to train. Frozen: make a changed copy with ``dataclasses.replace(config, epochs=10)``.

    Batch vocabulary: ``batch_size`` images come out of the loader per batch (total over all DDP ranks,
    as the official ``--batch-size``); ``micro_batch_size`` images go through one forward/backward
    (a "micro-step", default the whole batch); an optimizer "step" happens every ``accumulate``
    batches. The hyper-parameters assume ``nominal_batch_size`` (64) images per step.
    """

    epochs: int = 100
    # An int, or "auto" (also -1, the official flag): before the first step, the largest batch whose step
    # the memory estimate fits into (1 - margin) of ``gpu`` (None: the training device; the CPU: its RAM),
    # as ``yolo9kit.memory.plan`` recommends it for ``nominal_batch_size`` (docs/memory.md).
    batch_size: int | str = 16
    gpu: str | int | None = None  # batch_size="auto": the card to size for (a name from memory.GPUS, bytes)
    margin: float = DEFAULT_MARGIN  # batch_size="auto": share of the card kept free
    # The batch the hyper-parameters were tuned for; accumulation makes each step see about this many images.
    nominal_batch_size: int = 64
    # None: official rule max(round(nominal/batch), 1), ramped up from 1 during warmup. An int: that many
    # batches per optimizer step (also ramped from 1 during warmup when accumulate_warmup is True).
    accumulate_steps: int | None = None
    accumulate_warmup: bool = True
    # Split each loader batch into micro-batches of this size (None: no split). OOM back-off halves it.
    micro_batch_size: int | None = None
    imgsz: int = 640
    # Recompute these layers in backward instead of keeping their activations: None, "backbone", "all" or a
    # list of layer indices (DetectionModel.set_activation_checkpointing). Saves memory, costs a forward.
    activation_checkpointing: str | list[int] | None = None
    # Fine-tuning: layers whose parameters do not train (official --freeze): None or 0 nothing, an int N the
    # first N layers, "backbone" the model yaml's backbone rows, or a list of layer indices (stored as a
    # tuple). Frozen parameters get no gradient, no optimizer state and no EMA update, and the memory
    # estimate of the step counts none of them (yolo9kit.models.freeze has the rules).
    freeze: int | str | tuple[int, ...] | None = None
    # "auto": bf16 where the GPU supports it, else fp16; always "off" on CPU (autocast on CPU is slow).
    amp: str = "auto"
    # Speed switches; None means on for CUDA, off on the CPU (StepConfig.resolve decides, for fit and memory).
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
    # Official data options of train_dual.py. rect: training batches of images sorted by aspect ratio, each
    # batch letterboxed to its own shape (official batch shapes, pad 0), no mosaic and no shuffling.
    rect: bool = False
    # Each batch resized to a random multiple of the model stride in [0.5, 1.5] x imgsz (official rule; the
    # memory estimate describes the step at the largest size).
    multi_scale: bool = False
    single_cls: bool = False  # every class becomes class 0 ("item"); the model predicts one class
    min_items: int = 0  # drop training images with fewer labelled boxes than this (official --min-items)
    # Official --label-smoothing: the official dual loss computes its smoothed BCE targets and never uses
    # them, so it changes nothing there and nothing here (kept so that official commands run; fit warns).
    label_smoothing: float = 0.0
    hyp: Mapping[str, float] | None = None  # augmentation dict for the data layer; None = official defaults
    loss: LossConfig | None = None  # None: the official gains
    cache: str | None = None  # None | "ram" | "disk"
    # Train even when the training labels use class ids `names` does not name, hold no box at all, or lose
    # more than a tenth of the labelled images to errors. Off: such data stops the run before the first
    # step with a DataError naming the data.yaml, the counts and the class ids (yolo9kit.data.guard), as the
    # official code stops on the first two, instead of training a model of what happened to be left.
    allow_bad_labels: bool = False
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
    progress_bar: bool = True  # tqdm bars of each epoch and its validation (rank 0)
    # The run folder's pictures (labels.jpg, train_batch0-2.jpg, results.png every epoch, the validation plots
    # at the end; yolo9kit.train.pictures). On a CPU about 0.4 s per epoch and 2 s per run (docs/training.md);
    # False for quiet or timed runs.
    plots: bool = True
    patience: int = 100  # stop after this many epochs without a better fitness
    save_period: int = -1  # also save epoch{n}.pt every n epochs when > 0
    # {"on_step": f(StepRecord), "on_epoch_end": g(EpochRecord)} (yolo9kit.train.records; rank 0 only). Not saved.
    callbacks: Mapping[str, Callable[[Any], None]] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        def bad(name: str, expected: str) -> ValueError:
            return ValueError(f"TrainConfig.{name}={getattr(self, name)!r}: expected {expected}")

        for f in dataclasses.fields(self):  # whole numbers: 2.5 epochs would fail later, inside fit
            value, optional = getattr(self, f.name), f.type == "int | None"
            if (f.type == "int" or optional) and not (value is None and optional) and \
                    (isinstance(value, bool) or not isinstance(value, int)):
                raise bad(f.name, "a whole number" + (" or None" if optional else ""))
        if self.epochs < 1:
            raise bad("epochs", "an integer >= 1")
        if self.batch_size == -1:  # the official --batch-size -1
            object.__setattr__(self, "batch_size", "auto")
        if self.batch_size != "auto" and (not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise bad("batch_size", "an integer >= 1, or \"auto\" (also -1) to size it from the memory estimate")
        if self.batch_size == "auto" and self.micro_batch_size is not None:
            raise bad("micro_batch_size", "None with batch_size='auto' (the automatic batch is the micro-batch)")
        if not 0 <= self.margin < 1:
            raise bad("margin", "a share of the card in [0, 1)")
        check_activation_checkpointing(self.activation_checkpointing, "TrainConfig")
        object.__setattr__(self, "freeze", check_freeze(self.freeze, "TrainConfig"))
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
        self._check_ranges(bad)

    def _check_ranges(self, bad: Callable[[str, str], ValueError]) -> None:
        """Hyper-parameters and counts outside their ranges, and options that contradict each other: refused
        here, before any work, rather than as a NaN loss or a division by zero epochs later."""
        if isinstance(self.batch_size, int) and (self.micro_batch_size or 0) > self.batch_size:
            raise bad("micro_batch_size", f"at most batch_size={self.batch_size} (a batch is split into micro-batches)")
        minimum = {"lr0": (0, False), "lrf": (0, True), "weight_decay": (0, True), "warmup_epochs": (0, True),
                   "warmup_bias_lr": (0, True), "grad_clip": (0, True), "ema_tau": (0, False)}
        for name, (low, inclusive) in minimum.items():
            value = getattr(self, name)
            if not (value >= low if inclusive else value > low):
                raise bad(name, f"a number {'>=' if inclusive else '>'} {low}")
        for name in ("momentum", "warmup_momentum", "ema_decay"):
            if not 0 <= getattr(self, name) <= 1:
                raise bad(name, "a number in [0, 1]")
        for name in ("nominal_batch_size", "val_batch_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise bad(name, "an integer >= 1")
        if not 0 <= self.label_smoothing < 1:
            raise bad("label_smoothing", "an epsilon in [0, 1)")
        for name in ("close_mosaic", "patience", "workers", "warmup_min_steps", "min_items"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise bad(name, "an integer >= 0")
        if self.cache not in (None, False, True, "ram", "disk", "auto"):
            raise bad("cache", "None, 'ram' or 'disk'")
        check_augment_hyp(self.augment_hyp, "TrainConfig.hyp")

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
            elif isinstance(value, tuple):  # freeze indices: a list in checkpoints and YAML
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], **overrides: Any) -> TrainConfig:
        """Inverse of ``to_dict``; unknown keys are ignored (checkpoints of other versions), ``overrides`` win."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in names}
        loss = kwargs.get("loss")
        if isinstance(loss, Mapping):
            loss = {k: v for k, v in loss.items() if k != "__dataclass__"}
            kwargs["loss"] = LossConfig(**loss)
        kwargs.update(overrides)
        return cls(**kwargs)


def official_accumulate(nominal_batch_size: int, batch_size: int) -> int:
    """Batches per optimizer step so that a step sees about ``nominal_batch_size`` images (official
    train_dual.py): ``max(round(nominal / batch), 1)``, Python's round (halves to even, 64/24 = 2.67 -> 3)."""
    return max(round(nominal_batch_size / batch_size), 1)


# augmentation keys that are probabilities; the others are gains and ranges, >= 0
_AUGMENT_PROBABILITIES = ("flipud", "fliplr", "mosaic", "mixup", "copy_paste")


def check_augment_hyp(values: Mapping[str, float], owner: str) -> None:
    """Augmentation hyper-parameters in range (probabilities in [0, 1], gains >= 0), else a ValueError naming
    ``owner`` and the key."""
    for key, value in values.items():
        if key not in DEFAULT_AUGMENT_HYP:
            continue
        probability = key in _AUGMENT_PROBABILITIES
        if not (0 <= value <= 1 if probability else value >= 0):
            raise ValueError(f"{owner}[{key!r}]={value!r}: expected "
                             f"{'a probability in [0, 1]' if probability else 'a number >= 0'}")


def check_freeze(value: Freeze, owner: str) -> int | str | tuple[int, ...] | None:
    """The freeze setting in its stored form (a list becomes a tuple), else a ValueError naming ``owner``.

    None or 0 (stored as None): nothing; an int N: the first N layers; "backbone"; a non-empty list of layer
    indices >= 0.
    """
    if value is None or value == "backbone":
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value or None  # 0, the official default, freezes nothing
    if isinstance(value, (list, tuple)) and value and all(isinstance(i, int) and not isinstance(i, bool)
                                                          and i >= 0 for i in value):
        return tuple(value)
    raise ValueError(f"{owner}.freeze={value!r}: expected None, a number of first layers (int >= 0), "
                     "'backbone' or a non-empty list of layer indices >= 0")


def check_activation_checkpointing(value: Any, owner: str) -> None:
    """None, "backbone", "all" or a list of layer indices, else a ValueError naming ``owner``."""
    if value is None or value in ACTIVATION_CHECKPOINTING:
        return
    if isinstance(value, (list, tuple)) and value and all(isinstance(i, int) and i >= 0 for i in value):
        return
    raise ValueError(f"{owner}.activation_checkpointing={value!r}: expected None, 'backbone', 'all' "
                     "or a list of layer indices")
