"""Training settings: ``TrainConfig``, frozen parts (``step``, ``optim``, ``pipeline``, ``run``) with the official
defaults and why they are what they are. Every setting has one name (``config.declare``): made and changed by that
name whatever part holds it (``TrainConfig(lr0=0.02)``, ``config.replace(micro_batch_size=8)``), read through its
part (``config.optim.lr0``). docs/training.md lists them all."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from yolo9kit.config.declare import CHANGE, RUN, check_declared, declare, part, settings
from yolo9kit.config.hyp import DEFAULT_AUGMENT_HYP, check_augment_hyp
from yolo9kit.config.step import StepConfig

# Head-room kept below a card's capacity when sizing a batch: validation runs at 2x the batch in eval mode
# (no saved activations, but its own peak), the number of objects per image changes the assigner's memory,
# and the allocator fragments over an epoch (YOLOv5 went from 0.9 to 0.8 of the card for this reason;
# Ultralytics keeps 0.4 free).
DEFAULT_MARGIN = 0.10
# The image cache of a dataset, a loader and a run (yolo9kit.data.dataset): None reads the files every time.
CACHE_MODES = ("auto", "ram", "disk", None)
SCHEDULES = ("linear", "cosine", "flat-cosine", "fixed")
# How the optimizer and the augmentation are chosen (yolo9kit.config.recipe): "official" is train_dual.py's
# (SGD, nominal batch 64, hyp.scratch-high), "short" the kit's recipe for runs too short for it (AdamW, one
# optimizer step per batch of 16, lighter augmentation), "auto" the short one for runs of at most
# SHORT_RUN_UPDATES optimizer steps, as Ultralytics' optimizer="auto" picks AdamW for short runs.
RECIPES = ("auto", "official", "short")
CALLBACK_NAMES = ("on_batch", "on_epoch_end")
# Experiment loggers beside the run folder (yolo9kit.train.loggers), each an optional extra of the package.
LOGGERS = ("tensorboard", "mlflow")

# Why some settings have no flag of their own (config.declare: every setting has a flag or a reason).
_HYP = "--hyp reads it from an official hyp yaml"
_API = "API only: the official value serves every command-line run"

@dataclass(frozen=True)
class LossConfig:
    """Loss settings. Defaults are the official values.

    The official ``ComputeLoss`` hard-codes the gains and the auxiliary weight in its ``__call__``
    (``loss[0] *= 7.5``, ``loss[1] *= 0.5``, ``loss[2] *= 1.5``, ``*= 0.25`` for the aux head) and
    ignores the identically valued ``box`` / ``cls`` / ``dfl`` keys of ``hyp.scratch-high.yaml``;
    it builds the assigner with topk 10, alpha 0.5, beta 6.0 (overridable there only through the
    environment variables ``YOLOM``/``YOLOA``/``YOLOB``). Here they are plain fields.
    """

    # The gains are the hyp keys box, cls, dfl and cls_pw; a gain of 0 turns its loss off (cls for one class).
    box_gain: float = declare(7.5, "weight of the CIoU box loss", no_flag=_HYP, low=0)
    cls_gain: float = declare(0.5, "weight of the BCE class loss", no_flag=_HYP, low=0)
    dfl_gain: float = declare(1.5, "weight of the distribution focal loss", no_flag=_HYP, low=0)
    aux_weight: float = declare(0.25, "the auxiliary (PGI) head's share; the main head counts 1", no_flag=_API, low=0)
    topk: int = declare(10, "candidate anchors per GT in the assigner", no_flag=_API, integer=True, low=1)
    alpha: float = declare(0.5, "class-score exponent of the alignment metric", no_flag=_API, low=0)
    beta: float = declare(6.0, "CIoU exponent of the alignment metric", no_flag=_API, low=0)
    eps: float = declare(1e-9, "assigner in-box margin and normalisation epsilon", no_flag=_API, low=0, low_open=True)
    cls_pos_weight: float = declare(1.0, "BCE pos_weight of the positives", no_flag=_HYP, low=0, low_open=True)
    # Most (image, GT, anchor) pairs the assigner works on at once. The official assigner peaks at
    # ~100 bytes per pair for the whole batch (4 GB for 16 images of 640 with 300 objects each); ours
    # at ~25 bytes per pair of a chunk, so this default bounds it near 250 MB however crowded the
    # images (docs/loss.md has the measurements). None: the whole batch at once.
    max_assign_chunk: int | None = declare(8_388_608, "assigner pairs per chunk (None: the whole batch)",
                                           no_flag=_API, integer=True, low=1)

    def __post_init__(self) -> None:
        check_declared(self)

    def replace(self, **changes: Any) -> LossConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer's hyper-parameters, its schedule, accumulation and clipping, the EMA's decay and the loss
    (the optimizer's kind is the step's: it sets the step's memory). Official hyp.scratch-high.yaml defaults."""

    lr0: float = declare(0.01, "initial learning rate", no_flag=_HYP, low=0, low_open=True)
    lrf: float = declare(0.01, "final learning rate = lr0 * lrf", no_flag=_HYP, low=0)
    momentum: float = declare(0.937, "SGD momentum / Adam beta1", no_flag=_HYP, low=0, high=1)
    weight_decay: float = declare(0.0005, "scaled by batch * accumulate / nominal (official)", no_flag=_HYP, low=0)
    schedule: str = declare("linear", "the learning-rate schedule",
                            no_flag="--cos-lr, --flat-cos-lr or --fixed-lr (the official flag names)",
                            choices=SCHEDULES)
    warmup_epochs: float = declare(3.0, "epochs of warmup", no_flag=_HYP, low=0)
    # Official: at least 100 warmup batches, however short the epoch (lower it for tiny CPU runs).
    warmup_min_batches: int = declare(100, "the fewest warmup batches", no_flag=_API, integer=True, low=0)
    warmup_momentum: float = declare(0.8, "momentum at the start of warmup", no_flag=_HYP, low=0, high=1)
    warmup_bias_lr: float = declare(0.1, "bias learning rate at the start of warmup", no_flag=_HYP, low=0)
    # The batch the hyper-parameters were tuned for; accumulation makes each step see about this many images.
    nominal_batch_size: int = declare(64, "images per optimizer step the hyper-parameters assume",
                                      no_flag="fixed at the official 64 on the command line", integer=True, low=1)
    # None: official rule max(round(nominal/batch), 1), ramped up from 1 during warmup. An int: that many
    # batches per optimizer step (also ramped from 1 during warmup when accumulate_warmup is True).
    accumulate_steps: int | None = declare(None, "batches per optimizer step (default max(round(64 / batch), 1))",
                                           flag="--accumulate-steps", integer=True, low=1)
    accumulate_warmup: bool = declare(True, "ramp the accumulation up from 1 during warmup (official)",
                                      no_flag="API only: the official ramp")
    grad_clip: float = declare(10.0, "max total grad norm after unscaling (official constant); 0 disables",
                               no_flag=_API, low=0)
    ema_decay: float = declare(0.9999, "EMA decay", no_flag=_API, low=0, high=1)
    ema_tau: float = declare(2000.0, "EMA decay ramps as decay * (1 - exp(-updates / tau))", no_flag=_API, low=0,
                             low_open=True)
    loss: LossConfig = declare(LossConfig(), "the loss gains (official by default)",
                               no_flag="--hyp (the official box, cls, dfl and cls_pw keys)")
    # Official --label-smoothing: the official dual loss computes its smoothed BCE targets and never uses
    # them, so it changes nothing there and nothing here (kept so that official commands run; fit warns).
    label_smoothing: float = declare(0.0, "official flag, accepted for official commands: the official dual loss "
                                     "never applies it", flag="--label-smoothing", low=0, high=1, high_open=True)

    def __post_init__(self) -> None:
        check_declared(self)
        if not isinstance(self.loss, LossConfig):
            raise ValueError(f"OptimConfig.loss={self.loss!r}: expected a LossConfig")


