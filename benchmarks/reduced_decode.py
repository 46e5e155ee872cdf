"""Reduced JPEG decoding in training against a full decode: time and pixel difference on the same images.

    python benchmarks/reduced_decode.py [--images DIR] [--n 16] [--sizes 1920x1080 4032x3024] [--imgsz 640]

Training decodes a JPEG that shrinks a lot at 1/2, 1/4 or 1/8 of its size (libjpeg's DCT scaling, OpenCV's
``IMREAD_REDUCED_COLOR_*``): ``yolo9kit.data.images.reduce_factor``. Two training paths use it:

* ``cache``: the RAM and disk caches of a training split (``load_resized(..., augment=True)``) resize each
  image to ``imgsz``, decoding at a reduced size that stays at least twice ``imgsz``;
* ``warp``: without a cache each mosaic tile is decoded at the largest reduction that keeps one source
  pixel per output pixel of its warp (``YOLODataset._source``), so a tile the random affine zooms out by
  a further 2x (``--zooms``) is decoded smaller still.

Validation never reduces (full decode, as the official code). For each path and image this prints the
decode time of the full and of the reduced decode, the resize time, and how far the image the training
step receives (resized with INTER_LINEAR to the same size) is from the one a full decode would give, which
is what the official training loader decodes: mean and 99th-percentile absolute difference in 8-bit
levels, the largest difference, the share of values differing by more than 2 levels, and the PSNR. The
last two columns put both against an INTER_AREA resize of the full decode (an area average, free of the
aliasing a sparse INTER_LINEAR shrink shows on fine grain): the mean absolute difference of each.
Without ``--images`` the images are synthetic shapes JPEGs (``make_shapes``) of each ``--sizes``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from yolo9kit.data.images import read_bgr, reduce_factor, resized_size


def _best_ms(fn, repeat: int):
    """(result, fastest of ``repeat`` calls in ms): the minimum is the least disturbed by other processes."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return out, best * 1e3


def compare(path: str, out_w: int, out_h: int, factor: int, repeat: int) -> dict:
    """Full against reduced decode of one file, both resized (INTER_LINEAR) to (out_w, out_h)."""
    full, t_full = _best_ms(lambda: read_bgr(path), repeat)
    reduced, t_red = _best_ms(lambda: read_bgr(path, factor), repeat)
    a, t_resize_full = _best_ms(lambda: cv2.resize(full, (out_w, out_h), interpolation=cv2.INTER_LINEAR), repeat)
    b, t_resize_red = _best_ms(lambda: cv2.resize(reduced, (out_w, out_h), interpolation=cv2.INTER_LINEAR), repeat)
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    mse = float((d.astype(np.float64) ** 2).mean())
    # an anti-aliased reference: INTER_LINEAR samples a 2x-plus shrink sparsely (fine grain aliases), a DCT
    # reduction averages; which of the two is nearer an area average of the full image?
    area = cv2.resize(full, (out_w, out_h), interpolation=cv2.INTER_AREA).astype(np.int16)
    return {"factor": factor, "full_ms": t_full + t_resize_full, "reduced_ms": t_red + t_resize_red,
            "decode_full_ms": t_full, "decode_reduced_ms": t_red, "mean": float(d.mean()),
            "p99": float(np.percentile(d, 99)), "max": int(d.max()), "over2": float((d > 2).mean()),
            "psnr": 10 * np.log10(255**2 / mse) if mse else float("inf"),
            "full_vs_area": float(np.abs(a - area).mean()), "reduced_vs_area": float(np.abs(b - area).mean())}


def cases(w0: int, h0: int, imgsz: int, zooms: list[float]) -> list[tuple[str, int, int, int]]:
    """(path name, output w, output h, reduction factor) of the training paths for one image size."""
    w, h = resized_size(w0, h0, imgsz)
    r = imgsz / max(w0, h0)
    out = [("cache", w, h, reduce_factor(r * 2) if r < 0.5 else 1)]
    for zoom in zooms:
        zw, zh = max(round(w * zoom), 1), max(round(h * zoom), 1)
        out.append((f"warp, zoom {zoom:g}", zw, zh, reduce_factor(zoom * w / w0)))
    return out


def _images(args) -> list[Path]:
    if args.images:
        files = sorted(p for p in Path(args.images).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
        return files[:args.n]
    from yolo9kit.data import make_shapes

    root = Path(args.out or tempfile.mkdtemp(prefix="yolo9kit-reduced-decode-"))
    files = []
    for size in args.sizes:
        w, h = (int(v) for v in size.lower().split("x"))
        make_shapes(root / size, n_train=args.n, n_val=1, imgsz=(w, h), num_classes=8, seed=0)
        files += sorted((root / size / "images" / "train").glob("*.jpg"))
    return files


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", help="a folder of JPEGs to measure (default: synthetic shapes JPEGs)")
    p.add_argument("--sizes", nargs="+", default=["1920x1080", "4032x3024"], help="synthetic image sizes, WxH")
    p.add_argument("--n", type=int, default=16, help="images per size (or from --images)")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--zooms", type=float, nargs="+", default=[1.0, 0.5],
                   help="zoom of the random affine for the warp path (hyp.scratch-high: 0.1 to 1.9)")
    p.add_argument("--repeat", type=int, default=3, help="timings per call; the fastest counts")
    p.add_argument("--out", help="folder for the synthetic images (default: a temporary folder)")
    args = p.parse_args()
    cv2.setNumThreads(0)  # as in the loader's workers: one core each
    from PIL import Image

    groups: dict[tuple[str, str], list[dict]] = {}
    for f in _images(args):
        with Image.open(f) as im:
            w0, h0 = im.size
        for name, ow, oh, factor in cases(w0, h0, args.imgsz, args.zooms):
            if factor > 1:
                r = compare(str(f), ow, oh, factor, args.repeat)
                r["kB"] = f.stat().st_size / 1e3
                groups.setdefault((f"{w0}x{h0}", f"{name} -> {ow}x{oh}"), []).append(r)
    print(f"imgsz {args.imgsz}; fastest of {args.repeat} calls; differences of the resized images in 8-bit levels\n")
    print("| JPEG (mean kB) | path -> output | images | factor | full decode + resize ms | reduced ms | speed-up | "
          "mean abs diff | p99 | max | share > 2 levels | PSNR dB | full vs area | reduced vs area |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (jpeg, case), rs in groups.items():
        m = {k: float(np.mean([r[k] for r in rs])) for k in rs[0]}
        print(f"| {jpeg} ({m['kB']:.0f}) | {case} | {len(rs)} | {int(m['factor'])} | {m['full_ms']:.1f} | "
              f"{m['reduced_ms']:.1f} | "
              f"{m['full_ms'] / m['reduced_ms']:.2f}x | {m['mean']:.2f} | {m['p99']:.1f} | {max(r['max'] for r in rs)} "
              f"| {100 * m['over2']:.1f} % | {m['psnr']:.1f} | {m['full_vs_area']:.2f} | {m['reduced_vs_area']:.2f} |")


if __name__ == "__main__":
    main()
