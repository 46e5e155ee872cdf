"""Declared settings (``declare``, docs/training.md) and ``StepConfig``, one training step (memory tools, fit)."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from yolo9kit.env import native_bf16, native_cpu_bf16, parse_device

# What a resumed run does with a setting:
KEEP = "keep"  # the run's value: a resume that asks for another is refused (the data order, the schedule, ...)
CHANGE = "change"  # a resume may set it (how long, where and how fast the run goes on)
RUN = "run"  # the resume itself decides it (which run to resume, and where its folder is)
API_ONLY = "API only: the official value serves every command-line run"  # a reason for no flag
PLAIN_STEP = "--plain-step turns them off together (None: decided for the device)"


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
    low: float | None = None
    low_open: bool = False  # the bound itself excluded: value > low
    high: float | None = None
    high_open: bool = False
    choices: tuple[Any, ...] | None = None
    multiple: int | None = None  # the value must be a multiple of this (image sizes of the stride 32)
    integer: bool = False  # a whole number (bool excluded), also when None is allowed

    def __post_init__(self) -> None:
        if (self.flag is None) == (self.no_flag is None):
            raise ValueError(f"a setting has a flag or says why it has none, not both or neither: {self.help!r}")

    @property
    def expected(self) -> str:
        """The allowed values in words: ``an integer >= 1``, ``a number in [0, 1)``, ``one of (...)``."""
        if self.choices is not None:
            return f"one of {self.choices}"
        if self.multiple:
            return f"a multiple of {self.multiple} (the largest model stride)"
        if self.low is not None and self.high is not None:
            return (f"{'an integer' if self.integer else 'a number'} in {'(' if self.low_open else '['}{self.low:g}, "
                    f"{self.high:g}{')' if self.high_open else ']'}")
        if self.low is not None:  # unbounded above: "finite" says that infinity is refused too
            kind = "an integer" if self.integer else "a finite number"
            return f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
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


def declare(default: Any, help: str, compare: bool = True, **declaration: Any) -> Any:  # noqa: A002 (argparse's)
    """A dataclass field with its default and its :class:`Declared` (``help``, ``flag`` or ``no_flag``, ...)."""
    return field(default=default, compare=compare, metadata={"declared": Declared(help, **declaration)})


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
    """A ValueError ``owner.name=value: expected ...`` unless the declaration of ``f`` allows ``value``."""
    problem = f.metadata["declared"].problem(value, optional="None" in str(f.type))
    if problem is not None:
        raise ValueError(f"{owner}.{name}={value!r}: expected {problem}")


class Settings:
    """A frozen dataclass of declared settings, each value checked when it is made; ``replace`` for a copy."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if "declared" in f.metadata:
                check_setting(type(self).__name__, f.name, f, getattr(self, f.name))

    def replace(self, **changes: Any) -> Any:
        """A copy with some settings changed."""
        return dataclasses.replace(self, **changes)


AMP_MODES = ("auto", "fp16", "bf16", "off")
# Cards whose fp16 autocast gives NaN losses or zero mAP (GTX 16xx, Quadro/NVIDIA T400-T2000, Tesla K40m: the
# list Ultralytics' check_amp keeps by name): "auto" trains them in fp32, an explicit "fp16" is refused
FP16_NAN_CARDS = re.compile(r"\b(1630|1650|1660|T400|T550|T600|T1000|T1200|T2000|K40m)\b", re.IGNORECASE)
# What ``freeze`` accepts: None/0, the first N layers, "backbone", or layer indices (yolo9kit.models.model).
Freeze = int | str | Sequence[int] | None
# The speed switches that ``None`` leaves to the device: all on for CUDA, channels_last on the CPU (resolve).
FAST_SWITCHES = ("channels_last", "lean_activations", "fused_optimizer")