@dataclass(frozen=True)
class PipelineConfig:
    """The training data pipeline: which images (the data options of the official train_dual.py), their
    batches, the augmentation, and the loaders (caching, workers)."""

    # Official data options of train_dual.py. rect: training batches of images sorted by aspect ratio, each
    # batch letterboxed to its own shape (official batch shapes, pad 0), no mosaic and no shuffling.
    rect: bool = declare(False, "rectangular training batches (images sorted by aspect ratio; no mosaic, no "
                         "shuffling)", flag="--rect")
    single_cls: bool = declare(False, "train multi-class data as one class (\"item\")", flag="--single-cls")
    min_items: int = declare(0, "drop training images with fewer labelled boxes (official --min-items)",
                             flag="--min-items", integer=True, low=0)
    close_mosaic: int = declare(0, "mosaic off for the last N epochs", flag="--close-mosaic", integer=True, low=0)
    hyp: Mapping[str, float] | None = declare(None, "augmentation dict for the data layer; None = official defaults",
                                              no_flag="--hyp reads an official hyp yaml (its augmentation keys)")
    colour_on_device: bool | None = declare(
        None, "HSV colour jitter on the training device, not in the loader",
        no_flag="--plain-step turns the CUDA speed switches off together (None: decided for the device)",
        resume=CHANGE)
    cache: str | None = declare("auto", "cache the decoded images: auto (in RAM when they fit), ram (always; the "
                                "flag alone), disk (a memory-mapped file beside the labels), or None", flag="--cache",
                                resume=CHANGE, choices=CACHE_MODES)
    # Train even when the training labels use class ids `names` does not name, hold no box at all, or lose
    # more than a tenth of the labelled images to errors. Off: such data stops the run before the first
    # step with a DataError naming the data.yaml, the counts and the class ids (yolo9kit.data.guard), as the
    # official code stops on the first two, instead of training a model of what happened to be left.
    allow_bad_labels: bool = declare(False, "train even when labels use unnamed classes, no image has a box, or "
                                     "many labelled images would be dropped (refused by default, before the first "
                                     "step)", flag="--allow-bad-labels", resume=CHANGE)
    workers: int | None = declare(None, "loader processes (default min(CPUs, batch, 8), official)", flag="--workers",
                                  resume=CHANGE, integer=True, low=0)
    val_batch_size: int | None = declare(None, "validation batch (None: 2 x batch size, official)", no_flag=_API,
                                         resume=CHANGE, integer=True, low=1)

    def __post_init__(self) -> None:
        check_declared(self)
        check_augment_hyp(self.augment_hyp, "TrainConfig.hyp")

    @property
    def augment_hyp(self) -> dict[str, float]:
        """The augmentation hyper-parameters: official defaults updated with ``hyp``."""
        return {**DEFAULT_AUGMENT_HYP, **(self.hyp or {})}


