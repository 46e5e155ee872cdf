"""Declared settings (``declare``: one declaration per field, docs/training.md) and ``StepConfig``: one training
step, the ``step`` part of a ``TrainConfig`` that ``fit`` runs and the object the memory tools describe."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yolo9kit.env import native_bf16, native_cpu_bf16, parse_device

# What a resumed run does with a setting:
KEEP = "keep"  # the run's value: a resume that asks for another is refused (the data order, the schedule, ...)
CHANGE = "change"  # a resume may set it (how long, where and how fast the run goes on)
RUN = "run"  # the resume itself decides it (which run to resume, and where its folder is)
API_ONLY = "API only: the official value serves every command-line run"  # a reason for no flag


@dataclass(frozen=True)
class Declared:
    """The declaration of one setting: its help, flag (or why none), resume rule and allowed values."""

    help: str  # one line, for --help and the docs
    setting: str | None = None  # the setting's name where it is not the field's (unique over all parts)
    flag: str | None = None  # the train command's flag, e.g. "--batch-size"
    aliases: tuple[str, ...] = ()  # official spellings also accepted, e.g. "--batch"
    no_flag: str | None = None  # why there is no flag of its own: which flag sets it, or that it is API only
    negate: bool = False  # a bool whose flag turns it off (--noval, --no-plots)
    resume: str = KEEP
    low: float | None = None  # the smallest value (None: no bound)
    low_open: bool = False  # the bound itself excluded: value > low
    high: float | None = None
    high_open: bool = False
    choices: tuple[Any, ...] | None = None
    multiple: int | None = None  # the value must be a multiple of this (image sizes of the stride 32)
    integer: bool = False  # a whole number (bool excluded), also when None is allowed

    def __post_init__(self) -> None:
        if (self.flag is None) == (self.no_flag is None):
            raise ValueError(f"a setting has a flag or says why it has none, not both or neither: {self.help!r}")
        if self.resume not in (KEEP, CHANGE, RUN):
            raise ValueError(f"resume={self.resume!r}: expected one of {(KEEP, CHANGE, RUN)}")

    @property
    def expected(self) -> str:
        """The allowed values in words: ``an integer >= 1``, ``a number in [0, 1)``, ``one of (...)``."""
        if self.choices is not None:
            return f"one of {self.choices}"
        kind = "an integer" if self.integer else "a number"
        if self.multiple:
            return f"a multiple of {self.multiple} (the largest model stride)"
        if self.low is not None and self.high is not None:
            return f"{kind} in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}" \
                   f"{')' if self.high_open else ']'}"
        if self.low is not None:  # unbounded above: "finite" says that infinity is refused too
            return f"{'an integer' if self.integer else 'a finite number'} {'>' if self.low_open else '>='} " \
                   f"{_num(self.low)}"
        return "a whole number" if self.integer else "a value"

    def problem(self, value: Any, optional: bool = False) -> str | None:
        """None when ``value`` is allowed, else what was expected (``optional``: None is allowed too)."""
        if value is None and optional:
            return None
        if self.choices is not None:
            return None if value in self.choices else self.expected
        if self.integer and (isinstance(value, bool) or not isinstance(value, int)):
            return "a whole number" + (" or None" if optional else "")
        if self.low is None and self.high is None and not self.multiple:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return self.expected
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        off_grid = bool(self.multiple) and value % self.multiple != 0
        return self.expected if too_low or too_high or off_grid else None


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def declare(default: Any, help: str, **declaration: Any) -> Any:  # noqa: A002 (argparse's word)
    """A dataclass field with its default and its :class:`Declared` (``help``, ``flag`` or ``no_flag``, ...)."""
    extra = {"compare": declaration.pop("compare")} if "compare" in declaration else {}
    return field(default=default, metadata={"declared": Declared(help, **declaration)}, **extra)


def part(config_type: type) -> Any:
    """A field holding a part of a composed config (a frozen dataclass with declared fields of its own)."""
    return field(default_factory=config_type, metadata={"part": config_type})


def settings(config_type: type) -> dict[str, tuple[str | None, dataclasses.Field, Declared]]:
    """Setting name -> (the part holding it, None for the config's own fields; its field; its Declared)."""
    out: dict[str, tuple[str | None, dataclasses.Field, Declared]] = {}
    for f in dataclasses.fields(config_type):
        if "declared" in f.metadata:
            out[f.metadata["declared"].setting or f.name] = (None, f, f.metadata["declared"])
        for name, (_, inner, declared) in settings(f.metadata["part"]).items() if "part" in f.metadata else ():
            out[name] = (f.name, inner, declared)
    return out


def check_setting(owner: str, name: str, f: dataclasses.Field, value: Any) -> None:
    """A ValueError ``owner.name=value: expected ...`` unless ``value`` is allowed by the declaration of ``f``."""
    problem = f.metadata["declared"].problem(value, optional="None" in str(f.type))
    if problem is not None:
        raise ValueError(f"{owner}.{name}={value!r}: expected {problem}")


class Settings:
    """A frozen dataclass of declared settings: each value checked when it is made (``Type.name=value: expected
    ...``), ``replace`` for a changed copy."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if "declared" in f.metadata:
                check_setting(type(self).__name__, f.name, f, getattr(self, f.name))

    def replace(self, **changes: Any) -> Any:
        """A copy with some settings changed."""
        return dataclasses.replace(self, **changes)


AMP_MODES = ("auto", "fp16", "bf16", "off")
ACTIVATION_CHECKPOINTING = ("backbone", "all")  # or a list of layer indices
OPTIMIZERS = ("SGD", "Adam", "AdamW")
# What ``freeze`` accepts: None/0, the first N layers, "backbone", or layer indices (yolo9kit.models.model).
Freeze = int | str | Sequence[int] | None
# The speed switches that ``None`` leaves to the device: all on for CUDA, channels_last on the CPU (resolve).
FAST_SWITCHES = ("channels_last", "lean_activations", "fused_optimizer")
_PLAIN_STEP = "--plain-step turns the CUDA speed switches off together (None: decided for the device)"


def check_freeze(value: Freeze, owner: str) -> int | str | tuple[int, ...] | None:
    """The freeze setting in its stored form (0 is None, a list a tuple), else a ValueError naming ``owner``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value or None  # 0, the official default, freezes nothing
    return _layers(value, ("backbone",), f"{owner}.freeze", "a number of first layers (int >= 0), 'backbone'")


def check_activation_checkpointing(value: Any, owner: str) -> tuple[int, ...] | str | None:
    """None, "backbone", "all" or a list of layer indices (stored as a tuple), else a ValueError naming ``owner``."""
    return _layers(value, ACTIVATION_CHECKPOINTING, f"{owner}.activation_checkpointing", "'backbone', 'all'")


def _layers(value: Any, words: tuple[str, ...], name: str, expected: str) -> tuple[int, ...] | str | None:
    if value is None or value in words:
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(i, int) and not isinstance(i, bool)
                                                          and i >= 0 for i in value):
        return tuple(value)
    raise ValueError(f"{name}={value!r}: expected None, {expected} or a non-empty list of layer indices >= 0")


