"""Training-loader throughput: yolo9kit against the official YOLOv9 loader, side by side.

    python benchmarks/loader.py [--official PATH/TO/yolov9] [--batches 20] [--workers 0 2] [--profile-batches 10]

Both loaders read the same synthetic shapes data set (default 512 JPEGs of 640x480) with the
hyp.scratch-high augmentations (mosaic, mixup 0.15, random affine, HSV, flips) at 640, batch 16, and are
timed the same way: warm-up batches first (worker start-up, caches), then ``--batches`` batches.
The official code is imported from the given checkout at run time; a few import-time incompatibilities
with current packages are bridged inside this process only (stub modules for missing optional imports).
Compare figures only within one run: other processes on the machine change them a lot. OpenCV's
internal threads are off for both loaders (the official code switches them off when imported), so each
loader process works on one core.

Each kit row is timed twice: as on a CPU-only machine (colour jitter in the loader, OpenCV) and with the
colour jitter left for the training device (the CUDA default, ``colour_device``); the second times the
loader's CPU work only, and the torch jitter's cost on this CPU is printed separately.

To show why the ratio is what it is, the script also prints the JPEGs' mean size (bytes and pixels) and,
for each cache setting, a profile of both loaders in this process without workers: milliseconds per output
image in each stage (decode, resize, mosaic, affine, mixup, colour, flip + convert, collate; see
``loader_stages.py``), with the JPEG decodes and decoded megapixels per output image.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def time_loader(loader, warmup: int, batches: int) -> float:
    """Images per second over ``batches`` batches after ``warmup`` batches."""
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    n, t0 = 0, time.perf_counter()
    for _ in range(batches):
        n += len(next(it)[0])
    return n / (time.perf_counter() - t0)


def kit_loader(data_yaml: Path, workers: int, args, colour_left: bool = False):
    """The kit's loader; ``colour_left``: the HSV jitter is left for the training device (the CUDA default),
    so the loader's CPU work is timed without it (its device cost is timed by ``device_jitter_ms``)."""
    from yolo9kit.config import LoaderConfig
    from yolo9kit.data import create_dataloader

    loader = create_dataloader(data_yaml, "train", imgsz=args.imgsz, batch_size=args.batch_size, workers=workers,
                               cache=args.cache_mode, seed=0, options=LoaderConfig(pin_memory=False))
    loader.dataset.colour_on_device = colour_left  # set before the first pass: workers copy the dataset then
    return loader


def ours(data_yaml: Path, workers: int, args, colour_left: bool = False) -> float:
    return time_loader(kit_loader(data_yaml, workers, args, colour_left), args.warmup, args.batches)


def device_jitter_ms(args) -> float:
    """The torch colour jitter of one batch on the CPU of this machine (on a GPU it is a few kernels)."""
    import numpy as np
    import torch

    from yolo9kit.data.augment import Hyp, hsv_gains
    from yolo9kit.data.images import hsv_jitter

    rng = np.random.default_rng(0)
    images = torch.randint(0, 256, (args.batch_size, 3, args.imgsz, args.imgsz), dtype=torch.uint8)
    gains = torch.tensor(np.stack([hsv_gains(rng, Hyp()) for _ in range(args.batch_size)]), dtype=torch.float32)
    hsv_jitter(images, gains)
    t = time.perf_counter()
    for _ in range(3):
        hsv_jitter(images, gains)
    return (time.perf_counter() - t) / 3 * 1e3


def _import_official(checkout: Path):
    """Import the official utils.dataloaders from a checkout (see official_shim.py)."""
    from official_shim import import_official

    import_official(checkout)
    from utils import dataloaders

    return dataloaders


def official_loader(checkout: Path, list_file: Path, workers: int, args):
    import yaml

    if args.cache_mode != "disk":
        # The official load_image reads an image's .npy (what its disk cache writes) whenever one exists,
        # whatever the cache setting: without this, 'none' and 'ram' after a 'disk' run would time .npy reads.
        for npy in (list_file.parent / "images" / "train").glob("*.npy"):
            npy.unlink()
    dataloaders = _import_official(checkout)
    hyp = yaml.safe_load((checkout / "data" / "hyps" / "hyp.scratch-high.yaml").read_text())
    loader, _ = dataloaders.create_dataloader(str(list_file), args.imgsz, args.batch_size, 32, hyp=hyp, augment=True,
                                              cache=args.cache_mode, workers=workers,
                                              shuffle=True)
    return loader


def official(checkout: Path, list_file: Path, workers: int, args) -> float:
    return time_loader(official_loader(checkout, list_file, workers, args), args.warmup, args.batches)


