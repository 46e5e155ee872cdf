"""``StepConfig``: one training step, as the memory tools describe it and ``fit`` runs it.

Built from a ``TrainConfig`` with the rules ``fit`` applies on a device (``StepConfig.from_train_config``,
``StepConfig.resolve``), so an estimate, a measurement and a training run agree on what the step is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yolo9kit.config.train import AMP_MODES, OPTIMIZERS, TrainConfig, check_activation_checkpointing, check_freeze
from yolo9kit.env import native_bf16, parse_device

# The speed switches that ``None`` turns on for CUDA and off for the CPU (TrainConfig and StepConfig alike).
FAST_SWITCHES = ("channels_last", "lean_activations", "sync_free", "fused_optimizer")


def amp_for(amp: str, device_type: str, bf16: bool | None, gpu_name: str = "this GPU") -> str:
    """The autocast mode a step runs with: "fp16", "bf16" or "off".

    "auto" is bf16 where the GPU computes it in hardware (``bf16``: compute capability 8.0 or more; no loss
    scaling needed), else fp16 (also when ``bf16`` is None: not known, no such card here); on the CPU the step
    is fp32 whatever is asked, as the official check_amp does (CPU autocast is slower than fp32 for
    convolutions).

    Raises:
        ValueError: ``amp="bf16"`` on a GPU without bf16 (a T4 or V100 would emulate it, slowly): the message
            names ``gpu_name`` and the choices that work there.
    """
    if amp not in AMP_MODES:
        raise ValueError(f"amp={amp!r}: expected one of {AMP_MODES}")
    if device_type != "cuda" or amp == "off":
        return "off"
    if amp == "auto":
        return "bf16" if bf16 else "fp16"
    if amp == "bf16" and bf16 is False:
        raise ValueError(f"amp='bf16': {gpu_name} has no bf16 in hardware (it needs compute capability 8.0, Ampere "
                         "or newer; older cards emulate it, slowly): use amp='fp16' or amp='auto' (fp16 there)")
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
    # Frozen layers (TrainConfig.freeze): their parameters get no gradient, no optimizer state, no EMA update,
    # and autograd keeps no activation that only their gradients would need.
    freeze: int | str | tuple[int, ...] | None = None
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
        object.__setattr__(self, "freeze", check_freeze(self.freeze, "StepConfig"))

    @classmethod
    def from_train_config(cls, config: TrainConfig, model: Any, *, world_size: int = 1, num_targets: int = 8,
                          batch_size: int | None = None) -> StepConfig:
        """The step ``fit`` runs for ``config``: its micro-batch (per DDP rank), size, AMP and switches.

        ``batch_size`` overrides the micro-batch (needed while ``config.batch_size`` is "auto"). With
        ``multi_scale`` the step is the one at the largest size a batch can get (``multi_scale_range``): its
        memory is the peak of the run.
        """
        if batch_size is None:
            if config.batch_size == "auto":
                raise ValueError("TrainConfig.batch_size is 'auto': pass batch_size= (the batch to describe)")
            batch_size = config.micro_batch_size or max(1, config.batch_size // world_size)
        imgsz = multi_scale_range(config.imgsz)[1] if config.multi_scale else config.imgsz
        return cls(model=model, batch_size=batch_size, imgsz=imgsz, amp=config.amp,
                   activation_checkpointing=config.activation_checkpointing, freeze=config.freeze,
                   channels_last=config.channels_last,
                   lean_activations=config.lean_activations, sync_free=config.sync_free,
                   fused_optimizer=config.fused_optimizer, optimizer=config.optimizer, ema=config.ema,
                   num_classes=getattr(model, "nc", None), num_targets=num_targets)

    def resolve(self, device: Any = None, *, bf16: bool | None = None, gpu_name: str | None = None) -> StepConfig:
        """This step as it runs on ``device`` (None: the current CUDA device, else the CPU): "auto" AMP and
        every ``None`` switch decided as ``fit`` decides them there (on for CUDA, off for the CPU).

        ``bf16``: whether the GPU computes bf16 in hardware (default: ask the CUDA device named, or the current
        one; without CUDA on this machine it is not known: "auto" is fp16, an explicit "bf16" is kept).
        ``gpu_name`` names it in errors. Values already set are kept, so resolving twice changes nothing.

        Raises:
            ValueError: ``amp="bf16"`` where the GPU has no bf16 (see :func:`amp_for`).
        """
        device_type = _device_type(device)
        if bf16 is None:
            bf16 = _local_bf16(device) if device_type == "cuda" else False
        if gpu_name is None and device_type == "cuda":
            gpu_name = _local_gpu_name(device)
        switches = {name: (device_type == "cuda") if getattr(self, name) is None else bool(getattr(self, name))
                    for name in FAST_SWITCHES}
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
        parts = [self.amp]
        parts += [name for name, on in (("channels_last", self.channels_last), ("lean", self.lean_activations))
                  if on]
        if self.activation_checkpointing is not None:
            value = self.activation_checkpointing
            parts.append(f"ckpt={value if isinstance(value, str) else ','.join(map(str, value))}")
        if self.freeze is not None:
            value = self.freeze
            parts.append(f"freeze={value if not isinstance(value, tuple) else ','.join(map(str, value))}")
        parts.append(f"{self.imgsz}px")
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
