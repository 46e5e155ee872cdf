"""Training-loader throughput: yolo9kit against the official YOLOv9 loader, side by side.

    python benchmarks/loader.py [--official PATH/TO/yolov9] [--batches 20] [--workers 0 2]

Both loaders read the same synthetic shapes data set (default 256 JPEGs of 640x480) with the
hyp.scratch-high augmentations (mosaic, mixup 0.15, random affine, HSV, flips) at 640, batch 16, and are
timed the same way: warm-up batches first (worker start-up, caches), then ``--batches`` batches.
The official code is imported from the given checkout at run time; a few import-time incompatibilities
with current packages are bridged inside this process only (stub modules for missing optional imports).
Compare figures only within one run: other processes on the machine change them a lot.
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


def ours(data_yaml: Path, workers: int, args) -> float:
    from yolo9kit.data import create_dataloader

    loader = create_dataloader(data_yaml, "train", imgsz=args.imgsz, batch_size=args.batch_size, workers=workers,
                               cache=args.cache_mode, seed=0, pin_memory=False)
    return time_loader(loader, args.warmup, args.batches)


def _import_official(checkout: Path):
    """Import the official utils.dataloaders from a checkout (see official_shim.py)."""
    from official_shim import import_official

    import_official(checkout)
    from utils import dataloaders

    return dataloaders


def official(checkout: Path, list_file: Path, workers: int, args) -> float:
    import yaml

    dataloaders = _import_official(checkout)
    hyp = yaml.safe_load((checkout / "data" / "hyps" / "hyp.scratch-high.yaml").read_text())
    loader, _ = dataloaders.create_dataloader(str(list_file), args.imgsz, args.batch_size, 32, hyp=hyp, augment=True,
                                              cache=args.cache_mode, workers=workers,
                                              shuffle=True)
    return time_loader(loader, args.warmup, args.batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official", type=Path, help="checkout of WongKinYiu/yolov9 to time side by side")
    parser.add_argument("--data", type=Path, default=REPO / "data" / "generated" / "bench-640x480")
    parser.add_argument("--n-images", type=int, default=512)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--cache", choices=["none", "ram"], nargs="+", default=["none", "ram"],
                        help="image caching, the same on both sides: 'none' decodes every JPEG each time, 'ram' "
                             "decodes each once (the yolo9kit default, cache=None, behaves as 'ram' when it fits)")
    args = parser.parse_args()

    from yolo9kit.data import make_shapes

    data_yaml = make_shapes(args.data, args.n_images, 8, (640, 480), num_classes=8, seed=0)
    list_file = args.data / "train_official.txt"  # its own list file, so the official cache has its own name
    images = sorted((args.data / "images" / "train").glob("*.jpg"))
    list_file.write_text("".join(f"./images/train/{p.name}\n" for p in images))
    print(f"{args.n_images} images 640x480, imgsz {args.imgsz}, batch {args.batch_size}, {args.batches} batches after "
          f"{args.warmup} warm-up, {os.cpu_count()} CPUs")
    rows = {}
    for cache in args.cache:
        args.cache_mode = False if cache == "none" else "ram"
        for w in args.workers:
            mine = ours(data_yaml, w, args)
            theirs = official(args.official, list_file, w, args) if args.official else None
            rows[cache, w] = (mine, theirs)
            print(f"cache {cache}, {w} workers: yolo9kit {mine:.1f} img/s"
                  + (f", official {theirs:.1f} img/s" if theirs else ""), flush=True)
    print("\n| cache | workers | yolo9kit img/s | official img/s | ratio |\n|---|---|---|---|---|")
    for (cache, w), (mine, theirs) in rows.items():
        print(f"| {cache} | {w} | {mine:.1f} | " + (f"{theirs:.1f} | {mine / theirs:.2f}x |" if theirs else "- | - |"))
    if args.official and ("ram", args.workers[0]) in rows and ("none", args.workers[0]) in rows:
        print("\nDefaults (yolo9kit caches when the images fit in RAM, the official loader does not):")
        for w in args.workers:
            print(f"  {w} workers: {rows['ram', w][0] / rows['none', w][1]:.2f}x")


if __name__ == "__main__":
    main()