def amp_for(amp: str, device_type: str, bf16: bool | None, gpu_name: str = "this GPU") -> str:
    """The autocast mode a step runs with: "fp16", "bf16" or "off" (docs/training.md, mixed precision).

    "auto" is bf16 where the GPU has it in hardware (``bf16``), else fp16; on the CPU "auto" and "fp16" are fp32
    and only an explicit "bf16" autocasts.

    Raises:
        ValueError: ``amp="bf16"`` on a GPU or CPU without bf16 in hardware (naming ``gpu_name``).
    """
    if amp not in AMP_MODES:
        raise ValueError(f"amp={amp!r}: expected one of {AMP_MODES}")
    if device_type == "cpu":
        if amp == "bf16" and not bf16:
            raise ValueError("amp='bf16': this CPU has no bf16 in hardware (AVX512-BF16 or AMX; `python -m "
                             "yolo9kit checks` says), so bf16 would be emulated, slower than fp32: use amp='off' "
                             "or amp='auto' (fp32 on the CPU)")
        return "bf16" if amp == "bf16" else "off"
    if device_type != "cuda" or amp == "off":
        return "off"
    if amp == "auto":
        return "bf16" if bf16 else "fp16"
    if amp == "bf16" and bf16 is False:
        raise ValueError(f"amp='bf16': {gpu_name} has no bf16 in hardware (it needs compute capability 8.0, Ampere "
                         "or newer; older cards emulate it, slowly): use amp='fp16' or amp='auto' (fp16 there)")
    return amp