def stage_profiles(data_yaml: Path, list_file: Path, args) -> dict[str, dict]:
    """Per-image stage costs of each loader, in this process without workers (see loader_stages.py)."""
    from loader_stages import profile, wrap_kit, wrap_official

    rows = {}
    for colour_left in (False, True):
        name = "yolo9kit" + (", colour jitter on the device" if colour_left else "")
        rows[name] = profile(lambda c=colour_left: kit_loader(data_yaml, 0, args, c), wrap_kit, args.profile_batches)
    if args.official:
        dataloaders = _import_official(args.official)
        rows["official"] = profile(lambda: official_loader(args.official, list_file, 0, args),
                                   lambda clock: wrap_official(clock, dataloaders), args.profile_batches)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official", type=Path, help="checkout of WongKinYiu/yolov9 to time side by side")
    parser.add_argument("--data", type=Path, default=REPO / "data" / "generated" / "bench-640x480")
    parser.add_argument("--n-images", type=int, default=512)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--profile-batches", type=int, default=10,
                        help="batches of the per-stage profile of each loader (0: no profile)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--cache", choices=["none", "ram", "disk"], nargs="+", default=["none", "ram"],
                        help="image caching, the same on both sides: 'none' decodes every JPEG each time, 'ram' "
                             "decodes each once (the yolo9kit default, cache='auto', behaves as 'ram' when it fits), "
                             "'disk' decodes each once into files (the kit: one memory-mapped file; official: .npy)")
    args = parser.parse_args()

    # OpenCV's own threads off on both sides, from the start: the official code turns them off for the
    # whole process when it is imported, which would otherwise favour whichever loader runs first.
    import cv2

    cv2.setNumThreads(0)
    from yolo9kit.data import make_shapes

    data_yaml = make_shapes(args.data, args.n_images, 8, (640, 480), num_classes=8, seed=0)
    list_file = args.data / "train_official.txt"  # its own list file, so the official cache has its own name
    images = sorted((args.data / "images" / "train").glob("*.jpg"))
    list_file.write_text("".join(f"./images/train/{p.name}\n" for p in images))
    print(f"{args.n_images} images 640x480, imgsz {args.imgsz}, batch {args.batch_size}, {args.batches} batches after "
          f"{args.warmup} warm-up, {os.cpu_count()} CPUs")
    from loader_stages import jpeg_sizes, stage_table

    js = jpeg_sizes(images)
    print(f"JPEGs: {js['files']} files, mean {js['mean_bytes'] / 1e3:.1f} kB, {js['mean_w']:.0f}x{js['mean_h']:.0f} "
          f"pixels ({js['mean_w'] * js['mean_h'] / 1e6:.3f} Mpixel), {js['bytes_per_pixel']:.3f} bytes per pixel")
    rows = {}
    for cache in args.cache:
        args.cache_mode = None if cache == "none" else cache
        for w in args.workers:
            mine = ours(data_yaml, w, args)
            left = ours(data_yaml, w, args, colour_left=True)
            theirs = official(args.official, list_file, w, args) if args.official else None
            rows[cache, w] = (mine, left, theirs)
            print(f"cache {cache}, {w} workers: yolo9kit {mine:.1f} img/s, colour on the device {left:.1f} img/s"
                  + (f", official {theirs:.1f} img/s" if theirs else ""), flush=True)
    print("\n| cache | workers | yolo9kit img/s | ratio | yolo9kit, colour jitter on the device, img/s | ratio "
          "| official img/s |\n|---|---|---|---|---|---|---|")
    for (cache, w), (mine, left, theirs) in rows.items():
        r1, r2 = (f"{mine / theirs:.2f}x", f"{left / theirs:.2f}x") if theirs else ("-", "-")
        print(f"| {cache} | {w} | {mine:.1f} | {r1} | {left:.1f} | {r2} | " + (f"{theirs:.1f} |" if theirs else "- |"))
    print(f"\nThe colour jitter left for the device, run in torch on this CPU: {device_jitter_ms(args):.0f} ms per "
          f"batch of {args.batch_size} (on a GPU: a few kernels; on a CPU-only machine the kit keeps it in the loader)")
    if args.official and ("ram", args.workers[0]) in rows and ("none", args.workers[0]) in rows:
        print("\nDefaults (yolo9kit caches when the images fit in RAM, the official loader does not):")
        for w in args.workers:
            print(f"  {w} workers: {rows['ram', w][0] / rows['none', w][2]:.2f}x on a CPU-only machine, "
                  f"{rows['ram', w][1] / rows['none', w][2]:.2f}x with the colour jitter on a GPU")
    if args.profile_batches:
        for cache in args.cache:
            args.cache_mode = None if cache == "none" else cache
            print(f"\nPer-stage cost, cache {cache}, no workers, {args.profile_batches} batches: ms per output image "
                  "(exclusive time of each stage; loader_stages.py says what each covers)")
            print(stage_table(stage_profiles(data_yaml, list_file, args)), flush=True)


if __name__ == "__main__":
    main()
