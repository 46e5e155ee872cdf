"""``MemoryReport``: what one training step at one batch size needs, measured or estimated."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from yolo9kit.memory.tracker import CATEGORIES

GIB = 1 << 30


def fmt_bytes(nbytes: float) -> str:
    """Bytes -> "1.23 GiB" / "45.6 MiB" (display only; the code keeps bytes)."""
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{int(nbytes)} B"


@dataclass
class MemoryReport:
    """Peak memory and speed of one training step (optimizer update) at one batch size.

    All sizes are bytes. ``breakdown`` splits ``peak_allocated`` at the moment of the peak into
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
    counters (nvidia-smi shows reserved + context). ``source`` is "measured" or "estimated".
    """

    model: str
    batch_size: int
    imgsz: int
    amp: str
    checkpoint: Any
    channels_last: bool
    source: str
    device: str
    peak_allocated: int
    peak_reserved: int
    breakdown: dict[str, int]
    step_time_s: float | None = None
    images_per_s: float | None = None
    context_bytes: int = 0
    num_targets: int = 8
    gpu_total_bytes: int | None = None
    notes: list[str] = field(default_factory=list)
    lean: bool = False  # the lean BatchNorm+SiLU of yolo9kit.models.lean

    def __post_init__(self) -> None:
        missing = [c for c in CATEGORIES if c not in self.breakdown]
        if missing:
            raise ValueError(f"MemoryReport breakdown lacks {missing}; expected the keys {CATEGORIES}")

    @property
    def device_bytes(self) -> int:
        """What the process holds on the card: reserved peak + CUDA context."""
        return self.peak_reserved + self.context_bytes

    @property
    def fits(self) -> bool | None:
        """Does the step fit on ``gpu_total_bytes``? None when no capacity is known."""
        return None if self.gpu_total_bytes is None else self.device_bytes <= self.gpu_total_bytes

    def as_row(self) -> dict[str, Any]:
        """A flat dict (one DataFrame row): settings, bytes, GiB columns for reading, breakdown."""
        row = {k: v for k, v in asdict(self).items() if k not in ("breakdown", "notes")}
        row["checkpoint"] = "none" if self.checkpoint is None else str(self.checkpoint)
        row.update({f"{c}_bytes": self.breakdown[c] for c in CATEGORIES})
        row["device_bytes"] = self.device_bytes
        row["fits"] = self.fits
        row["peak_allocated_gib"] = self.peak_allocated / GIB
        row["peak_reserved_gib"] = self.peak_reserved / GIB
        row["device_gib"] = self.device_bytes / GIB
        return row

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        speed = "" if self.step_time_s is None else \
            f", {self.step_time_s * 1000:.0f} ms/step, {self.images_per_s:.1f} img/s"
        head = (f"{self.model} batch {self.batch_size} @ {self.imgsz} amp={self.amp} checkpoint={self.checkpoint} "
                f"channels_last={self.channels_last}{' lean' if self.lean else ''} ({self.source} on {self.device}): "
                f"peak allocated "
                f"{fmt_bytes(self.peak_allocated)}, reserved {fmt_bytes(self.peak_reserved)}{speed}")
        parts = [f"  {c:16s} {fmt_bytes(self.breakdown[c]):>12s}" for c in CATEGORIES]
        return "\n".join([head, *parts])
