"""``TrainConfig`` and its parts (``step``, ``optim``, ``pipeline``, ``run``), official defaults (docs/training.md)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from yolo9kit.config.step import API_ONLY, CHANGE, RUN, Settings, StepConfig, check_setting, declare, settings

DEFAULT_MARGIN = 0.10  # share of a card kept free when sizing a batch (docs/memory.md)
CACHE_MODES = ("auto", "ram", "disk", None)  # the image cache (yolo9kit.data.dataset); None reads the files
CALLBACK_NAMES = ("on_batch", "on_epoch_end", "on_run_end")
LOGGERS = ("tensorboard", "mlflow")  # entry points "yolo9kit.loggers", each an optional extra of the package
# Fixed at the official values (docs/training.md):
GRAD_CLIP = 10.0  # the largest total gradient norm after unscaling
LOG_INTERVAL = 10  # batches between read-backs of the losses (progress bar, callbacks)
MAX_NONFINITE_BATCHES = 10  # non-finite losses in a row that stop a run
OOM_BACKOFF = True  # on CUDA out-of-memory halve the micro-batch and retry
_AUGMENT_PROBABILITIES = ("flipud", "fliplr", "mosaic", "mixup", "copy_paste")  # the others: gains >= 0
_HYP = "--hyp reads it from an official hyp yaml"
_PLAIN = "--plain-step turns it off"


def check_augment_hyp(values: Mapping[str, float], owner: str) -> None:
    """Probabilities in [0, 1], gains finite and >= 0, else a ValueError naming ``owner`` and the key."""
    for key, value in values.items():
        probability = key in _AUGMENT_PROBABILITIES
        if key in Hyp.__dataclass_fields__ and not (0 <= value <= 1 if probability else 0 <= value < math.inf):
            raise ValueError(f"{owner}[{key!r}]={value!r}: expected "
                             f"{'a probability in [0, 1]' if probability else 'a finite number >= 0'}")


@dataclass(frozen=True)
class Hyp:
    """Augmentation hyper-parameters; defaults are the official hyp.scratch-high.yaml values."""

    hsv_h: float = 0.015  # hue gain fraction
    hsv_s: float = 0.7  # saturation gain fraction
    hsv_v: float = 0.4  # value gain fraction
    degrees: float = 0.0  # rotation, +/- degrees
    translate: float = 0.1  # +/- fraction of the output size
    scale: float = 0.9  # zoom drawn from [1 - scale, 1 + scale]
    shear: float = 0.0  # +/- degrees
    perspective: float = 0.0  # +/- fraction (0 keeps the warp affine)
    flipud: float = 0.0  # probability
    fliplr: float = 0.5  # probability
    mosaic: float = 1.0  # probability, while mosaic is enabled
    mixup: float = 0.15  # probability, inside the mosaic path only
    copy_paste: float = 0.3  # probability per polygon; acts only on polygon labels, inside mosaics

    def __post_init__(self) -> None:
        check_augment_hyp(dataclasses.asdict(self), "Hyp")

    @classmethod
    def from_dict(cls, hyp: dict | Hyp | None) -> Hyp:
        """From a dict such as an official hyp yaml; other keys (lr0, box, ...) are ignored."""
        if hyp is None or isinstance(hyp, Hyp):
            return hyp or cls()
        return cls(**{k: float(v) for k, v in hyp.items() if k in cls.__dataclass_fields__})


DEFAULT_AUGMENT_HYP: dict[str, float] = dataclasses.asdict(Hyp())  # the official hyp.scratch-high.yaml augmentation


@dataclass(frozen=True)
class LossConfig(Settings):
    """Loss settings, the official values (docs/loss.md); a gain of 0 turns its loss off (cls for one class)."""

    box_gain: float = declare(7.5, "weight of the CIoU box loss", no_flag=_HYP, low=0)
    cls_gain: float = declare(0.5, "weight of the BCE class loss", no_flag=_HYP, low=0)
    dfl_gain: float = declare(1.5, "weight of the distribution focal loss", no_flag=_HYP, low=0)
    aux_weight: float = declare(0.25, "the auxiliary (PGI) head's share (the main head's: 1)", no_flag=API_ONLY, low=0)
    topk: int = declare(10, "candidate anchors per GT in the assigner", no_flag=API_ONLY, integer=True, low=1)
    alpha: float = declare(0.5, "class-score exponent of the alignment metric", no_flag=API_ONLY, low=0)
    beta: float = declare(6.0, "CIoU exponent of the alignment metric", no_flag=API_ONLY, low=0)
    eps: float = declare(1e-9, "assigner in-box margin, normalisation epsilon", no_flag=API_ONLY, low=0, low_open=True)
    cls_pos_weight: float = declare(1.0, "BCE pos_weight of the positives", no_flag=_HYP, low=0, low_open=True)
    max_assign_chunk: int | None = declare(8_388_608, "assigner pairs per chunk (None: all)", no_flag=API_ONLY,
                                           integer=True, low=1)


@dataclass(frozen=True)
class OptimConfig(Settings):
    """The optimizer's hyper-parameters, its schedule, accumulation and the loss (official hyp.scratch-high)."""

    lr0: float = declare(0.01, "initial learning rate", no_flag=_HYP, low=0, low_open=True)
    lrf: float = declare(0.01, "final learning rate = lr0 * lrf", no_flag=_HYP, low=0)
    momentum: float = declare(0.937, "SGD momentum / Adam beta1", no_flag=_HYP, low=0, high=1)
    weight_decay: float = declare(0.0005, "scaled by batch * accumulate / nominal (official)", no_flag=_HYP, low=0)
    schedule: str = declare("linear", "the learning-rate schedule", no_flag="--cos-lr, --flat-cos-lr or --fixed-lr",
                            choices=("linear", "cosine", "flat-cosine", "fixed"))
    warmup_epochs: float = declare(3.0, "epochs of warmup", no_flag=_HYP, low=0)
    warmup_min_batches: int = declare(100, "the fewest warmup batches", no_flag=API_ONLY, integer=True, low=0)
    warmup_momentum: float = declare(0.8, "momentum at the start of warmup", no_flag=_HYP, low=0, high=1)
    warmup_bias_lr: float = declare(0.1, "bias learning rate at the start of warmup", no_flag=_HYP, low=0)
    nominal_batch_size: int = declare(64, "images per optimizer step the hyper-parameters assume", no_flag=API_ONLY,
                                      integer=True, low=1)
    accumulate_steps: int | None = declare(None, "batches per optimizer step (default max(round(64 / batch), 1))",
                                           flag="--accumulate-steps", integer=True, low=1)
    loss: LossConfig = declare(LossConfig(), "the loss gains (official by default)", no_flag=_HYP)


