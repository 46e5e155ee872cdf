"""Settings as data: frozen dataclasses with the official defaults and why they are what they are.

``TrainConfig`` holds everything ``yolo9kit.train.fit`` needs besides the model and the data. The
hyper-parameter defaults are those of the official ``hyp.scratch-high.yaml`` (lr0 0.01, momentum 0.937,
...); the loss gains are a ``LossConfig``, passed through ``TrainConfig.loss`` (``yolo9kit.loss`` re-exports
it beside the loss it configures).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
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
    hyp: Mapping[str, float] | None = None  # augmentation dict for the data layer; None = official defaults
    loss: LossConfig | None = None  # None: the official gains
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
        if self.batch_size == -1:  # the official --batch-size -1
            object.__setattr__(self, "batch_size", "auto")
        if self.batch_size != "auto" and (not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise bad("batch_size", "an integer >= 1, or \"auto\" (also -1) to size it from the memory estimate")
        if self.batch_size == "auto" and self.micro_batch_size is not None:
            raise bad("micro_batch_size", "None with batch_size='auto' (the automatic batch is the micro-batch)")
        if not 0 <= self.margin < 1:
            raise bad("margin", "a share of the card in [0, 1)")
        check_activation_checkpointing(self.activation_checkpointing, "TrainConfig")
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
            loss = {k: v for k, v in loss.items() if k != "__dataclass__"}
            kwargs["loss"] = LossConfig(**loss)
        kwargs.update(overrides)
        return cls(**kwargs)


# The speed switches that ``None`` turns on for CUDA and off for the CPU (TrainConfig and StepConfig alike).
FAST_SWITCHES = ("channels_last", "lean_activations", "sync_free", "fused_optimizer")


def check_activation_checkpointing(value: Any, owner: str) -> None:
    """None, "backbone", "all" or a list of layer indices, else a ValueError naming ``owner``."""
    if value is None or value in ACTIVATION_CHECKPOINTING:
        return
    if isinstance(value, (list, tuple)) and value and all(isinstance(i, int) and i >= 0 for i in value):
        return
    raise ValueError(f"{owner}.activation_checkpointing={value!r}: expected None, 'backbone', 'all' "
                     "or a list of layer indices")


def amp_for(amp: str, device_type: str, bf16: bool) -> str:
    """The autocast mode a step runs with: "fp16", "bf16" or "off".

    "auto" is bf16 where the GPU has it (no loss scaling needed), else fp16; on the CPU the step is fp32
    whatever is asked, as the official check_amp does (CPU autocast is slower than fp32 for convolutions).
    """
    if amp not in AMP_MODES:
        raise ValueError(f"amp={amp!r}: expected one of {AMP_MODES}")
    if device_type != "cuda" or amp == "off":
        return "off"
    if amp == "auto":
        return "bf16" if bf16 else "fp16"
    return amp


@dataclass(frozen=True)
class StepConfig:
    """One training step, everything that sets its memory: what ``yolo9kit.memory`` estimates and measures
    and what ``fit`` runs.

    ``batch_size`` is the images of one forward/backward (``TrainConfig.micro_batch_size``, or its batch
    when that is not split). ``None`` switches and ``amp="auto"`` are decided for a device by
    :meth:`resolve`, with the rules ``fit`` uses; ``from_train_config`` builds the step of a training
    config. The simple form is a model name: ``StepConfig("yolov9-s", 16)``.
    """

    model: Any  # a registered name ("yolov9-s"), a model yaml, or an nn.Module
    batch_size: int = 16
    imgsz: int = 640
    amp: str = "auto"
    activation_checkpointing: str | tuple[int, ...] | None = None
    channels_last: bool | None = None
    lean_activations: bool | None = None
    sync_free: bool | None = None  # on: the dense loss of the sync-free step (all anchors, masked)
    fused_optimizer: bool | None = None
    optimizer: str = "SGD"
    ema: bool = True
    num_classes: int | None = None  # None: the model's own (80 for a registered name)
    num_targets: int = 8  # boxes per image of the synthetic batch (the assigner's memory grows with them)
    loss_fn: Callable | None = None  # (outputs, targets) -> (loss, items); None: the kit's DetectionLoss
    device_type: str | None = None  # "cuda" or "cpu" once resolved for a device, else None

    def __post_init__(self) -> None:
        def bad(name: str, expected: str) -> ValueError:
            return ValueError(f"StepConfig.{name}={getattr(self, name)!r}: expected {expected}")

        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise bad("batch_size", "an integer >= 1")
        if self.imgsz < 32 or self.imgsz % 32:
            raise bad("imgsz", "a multiple of 32 (the largest model stride)")
        if self.amp not in AMP_MODES:
            raise bad("amp", f"one of {AMP_MODES}")
        if self.optimizer not in OPTIMIZERS:
            raise bad("optimizer", f"one of {OPTIMIZERS}")
        if self.num_targets < 0:
            raise bad("num_targets", "an integer >= 0")
        check_activation_checkpointing(self.activation_checkpointing, "StepConfig")
        if isinstance(self.activation_checkpointing, list):  # hashable: the estimator cache is keyed by steps
            object.__setattr__(self, "activation_checkpointing", tuple(self.activation_checkpointing))

    @classmethod
    def from_train_config(cls, config: TrainConfig, model: Any, *, world_size: int = 1, num_targets: int = 8,
                          batch_size: int | None = None) -> StepConfig:
        """The step ``fit`` runs for ``config``: its micro-batch (per DDP rank), size, AMP and switches.

        ``batch_size`` overrides the micro-batch (needed while ``config.batch_size`` is "auto").
        """
        if batch_size is None:
            if config.batch_size == "auto":
                raise ValueError("TrainConfig.batch_size is 'auto': pass batch_size= (the batch to describe)")
            batch_size = config.micro_batch_size or max(1, config.batch_size // world_size)
        return cls(model=model, batch_size=batch_size, imgsz=config.imgsz, amp=config.amp,
                   activation_checkpointing=config.activation_checkpointing, channels_last=config.channels_last,
                   lean_activations=config.lean_activations, sync_free=config.sync_free,
                   fused_optimizer=config.fused_optimizer, optimizer=config.optimizer, ema=config.ema,
                   num_classes=getattr(model, "nc", None), num_targets=num_targets)

    def resolve(self, device: Any = None, *, bf16: bool | None = None) -> StepConfig:
        """This step as it runs on ``device`` (None: the first CUDA device, else the CPU): "auto" AMP and
        every ``None`` switch decided as ``fit`` decides them there (on for CUDA, off for the CPU).

        ``bf16``: whether the GPU has bf16 (default: ask the local CUDA device; a GPU without one: True).
        Values already set are kept, so resolving twice changes nothing.
        """
        device_type = _device_type(device)
        if bf16 is None:
            bf16 = _local_bf16() if device_type == "cuda" else False
        switches = {name: (device_type == "cuda") if getattr(self, name) is None else bool(getattr(self, name))
                    for name in FAST_SWITCHES}
        return dataclasses.replace(self, amp=amp_for(self.amp, device_type, bf16), device_type=device_type,
                                   **switches)

    @property
    def model_name(self) -> str:
        if isinstance(self.model, (str, Path)):
            return Path(str(self.model)).stem if str(self.model).endswith((".yaml", ".yml", ".pt")) else str(self.model)
        return str(getattr(self.model, "name", None) or type(self.model).__name__)

    @property
    def label(self) -> str:
        """A short name of the setting, e.g. ``fp16 channels_last lean ckpt=all 640px`` (curves, tables)."""
        parts = [self.amp]
        parts += [name for name, on in (("channels_last", self.channels_last), ("lean", self.lean_activations))
                  if on]
        if self.activation_checkpointing is not None:
            value = self.activation_checkpointing
            parts.append(f"ckpt={value if isinstance(value, str) else ','.join(map(str, value))}")
        parts.append(f"{self.imgsz}px")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Plain values for JSON (the model by name, the loss by its name)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["model"] = self.model_name
        if self.loss_fn is not None:
            out["loss_fn"] = getattr(self.loss_fn, "__name__", type(self.loss_fn).__name__)
        if isinstance(self.activation_checkpointing, tuple):
            out["activation_checkpointing"] = list(self.activation_checkpointing)
        return out


def _device_type(device: Any) -> str:
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if isinstance(device, int):
        return "cuda"
    text = str(device)
    return torch.device(f"cuda:{text}" if text.isdigit() else text).type


def _local_bf16() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


# ---- inference, validation and loader settings ------------------------------------------------------------


@dataclass(frozen=True)
class NMSConfig:
    """Which boxes survive non-maximum suppression (``predict``, ``evaluate``, ``non_max_suppression``).

    A field left None takes the official value of the function it is passed to: :data:`PREDICT_NMS` in
    ``predict`` (as ``detect_dual.py``), :data:`VAL_NMS` in ``evaluate`` (as ``val_dual.py``). So
    ``NMSConfig(conf=0.5)`` changes only the confidence threshold in both. Frozen: make a changed copy
    with ``dataclasses.replace(nms, iou=0.6)``.
    """

    conf: float | None = None  # a box needs a class score above this (official --conf-thres)
    iou: float | None = None  # a box overlapping a higher-scored one by more is dropped (--iou-thres)
    max_det: int | None = None  # at most this many boxes per image, the highest scored (--max-det)
    # Keep only these class ids (--classes); a tuple so that the frozen settings stay hashable.
    classes: tuple[int, ...] | None = None
    agnostic: bool = False  # suppress across classes, not only within one (--agnostic-nms)

    def __post_init__(self) -> None:
        for name in ("conf", "iou"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                raise ValueError(f"NMSConfig.{name}={value!r}: expected a number in [0, 1] or None")
        if self.max_det is not None and self.max_det < 1:
            raise ValueError(f"NMSConfig.max_det={self.max_det!r}: expected an integer >= 1 or None")
        if self.classes is not None:
            object.__setattr__(self, "classes", tuple(int(c) for c in self.classes))

    def filled(self, defaults: NMSConfig) -> NMSConfig:
        """This config with its None fields taken from ``defaults`` (``PREDICT_NMS`` or ``VAL_NMS``)."""
        return dataclasses.replace(self, **{name: getattr(defaults, name) for name in ("conf", "iou", "max_det")
                                            if getattr(self, name) is None})


# detect_dual.py's defaults: --conf-thres 0.25, --iou-thres 0.45, --max-det 1000 (one class per box).
PREDICT_NMS = NMSConfig(conf=0.25, iou=0.45, max_det=1000)
# val_dual.py's defaults: --conf-thres 0.001, --iou-thres 0.7, --max-det 300 (multi-label rows). The low
# threshold keeps the whole precision-recall curve, which mAP integrates over.
VAL_NMS = NMSConfig(conf=0.001, iou=0.7, max_det=300)


@dataclass(frozen=True)
class SaveConfig:
    """What ``predict`` writes and where (official ``detect_dual.py`` outputs). Nothing without ``save_dir``."""

    save_dir: str | Path | None = None  # the folder; None writes nothing (a notebook usually wants the objects)
    txt: bool = False  # labels/<stem>.txt lines "cls cx cy w h" normalised (official --save-txt)
    conf: bool = False  # add the confidence to each txt line (--save-conf)
    images: bool = True  # annotated images, on by default as the official script (off: --nosave)
    line_width: int | None = None  # box lines in pixels; None scales with the image (--line-thickness)


@dataclass(frozen=True)
class LoaderConfig:
    """Process plumbing of ``create_dataloader``: it changes speed and memory, never the batches."""

    # Page-locked batches let the copy to the GPU overlap compute; None: on when CUDA is available.
    pin_memory: bool | None = None
    # Batches each worker prepares ahead (torch's default is 2): a deeper queue absorbs the batches that take
    # longer than the rest (mosaic, mixup), at the price of that many batches of RAM per worker.
    prefetch_factor: int = 4
    # cache=None decodes all images into RAM only when they need less than this share of the available RAM.
    cache_budget: float = 0.5

    def __post_init__(self) -> None:
        if self.prefetch_factor < 1:
            raise ValueError(f"LoaderConfig.prefetch_factor={self.prefetch_factor!r}: expected an integer >= 1")
        if not 0 < self.cache_budget <= 1:
            raise ValueError(f"LoaderConfig.cache_budget={self.cache_budget!r}: expected a share in (0, 1]")
