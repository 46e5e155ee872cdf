"""Opening a split: ``check`` (the report alone) and ``YOLODataset`` (official training and validation samples)."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import NamedTuple

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from yolo9kit.config.train import CACHE_MODES
from yolo9kit.data import augment as A
from yolo9kit.data.images import PAD_VALUE, cache_images, letterbox, load_resized, read_bgr, reduce_factor, resized_size
from yolo9kit.data.labels import DatasetReport, cache_path, check_command, refuse_bad_labels, scan_split
from yolo9kit.data.sources import DataConfig, load_data_config

log = logging.getLogger(__name__)


def check(data: str | Path | dict | DataConfig, split: str = "train", use_cache: bool = True,
          for_training: bool = False) -> DatasetReport:
    """Check every image and label file of ``split`` (the check any opening of the data set runs): its report.

    Args:
        data: data.yaml path, dict or DataConfig; use_cache: reuse (and write) the label cache.
        for_training: also raise the ``DataError`` that training on ``split`` would raise.
    Raises:
        DataError: the split has no image at all, or (``for_training``) it would not train.
    """
    config = load_data_config(data)
    records, report = scan_split(config, split, use_cache)
    if for_training:
        refuse_bad_labels(config, split, report, records)
    return report


class SampleKey(NamedTuple):
    """What the sampler sends to a worker: persistent workers see the state in it."""

    index: int
    epoch: int = 0
    mosaic: bool = True


def rect_batch_shapes(sizes_wh: np.ndarray, batch_size: int, imgsz: int, stride: int = 32,
                      pad: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(order of the images by h/w, (n_batches, 2) int (h, w) batch shapes): official rectangular batches."""
    ar = sizes_wh[:, 1] / sizes_wh[:, 0]
    order = ar.argsort()
    starts = np.arange(0, len(ar), batch_size)
    lo, hi = np.minimum.reduceat(ar[order], starts), np.maximum.reduceat(ar[order], starts)
    shapes = np.ones((len(starts), 2))
    shapes[hi < 1, 0] = hi[hi < 1]
    shapes[lo > 1, 1] = 1 / lo[lo > 1]
    return order, (np.ceil(shapes * imgsz / stride + pad).astype(int) * stride)