def precision_name(amp: str) -> str:
    """The word labels, figures and tables use for a step's ``amp``: "fp32" for "off" (no autocast)."""
    return "fp32" if amp == "off" else amp


@dataclass(frozen=True)
class StepConfig(Settings):
    """One training step, everything that sets its memory and speed: ``StepConfig("yolov9-s", 16)``.

    ``batch_size`` is the micro-batch (the setting ``micro_batch_size`` of a ``TrainConfig``, where None is the
    whole batch of each rank). ``None`` switches and ``amp="auto"`` are decided for a device by :meth:`resolve`.
    Inside a ``TrainConfig`` the model is ``fit``'s: ``model`` and ``num_classes`` are kept empty there.
    """

    model: Any = None  # a registered name ("yolov9-s"), a model yaml, or an nn.Module; None: fit's model
    batch_size: int | None = declare(
        None, "images per forward/backward: each batch is split into micro-batches of this size (default: the "
        "whole batch of each GPU)", flag="--micro-batch-size", setting="micro_batch_size", integer=True, low=1)
    imgsz: int = declare(640, "training image size", flag="--imgsz", aliases=("--img", "--img-size"), integer=True,
                         low=32, multiple=32)
    # the memory tools describe a multi-scale step at its largest size (peak_imgsz)
    multi_scale: bool = declare(False, "resize each batch to a random multiple of 32 in [0.5, 1.5] x imgsz",
                                flag="--multi-scale")
    amp: str = declare("auto", "mixed precision", flag="--amp", choices=AMP_MODES)
    # None, "backbone", "all" or layer indices (DetectionModel.set_activation_checkpointing)
    activation_checkpointing: str | tuple[int, ...] | None = declare(
        None, "recompute layers in backward to save memory: backbone, all, or layer indices 1,2,3",
        flag="--activation-checkpointing", resume=CHANGE)
    # the rules: yolo9kit.models.model
    freeze: int | str | tuple[int, ...] | None = declare(
        None, "layers that do not train (fine-tuning): N for the first N layers (official: 10 is the yolov9-c "
        "backbone), several indices (0 1 2), or backbone (the model yaml's backbone rows)", flag="--freeze")
    channels_last: bool | None = declare(None, "channels_last weights and inputs (NHWC convolutions)",
                                         no_flag=_PLAIN_STEP, resume=CHANGE)
    lean_activations: bool | None = declare(None, "BatchNorm+SiLU keep one activation for backward, not two "
                                            "(~25 % less)", no_flag=_PLAIN_STEP, resume=CHANGE)
    fused_optimizer: bool | None = declare(None, "torch's fused SGD/Adam/AdamW", no_flag=_PLAIN_STEP, resume=CHANGE)
    # off by default: the first step then takes minutes (docs/benchmarks.md)
    compile: bool | str = declare(False, "torch.compile the forward (optionally a mode: reduce-overhead, "
                                  "max-autotune)", flag="--compile", resume=CHANGE)
    optimizer: str = declare("SGD", "the optimizer", flag="--optimizer", choices=OPTIMIZERS)
    ema: bool = declare(True, "keep an EMA of the weights (what is validated and saved)",
                        no_flag=API_ONLY)
    num_classes: int | None = None  # None: the model's own (80 for a registered name)
    num_targets: int = 8  # boxes per image of the memory tools' synthetic batch (the assigner grows with them)
    loss_fn: Callable | None = None  # memory tools: (outputs, targets) -> (loss, items); None: DetectionLoss
    device_type: str | None = None  # "cuda" or "cpu" once resolved for a device, else None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_targets < 0:
            raise ValueError(f"StepConfig.num_targets={self.num_targets!r}: expected an integer >= 0")
        # hashable: the estimator cache is keyed by steps
        object.__setattr__(self, "activation_checkpointing",
                           check_activation_checkpointing(self.activation_checkpointing, "StepConfig"))
        object.__setattr__(self, "freeze", check_freeze(self.freeze, "StepConfig"))

    @property
    def peak_imgsz(self) -> int:
        """The largest image side of the step (with ``multi_scale``, the largest a batch can get)."""
        return multi_scale_range(self.imgsz)[1] if self.multi_scale else self.imgsz

    def resolve(self, device: Any = None, *, bf16: bool | None = None, gpu_name: str | None = None) -> StepConfig:
        """This step as ``fit`` runs it on ``device`` (None: the current CUDA device, else the CPU).

        Args:
            device: the device; "auto" AMP and every ``None`` switch are decided for it, values set are kept.
            bf16: whether it computes bf16 in hardware (default: ask the device; unknown without CUDA here).
            gpu_name: its name in errors.

        Raises:
            ValueError: ``amp="bf16"`` where the GPU or CPU has no bf16 (see :func:`amp_for`).
        """
        device_type = parse_device(device).type
        if device_type == "cuda" and (bf16 is None or gpu_name is None):
            local_bf16, local_name = _local_cuda(device)
            bf16, gpu_name = local_bf16 if bf16 is None else bf16, gpu_name or local_name
        elif bf16 is None:
            bf16 = native_cpu_bf16()
        switches = {name: _fast_by_default(name, device_type) if getattr(self, name) is None
                    else bool(getattr(self, name)) for name in FAST_SWITCHES}
        return dataclasses.replace(self, amp=amp_for(self.amp, device_type, bf16, gpu_name or "this GPU"),
                                   device_type=device_type, **switches)

    @property
    def model_name(self) -> str:
        if isinstance(self.model, (str, Path)):
            return Path(str(self.model)).stem if str(self.model).endswith((".yaml", ".yml", ".pt")) else str(self.model)
        return str(getattr(self.model, "name", None) or type(self.model).__name__)

    @property
    def label(self) -> str:
        """A short name of the setting, e.g. ``fp16 channels_last lean ckpt=all 640px`` (curves, tables)."""
        parts = [precision_name(self.amp)]
        parts += [name for name, on in (("channels_last", self.channels_last), ("lean", self.lean_activations))
                  if on]
        for name, value in (("ckpt", self.activation_checkpointing), ("freeze", self.freeze)):
            if value is not None:
                parts.append(f"{name}={','.join(map(str, value)) if isinstance(value, tuple) else value}")
        parts.append(f"{self.imgsz}px" + (" multi-scale" if self.multi_scale else ""))
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Plain values for JSON (the model by name, the loss by its name)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["model"] = self.model_name
        if self.loss_fn is not None:
            out["loss_fn"] = getattr(self.loss_fn, "__name__", type(self.loss_fn).__name__)
        for name in ("activation_checkpointing", "freeze"):
            if isinstance(out[name], tuple):
                out[name] = list(out[name])
        return out


