"""Per-image cost of each stage of a training loader, for benchmarks/loader.py.

The loader's own functions are wrapped by timers for the length of one profiling pass (one process, no
workers), and each stage gets its *exclusive* time: a wrapped call's time minus that of the wrapped calls
inside it (a mosaic's own work without the decoding it triggers). What no wrapper covers (the sampler,
the DataLoader's fetch, label bookkeeping outside the wrapped functions) is "unattributed". The timers
cost a few microseconds per call, far below every stage measured here.

Stages, for both loaders:

* ``decode``: JPEG decoding (the kit: ``read_bgr``, at a reduced size when a tile shrinks by 2x or more;
  official: ``cv2.imread``); also counts the calls and the pixels decoded.
* ``resize``: the load-time resize to the training size (official ``load_image`` without its imread; the kit
  folds it into the tile warp, so it has none without a RAM cache and none per batch with one).
* ``mosaic``: building the 4-image mosaic except decoding and warping (official ``load_mosaic``: the 2s x 2s
  canvas fill, labels, copy-paste; the kit: tile layout, labels, copy-paste).
* ``affine``: the pixel warp (official ``random_perspective`` of the canvas; the kit: ``place`` of each
  visible tile, which does the mosaic placement and the random affine in one resize or warp, and the label
  transform).
* ``mixup``, ``colour`` (official ``augment_hsv``; the kit: ``bgr_to_rgb``, the HSV jitter and the
  conversion to RGB in one), ``flip + convert`` (the rest of ``__getitem__``: flips, channel order, labels to
  tensors), ``collate``.
"""

from __future__ import annotations

import time
from collections import defaultdict

STAGES = ("decode", "resize", "mosaic", "affine", "mixup", "colour", "flip + convert", "collate")


class StageClock:
    """Exclusive seconds per stage of the wrapped functions, plus the calls and pixels of the decode stage."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.decodes, self.decoded_pixels = 0, 0
        self._children: list[float] = []
        self._undo: list[tuple[object, str, object]] = []

    def wrap(self, owner, name: str, stage: str) -> None:
        """Time every call of ``owner.name`` (a module function, a method or a static method) as ``stage``."""
        raw = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        fn = raw.__func__ if isinstance(raw, staticmethod) else raw

        def timed(*args, **kwargs):
            t = time.perf_counter()
            self._children.append(0.0)
            try:
                out = fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t
                inner = self._children.pop()
                self.seconds[stage] += dt - inner
                if self._children:
                    self._children[-1] += dt
            if stage == "decode" and out is not None:
                self.decodes += 1
                self.decoded_pixels += out.shape[0] * out.shape[1]
            return out

        setattr(owner, name, staticmethod(timed) if isinstance(raw, staticmethod) else timed)
        self._undo.append((owner, name, raw))

    def restore(self) -> None:
        for owner, name, raw in reversed(self._undo):
            setattr(owner, name, raw)
        self._undo.clear()


def wrap_kit(clock: StageClock) -> None:
    """Stage timers on the kit's loader (call before ``create_dataloader``: the DataLoader keeps its collate)."""
    from yolo9kit.data import augment, dataset, loader

    clock.wrap(dataset, "read_bgr", "decode")
    clock.wrap(dataset.YOLODataset, "_mosaic", "mosaic")
    clock.wrap(dataset.YOLODataset, "_single_augmented", "mosaic")
    clock.wrap(augment, "place", "affine")
    clock.wrap(augment, "affine_labels", "affine")
    clock.wrap(augment, "mixup", "mixup")
    clock.wrap(augment, "bgr_to_rgb", "colour")
    clock.wrap(augment, "flip_image", "flip + convert")
    clock.wrap(dataset.YOLODataset, "__getitem__", "flip + convert")
    clock.wrap(loader, "collate", "collate")


def wrap_official(clock: StageClock, dataloaders) -> None:
    """Stage timers on the official ``utils.dataloaders`` module (call before its ``create_dataloader``)."""
    cls = dataloaders.LoadImagesAndLabels
    clock.wrap(dataloaders.cv2, "imread", "decode")
    clock.wrap(cls, "load_image", "resize")
    clock.wrap(cls, "load_mosaic", "mosaic")
    clock.wrap(dataloaders, "random_perspective", "affine")
    clock.wrap(dataloaders, "mixup", "mixup")
    clock.wrap(dataloaders, "augment_hsv", "colour")
    clock.wrap(cls, "__getitem__", "flip + convert")
    clock.wrap(cls, "collate_fn", "collate")


def profile(make_loader, wrap, batches: int, warmup: int = 1) -> dict:
    """One pass of ``batches`` batches after ``warmup``, with stage timers on.

    Args:
        make_loader: builds the loader (called after the timers are installed; it must use 0 workers).
        wrap: installs the timers on a :class:`StageClock`.

    Returns:
        ``{"images", "ms": {stage: ms per output image}, "total_ms", "unattributed_ms", "decodes_per_image",
        "decoded_mpix_per_image"}``.
    """
    clock = StageClock()
    wrap(clock)
    try:
        it = iter(make_loader())
        for _ in range(warmup):
            next(it)
        clock.seconds.clear()
        clock.decodes = clock.decoded_pixels = 0
        n, t = 0, time.perf_counter()
        for _ in range(batches):
            n += len(next(it)[0])
        total = time.perf_counter() - t
    finally:
        clock.restore()
    ms = {s: 1e3 * clock.seconds.get(s, 0.0) / n for s in STAGES}
    return {"images": n, "ms": ms, "total_ms": 1e3 * total / n,
            "unattributed_ms": 1e3 * total / n - sum(ms.values()),
            "decodes_per_image": clock.decodes / n, "decoded_mpix_per_image": clock.decoded_pixels / n / 1e6}


def jpeg_sizes(paths) -> dict:
    """Mean file bytes and pixel size of the JPEGs (read from their headers, not decoded)."""
    from PIL import Image

    sizes, pixels = [], []
    for p in paths:
        sizes.append(p.stat().st_size)
        with Image.open(p) as im:
            pixels.append(im.size)
    w = sum(s[0] for s in pixels) / len(pixels)
    h = sum(s[1] for s in pixels) / len(pixels)
    return {"files": len(sizes), "mean_bytes": sum(sizes) / len(sizes), "mean_w": w, "mean_h": h,
            "bytes_per_pixel": sum(sizes) / sum(a * b for a, b in pixels)}


def stage_table(rows: dict[str, dict]) -> str:
    """Markdown table, one row per (loader, setting), ms per output image per stage."""
    head = ("| loader | " + " | ".join(STAGES) + " | unattributed | total | decodes per image | "
            "decoded Mpixel per image |")
    lines = [head, "|" + "---|" * (len(STAGES) + 5)]
    for name, r in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{r['ms'][s]:.2f}" for s in STAGES)
                     + f" | {r['unattributed_ms']:.2f} | {r['total_ms']:.2f} | {r['decodes_per_image']:.2f} | "
                       f"{r['decoded_mpix_per_image']:.3f} |")
    return "\n".join(lines)
