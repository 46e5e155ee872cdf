"""create_dataloader: uint8 batches, seeded and reproducible with any number of workers (docs/data.md, Loader).

Design: the sampler (main process) sends :class:`SampleKey` (index, epoch, mosaic) to the workers, and
every random draw of a sample comes from a generator seeded by (seed, epoch, index). So the batches depend
only on the seed and the epoch, not on the number of workers, and switching mosaic off (close-mosaic)
reaches persistent workers without restarting them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler, get_worker_info

from yolo9kit.config import LoaderConfig
from yolo9kit.data.colour import hsv_jitter
from yolo9kit.data.dataset import SampleKey, YOLODataset
from yolo9kit.data.sources import DataConfig
from yolo9kit.env import usable_cores

log = logging.getLogger(__name__)


class KeySampler(Sampler):
    """Yields SampleKey(index, epoch, mosaic); shuffles with a generator seeded by (seed, epoch).

    With ``distributed`` each rank takes every world_size-th index of the (padded) permutation, as
    torch's DistributedSampler does.
    """

    def __init__(self, n: int, shuffle: bool, seed: int, rank: int = 0, world_size: int = 1, dataset=None):
        self.n, self.shuffle, self.seed, self.rank, self.world_size = n, shuffle, seed, rank, world_size
        self.epoch = 0
        self.dataset = dataset  # its .mosaic, read in the main process, travels with every key
        self.num_samples = -(-n // world_size)

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        if self.world_size > 1:
            total = self.num_samples * self.world_size
            order = (order * (total // max(len(order), 1) + 1))[:total][self.rank::self.world_size]
        epoch, mosaic = self.epoch, bool(getattr(self.dataset, "mosaic", True))
        return (SampleKey(i, epoch, mosaic) for i in order)


def collate(batch):
    """Stack samples: (images uint8 (B, 3, H, W) in channels_last memory, targets (N, 6), paths, shapes).

    Inside a worker the image batch is allocated in shared memory, so it crosses to the main process
    without another copy.
    """
    images, targets, paths, shapes, *gains = zip(*batch)
    h, w = images[0].shape[1:]
    shape = (len(images), h, w, 3)
    if get_worker_info() is not None:
        out = torch.empty(0, dtype=torch.uint8).new_empty(shape).share_memory_()
    else:
        out = torch.empty(shape, dtype=torch.uint8)
    for i, im in enumerate(images):
        out[i].copy_(im.permute(1, 2, 0))
    for i, t in enumerate(targets):
        t[:, 0] = i
    if gains:  # colour jitter left for the device: (B, 3) HSV gains as a 5th field
        return out.permute(0, 3, 1, 2), torch.cat(targets, 0), list(paths), list(shapes), torch.stack(gains[0])
    return out.permute(0, 3, 1, 2), torch.cat(targets, 0), list(paths), list(shapes)


def _worker_init(worker_id: int) -> None:
    cv2.setNumThreads(0)  # one process per core already: OpenCV's own threads only compete
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    import random

    random.seed(seed)


class YOLOLoader:
    """Iterable over batches; each full pass is one epoch (``set_epoch`` to choose it, e.g. on resume).

    Attributes:
        dataset: the :class:`YOLODataset`.
        sampler: the :class:`KeySampler`.
        loader: the underlying torch DataLoader.
    """

    def __init__(self, dataset: YOLODataset, loader: DataLoader, sampler: KeySampler,
                 colour_device: torch.device | None = None):
        self.dataset, self.loader, self.sampler = dataset, loader, sampler
        self.batch_size = loader.batch_size
        self.colour_device = colour_device
        self._epoch_set = False

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.epoch = epoch
        self._epoch_set = True

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def __iter__(self):
        if not self._epoch_set and getattr(self, "_started", False):
            self.sampler.epoch += 1
        self._started, self._epoch_set = True, False
        if self.colour_device is None:
            return iter(self.loader)
        return self._jittered(iter(self.loader))

    def _jittered(self, batches):
        """Copy each batch's images to ``colour_device`` and apply its HSV gains there."""
        for images, targets, paths, shapes, *gains in batches:
            images = images.to(self.colour_device, non_blocking=True)
            if gains:
                images = hsv_jitter(images, gains[0])
            yield images, targets, paths, shapes


def set_mosaic(loader_or_dataset, enabled: bool) -> None:
    """Switch the mosaic path on or off (close-mosaic); takes effect at the next epoch, in every worker.

    The flag lives on the dataset object of the main process; the sampler puts it into every sample key,
    so persistent worker processes (which hold their own copies of the dataset) follow it too.
    """
    if isinstance(loader_or_dataset, YOLOLoader):
        loader_or_dataset = loader_or_dataset.dataset
    loader_or_dataset.mosaic = enabled and loader_or_dataset.augment and not loader_or_dataset.rect


