"""Loader: batch format, seeded reproducibility with and without workers, close-mosaic in workers, workers in a
container's small /dev/shm."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch
from tqdm.auto import tqdm

from yolo9kit.config import LoaderConfig
from yolo9kit.data import create_dataloader, make_shapes, preprocess_images, set_mosaic
from yolo9kit.data.loader import KeySampler


@pytest.fixture(scope="module")
def shapes_yaml(tmp_path_factory):
    return make_shapes(tmp_path_factory.mktemp("shapes"), n_train=12, n_val=5, imgsz=96, num_classes=3, seed=1)


def _epoch(loader):
    return [(b[0].clone(), b[1].clone(), list(b[2]), b[3]) for b in loader]


def test_a_progress_bar_over_the_loader_sees_the_epoch_that_was_set(shapes_yaml):
    """tqdm.auto's bar calls iter() once more than it iterates: the loader's epoch moves on at a first batch only."""
    loader = create_dataloader(shapes_yaml, "train", imgsz=96, batch_size=4, workers=0, seed=0)
    loader.set_epoch(3)
    plain = _epoch(loader)
    loader.set_epoch(3)
    barred = _epoch(tqdm(loader, disable=True))
    assert len(barred) == len(plain) == len(loader)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(plain, barred))


def test_batch_format(shapes_yaml):
    loader = create_dataloader(shapes_yaml, "train", imgsz=96, batch_size=4, workers=0)
    images, targets, paths, shapes = next(iter(loader))
    assert images.shape == (4, 3, 96, 96) and images.dtype == torch.uint8
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert targets.dtype == torch.float32 and targets.shape[1] == 6
    assert set(targets[:, 0].long().tolist()) <= {0, 1, 2, 3}
    assert ((targets[:, 2:] >= 0) & (targets[:, 2:] <= 1)).all()
    assert len(paths) == 4 and shapes == [None] * 4
    assert loader.dataset.names == ["rectangle", "ellipse", "triangle"] and loader.dataset.nc == 3
    x = preprocess_images(images, "cpu")
    assert x.dtype == torch.float32 and x.shape == images.shape and float(x.max()) <= 1.0
    assert torch.equal(x, images.float() / 255)
    val = create_dataloader(shapes_yaml, "val", imgsz=96, batch_size=2, workers=0)
    images, _, _, shapes = next(iter(val))
    assert images.shape[-2:] == (128, 128)  # rect, pad 0.5: ceil(96/32 + 0.5) * 32
    (h0, w0), ((rh, rw), (pw, ph)) = shapes[0]
    assert (h0, w0) == (96, 96) and (rh, rw) == (1.0, 1.0) and (pw, ph) == (16.0, 16.0)


def test_same_seed_same_batches_with_0_and_2_workers(shapes_yaml):
    def run(workers, seed=0):
        loader = create_dataloader(shapes_yaml, "train", imgsz=96, batch_size=4, workers=workers, seed=seed,
                                   cache=None)
        return _epoch(loader), _epoch(loader)

    (a1, a2), (b1, b2) = run(0), run(2)
    for x, y in zip(a1 + a2, b1 + b2):
        assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) and x[2] == y[2]
    assert not torch.equal(a1[0][0], a2[0][0])  # the second epoch is a different draw
    c1, _ = run(0, seed=1)
    assert not all(torch.equal(x[0], y[0]) for x, y in zip(a1, c1))


def test_close_mosaic_reaches_persistent_workers(shapes_yaml):
    loader = create_dataloader(shapes_yaml, "train", imgsz=96, batch_size=4, workers=2)
    assert all(s is None for b in loader for s in b[3])  # mosaic
    workers_before = loader.loader._iterator
    set_mosaic(loader, False)
    batches = list(loader)
    assert loader.loader._iterator is workers_before  # same persistent workers
    assert all(s is not None for b in batches for s in b[3])  # single letterboxed images
    assert loader.epoch == 1
    set_mosaic(loader.dataset, True)  # the dataset object works as well as the loader
    assert all(s is None for b in loader for s in b[3])


def test_distributed_sampler_partitions_the_epoch():
    parts = []
    for rank in range(3):
        sampler = KeySampler(10, shuffle=True, seed=5, rank=rank, world_size=3)
        sampler.epoch = 2
        keys = list(sampler)
        assert len(keys) == len(sampler) == 4 and all(k.epoch == 2 for k in keys)
        parts += [k.index for k in keys]
    assert sorted(set(parts)) == list(range(10)) and len(parts) == 12  # padded like DistributedSampler


def test_ram_cache_gives_identical_batches(shapes_yaml):
    plain = _epoch(create_dataloader(shapes_yaml, "val", imgsz=96, batch_size=2, workers=0, cache=None))
    cached = _epoch(create_dataloader(shapes_yaml, "val", imgsz=96, batch_size=2, workers=0, cache="ram"))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(plain, cached))


def test_ram_cache_that_does_not_fit_is_a_clear_error(shapes_yaml):
    with pytest.raises(MemoryError, match="needs .* GiB but only"):
        create_dataloader(shapes_yaml, "train", imgsz=96, batch_size=2, workers=0, cache="ram",
                          options=LoaderConfig(cache_budget=1e-12))
    loader = create_dataloader(shapes_yaml, "train", imgsz=96, batch_size=2, workers=0,
                               options=LoaderConfig(cache_budget=1e-12))
    assert loader.dataset.images is None  # "auto", the default: silently not cached


def test_min_items_single_cls_and_cache_values(shapes_yaml):
    from yolo9kit.config import TrainConfig
    from yolo9kit.data import YOLODataset

    full = YOLODataset(shapes_yaml, "train", imgsz=96)
    counts = [len(x) for x in full.labels]
    some = YOLODataset(shapes_yaml, "train", imgsz=96, min_items=3, single_cls=True)
    assert len(some) == sum(c >= 3 for c in counts) < len(full)
    assert all((x[:, 0] == 0).all() for x in some.labels)
    for value in ("gpu", True, False):  # one spelling per mode: None is no cache, "ram" the RAM cache
        with pytest.raises(ValueError, match="cache must be one of"):
            YOLODataset(shapes_yaml, "train", imgsz=96, cache=value)
    with pytest.raises(ValueError, match=r"TrainConfig.cache=True: expected one of \('auto', 'ram', 'disk', None\)"):
        TrainConfig(cache=True)


def test_disk_cache_gives_identical_batches_and_is_rebuilt_when_an_image_changes(tmp_path):
    import os

    data = make_shapes(tmp_path / "shapes", n_train=10, n_val=3, imgsz=(128, 96), num_classes=3, seed=2)
    kwargs = dict(imgsz=96, batch_size=4, seed=0)
    # the same pixels as the RAM cache (both hold images resized at load; without a cache the resize is
    # folded into the mosaic warp, one interpolation instead of two)
    plain = _epoch(create_dataloader(data, "train", workers=0, cache="ram", **kwargs))
    disk = create_dataloader(data, "train", workers=0, cache="disk", **kwargs)
    files = sorted((tmp_path / "shapes" / "labels").glob("train.96px-linear.yolo9kit-images*"))
    assert [f.name for f in files] == ["train.96px-linear.yolo9kit-images", "train.96px-linear.yolo9kit-images.json"]
    assert files[0].stat().st_size == sum(a.nbytes for a in disk.dataset.images)
    for a, b in zip(plain, _epoch(disk)):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    with_workers = _epoch(create_dataloader(data, "train", workers=2, cache="disk", **kwargs))  # workers map it too
    assert all(torch.equal(a[0], b[0]) for a, b in zip(plain, with_workers))

    mtime = files[0].stat().st_mtime_ns
    create_dataloader(data, "train", workers=0, cache="disk", **kwargs)
    assert files[0].stat().st_mtime_ns == mtime  # up to date: reused, not rewritten
    image = sorted((tmp_path / "shapes" / "images" / "train").glob("*.jpg"))[0]
    os.utime(image, ns=(image.stat().st_atime_ns, image.stat().st_mtime_ns + 10**9))  # "edited"
    create_dataloader(data, "train", workers=0, cache="disk", **kwargs)
    assert files[0].stat().st_mtime_ns != mtime
    val = create_dataloader(data, "val", workers=0, cache="disk", imgsz=96, batch_size=2)  # validation: INTER_AREA
    assert (tmp_path / "shapes" / "labels" / "val.96px-area.yolo9kit-images").is_file() and len(val.dataset.images) == 3
    val_plain = create_dataloader(data, "val", workers=0, cache=None, imgsz=96, batch_size=2)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(_epoch(val_plain), _epoch(val)))


SMALL_SHM = """
import logging, sys
from yolo9kit.data import create_dataloader, make_shapes
data = make_shapes(sys.argv[1], n_train=32, n_val=1, imgsz=320, num_classes=3, seed=0)
workers = None if sys.argv[2] == "default" else int(sys.argv[2])
logging.basicConfig(level=logging.INFO)
loader = create_dataloader(data, "train", imgsz=320, batch_size=16, workers=workers, seed=0)
print(loader.loader.num_workers, sum(len(batch[0]) for batch in loader))
"""


@pytest.mark.slow
def test_in_a_small_shm_the_default_workers_load_where_the_official_count_dies(tmp_path):
    """An 8 MB /dev/shm (a mount namespace, as a container's 64 MB one at a fraction of the batch size): two
    workers, the official count on 2 cores, die handing over batches of 16 x 320 px; the default count loads the
    epoch and logs why it is lower."""
    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare or "unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", "/dev/shm"],
                           capture_output=True, text=True) if unshare else None
    if probe is None or probe.returncode != 0:
        pytest.skip(f"cannot mount a small /dev/shm here: {probe.stderr.strip() if probe else 'no unshare'}")

    def run(workers: str):
        script = (f"mount -t tmpfs -o size=8m tmpfs /dev/shm && exec {sys.executable} -c '{SMALL_SHM}' {tmp_path} "
                  f"{workers}")
        return subprocess.run([unshare, "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300)

    official = run("2")
    assert official.returncode != 0 and "shared memory" in official.stderr + official.stdout, official.stderr[-2000:]
    default = run("default")
    assert default.returncode == 0, default.stderr[-2000:]
    assert default.stdout.split() == ["0", "32"], default.stdout
    assert "train loader, 0 workers: half the free /dev/shm (8.00 MiB)" in default.stderr, default.stderr[-2000:]