@dataclass(frozen=True)
class RunConfig:
    """Where and how the run goes: the device, the seed, the run folder, validation, saving and the guards."""

    device: str | None = declare(None, "cpu, 0, cuda:1 (default: first GPU, else CPU)", flag="--device",
                                 resume=CHANGE)
    seed: int = declare(0, "the seed of the initial weights (of a model fit builds from a name), the data order "
                        "and the augmentation", flag="--seed", integer=True)
    # Off: the CUDA defaults take the fastest kernels, some add in a varying order (the CPU's are fixed anyway)
    deterministic: bool = declare(False, "deterministic CUDA kernels (torch.use_deterministic_algorithms, cuDNN "
                                  "without autotuning): the same numbers on the same GPU, slower",
                                  flag="--deterministic", resume=CHANGE)
    val: bool = declare(True, "validate the EMA every epoch (the last epoch is always validated)", flag="--noval",
                        negate=True, resume=CHANGE)
    patience: int = declare(100, "stop after N epochs without a better fitness", flag="--patience", resume=CHANGE,
                            integer=True, low=0)
    project: str = declare("runs/train", "folder of the run folders (with --resume: where the newest is looked "
                           "for)", flag="--project", resume=RUN)
    name: str = declare("exp", "run folder name under --project", flag="--name", resume=RUN)
    exist_ok: bool = declare(False, "write into an existing run folder of that name", flag="--exist-ok", resume=RUN)
    resume: bool | str = declare(False, "resume the newest run, or this run folder / last.pt (its settings; "
                                 "--epochs may extend it)", flag="--resume", resume=RUN)
    save_period: int = declare(-1, "also save weights/epoch<e>.pt every N epochs (e = 0, N, 2N, ...; -1: off)",
                               flag="--save-period", resume=CHANGE, integer=True)
    # False for tune's trials unless keep_weights="all": the study removes the weights of all but the best
    log_weights: bool = declare(True, "the mlflow logger uploads best.pt and last.pt at the end of the run",
                                no_flag=_API, resume=CHANGE)
    # The run folder's pictures (yolo9kit.train.pictures): on a CPU about 0.4 s per epoch and 2 s per run
    # (docs/training.md); False for quiet or timed runs.
    plots: bool = declare(True, "draw the run folder's pictures (labels, training batches, curves, validation "
                          "plots)", flag="--no-plots", negate=True, resume=CHANGE)
    progress_bar: bool = declare(True, "tqdm bars of each epoch and its validation (rank 0)",
                                 no_flag="API only: the command line always shows them", resume=CHANGE)
    log_interval: int = declare(10, "batches between read-backs of the losses from the device (progress "
                                "bar, callbacks)", no_flag=_API, resume=CHANGE, integer=True, low=1)
    max_nonfinite_batches: int = declare(10, "stop after this many non-finite losses in a row", no_flag=_API,
                                         resume=CHANGE, integer=True, low=1)
    oom_backoff: bool = declare(True, "on CUDA out-of-memory halve the micro-batch and retry", no_flag=_API,
                                resume=CHANGE)
    sync_bn: bool = declare(False, "SyncBatchNorm (DDP only)", flag="--sync-bn")
    # A logger that fails (a server gone, a full disk) is a warning: the run folder holds everything anyway.
    loggers: tuple[str, ...] = declare((), "also log the run to tensorboard (events in the run folder) and/or "
                                       "mlflow (--mlflow-uri)", flag="--loggers", resume=CHANGE)
    mlflow_uri: str | None = declare(None, "the MLflow tracking server (http://host:5000) or store (sqlite:///FILE); "
                                     "default sqlite:///<project>/mlflow.db", flag="--mlflow-uri", resume=CHANGE)
    # {"on_batch": f(BatchRecord), "on_epoch_end": g(EpochRecord)} (yolo9kit.train.records; rank 0 only). Not saved.
    callbacks: Mapping[str, Callable[[Any], None]] | None = declare(
        None, "functions called after each step and epoch", no_flag="API only: functions", resume=CHANGE,
        compare=False)

    def __post_init__(self) -> None:
        check_declared(self)
        loggers = (self.loggers,) if isinstance(self.loggers, str) else self.loggers or ()
        loggers = tuple(loggers) if isinstance(loggers, (list, tuple)) else (loggers,)
        if not set(loggers) <= set(LOGGERS) or len(set(loggers)) != len(loggers):
            raise ValueError(f"TrainConfig.loggers={self.loggers!r}: expected some of {LOGGERS}, each once")
        object.__setattr__(self, "loggers", loggers)  # a list (a checkpoint's) or a name, kept as a tuple
        unknown = set(self.callbacks or {}) - set(CALLBACK_NAMES)
        if unknown:
            raise ValueError(f"TrainConfig.callbacks={self.callbacks!r}: expected a dict with keys among "
                             f"{CALLBACK_NAMES}, got {sorted(unknown)}")
        if self.mlflow_uri and urlsplit(self.mlflow_uri).password:  # never stored or printed: not named here either
            raise ValueError("TrainConfig.mlflow_uri (--mlflow-uri) holds a password, which the run would store and "
                             "print: give the server without it (http://host:5000) and the credentials where MLflow's "
                             "client reads them, MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or "
                             "MLFLOW_TRACKING_TOKEN) in the environment or ~/.mlflow/credentials")