@dataclass(frozen=True)
class PipelineConfig(Settings):
    """The training data: which images (train_dual.py's data options), the augmentation and the loaders."""

    rect: bool = declare(False, "rectangular batches, sorted by aspect ratio (no mosaic, no shuffling)", flag="--rect")
    single_cls: bool = declare(False, "train multi-class data as one class (\"item\")", flag="--single-cls")
    min_items: int = declare(0, "drop training images with fewer labelled boxes (official --min-items)",
                             flag="--min-items", integer=True, low=0)
    close_mosaic: int = declare(0, "mosaic off for the last N epochs", flag="--close-mosaic", integer=True, low=0)
    hyp: Mapping[str, float] | None = declare(None, "augmentation keys changed from the official", no_flag=_HYP)
    colour_on_device: bool | None = declare(None, "HSV jitter on the device, not in the loader", no_flag=_PLAIN,
                                            resume=CHANGE)
    cache: str | None = declare("auto", "decoded images: auto (in RAM when they fit), ram (the flag alone), disk (a "
                                "file beside the labels) or None", flag="--cache", resume=CHANGE, choices=CACHE_MODES)
    allow_bad_labels: bool = declare(False, "train even when labels use unnamed classes, no image has a box, or "
                                     "many would be dropped", flag="--allow-bad-labels", resume=CHANGE)
    workers: int | None = declare(None, "loader processes (default the official min(CPUs, batch, 8), fewer when "
                                  "/dev/shm or RAM is small)", flag="--workers", resume=CHANGE, integer=True, low=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_augment_hyp(self.augment_hyp, "TrainConfig.hyp")

    @property
    def augment_hyp(self) -> dict[str, float]:
        """The augmentation hyper-parameters: official defaults updated with ``hyp``."""
        return {**DEFAULT_AUGMENT_HYP, **(self.hyp or {})}


@dataclass(frozen=True)
class RunConfig(Settings):
    """Where and how the run goes: the device, the seed, the run folder, validation, saving and logging."""

    device: str | None = declare(None, "cpu, 0, cuda:1 (default: first GPU, else CPU)", flag="--device", resume=CHANGE)
    seed: int = declare(0, "seed of the initial weights (a model fit builds), the data order and the augmentation",
                        flag="--seed", integer=True)
    deterministic: bool = declare(False, "deterministic CUDA kernels, no cuDNN autotuning: the same numbers on the "
                                  "same GPU, slower", flag="--deterministic", resume=CHANGE)
    val: bool = declare(True, "validate the EMA every epoch (the last epoch is always validated)", flag="--noval",
                        negate=True, resume=CHANGE)
    patience: int = declare(100, "stop after N epochs without a better fitness", flag="--patience", resume=CHANGE,
                            integer=True, low=0)
    project: str = declare("runs/train", "folder of the run folders (and of the newest, for --resume)",
                           flag="--project", resume=RUN)
    name: str = declare("exp", "run folder name under --project", flag="--name", resume=RUN)
    exist_ok: bool = declare(False, "write into an existing run folder of that name", flag="--exist-ok", resume=RUN)
    resume: bool | str = declare(False, "resume the newest unfinished run, or this run folder / last.pt (its "
                                 "settings; --epochs may extend it)", flag="--resume", resume=RUN)
    save_period: int = declare(-1, "also save weights/epoch<e>.pt every N epochs (e = 0, N, 2N, ...; -1: off)",
                               flag="--save-period", resume=CHANGE, integer=True)
    log_weights: bool = declare(True, "the mlflow logger uploads best.pt and last.pt (tune: the best trial's)",
                                no_flag=API_ONLY, resume=CHANGE)
    plots: bool = declare(True, "draw the run's pictures (labels, training batches, curves, validation)",
                          flag="--no-plots", negate=True, resume=CHANGE)
    progress_bar: bool = declare(True, "tqdm bars of each epoch and its validation (rank 0)",
                                 no_flag="API only: the command line always shows them", resume=CHANGE)
    sync_bn: bool = declare(False, "SyncBatchNorm (DDP only)", flag="--sync-bn")
    loggers: tuple[str, ...] = declare((), "also log the run to tensorboard (events in the run folder) and/or "
                                       "mlflow (--mlflow-uri)", flag="--loggers", resume=CHANGE)
    mlflow_uri: str | None = declare(None, "the MLflow tracking server (http://host:5000) or store (sqlite:///FILE); "
                                     "default sqlite:///<project>/mlflow.db", flag="--mlflow-uri", resume=CHANGE)
    callbacks: Mapping[str, Callable[[Any], None]] | None = declare(  # not saved
        None, "{name: f(record)} of CALLBACK_NAMES, on rank 0", no_flag="API only", resume=CHANGE, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        loggers = (self.loggers,) if isinstance(self.loggers, str) else tuple(self.loggers or ())
        if not set(loggers) <= set(LOGGERS) or len(set(loggers)) != len(loggers):
            raise ValueError(f"TrainConfig.loggers={self.loggers!r}: expected some of {LOGGERS}, each once")
        object.__setattr__(self, "loggers", loggers)  # a list (a checkpoint's) or a name, kept as a tuple
        unknown = set(self.callbacks or {}) - set(CALLBACK_NAMES)
        if unknown:
            raise ValueError(f"TrainConfig.callbacks={self.callbacks!r}: expected a dict with keys among "
                             f"{CALLBACK_NAMES}, got {sorted(unknown)}")
        if self.mlflow_uri and urlsplit(self.mlflow_uri).password:  # never stored or printed: not named here either
            raise ValueError("TrainConfig.mlflow_uri (--mlflow-uri) holds a password, which the run would store and "
                             "print: give the server alone and the credentials as MLFLOW_TRACKING_USERNAME and "
                             "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN), or in ~/.mlflow/credentials")


@dataclass(frozen=True, init=False)
class TrainConfig(Settings):
    """How to train, set by setting names (``TrainConfig(lr0=0.02)``, ``.replace(micro_batch_size=8)``), read through
    the parts (``config.optim.lr0``); a part passed whole (``step=plan.step``) takes the names given beside it."""

    epochs: int = declare(100, "epochs to train; with --resume, a larger number extends the run", flag="--epochs",
                          resume=CHANGE, integer=True, low=1)
    time: float | None = declare(None, "hours to train (Ultralytics' time): the epochs that fit replace --epochs after "
                                 "the first", flag="--time", resume=CHANGE, low=0, low_open=True)
    batch_size: int | str = declare(16, "images per batch (all GPUs), or auto (also -1): the largest the memory "
                                    "estimate fits (--gpu, --margin), accumulated to the nominal 64",
                                    flag="--batch-size", aliases=("--batch",), integer=True, low=1)
    recipe: str = declare("auto", "official (train_dual.py's SGD), short (AdamW, a step per 16 images, lighter "
                          "augmentation), or auto: short for at most 10,000 optimizer steps of 64 images",
                          flag="--recipe", choices=("auto", "official", "short"))
    gpu: str | int | None = declare(None, "batch size auto: size for this card (e.g. \"RTX 4090\", or bytes; default: "
                                    "the training device, on the CPU its RAM)", flag="--gpu")
    margin: float = declare(DEFAULT_MARGIN, "batch size auto: share of the card kept free", flag="--margin",
                            low=0, high=1, high_open=True)
    step: StepConfig = dataclasses.field(default_factory=StepConfig, metadata={"part": StepConfig})
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig, metadata={"part": OptimConfig})
    pipeline: PipelineConfig = dataclasses.field(default_factory=PipelineConfig, metadata={"part": PipelineConfig})
    run: RunConfig = dataclasses.field(default_factory=RunConfig, metadata={"part": RunConfig})

    def __init__(self, **values: Any) -> None:
        parts = {name: values.pop(name, None) or kind() for name, kind in _PARTS.items()}
        for name, value in parts.items():
            if not isinstance(value, _PARTS[name]):
                raise TypeError(f"TrainConfig({name}=...): expected a {_PARTS[name].__name__}, got "
                                f"{type(value).__name__}")
        unknown = sorted(set(values) - set(SETTINGS))
        if unknown:
            raise TypeError(f"TrainConfig() got unexpected settings {unknown} (known: yolo9kit.config.train.SETTINGS)")
        if values.get("batch_size") in ("auto", -1):  # -1: the official --batch-size -1
            values["batch_size"] = "auto"
        elif "batch_size" in values and SETTINGS["batch_size"][2].problem(values["batch_size"]):
            raise ValueError(f"TrainConfig.batch_size={values['batch_size']!r}: expected an integer >= 1, or \"auto\" "
                             "(also -1) to size it from the memory estimate")
        changes: dict[str | None, dict[str, Any]] = {None: {}, **{name: {} for name in _PARTS}}
        for name, value in values.items():
            holder, f, _ = SETTINGS[name]
            if name != "batch_size":
                check_setting("TrainConfig", name, f, value)
            changes[holder][f.name] = value
        changes["step"].update(model=None, num_classes=None)  # the model is fit's
        for f in dataclasses.fields(self):
            value = changes[None].get(f.name, f.default)
            if f.name in parts:  # the part, remembering the settings given by name (named_settings)
                value = dataclasses.replace(parts[f.name], **changes[f.name])
                object.__setattr__(value, "_named", getattr(parts[f.name], "_named", frozenset())
                                   | {n for n in values if SETTINGS[n][0] == f.name})
            object.__setattr__(self, f.name, value)
        micro = self.step.batch_size
        if self.batch_size == "auto" and micro is not None:
            raise ValueError(f"TrainConfig.micro_batch_size={micro!r}: expected None with batch_size='auto' (the "
                             "automatic batch is the micro-batch)")
        if isinstance(self.batch_size, int) and (micro or 0) > self.batch_size:
            raise ValueError(f"TrainConfig.micro_batch_size={micro!r}: expected at most batch_size="
                             f"{self.batch_size} (a batch is split into micro-batches)")

    def to_dict(self) -> dict[str, Any]:
        """Every setting by its name, as plain values for checkpoints and settings.yaml; callbacks are left out."""
        out: dict[str, Any] = {}
        for name, (holder, f, _) in SETTINGS.items():
            value = getattr(self if holder is None else getattr(self, holder), f.name)
            if dataclasses.is_dataclass(value):  # the loss
                value = dataclasses.asdict(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, (Path, tuple)):  # tuples: lists in checkpoints and YAML
                value = str(value) if isinstance(value, Path) else list(value)
            out[name] = value
        del out["callbacks"]
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], **overrides: Any) -> TrainConfig:
        """Inverse of ``to_dict``; unknown keys are ignored (settings the kit no longer has), ``overrides`` win."""
        kwargs = {k: v for k, v in values.items() if k in SETTINGS}
        if isinstance(kwargs.get("loss"), Mapping):
            kwargs["loss"] = LossConfig(**kwargs["loss"])
        return cls(**{**kwargs, **overrides})


_PARTS = {"step": StepConfig, "optim": OptimConfig, "pipeline": PipelineConfig, "run": RunConfig}
SETTINGS = settings(TrainConfig)  # setting name -> (the part holding it, its field, its Declared)


def named_settings(config: TrainConfig) -> frozenset[str]:
    """The settings of ``config``'s parts given by name, whatever their value: the recipe leaves them alone."""
    return frozenset().union(*(getattr(getattr(config, name), "_named", ()) for name in _PARTS))


def official_accumulate(nominal_batch_size: int, batch_size: int) -> int:
    """Batches per optimizer step so that a step sees about ``nominal_batch_size`` images (official
    train_dual.py): ``max(round(nominal / batch), 1)``, Python's round (halves to even, 64/24 = 2.67 -> 3)."""
    return max(round(nominal_batch_size / batch_size), 1)