class YOLODataset(Dataset):
    """A checked YOLO-format split with official-semantics augmentation (docs/data.md).

    Args:
        imgsz: long side of each loaded image; hyp: dict of official keys or :class:`Hyp` (hyp.scratch-high).
        rect, batch_size, stride, pad: rectangular batches (aspect-ratio order, mosaic off), ``pad`` strides wide.
        cache: "ram", "auto" (RAM within ``cache_budget`` of it), "disk" (memory-mapped) or None (docs/data.md).
        min_items: drop images with fewer boxes; single_cls: every class becomes 0; seed: of the augmentation.
        allow_bad_labels: open a ``train`` split that would raise a ``DataError``.
    Attributes:
        im_files, labels (per image (n, 5) ``class cx cy w h``), shapes ((N, 2) width, height), report,
        mosaic (``set_mosaic``), colour_on_device (samples carry their HSV gains, set by create_dataloader).
    """

    def __init__(self, data: str | Path | dict | DataConfig, split: str = "train", imgsz: int = 640,
                 augment: bool = False, hyp: dict | A.Hyp | None = None, rect: bool = False, batch_size: int = 16,
                 stride: int = 32, pad: float = 0.0, cache: str | None = None, min_items: int = 0,
                 single_cls: bool = False, seed: int = 0, cache_budget: float = 0.5, allow_bad_labels: bool = False):
        if cache not in CACHE_MODES:
            raise ValueError(f"cache must be one of {CACHE_MODES} (None: no cache), got {cache!r}")
        self.config = load_data_config(data)
        self.split, self.image_size, self.augment, self.rect, self.seed = split, imgsz, augment, rect, seed
        self.hyp = A.Hyp.from_dict(hyp)
        self.names, self.nc = list(self.config.names), self.config.nc
        records, self.report = scan_split(self.config, split, use_cache=True)
        if any(p.severity != "info" for p in self.report.problems):
            log.warning("%s: `%s` lists them (in Python: the dataset's .report)", self.report.summary(),
                        check_command(self.config, split))
        if split == "train" and not allow_bad_labels:
            refuse_bad_labels(self.config, split, self.report, records)
        records = [r for r in records if r.usable and len(r.labels) >= min_items]
        if not records:
            raise ValueError(f"no usable image in the {split} split of {self.config.yaml_file or self.config.path}: "
                             f"{self.report.summary()}; `{check_command(self.config, split)}` gives the reasons")
        self.batch_shapes = None
        if rect:
            order, self.batch_shapes = rect_batch_shapes(np.array([r.size for r in records]), batch_size, imgsz,
                                                         stride, pad)
            self.batch_index = np.arange(len(order)) // batch_size
            records = [records[i] for i in order]
        self.im_files = [r.im_file for r in records]
        self.labels = [r.labels.copy() for r in records]
        self.segments = [r.segments for r in records]  # per image: one (k, 2) polygon per row, or []
        if single_cls:
            for lb in self.labels:
                lb[:, 0] = 0
        self.shapes = np.array([r.size for r in records], dtype=np.int64)
        self.nominal = np.array([resized_size(w, h, imgsz) for w, h in self.shapes], np.int64)  # (w, h)
        self.mosaic = augment and not rect and self.hyp.mosaic > 0
        self.colour_on_device = False
        self.images = None if cache is None else cache_images(
            self.im_files, [tuple(int(v) for v in s) for s in self.shapes], imgsz, augment, cache, cache_budget,
            cache_path(self.config.sources[split], [r.lb_file for r in records]))

    def __len__(self) -> int:
        return len(self.im_files)

    def load_image(self, i: int) -> np.ndarray:
        """Official load_image: BGR, long side = image_size."""
        if self.images is not None:
            return self.images[i]
        return load_resized(self.im_files[i], self.image_size, self.augment, tuple(int(v) for v in self.shapes[i]))

    def _source(self, i: int, zoom: float) -> tuple[np.ndarray, np.ndarray]:
        """An image to warp from and its matrix to the nominal resized image (docs/data.md, "Why it is fast")."""
        w, h = self.nominal[i]
        if self.images is not None:
            return self.images[i], np.eye(3)
        src = read_bgr(self.im_files[i], reduce_factor(zoom * w / self.shapes[i][0]))
        return src, A.resize_matrix(src.shape[1], src.shape[0], w, h)

    def __getitem__(self, key: int | SampleKey):
        key = key if isinstance(key, SampleKey) else SampleKey(int(key), 0, self.mosaic)
        index = key.index
        if not self.augment:  # the official validation path: load_image, then letterbox
            image = self.load_image(index)
            h, w = image.shape[:2]
            w0, h0 = (int(v) for v in self.shapes[index])
            image, ratio, pad = letterbox(image, self._target_shape(index), auto=False, scaleup=False)
            labels = A.cxcywh_norm_to_xyxy(self.labels[index], ratio[0] * w, ratio[1] * h, pad[0], pad[1])
            return self._output(A.bgr_to_rgb(image, None), labels, index, ((h0, w0), ((h / h0, w / w0), pad)))
        rng = np.random.default_rng([self.seed, key.epoch, index])
        if key.mosaic and not self.rect and rng.random() < self.hyp.mosaic:
            image, labels = self._mosaic(index, rng)
            if rng.random() < self.hyp.mixup:
                image2, labels2 = self._mosaic(int(rng.integers(len(self))), rng)
                image, labels = A.mixup(image, labels, image2, labels2, rng)
            shapes = None
        else:
            image, labels, shapes = self._single_augmented(index, rng)
        gains = A.hsv_gains(rng, self.hyp)
        flip_ud, flip_lr = rng.random() < self.hyp.flipud, rng.random() < self.hyp.fliplr
        h, w = image.shape[:2]
        image = A.flip_image(A.bgr_to_rgb(image, None if self.colour_on_device else gains), flip_lr, flip_ud)
        if flip_lr:
            labels[:, [1, 3]] = w - labels[:, [3, 1]]
        if flip_ud:
            labels[:, [2, 4]] = h - labels[:, [4, 2]]
        if self.colour_on_device:  # the gains travel with the sample; the loader applies them on its device
            return *self._output(image, labels, index, shapes), torch.as_tensor(
                np.ones(3) if gains is None else gains, dtype=torch.float32)
        return self._output(image, labels, index, shapes)

    def _output(self, image_rgb: np.ndarray, labels_xyxy: np.ndarray, index: int, shapes):
        h, w = image_rgb.shape[:2]
        labels = A.xyxy_to_cxcywh_norm(labels_xyxy, w, h) if len(labels_xyxy) else np.zeros((0, 5), np.float32)
        targets = torch.cat([torch.zeros(len(labels), 1), torch.from_numpy(labels)], 1)  # (n, 6): image, class, box
        image = torch.from_numpy(image_rgb).permute(2, 0, 1)  # (3, H, W) view of HWC memory: channels_last
        return image, targets, self.im_files[index], shapes

    def _target_shape(self, index: int) -> tuple[int, int]:
        h, w = self.batch_shapes[self.batch_index[index]] if self.rect else (self.image_size, self.image_size)
        return int(h), int(w)

    def _single_augmented(self, index: int, rng: np.random.Generator):
        """Mosaic off: letterbox, then the random affine, as one warp."""
        H, W = self._target_shape(index)
        w, h = (int(v) for v in self.nominal[index])
        w0, h0 = (int(v) for v in self.shapes[index])
        r = min(H / h, W / w)
        unpad_w, unpad_h = int(round(w * r)), int(round(h * r))
        dw, dh = (W - unpad_w) / 2, (H - unpad_h) / 2
        left, top = int(round(dw - 0.1)), int(round(dh - 0.1))
        M, zoom = A.random_affine_matrix(rng, self.hyp, (W, H), (W, H))
        src, to_nominal = self._source(index, zoom * r)
        place = A.translation(left, top) @ A.resize_matrix(w, h, unpad_w, unpad_h) @ to_nominal
        image = np.full((H, W, 3), PAD_VALUE, np.uint8)
        A.place(image, src, M @ place, self.hyp.perspective != 0)
        labels = A.cxcywh_norm_to_xyxy(self.labels[index], r * w, r * h, dw, dh)
        labels = A.affine_labels(labels, M, zoom, W, H)
        return image, labels, ((h0, w0), ((h / h0, w / w0), (dw, dh)))

    def _render(self, out: np.ndarray, tiles, G: np.ndarray, zoom: float) -> None:
        """Draw the visible mosaic tiles into ``out`` through G (canvas pixels -> output pixels)."""
        H, W = out.shape[:2]
        for i, x1a, y1a, x2a, y2a, padw, padh in tiles:
            tile_w, tile_h = x2a - x1a, y2a - y1a
            xy = A.mapped_corners(G @ A.translation(x1a, y1a), 0, 0, tile_w, tile_h)  # the tile in the output
            if min(tile_w, tile_h) <= 0 or (xy.max(0) <= 0).any() or (xy.min(0) >= (W, H)).any():
                continue  # this tile lands outside the output: never decode it
            src, to_nominal = self._source(i, zoom)
            sx, sy = to_nominal[0, 0], to_nominal[1, 1]  # the source cropped to the part of the tile on the canvas
            inv = np.array([[1 / sx, 0, -to_nominal[0, 2] / sx], [0, 1 / sy, -to_nominal[1, 2] / sy], [0, 0, 1.0]])
            x1b, y1b = x1a - padw, y1a - padh
            (sx0, sy0), (sx1, sy1) = ((inv @ [x1b - 0.5, y1b - 0.5, 1])[:2],
                                      (inv @ [x1b + tile_w - 0.5, y1b + tile_h - 0.5, 1])[:2])
            cx0, cy0 = max(int(math.floor(sx0 + 0.5)), 0), max(int(math.floor(sy0 + 0.5)), 0)
            cx1 = min(int(math.ceil(sx1 - 0.5)) + 1, src.shape[1])
            cy1 = min(int(math.ceil(sy1 - 0.5)) + 1, src.shape[0])
            A.place(out, src[cy0:cy1, cx0:cx1], G @ A.translation(padw, padh) @ to_nominal @ A.translation(cx0, cy0),
                    self.hyp.perspective != 0)

    def _mosaic(self, index: int, rng: np.random.Generator):
        """Official load_mosaic (4 images, copy-paste, random affine), drawn straight into the s x s output."""
        s = self.image_size
        xc, yc = (int(v) for v in rng.uniform(s // 2, 2 * s - s // 2, 2))
        indices = [index, *rng.integers(0, len(self), 3).tolist()]
        rng.shuffle(indices)
        tiles, labels, polygons = [], [], []  # tile: (image, x1a, y1a, x2a, y2a, padw, padh) in canvas pixels
        for k, i in enumerate(indices):
            w, h = (int(v) for v in self.nominal[i])
            x1a, x2a = (max(xc - w, 0), xc) if k in (0, 2) else (xc, min(xc + w, s * 2))
            y1a, y2a = (max(yc - h, 0), yc) if k in (0, 1) else (yc, min(yc + h, s * 2))
            padw, padh = x1a - (w - (x2a - x1a) if k in (0, 2) else 0), y1a - (h - (y2a - y1a) if k in (0, 1) else 0)
            tiles.append((i, x1a, y1a, x2a, y2a, padw, padh))
            wh = self.nominal[i]  # numpy ints: the boxes in float64
            labels.append(A.cxcywh_norm_to_xyxy(self.labels[i], *wh, padw, padh))
            polygons += [np.clip(p * wh + (padw, padh), 0, 2 * s) for p in self.segments[i]] or \
                [None] * len(self.labels[i])
        labels = np.concatenate(labels, 0)
        np.clip(labels[:, 1:], 0, 2 * s, out=labels[:, 1:])
        labels, polygons, pasted = A.copy_paste(labels, polygons, self.hyp.copy_paste, rng, 2 * s)
        M, zoom = A.random_affine_matrix(rng, self.hyp, (2 * s, 2 * s), (s, s))
        out = np.full((s, s, 3), PAD_VALUE, np.uint8)
        self._render(out, tiles, M, zoom)
        if pasted:  # pasted regions show the left-right mirrored canvas
            mirrored = np.full_like(out, PAD_VALUE)
            self._render(mirrored, tiles, M @ np.array([[-1, 0, 2 * s - 1], [0, 1, 0], [0, 0, 1.0]]), zoom)
            mask = np.zeros((s, s), np.uint8)
            for poly in pasted:
                xy = np.c_[poly, np.ones(len(poly))] @ M.T
                cv2.fillPoly(mask, [np.round(xy[:, :2] / xy[:, 2:3]).astype(np.int32)], 1)
            out[mask.astype(bool)] = mirrored[mask.astype(bool)]
        return out, A.affine_labels(labels, M, zoom, s, s, polygons)