def check_layers(value: Any, owner: str, name: str) -> int | str | tuple[int, ...] | None:
    """``freeze`` or ``activation_checkpointing`` as stored (a list as a tuple), else a ValueError naming ``owner``."""
    freeze = name == "freeze"
    if freeze and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value or None  # 0, the official default, freezes nothing
    if value is None or value in (("backbone",) if freeze else ("backbone", "all")):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(i, int) and not isinstance(i, bool)
                                                          and i >= 0 for i in value):
        return tuple(value)
    expected = "a number of first layers (int >= 0), 'backbone'" if freeze else "'backbone', 'all'"
    raise ValueError(f"{owner}.{name}={value!r}: expected None, {expected} or a non-empty list of layer indices >= 0")


def precision_name(amp: str) -> str:
    """The word labels, figures and tables use for a step's ``amp``: "fp32" for "off" (no autocast)."""
    return "fp32" if amp == "off" else amp


@dataclass(frozen=True)
class StepConfig(Settings):
    """One training step, everything that sets its memory and speed: ``StepConfig("yolov9-s", 16)``;
    ``batch_size`` is the micro-batch, ``None`` switches and ``amp="auto"`` are decided by :meth:`resolve`."""

    model: Any = None  # a registered name, a model yaml or an nn.Module; None in a TrainConfig: fit's model
    batch_size: int | None = declare(None, "images per forward/backward (default: the whole batch of each GPU)",
                                     flag="--micro-batch-size", setting="micro_batch_size", integer=True, low=1)
    imgsz: int = declare(640, "training image size", flag="--imgsz", aliases=("--img", "--img-size"), integer=True,
                         low=32, multiple=32)
    multi_scale: bool = declare(False, "resize each batch to a random multiple of 32 in [0.5, 1.5] x imgsz",
                                flag="--multi-scale")
    amp: str = declare("auto", "mixed precision", flag="--amp", choices=AMP_MODES)
    activation_checkpointing: str | tuple[int, ...] | None = declare(
        None, "recompute layers in backward to save memory: backbone, all, or layer indices 1,2,3",
        flag="--activation-checkpointing", resume=CHANGE)
    freeze: int | str | tuple[int, ...] | None = declare(
        None, "layers that do not train: the first N (10: the yolov9-c backbone), indices (0 1 2), or backbone (the "
        "model yaml's backbone rows)", flag="--freeze")
    channels_last: bool | None = declare(None, "channels_last weights and inputs (NHWC convolutions)",
                                         no_flag=PLAIN_STEP, resume=CHANGE)
    lean_activations: bool | None = declare(None, "BatchNorm+SiLU keep one activation for backward, not two "
                                            "(~25 % less)", no_flag=PLAIN_STEP, resume=CHANGE)
    fused_optimizer: bool | None = declare(None, "torch's fused SGD/Adam/AdamW", no_flag=PLAIN_STEP, resume=CHANGE)
    # off by default: the first step then takes minutes (docs/benchmarks.md)
    compile: bool | str = declare(False, "torch.compile the forward (optionally a mode: reduce-overhead, "
                                  "max-autotune)", flag="--compile", resume=CHANGE)
    optimizer: str = declare("SGD", "the optimizer", flag="--optimizer", choices=("SGD", "Adam", "AdamW"))
    ema: bool = declare(True, "keep an EMA of the weights (what is validated and saved)", no_flag=API_ONLY)
    num_classes: int | None = None  # None: the model's own (80 for a registered name)
    num_targets: int = 8  # boxes per image of the memory tools' synthetic batch (the assigner grows with them)
    loss_fn: Callable | None = None  # memory tools: (outputs, targets) -> (loss, items); None: DetectionLoss
    device_type: str | None = None  # "cuda" or "cpu" once resolved for a device, else None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("activation_checkpointing", "freeze"):  # hashable: the estimator cache is keyed by steps
            object.__setattr__(self, name, check_layers(getattr(self, name), "StepConfig", name))

    @property
    def peak_imgsz(self) -> int:
        """The largest image side of the step (with ``multi_scale``, the largest ``multi_scale_side`` gives)."""
        return (int(self.imgsz * 1.5) + 31) // 32 * 32 if self.multi_scale else self.imgsz

    def resolve(self, device: Any = None, *, bf16: bool | None = None, gpu_name: str | None = None) -> StepConfig:
        """This step as ``fit`` runs it on ``device`` (None: the current CUDA device, else the CPU): ``amp`` and the
        ``None`` switches decided (docs/training.md); ``bf16``, ``gpu_name``: asked of the device when None.

        Raises:
            ValueError: ``amp="bf16"`` where the GPU or CPU has no bf16 in hardware, ``"fp16"`` on FP16_NAN_CARDS.
        """
        device = parse_device(device)
        if device.type == "cuda" and (bf16 is None or gpu_name is None) and torch.cuda.is_available():
            index = torch.cuda.current_device() if device.index is None else device.index
            bf16 = native_bf16(index) if bf16 is None else bf16
            gpu_name = gpu_name or f"{torch.cuda.get_device_name(index)} (cuda:{index})"
        amp = "off" if self.amp == "off" or device.type not in ("cpu", "cuda") else self.amp
        if device.type == "cpu":  # bf16 where the CPU computes it: its seed spread overlaps fp32's (docs/benchmarks.md)
            native = native_cpu_bf16() if bf16 is None else bf16
            if amp == "bf16" and not native:
                raise ValueError("amp='bf16': this CPU has no bf16 in hardware (AVX512-BF16 or AMX; `python -m "
                                 "yolo9kit checks` says), so bf16 would be emulated, slower than fp32: use amp='off' "
                                 "or amp='auto' (fp32 on this CPU)")
            amp = "bf16" if amp == "bf16" or (amp == "auto" and native) else "off"
        elif amp == "auto":
            amp = "bf16" if bf16 else "off" if FP16_NAN_CARDS.search(gpu_name or "") else "fp16"
        elif amp == "fp16" and FP16_NAN_CARDS.search(gpu_name or ""):
            raise ValueError(f"amp='fp16': {gpu_name} gives NaN losses in fp16 (GTX 16xx and Quadro T cards do): use "
                             "amp='auto' (fp32 there) or amp='off'")
        elif amp == "bf16" and bf16 is False:
            raise ValueError(f"amp='bf16': {gpu_name or 'this GPU'} has no bf16 in hardware (it needs compute "
                             "capability 8.0, Ampere or newer; older cards emulate it, slowly): use amp='fp16' or "
                             "amp='auto' (fp16 there)")
        # on the CPU only channels_last, where oneDNN runs the convolutions (docs/benchmarks.md)
        cpu_layout = device.type == "cpu" and torch.backends.mkldnn.is_available()
        switches = {name: (device.type == "cuda" or (name == "channels_last" and cpu_layout))
                    if getattr(self, name) is None else bool(getattr(self, name)) for name in FAST_SWITCHES}
        return dataclasses.replace(self, amp=amp, device_type=device.type, **switches)

    @property
    def model_name(self) -> str:
        if isinstance(self.model, (str, Path)):
            return Path(str(self.model)).stem if str(self.model).endswith((".yaml", ".yml", ".pt")) else str(self.model)
        return str(getattr(self.model, "name", None) or type(self.model).__name__)

    @property
    def label(self) -> str:
        """A short name of the setting, e.g. ``fp16 channels_last lean ckpt=all 640px`` (curves, tables)."""
        parts = [precision_name(self.amp)]
        parts += [name for name, on in (("channels_last", self.channels_last), ("lean", self.lean_activations)) if on]
        for name, value in (("ckpt", self.activation_checkpointing), ("freeze", self.freeze)):
            if value is not None:
                parts.append(f"{name}={','.join(map(str, value)) if isinstance(value, tuple) else value}")
        parts.append(f"{self.imgsz}px" + (" multi-scale" if self.multi_scale else ""))
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Plain values for JSON (the model and the loss by their names)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out.update({name: list(value) for name, value in out.items() if isinstance(value, tuple)})
        loss = None if self.loss_fn is None else getattr(self.loss_fn, "__name__", type(self.loss_fn).__name__)
        return {**out, "model": self.model_name, "loss_fn": loss}


def multi_scale_side(imgsz: int, stride: int, rng: Any) -> int:
    """The image side of one multi-scale batch, as official train_dual.py ``--multi-scale`` draws it."""
    return max(rng.randrange(int(imgsz * 0.5), int(imgsz * 1.5) + stride) // stride * stride, stride)