def multi_scale_side(imgsz: int, stride: int, rng: Any) -> int:
    """The image side of one multi-scale batch (official train_dual.py ``--multi-scale``):
    ``randrange(0.5 * imgsz, 1.5 * imgsz + stride) // stride * stride``, at least one stride."""
    return max(rng.randrange(int(imgsz * 0.5), int(imgsz * 1.5) + stride) // stride * stride, stride)


def multi_scale_range(imgsz: int, stride: int = 32) -> tuple[int, int]:
    """Smallest and largest side ``multi_scale_side`` can give (the memory tools describe the largest)."""
    return max(int(imgsz * 0.5) // stride * stride, stride), (int(imgsz * 1.5) + stride - 1) // stride * stride


def _fast_by_default(switch: str, device_type: str) -> bool:
    """A ``None`` speed switch on ``device_type``: all on for CUDA; on the CPU only channels_last, where oneDNN
    runs the convolutions (1.24x the contiguous fp32 step of yolov9-t, docs/benchmarks.md)."""
    if device_type == "cuda":
        return True
    import torch

    return switch == "channels_last" and device_type == "cpu" and torch.backends.mkldnn.is_available()


def _local_cuda(device: Any) -> tuple[bool | None, str | None]:
    """Whether the CUDA device ``device`` names (or the current one) has bf16, and its name; None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None, None
    index = parse_device(device).index
    index = torch.cuda.current_device() if index is None else index
    return native_bf16(index), f"{torch.cuda.get_device_name(index)} (cuda:{index})"
