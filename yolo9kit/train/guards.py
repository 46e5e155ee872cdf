"""What the loop does when something goes wrong: out of memory, a non-finite loss, an interrupt."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import torch

LOGGER = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """Raised after ``max_nonfinite_steps`` non-finite losses in a row.

    Attributes:
        run_dir: the run folder; its ``weights/last.pt`` is the last good checkpoint (not overwritten).
        count: how many non-finite losses in a row were seen.
    """

    def __init__(self, run_dir: Path | None, count: int, epoch: int, batch: int) -> None:
        self.run_dir, self.count = run_dir, count
        where = f"; the last good checkpoint is {Path(run_dir) / 'weights' / 'last.pt'}" if run_dir else ""
        super().__init__(
            f"{count} non-finite losses in a row (epoch {epoch}, batch {batch}): training stopped{where}. "
            "Lower lr0, check the labels (yolo9kit.data.check) or train with amp='off' or 'bf16'."
        )


class OutOfMemoryAtMinimumError(RuntimeError):
    """Out of memory with a micro-batch of one image: nothing left to halve."""


def is_out_of_memory(error: BaseException) -> bool:
    """True for ``torch.cuda.OutOfMemoryError`` and the generic "out of memory" RuntimeError."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def free_memory(device: torch.device | None = None) -> None:
    """Collect garbage and return cached CUDA blocks to the driver (after the caller dropped its tensors)."""
    gc.collect()
    if torch.cuda.is_available() and (device is None or device.type == "cuda"):
        torch.cuda.empty_cache()


def halve_micro_batch(micro_batch: int, error: BaseException) -> int:
    """The micro-batch to retry with after an out-of-memory ``error``; raises when it is already 1."""
    if micro_batch <= 1:
        raise OutOfMemoryAtMinimumError(
            "out of memory with a micro-batch of 1 image: use a smaller model or image size, "
            "amp='fp16'/'bf16', or activation checkpointing (TrainConfig(activation_checkpointing='all'))"
        ) from error
    new = micro_batch // 2
    LOGGER.warning("out of memory at micro-batch %d: retrying this batch as micro-batches of %d "
                   "(accumulation x2, same images per optimizer step)", micro_batch, new)
    return new