def default_workers(batch_size: int) -> int:
    """Official rule: min(cpu count // GPUs, batch size if > 1 else 0, 8), with the cores this process may use
    (``env.usable_cores``: its affinity and a container's CPU quota), not the machine's count."""
    gpus = max(torch.cuda.device_count(), 1) if torch.cuda.is_available() else 1
    return min(usable_cores() // gpus, batch_size if batch_size > 1 else 0, 8)


def create_dataloader(data: str | Path | dict | DataConfig | YOLODataset, split: str = "train",
                      imgsz: int = 640, batch_size: int = 16, *, augment: bool | None = None,
                      workers: int | None = None, rect: bool | None = None, shuffle: bool | None = None,
                      seed: int = 0, cache: str | None = "auto", hyp: dict | None = None,
                      distributed: bool = False, stride: int = 32, pad: float | None = None, min_items: int = 0,
                      single_cls: bool = False, colour_device: str | torch.device | None = None,
                      options: LoaderConfig | None = None, allow_bad_labels: bool = False) -> YOLOLoader:
    """A loader of ``(images uint8 (B, 3, H, W) RGB, targets (N, 6), paths, shapes)``.

    Args:
        data: data.yaml path, dict, DataConfig, or an already built YOLODataset.
        split: train / val / test.
        imgsz: training size (long side for rect batches).
        batch_size: images per batch.
        augment: official training augmentation; default True for train.
        workers: worker processes; default min(cpus, batch size, 8). 0 loads in the main process.
        rect: rectangular batches (aspect-ratio order, no shuffle, no mosaic); default True except for train.
        shuffle: default True for train (False with rect).
        seed: the same seed gives the same batches, whatever the number of workers.
        cache: "auto" (default) caches the decoded images in RAM only when they fit in
            ``options.cache_budget`` of the available RAM; "ram" always, and fails with the numbers when they
            do not fit; None never; "disk" decodes them once into a memory-mapped file beside the label cache
            (data sets larger than RAM; rebuilt when an image changes).
        hyp: augmentation hyper-parameters (dict, official keys); default hyp.scratch-high.
        distributed: split the samples over torch.distributed ranks (multi-GPU).
        pad: rect padding in strides; default 0.5 for validation, 0.0 for training.
        colour_device: run the HSV colour jitter there (batched, in torch: ``yolo9kit.data.colour``) instead
            of in the CPU workers; the batches' images then come out on that device. Pays on a GPU (the
            jitter is about a third of the CPU work of a cached mosaic batch); on a CPU it is slower than
            OpenCV. The same gains are drawn either way; pixels agree within one level.
        options: a :class:`~yolo9kit.config.LoaderConfig`: pinned memory (default: when CUDA is available),
            batches prefetched per worker (4), the RAM share the automatic cache may take (0.5). They change
            speed and memory, never the batches. Mosaic starts on; :func:`set_mosaic` switches it.
        allow_bad_labels: open a ``train`` split whose labels use unnamed class ids, hold no box, or lose
            more than a tenth of the labelled images to errors (by default a ``DataError`` says which and why).
    """
    options = options or LoaderConfig()
    train = split == "train"
    augment = train if augment is None else augment
    rect = (not train) if rect is None else rect
    if isinstance(data, YOLODataset):
        dataset = data
    else:
        pad = (0.0 if train else 0.5) if pad is None else pad
        dataset = YOLODataset(data, split, imgsz, augment=augment, hyp=hyp, rect=rect, batch_size=batch_size,
                              stride=stride, pad=pad, cache=cache,
                              min_items=min_items, single_cls=single_cls, seed=seed,
                              cache_budget=options.cache_budget, allow_bad_labels=allow_bad_labels)
    shuffle = (train and not dataset.rect) if shuffle is None else (shuffle and not dataset.rect)
    batch_size = min(batch_size, len(dataset))
    workers = default_workers(batch_size) if workers is None else workers
    rank, world = 0, 1
    if distributed:
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    sampler = KeySampler(len(dataset), shuffle, seed, rank, world, dataset=dataset)
    set_mosaic(dataset, True)
    colour_device = torch.device(colour_device) if colour_device is not None else None
    dataset.colour_on_device = colour_device is not None and dataset.augment
    pin_memory = torch.cuda.is_available() if options.pin_memory is None else options.pin_memory
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                        collate_fn=collate, pin_memory=pin_memory, persistent_workers=workers > 0,
                        prefetch_factor=options.prefetch_factor if workers > 0 else None,
                        worker_init_fn=_worker_init if workers > 0 else None, drop_last=False)
    return YOLOLoader(dataset, loader, sampler, colour_device)


def preprocess_images(images: torch.Tensor, device: torch.device | str, dtype: torch.dtype = torch.float32,
                      channels_last: bool = False) -> torch.Tensor:
    """uint8 (B, 3, H, W) -> ``dtype`` in [0, 1] on ``device``: copy the bytes, then convert there.

    Copying uint8 moves 4x fewer bytes than float32; ``non_blocking`` overlaps it with compute when the
    batch is in pinned memory.
    """
    images = images.to(device, non_blocking=True)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return images.to(dtype=dtype, memory_format=fmt).div_(255)
