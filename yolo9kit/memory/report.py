"""``MemoryReport``: what one training step at one batch size needs, measured or estimated."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from yolo9kit.config import StepConfig
from yolo9kit.files import format_bytes
from yolo9kit.memory.tracker import CATEGORIES

GIB = 1 << 30


@dataclass
class MemoryReport:
    """Peak memory and speed of one training step (optimizer update) of ``step``, measured or estimated.

    ``step`` is the resolved ``StepConfig`` the figures describe (its ``batch_size`` is the batch). All
    sizes are bytes. ``breakdown`` splits ``peak_allocated`` at the moment of the peak into
    ``CATEGORIES`` and sums to it exactly:

    * weights: parameters and buffers, plus autocast's low-precision copies of the weights;
    * gradients: ``.grad`` tensors (fp32, like the weights);
    * optimizer_state: momentum (SGD) or moment (Adam) buffers;
    * ema: the EMA copy of the model;
    * activations: tensors made in the forward pass still alive (kept for backward, and the outputs);
    * loss_assigner: tensors of the loss and the task-aligned assigner;
    * workspace_other: backward temporaries, optimizer temporaries, cuDNN workspace and whatever the
      counters saw that the categories did not (measured runs: the difference to the CUDA counter).

    ``peak_reserved`` is what the CUDA caching allocator holds (allocated plus cached blocks and
    rounding), the number that runs out first; ``context_bytes`` is the CUDA context outside PyTorch's
    counters (nvidia-smi shows reserved + context). ``method`` is "measured" (CUDA counters),
    "estimated" (traced on shape-only tensors, any machine) or "traced" (the real step on the CPU, traced).
    """

    step: StepConfig
    method: str
    device: str
    peak_allocated: int
    peak_reserved: int
    breakdown: dict[str, int]
    step_time_s: float | None = None
    images_per_s: float | None = None
    context_bytes: int = 0
    gpu_total_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        missing = [c for c in CATEGORIES if c not in self.breakdown]
        if missing:
            raise ValueError(f"MemoryReport breakdown lacks {missing}; expected the keys {CATEGORIES}")

    @property
    def model(self) -> str:
        return self.step.model_name

    @property
    def batch_size(self) -> int:
        return self.step.batch_size

    @property
    def device_bytes(self) -> int:
        """What the process holds on the card: reserved peak + CUDA context."""
        return self.peak_reserved + self.context_bytes

    @property
    def fits(self) -> bool | None:
        """Does the step fit on ``gpu_total_bytes``? None when no capacity is known."""
        return None if self.gpu_total_bytes is None else self.device_bytes <= self.gpu_total_bytes

    def as_row(self) -> dict[str, Any]:
        """A flat dict (one DataFrame row): the step's settings, bytes, GiB columns for reading, breakdown."""
        step = self.step
        row: dict[str, Any] = {
            "model": step.model_name, "batch_size": step.batch_size, "imgsz": step.peak_imgsz, "amp": step.amp,
            "activation_checkpointing": "none" if step.activation_checkpointing is None
            else str(step.activation_checkpointing),
            "channels_last": step.channels_last, "lean_activations": step.lean_activations,
            "sync_free": step.sync_free, "setting": step.label, "method": self.method, "device": self.device,
            "peak_allocated": self.peak_allocated, "peak_reserved": self.peak_reserved,
            "step_time_s": self.step_time_s, "images_per_s": self.images_per_s,
            "context_bytes": self.context_bytes, "num_targets": step.num_targets,
            "gpu_total_bytes": self.gpu_total_bytes,
        }
        row.update({f"{c}_bytes": self.breakdown[c] for c in CATEGORIES})
        row["device_bytes"] = self.device_bytes
        row["fits"] = self.fits
        row["peak_allocated_gib"] = self.peak_allocated / GIB
        row["peak_reserved_gib"] = self.peak_reserved / GIB
        row["device_gib"] = self.device_bytes / GIB
        return row

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["step"] = self.step.to_dict()
        return out

    def __str__(self) -> str:
        speed = "" if self.step_time_s is None else \
            f", {self.step_time_s * 1000:.0f} ms/step, {self.images_per_s:.1f} img/s"
        head = (f"{self.model} batch {self.batch_size}, {self.step.label}, {self.method} for {self.device}: "
                f"peak allocated {format_bytes(self.peak_allocated)}, "
                f"reserved {format_bytes(self.peak_reserved)}{speed}")
        parts = [f"  {c:16s} {format_bytes(self.breakdown[c]):>12s}" for c in CATEGORIES]
        return "\n".join([head, *parts])
