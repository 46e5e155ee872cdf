"""create_dataloader: uint8 batches that depend only on the seed and the epoch (docs/data.md, "Loader")."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import cv2
import torch
from torch.utils.data import DataLoader, Sampler, get_worker_info

from yolo9kit.config import LoaderConfig
from yolo9kit.data.dataset import SampleKey, YOLODataset
from yolo9kit.data.images import hsv_jitter
from yolo9kit.data.sources import DataConfig
from yolo9kit.env import memory_limits, usable_cores
from yolo9kit.files import format_bytes

SHM = Path("/dev/shm")  # where workers hand their batches over (torch's sharing strategies both use it)
WORKER_BYTES = 64 << 20  # a forked worker's own memory beside its batches: 33 MB measured (USS; 640 px, batch 16)


class KeySampler(Sampler):
    """SampleKeys shuffled by (seed, epoch); a rank takes every world_size-th of the padded order (as torch's)."""

    def __init__(self, n: int, shuffle: bool, seed: int, rank: int = 0, world_size: int = 1, dataset=None):
        self.n, self.shuffle, self.seed, self.rank, self.world_size = n, shuffle, seed, rank, world_size
        self.epoch = 0
        self.dataset = dataset  # its .mosaic, read in the main process, travels with every key

    def __len__(self) -> int:
        return -(-self.n // self.world_size)  # this rank's share of the padded order

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.n, generator=generator).tolist() if self.shuffle else list(range(self.n))
        if self.world_size > 1:
            total = len(self) * self.world_size
            order = (order * (total // max(len(order), 1) + 1))[:total][self.rank::self.world_size]
        epoch, mosaic = self.epoch, bool(getattr(self.dataset, "mosaic", True))
        return (SampleKey(i, epoch, mosaic) for i in order)


def collate(batch):
    """(images uint8 (B, 3, H, W) in channels_last memory, targets (N, 6), paths, shapes[, HSV gains (B, 3)])."""
    images, targets, paths, shapes, *gains = zip(*batch)
    out = torch.empty((len(images), *images[0].shape[1:], 3), dtype=torch.uint8)
    if get_worker_info() is not None:  # in a worker the images go straight into shared memory
        out.share_memory_()
    for i, (im, t) in enumerate(zip(images, targets)):
        out[i].copy_(im.permute(1, 2, 0))
        t[:, 0] = i
    batch = (out.permute(0, 3, 1, 2), torch.cat(targets, 0), list(paths), list(shapes))
    return (*batch, torch.stack(gains[0])) if gains else batch


def _worker_init(worker_id: int) -> None:
    cv2.setNumThreads(0)  # one process per core already: OpenCV's own threads only compete


class YOLOLoader:
    """Iterable over batches, one epoch per pass (``set_epoch`` chooses it); ``loader`` is the torch DataLoader."""

    def __init__(self, dataset: YOLODataset, loader: DataLoader, sampler: KeySampler,
                 colour_device: torch.device | None = None):
        self.dataset, self.loader, self.sampler, self.colour_device = dataset, loader, sampler, colour_device
        self._epoch_set = self._started = False

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.epoch = epoch
        self._epoch_set = True

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def __iter__(self):
        # a generator: the epoch moves on and the workers start at the first batch asked for, not at iter()
        # (tqdm.auto's bar calls iter() once more than it iterates: the epoch's data was the next epoch's)
        if not self._epoch_set and self._started:
            self.sampler.epoch += 1
        self._started, self._epoch_set = True, False
        for images, targets, paths, shapes, *gains in self.loader:
            if self.colour_device is not None:  # the images go there and get their HSV gains there
                images = images.to(self.colour_device, non_blocking=True)
                images = hsv_jitter(images, gains[0]) if gains else images
            yield images, targets, paths, shapes


def set_mosaic(loader_or_dataset: YOLOLoader | YOLODataset, enabled: bool) -> None:
    """Switch the mosaic (of an augmented, non-rect dataset) on or off from the next epoch, in every worker."""
    dataset = loader_or_dataset.dataset if isinstance(loader_or_dataset, YOLOLoader) else loader_or_dataset
    dataset.mosaic = enabled and dataset.augment and not dataset.rect


def default_workers(batch_size: int, imgsz: int = 640, prefetch: int = 4) -> tuple[int, str]:
    """The official min(cores // GPUs, batch size if > 1 else 0, 8), with the cores this process may use, lowered
    until each worker's ``prefetch`` uint8 batches fit half the free /dev/shm (a container's is 64 MB: "Bus error"
    beyond it) and, with WORKER_BYTES each, half the free RAM, each shared by the GPUs' ranks. The count and why."""
    ranks = max(torch.cuda.device_count(), 1)  # officially one DDP rank per GPU, each with its loader
    cores = usable_cores() // ranks
    count, why = min(cores, batch_size if batch_size > 1 else 0, 8), f"min({cores} usable cores, batch {batch_size}, 8)"
    batches = prefetch * batch_size * 3 * imgsz * imgsz
    shm = shutil.disk_usage(SHM).free if SHM.is_dir() else None  # none on macOS and Windows
    for name, free, each in (("/dev/shm", shm, batches), ("RAM", min(memory_limits().values(), default=None),
                                                          batches + WORKER_BYTES)):
        if free is not None and count * each > free // 2 // ranks:
            count = free // 2 // ranks // each
            why = f"half the free {name} ({format_bytes(free)}) fits the {prefetch} batches each prepares {count} times"
    return count, f"{count} workers: {why}"


def create_dataloader(data: str | Path | dict | DataConfig | YOLODataset, split: str = "train",
                      imgsz: int = 640, batch_size: int = 16, *, augment: bool | None = None,
                      workers: int | None = None, rect: bool | None = None, shuffle: bool | None = None,
                      seed: int = 0, cache: str | None = "auto", hyp: dict | None = None,
                      distributed: bool = False, stride: int = 32, pad: float | None = None, min_items: int = 0,
                      single_cls: bool = False, colour_device: str | torch.device | None = None,
                      options: LoaderConfig | None = None, allow_bad_labels: bool = False) -> YOLOLoader:
    """A loader of ``(images uint8 (B, 3, H, W) RGB, targets (N, 6), paths, shapes)``; mosaic starts on.

    Args:
        data: data.yaml path, dict, DataConfig, or a YOLODataset (then the dataset keywords are not used).
        augment, rect, shuffle, pad: default: train augmented and shuffled, other splits rect, padded 0.5 stride.
        workers: worker processes; default ``default_workers`` (logged); 0 loads in the main process.
        seed, cache, hyp, stride, min_items, single_cls, allow_bad_labels: as :class:`YOLODataset`.
        distributed: split the samples over torch.distributed ranks; colour_device: HSV jitter there (and batches).
        options: a :class:`~yolo9kit.config.LoaderConfig`: speed and memory, never the batches.
    """
    options = options or LoaderConfig()
    train = split == "train"
    dataset = data if isinstance(data, YOLODataset) else YOLODataset(
        data, split, imgsz, augment=train if augment is None else augment, hyp=hyp,
        rect=(not train) if rect is None else rect, batch_size=batch_size, stride=stride,
        pad=(0.0 if train else 0.5) if pad is None else pad, cache=cache, min_items=min_items,
        single_cls=single_cls, seed=seed, cache_budget=options.cache_budget, allow_bad_labels=allow_bad_labels)
    shuffle = (train if shuffle is None else shuffle) and not dataset.rect
    batch_size = min(batch_size, len(dataset))
    if workers is None:
        workers, why = default_workers(batch_size, imgsz, options.prefetch_factor)
        logging.getLogger(__name__).info("%s loader, %s", split, why)
    rank, world = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if distributed else (0, 1)
    sampler = KeySampler(len(dataset), shuffle, seed, rank, world, dataset=dataset)
    set_mosaic(dataset, True)
    colour_device = torch.device(colour_device) if colour_device is not None else None
    dataset.colour_on_device = colour_device is not None and dataset.augment
    pin_memory = torch.cuda.is_available() if options.pin_memory is None else options.pin_memory
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                        collate_fn=collate, pin_memory=pin_memory, persistent_workers=workers > 0,
                        prefetch_factor=options.prefetch_factor if workers > 0 else None,
                        worker_init_fn=_worker_init)
    return YOLOLoader(dataset, loader, sampler, colour_device)


def preprocess_images(images: torch.Tensor, device: torch.device | str, dtype: torch.dtype = torch.float32,
                      channels_last: bool = False) -> torch.Tensor:
    """uint8 (B, 3, H, W) -> ``dtype`` in [0, 1] on ``device`` (copied as uint8, then converted)."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return images.to(device, non_blocking=True).to(dtype=dtype, memory_format=fmt).div_(255)