@dataclass(frozen=True, init=False)
class TrainConfig:
    """How to train: ``epochs``, the loader's ``batch_size``, the ``recipe`` and the parts ``step``, ``optim``,
    ``pipeline``, ``run``.

    Made and changed by setting names, whatever part holds them: ``TrainConfig(epochs=50, batch_size=16)``,
    ``config.replace(lr0=0.02, micro_batch_size=8)`` (``dataclasses.replace`` works the same way); read
    through the parts: ``config.optim.lr0``, ``config.step.batch_size``. A whole part may be passed
    (``TrainConfig(step=plan.step)``): the names given beside it apply on top of it.

    Batch vocabulary: ``batch_size`` images come out of the loader per batch (total over all DDP ranks,
    as the official ``--batch-size``); ``micro_batch_size`` (``step.batch_size``) images go through one
    forward/backward (default the whole batch of each rank); an optimizer "step" happens every
    ``accumulate_steps`` batches. The hyper-parameters assume ``nominal_batch_size`` (64) images per step.

    Each setting is declared once, with its help, range, flag and resume rule (``config.declare``): the
    ``train`` command, its checks and a resume's rules are read from these declarations.
    """

    epochs: int = declare(100, "epochs to train; with --resume, a larger number extends the run", flag="--epochs",
                          resume=CHANGE, integer=True, low=1)
    # An int, or "auto" (also -1, the official flag): before the first step, the largest batch whose step
    # the memory estimate fits into (1 - margin) of ``gpu`` (None: the training device; the CPU: its RAM),
    # as ``yolo9kit.memory.plan`` recommends it for ``nominal_batch_size`` (docs/memory.md).
    batch_size: int | str = declare(
        16, "images per batch (all GPUs), or auto (also -1): the largest that the memory estimate fits into the "
        "GPU (--gpu, --margin), with accumulation to the nominal 64", flag="--batch-size", aliases=("--batch",))
    recipe: str = declare("auto", "official (train_dual.py's SGD recipe), short (AdamW, one step per batch of 16, "
                          "lighter augmentation: learns in a few epochs), or auto: short for runs of at most 10,000 "
                          "optimizer steps of 64 images", flag="--recipe", choices=RECIPES)
    gpu: str | int | None = declare(None, "batch size auto: size for this card (e.g. \"RTX 4090\", or bytes; default: "
                                    "the training device, on the CPU its RAM)", flag="--gpu")
    margin: float = declare(DEFAULT_MARGIN, "batch size auto: share of the card kept free", flag="--margin",
                            low=0, high=1, high_open=True)
    step: StepConfig = part(StepConfig)
    optim: OptimConfig = part(OptimConfig)
    pipeline: PipelineConfig = part(PipelineConfig)
    run: RunConfig = part(RunConfig)

    def __init__(self, *, step: StepConfig | None = None, optim: OptimConfig | None = None,
                 pipeline: PipelineConfig | None = None, run: RunConfig | None = None, **values: Any) -> None:
        given = {"step": step or StepConfig(), "optim": optim or OptimConfig(),
                 "pipeline": pipeline or PipelineConfig(), "run": run or RunConfig()}
        for name, value in given.items():
            if not isinstance(value, _PARTS[name]):
                raise TypeError(f"TrainConfig({name}=...): expected a {_PARTS[name].__name__}, got "
                                f"{type(value).__name__}")
        unknown = sorted(set(values) - set(_SETTINGS))
        if unknown:
            raise TypeError(f"TrainConfig() got unexpected settings {unknown} (the settings: "
                            "yolo9kit.config.declare.declarations(TrainConfig))")
        changes: dict[str | None, dict[str, Any]] = {None: {}}
        for name, value in values.items():
            holder, f, declared = _SETTINGS[name]
            problem = declared.problem(value, optional="None" in str(f.type))
            if problem is not None and not (name == "batch_size" and value in ("auto", -1)):
                raise ValueError(f"TrainConfig.{name}={value!r}: expected {problem}")
            changes.setdefault(holder, {})[f.name] = value
        for holder, fields in changes.items():
            if holder is not None:
                given[holder] = _replace(given[holder], fields, named=True)
        # the step of a TrainConfig is that of fit's model: no model of its own
        given["step"] = _replace(given["step"], {"model": None, "num_classes": None}, named=False)
        for f in dataclasses.fields(self):
            if f.name in given:
                object.__setattr__(self, f.name, given[f.name])
            else:
                object.__setattr__(self, f.name, changes[None].get(f.name, f.default))
        self._check()

    def _check(self) -> None:
        if self.batch_size == -1:  # the official --batch-size -1
            object.__setattr__(self, "batch_size", "auto")
        for name in ("epochs", "recipe", "gpu", "margin"):
            _, f, declared = _SETTINGS[name]
            problem = declared.problem(getattr(self, name), optional="None" in str(f.type))
            if problem is not None:
                raise ValueError(f"TrainConfig.{name}={getattr(self, name)!r}: expected {problem}")
        micro = self.step.batch_size
        if self.batch_size != "auto" and (not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool)
                                          or self.batch_size < 1):
            raise ValueError(f"TrainConfig.batch_size={self.batch_size!r}: expected an integer >= 1, or \"auto\" "
                             "(also -1) to size it from the memory estimate")
        if self.batch_size == "auto" and micro is not None:
            raise ValueError(f"TrainConfig.micro_batch_size={micro!r}: expected None with batch_size='auto' (the "
                             "automatic batch is the micro-batch)")
        if isinstance(self.batch_size, int) and (micro or 0) > self.batch_size:
            raise ValueError(f"TrainConfig.micro_batch_size={micro!r}: expected at most batch_size="
                             f"{self.batch_size} (a batch is split into micro-batches)")

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with some settings (or whole parts) changed: ``config.replace(epochs=10, lr0=0.02)``."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every setting by its name, as plain values (numbers, strings, lists, dicts) for checkpoints and
        settings.yaml; callbacks are left out."""
        out: dict[str, Any] = {}
        for name, (holder, f, _) in _SETTINGS.items():
            if name == "callbacks":
                continue
            value = getattr(self if holder is None else getattr(self, holder), f.name)
            if dataclasses.is_dataclass(value):
                value = {"__dataclass__": type(value).__name__, **dataclasses.asdict(value)}
            elif isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, Path):
                value = str(value)
            elif isinstance(value, tuple):  # freeze and checkpointed layer indices: lists in checkpoints and YAML
                value = list(value)
            out[name] = value
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], **overrides: Any) -> TrainConfig:
        """Inverse of ``to_dict``; unknown keys are ignored (checkpoints of other versions), ``overrides`` win.
        A checkpoint's ``loss: None`` (older runs) is the official loss."""
        kwargs = {k: v for k, v in values.items() if k in _SETTINGS}
        loss = kwargs.pop("loss", None)
        if isinstance(loss, Mapping):
            kwargs["loss"] = LossConfig(**{k: v for k, v in loss.items() if k != "__dataclass__"})
        elif isinstance(loss, LossConfig):
            kwargs["loss"] = loss
        kwargs.update(overrides)
        return cls(**kwargs)


