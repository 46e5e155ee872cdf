"""Multi-GPU training with PyTorch's own DistributedDataParallel (launched by ``torchrun``).

``torchrun --nproc_per_node 2 -m yolo9kit train --data data.yaml --model yolov9-s --batch 64`` starts one
process per GPU; the CLI calls ``init_from_env`` and ``fit`` sees an initialised process group. Only
``init_from_env`` reads the launcher's variables (RANK, WORLD_SIZE, LOCAL_RANK); the package itself has
no environment switches.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    """Rank of this process, number of processes, GPU index on this node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, validates and writes checkpoints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_from_env() -> DistInfo:
    """Initialise the default process group when launched by torchrun (WORLD_SIZE > 1).

    Backend nccl when CUDA is available, gloo otherwise (CPU). Sets the current CUDA device to
    LOCAL_RANK. Without torchrun it does nothing and returns rank 0 of 1.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend=backend)
    return current()


def finish() -> None:
    """End the process group after a finished run, as torch asks of every process: each rank waits for the
    others (rank 0 may still be writing the last checkpoint), then the group is destroyed."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def current() -> DistInfo:
    """The DistInfo of the already initialised process group (rank 0 of 1 when none)."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistInfo()
    local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank() % max(torch.cuda.device_count(), 1)))
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank)


def wrap_model(model: nn.Module, info: DistInfo, device: torch.device, sync_bn: bool = False) -> nn.Module:
    """Optionally convert BatchNorm to SyncBatchNorm, then wrap in DistributedDataParallel."""
    if not info.distributed:
        return model
    if sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        LOGGER.info("using SyncBatchNorm")
    device_ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)


def broadcast_object(value, info: DistInfo):
    """``value`` of rank 0 on every rank (e.g. the run folder)."""
    if not info.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()
