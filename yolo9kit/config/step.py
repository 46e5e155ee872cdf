"""``StepConfig``: one training step, as the memory tools describe it and ``fit`` runs it.

It is the ``step`` part of a ``TrainConfig`` (``config.train``): ``fit`` runs ``config.step`` with its model and
batch filled in (``yolo9kit.train.step.describe_step``), and the memory tools take the same object, so an
estimate, a measurement and a training run agree on what the step is by construction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yolo9kit.config.declare import CHANGE, check_declared, declare
from yolo9kit.cpu import native_cpu_bf16
from yolo9kit.env import native_bf16, parse_device

AMP_MODES = ("auto", "fp16", "bf16", "off")
ACTIVATION_CHECKPOINTING = ("backbone", "all")  # or a list of layer indices
OPTIMIZERS = ("SGD", "Adam", "AdamW")
# What ``freeze`` accepts: None/0, the first N layers, "backbone", or layer indices (yolo9kit.models.freeze).
Freeze = int | str | Sequence[int] | None
# The speed switches that ``None`` leaves to the device: all on for CUDA, channels_last on the CPU (resolve).
FAST_SWITCHES = ("channels_last", "lean_activations", "fused_optimizer")
# Why the speed switches have no flag of their own (config.declare: every setting has a flag or a reason).
_PLAIN_STEP = "--plain-step turns the CUDA speed switches off together (None: decided for the device)"
_API = "API only: the official value serves every command-line run"


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


def check_activation_checkpointing(value: Any, owner: str) -> tuple[int, ...] | str | None:
    """None, "backbone", "all" or a list of layer indices (stored as a tuple), else a ValueError naming ``owner``."""
    if value is None or value in ACTIVATION_CHECKPOINTING:
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(i, int) and i >= 0 for i in value):
        return tuple(value)
    raise ValueError(f"{owner}.activation_checkpointing={value!r}: expected None, 'backbone', 'all' "
                     "or a list of layer indices")


def amp_for(amp: str, device_type: str, bf16: bool | None, gpu_name: str = "this GPU") -> str:
    """The autocast mode a step runs with: "fp16", "bf16" or "off".

    "auto" is bf16 where the GPU computes it in hardware (``bf16``: compute capability 8.0 or more; no loss
    scaling needed), else fp16 (also when ``bf16`` is None: not known, no such card here). On the CPU "auto"
    and "fp16" are fp32: an explicit "bf16" autocasts where the processor computes bf16 in hardware (``bf16``:
    ``cpu.native_cpu_bf16``, AVX512-BF16 or AMX; 1.65x the official step of yolov9-t with channels_last), but
    it is not the default, because the demo's 30 epochs reached mAP50 0.838 with it against 0.911 in fp32
    (``benchmarks/demo_recipe.py``, docs/benchmarks.md).

    Raises:
        ValueError: ``amp="bf16"`` on a GPU or CPU without bf16 in hardware (a T4, a V100, an AVX2 laptop would
            emulate it, slowly): the message names ``gpu_name`` and the choices that work there.
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
class StepConfig:
    """One training step, everything that sets its memory and speed: what ``yolo9kit.memory`` estimates and
    measures, and the ``step`` part of a ``TrainConfig`` that ``fit`` runs.

    ``batch_size`` is the images of one forward/backward, the micro-batch (the setting ``micro_batch_size`` of
    a ``TrainConfig``; None there: the whole batch of each rank; the memory tools need a number, given here or
    as their ``batch_size``). ``None`` switches and ``amp="auto"`` are decided for a device by :meth:`resolve`,
    with the rules ``fit`` uses. The simple form is a model name: ``StepConfig("yolov9-s", 16)``.

    Inside a ``TrainConfig`` the model is ``fit``'s: ``model`` and ``num_classes`` are kept empty there.
    """

    model: Any = None  # a registered name ("yolov9-s"), a model yaml, or an nn.Module; None: fit's model
    batch_size: int | None = declare(
        None, "images per forward/backward: each batch is split into micro-batches of this size (default: the "
        "whole batch of each GPU)", flag="--micro-batch-size", setting="micro_batch_size", integer=True, low=1)
    imgsz: int = declare(640, "training image size", flag="--imgsz", aliases=("--img", "--img-size"), integer=True,
                         low=32, multiple=32)
    # Each batch resized to a random multiple of the model stride in [0.5, 1.5] x imgsz (official rule); the
    # memory tools describe the step at the largest size (``peak_imgsz``).
    multi_scale: bool = declare(False, "resize each batch to a random multiple of 32 in [0.5, 1.5] x imgsz",
                                flag="--multi-scale")
    # "auto": bf16 where the GPU supports it, else fp16; "off" on the CPU, where only an explicit "bf16" autocasts
    # (and only on a processor with bf16 in hardware: amp_for).
    amp: str = declare("auto", "mixed precision", flag="--amp", choices=AMP_MODES)
    # Recompute these layers in backward instead of keeping their activations: None, "backbone", "all" or a
    # list of layer indices (DetectionModel.set_activation_checkpointing). Saves memory, costs a forward.
    activation_checkpointing: str | tuple[int, ...] | None = declare(
        None, "recompute layers in backward to save memory: backbone, all, or layer indices 1,2,3",
        flag="--activation-checkpointing", resume=CHANGE)
    # Fine-tuning: layers whose parameters do not train (official --freeze): None or 0 nothing, an int N the
    # first N layers, "backbone" the model yaml's backbone rows, or a list of layer indices (stored as a
    # tuple). Frozen parameters get no gradient, no optimizer state and no EMA update, and autograd keeps no
    # activation that only their gradients would need (yolo9kit.models.freeze has the rules).
    freeze: int | str | tuple[int, ...] | None = declare(
        None, "layers that do not train (fine-tuning): N for the first N layers (official: 10 is the yolov9-c "
        "backbone), several indices (0 1 2), or backbone (the model yaml's backbone rows)", flag="--freeze")
    # Speed switches; None: decided for the device (resolve, for fit and memory alike: _fast_by_default).
    channels_last: bool | None = declare(None, "channels_last weights and inputs (NHWC convolutions)",
                                         no_flag=_PLAIN_STEP, resume=CHANGE)
    lean_activations: bool | None = declare(None, "BatchNorm+SiLU keep one activation for backward, not two "
                                            "(~25 % less)", no_flag=_PLAIN_STEP, resume=CHANGE)
    fused_optimizer: bool | None = declare(None, "torch's fused SGD/Adam/AdamW", no_flag=_PLAIN_STEP, resume=CHANGE)
    cudnn_benchmark: bool = declare(True, "cudnn autotuning (CUDA only)", no_flag=_API, resume=CHANGE)
    # torch.compile the model's forward: True, or a mode such as "reduce-overhead" (CUDA graphs) or
    # "max-autotune". Off by default: the first step then takes minutes (measured in docs/benchmarks.md).
    compile: bool | str = declare(False, "torch.compile the forward (optionally a mode: reduce-overhead, "
                                  "max-autotune)", flag="--compile", resume=CHANGE)
    optimizer: str = declare("SGD", "the optimizer", flag="--optimizer", choices=OPTIMIZERS)
    ema: bool = declare(True, "keep an EMA of the weights (what is validated and saved)", no_flag=_API)
    num_classes: int | None = None  # None: the model's own (80 for a registered name)
    num_targets: int = 8  # boxes per image of the memory tools' synthetic batch (the assigner grows with them)
    loss_fn: Callable | None = None  # memory tools: (outputs, targets) -> (loss, items); None: DetectionLoss
    device_type: str | None = None  # "cuda" or "cpu" once resolved for a device, else None

    def __post_init__(self) -> None:
        check_declared(self)
        if self.num_targets < 0:
            raise ValueError(f"StepConfig.num_targets={self.num_targets!r}: expected an integer >= 0")
        # hashable: the estimator cache is keyed by steps
        object.__setattr__(self, "activation_checkpointing",
                           check_activation_checkpointing(self.activation_checkpointing, "StepConfig"))
        object.__setattr__(self, "freeze", check_freeze(self.freeze, "StepConfig"))

    def replace(self, **changes: Any) -> StepConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    @property
    def peak_imgsz(self) -> int:
        """The largest image side of the step: ``imgsz``, or with ``multi_scale`` the largest a batch can get
        (``multi_scale_range``): what the memory tools describe, the peak of the run."""
        return multi_scale_range(self.imgsz)[1] if self.multi_scale else self.imgsz

    def resolve(self, device: Any = None, *, bf16: bool | None = None, gpu_name: str | None = None) -> StepConfig:
        """This step as it runs on ``device`` (None: the current CUDA device, else the CPU): "auto" AMP and
        every ``None`` switch decided as ``fit`` decides them there (``_fast_by_default``: all on for CUDA,
        channels_last on the CPU).

        ``bf16``: whether the device computes bf16 in hardware (default: ask the CUDA device named, or the
        current one; without CUDA on this machine it is not known: "auto" is fp16, an explicit "bf16" is kept;
        for the CPU, this processor: ``cpu.native_cpu_bf16``).
        ``gpu_name`` names it in errors. Values already set are kept, so resolving twice changes nothing.

        Raises:
            ValueError: ``amp="bf16"`` where the GPU or CPU has no bf16 (see :func:`amp_for`).
        """
        device_type = _device_type(device)
        if bf16 is None:
            bf16 = _local_bf16(device) if device_type == "cuda" else native_cpu_bf16()
        if gpu_name is None and device_type == "cuda":
            gpu_name = _local_gpu_name(device)
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
        """A short name of the setting, e.g. ``fp16 channels_last lean ckpt=all 640px`` (curves, tables; a step
        without AMP reads ``fp32``)."""
        parts = [precision_name(self.amp)]
        parts += [name for name, on in (("channels_last", self.channels_last), ("lean", self.lean_activations))
                  if on]
        if self.activation_checkpointing is not None:
            value = self.activation_checkpointing
            parts.append(f"ckpt={value if isinstance(value, str) else ','.join(map(str, value))}")
        if self.freeze is not None:
            value = self.freeze
            parts.append(f"freeze={value if not isinstance(value, tuple) else ','.join(map(str, value))}")
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
    return max(rng.randrange(*_multi_scale_span(imgsz, stride)) // stride * stride, stride)


def multi_scale_range(imgsz: int, stride: int = 32) -> tuple[int, int]:
    """Smallest and largest side ``multi_scale_side`` can give (the memory tools describe the largest)."""
    low, high = _multi_scale_span(imgsz, stride)
    return max(low // stride * stride, stride), (high - 1) // stride * stride


def _multi_scale_span(imgsz: int, stride: int) -> tuple[int, int]:
    return int(imgsz * 0.5), int(imgsz * 1.5) + stride


def _fast_by_default(switch: str, device_type: str) -> bool:
    """What a ``None`` speed switch is on ``device_type``: every one on CUDA; on the CPU channels_last where
    oneDNN runs the convolutions (its NHWC kernels: 1.24x the contiguous fp32 step of yolov9-t,
    docs/benchmarks.md), the others off (the fused optimizer pays on a GPU only; the lean BatchNorm+SiLU saves
    memory, which a CPU step has)."""
    if device_type == "cuda":
        return True
    import torch

    return switch == "channels_last" and device_type == "cpu" and torch.backends.mkldnn.is_available()


def _device_type(device: Any) -> str:
    return parse_device(device).type


def _cuda_index(device: Any) -> int | None:
    """The index of the CUDA device ``device`` names on this machine (None: no CUDA here)."""
    import torch

    if not torch.cuda.is_available():
        return None
    index = parse_device(device).index
    return torch.cuda.current_device() if index is None else index


def _local_bf16(device: Any = None) -> bool | None:
    """Whether the named (or current) CUDA device has bf16; None without CUDA on this machine."""
    index = _cuda_index(device)
    return None if index is None else native_bf16(index)


def _local_gpu_name(device: Any = None) -> str | None:
    import torch

    index = _cuda_index(device)
    return None if index is None else f"{torch.cuda.get_device_name(index)} (cuda:{index})"


# ---- inference, validation and loader settings ------------------------------------------------------------
