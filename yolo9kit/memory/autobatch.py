"""``TrainConfig(batch_size="auto")``: the batch chosen from the memory estimate before the first step.

The official ``--batch-size -1`` and Ultralytics' AutoBatch run a few steps on the GPU and fit a line to
the memory they see. The kit predicts the same answer without running anything: the step ``fit`` is about
to run is its ``config.step`` (with the model and batch 1), ``memory.plan`` estimates it for the card
and recommends the largest batch that keeps ``margin`` of the card free, and the official accumulation rule
then reaches the nominal batch. The prediction is written to the run folder (``auto_batch.json``) and, on
CUDA, the measured peak of the first epoch beside it; an out-of-memory error still falls back to the
trainer's halving of the micro-batch.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from yolo9kit.config import TrainConfig
from yolo9kit.files import format_bytes, write_text_atomically
from yolo9kit.memory.estimate import estimator_for
from yolo9kit.memory.gpus import GPUSpec, gpu_from_device, host_memory, resolve_gpu
from yolo9kit.memory.plan import plan

LOGGER = logging.getLogger(__name__)
RECORD_NAME = "auto_batch.json"


@dataclass
class AutoBatch:
    """What ``batch_size="auto"`` chose and what it predicted (bytes); the measured peak once known."""

    batch_size: int  # images per loader batch, all DDP ranks together (what TrainConfig.batch_size becomes)
    accumulate: int  # batches per optimizer step by the official rule
    gpu: str  # the card (or "CPU RAM") the batch was sized for
    capacity_bytes: int
    margin: float
    largest_batch: int  # the largest per-device batch that fits (the chosen one divides the nominal batch or is it)
    step: dict  # the resolved StepConfig at the chosen per-device batch (StepConfig.to_dict)
    predicted_peak_allocated: int
    predicted_peak_reserved: int
    predicted_device_bytes: int  # reserved + CUDA context: what must fit under (1 - margin) of the capacity
    reason: str
    measured_peak_allocated: int | None = None  # CUDA: torch.cuda.max_memory_allocated over the first epoch
    measured_peak_reserved: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def record_measured_peak(self, device: torch.device, peak_allocated: int | None, run_dir: Path | None) -> None:
        """On CUDA, once: the first epoch's measured peaks beside the prediction (rewrites auto_batch.json)."""
        if self.measured_peak_allocated is not None or device.type != "cuda" or peak_allocated is None:
            return
        self.measured_peak_allocated = int(peak_allocated)
        self.measured_peak_reserved = int(torch.cuda.max_memory_reserved(device))
        if run_dir is not None:
            self.save(run_dir)

    def save(self, run_dir: Path) -> Path:
        path = Path(run_dir) / RECORD_NAME
        write_text_atomically(path, json.dumps(self.to_dict(), indent=2) + "\n")  # a reader never sees half
        return path

    def __str__(self) -> str:
        return (f"batch_size='auto': batch {self.batch_size} x accumulate {self.accumulate} on {self.gpu}, "
                f"predicted peak {format_bytes(self.predicted_device_bytes)} of {format_bytes(self.capacity_bytes)} "
                f"({self.margin:.0%} kept free)")


def sizing_target(config: TrainConfig, device: torch.device) -> GPUSpec:
    """The capacity the batch is sized against: ``config.gpu`` when named, else the training device's card,
    else (CPU training) the RAM available now."""
    if config.gpu is not None:
        return resolve_gpu(config.gpu)
    if device.type == "cuda":
        return gpu_from_device(device.index)  # None: the current CUDA device
    return host_memory()


def choose_batch(config: TrainConfig, model: nn.Module, device: torch.device, world_size: int = 1, *,
                 loss_fn: Callable | None = None) -> tuple[TrainConfig, AutoBatch]:
    """``config`` with ``batch_size="auto"`` replaced by the planned batch, and the record of the choice.

    ``model`` is only read; ``loss_fn`` is the run's loss when it is not the kit's ``DetectionLoss``.

    Raises:
        RuntimeError: not even batch 1 fits (the message says what to change).
    """
    spec = sizing_target(config, device)
    step = config.step.replace(model=model, batch_size=1, num_classes=getattr(model, "nc", None), loss_fn=loss_fn)
    chosen = plan(step, config.optim.nominal_batch_size, gpu=spec, margin=config.margin, method="estimated")
    if chosen.recommended is None:
        raise RuntimeError(f"batch_size='auto' for {step.model_name} at {step.peak_imgsz} px: {chosen.reason}")
    per_device = int(chosen.recommended["batch_size"])
    report = estimator_for(step, spec).reports([per_device], spec)[0]
    sized = dataclasses.replace(config, batch_size=per_device * world_size)
    record = AutoBatch(batch_size=per_device * world_size, accumulate=int(chosen.recommended["accumulate"]),
                       gpu=spec.name, capacity_bytes=spec.total_bytes, margin=config.margin,
                       largest_batch=chosen.largest_batch, step=report.step.to_dict(),
                       predicted_peak_allocated=report.peak_allocated, predicted_peak_reserved=report.peak_reserved,
                       predicted_device_bytes=report.device_bytes, reason=chosen.reason)
    LOGGER.info("%s", record)
    return sized, record
