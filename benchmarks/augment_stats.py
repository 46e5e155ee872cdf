"""Do yolo9kit's training samples follow the same distributions as the official loader's?

    python benchmarks/augment_stats.py --official PATH/TO/yolov9 [--samples 400]

Draws training samples (hyp.scratch-high: mosaic, mixup, affine, HSV, flips) from both loaders on the same
shapes data and prints quantiles of per-sample statistics: boxes per image, box width and height (fraction of
the image), box centre x, fraction of grey (114) pixels, and mean brightness. The two columns should agree
within sampling noise; they are not expected to match sample by sample (different random streams).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
from loader import REPO, _import_official  # same folder: the official import shims live there


def stats(image_rgb: np.ndarray, targets: np.ndarray) -> dict[str, list[float]]:
    grey = (np.abs(image_rgb.astype(int) - 114).max(-1) <= 2).mean()
    return {"boxes per image": [len(targets)], "box width": list(targets[:, 4]), "box height": list(targets[:, 5]),
            "box centre x": list(targets[:, 2]), "grey fraction": [grey], "brightness": [image_rgb.mean() / 255]}


def collect(dataset, n: int, key) -> dict[str, np.ndarray]:
    out: dict[str, list[float]] = {}
    for k in range(n):
        image, targets, _, _ = dataset[key(k)]
        for name, values in stats(image.permute(1, 2, 0).numpy() if image.shape[0] == 3 else image.numpy(),
                                  targets.numpy()).items():
            out.setdefault(name, []).extend(values)
    return {k: np.array(v) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official", type=Path, required=True, help="checkout of WongKinYiu/yolov9")
    parser.add_argument("--data", type=Path, default=REPO / "data" / "generated" / "bench-640x480")
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--hyp", nargs="*", default=[], help="overrides such as hsv_v=0")
    args = parser.parse_args()

    import yaml

    from yolo9kit.data import YOLODataset, make_shapes
    from yolo9kit.data.dataset import SampleKey

    data_yaml = make_shapes(args.data, 256, 8, (640, 480), num_classes=8, seed=0)
    list_file = args.data / "train_official.txt"
    images = sorted((args.data / "images" / "train").glob("*.jpg"))
    list_file.write_text("".join(f"./images/train/{p.name}\n" for p in images))
    dataloaders = _import_official(args.official)
    hyp = yaml.safe_load((args.official / "data" / "hyps" / "hyp.scratch-high.yaml").read_text())
    hyp.update({k: float(v) for k, v in (h.split("=") for h in args.hyp)})
    random.seed(0)
    np.random.seed(0)
    official = dataloaders.LoadImagesAndLabels(str(list_file), args.imgsz, 16, augment=True, hyp=hyp)
    ours = YOLODataset(data_yaml, "train", args.imgsz, augment=True, hyp=hyp, cache="ram")
    a = collect(ours, args.samples, lambda k: SampleKey(k % len(ours), k // len(ours), True))
    b = collect(official, args.samples, lambda k: k % len(official))
    print(f"{args.samples} samples each, quantiles 10 / 50 / 90 % and mean\n")
    print("| statistic | yolo9kit | official |\n|---|---|---|")
    for name in a:
        print(f"| {name} | {_quantiles(a[name])} | {_quantiles(b[name])} |")


def _quantiles(x: np.ndarray) -> str:
    return " / ".join(f"{q:.3f}" for q in np.quantile(x, [0.1, 0.5, 0.9])) + f" (mean {x.mean():.3f})"


if __name__ == "__main__":
    main()