_PARTS = {"step": StepConfig, "optim": OptimConfig, "pipeline": PipelineConfig, "run": RunConfig}
_SETTINGS = settings(TrainConfig)


def named_settings(config: TrainConfig) -> frozenset[str]:
    """The settings of ``config``'s parts that were given by name (``TrainConfig(lr0=...)``, ``replace``,
    ``from_dict``), whatever their value; a part passed whole names none. What the recipe leaves alone
    (``yolo9kit.config.recipe``): ``TrainConfig(optimizer="SGD")`` keeps SGD although it is the default."""
    out = set()
    for holder, part_type in _PARTS.items():
        declared = {f.name: f.metadata["declared"].setting or f.name for f in dataclasses.fields(part_type)
                    if "declared" in f.metadata}
        out.update(declared[name] for name in getattr(getattr(config, holder), "_named", ()) if name in declared)
    return frozenset(out)


def _replace(part: Any, fields: Mapping[str, Any], named: bool) -> Any:
    """``dataclasses.replace`` of a part that remembers which of its fields were given by name (``named``)."""
    new = dataclasses.replace(part, **fields)
    object.__setattr__(new, "_named", frozenset(getattr(part, "_named", ())) | (set(fields) if named else set()))
    return new


def official_accumulate(nominal_batch_size: int, batch_size: int) -> int:
    """Batches per optimizer step so that a step sees about ``nominal_batch_size`` images (official
    train_dual.py): ``max(round(nominal / batch), 1)``, Python's round (halves to even, 64/24 = 2.67 -> 3)."""
    return max(round(nominal_batch_size / batch_size), 1)
