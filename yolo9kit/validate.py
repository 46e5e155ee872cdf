"""Validation as the official ``val_dual.py`` with an optional COCOeval (docs/validation.md), and the model
plumbing ``predict`` shares."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from yolo9kit import metrics
from yolo9kit.boxes import cxcywh_to_xyxy
from yolo9kit.config import VAL_NMS, NMSConfig
from yolo9kit.data import create_dataloader, load_data_config, preprocess_images
from yolo9kit.detections import SPEED_COLUMNS, non_max_suppression, scale_boxes, speed_line
from yolo9kit.env import resolve_device
from yolo9kit.figure import plot_validation, save_figure
from yolo9kit.files import write_text_atomically
from yolo9kit.models import load_model
from yolo9kit.models.deploy import inference_layout, prepare_model, resolve_half, select_head

LOGGER = logging.getLogger(__name__)


def prepare(model: torch.nn.Module, device: torch.device, dtype: torch.dtype, nhwc: bool = True, **kwargs):
    """(model to run, input dtype, channels_last input): ``prepare_model``'s, channels_last where it pays."""
    prepared = prepare_model(model, device, dtype, **kwargs)
    nhwc = nhwc and inference_layout(prepared, device, own_copy=prepared is not model) is torch.channels_last
    if nhwc and prepared is not model:
        prepared = prepared.to(memory_format=torch.channels_last)
    return prepared, dtype, nhwc


def detect_batch(forward, images: torch.Tensor, device, dtype, nhwc: bool, head: str, nms: NMSConfig,
                 multi_label: bool = False):
    """(input batch, detections per image, (preprocess, inference, NMS) seconds) of uint8 ``images``, as official."""
    def clock() -> float:  # time.perf_counter() once the kernels queued on the device are done
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    t0 = clock()
    x = preprocess_images(images, device, dtype, channels_last=nhwc)
    t1 = clock()
    prediction = select_head(forward(x), head)
    t2 = clock()
    detections = non_max_suppression(prediction, nms.conf, nms.iou, nms.classes, nms.agnostic, multi_label=multi_label,
                                     max_det=nms.max_det)
    return x, detections, (t1 - t0, t2 - t1, clock() - t2)


@dataclass
class ValResult:
    """Metrics of one validation run (official method), and what is needed to look into them."""

    precision: float  # mean over labelled classes at the max-mean-F1 confidence (official mp)
    recall: float  # the same for recall (official mr)
    map50: float
    map50_95: float
    fitness: float  # 0.1 * map50 + 0.9 * map50_95: picks best.pt
    per_class: Any  # DataFrame (class, name, images containing it, instances, P, R, mAP50, mAP50-95)
    speed: dict[str, float]  # ms per image for preprocess / inference / nms
    seen: int  # images evaluated
    instances: int  # labels in them
    confusion_matrix: metrics.ConfusionMatrix
    ap_result: metrics.APResult | None = None  # the curves; None without any true positive
    figures: dict[str, Any] = field(default_factory=dict)  # file name -> matplotlib figure (plots=True)
    coco: dict[str, float] | None = None  # the 12 COCOeval numbers (coco=True)
    coco_predictions: list[dict] | None = field(default=None, repr=False)  # its records
    head: str = "main"
    input_shape: tuple[int, ...] = ()  # (batch, 3, imgsz, imgsz) of the Speed line
    names: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """The official printout: header, the ``all`` row, one row per class (when nc > 1)."""
        row = "%22s" + "%11i" * 2 + "%11.3g" * 4
        lines = [("%22s" + "%11s" * 6) % ("Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95"),
                 row % ("all", self.seen, self.instances, self.precision, self.recall, self.map50, self.map50_95)]
        if len(self.names) > 1:
            lines += [row % values[1:] for values in self.per_class.itertuples(index=False, name=None)]
        return "\n".join(lines)

    def __str__(self) -> str:
        return f"{self.summary()}\n{self.speed_line()}"

    def speed_line(self) -> str:
        """The official Speed line: ms per image, at shape (batch, 3, imgsz, imgsz)."""
        return speed_line([self.speed[k] for k in SPEED_COLUMNS], self.input_shape)

    def to_dict(self) -> dict[str, float]:
        """The headline numbers (plus COCOeval's, prefixed ``coco/``) as plain floats."""
        return {"P": self.precision, "R": self.recall, "mAP50": self.map50, "mAP50-95": self.map50_95,
                "fitness": self.fitness} | {f"coco/{k}": v for k, v in (self.coco or {}).items()}


def _loader(data, dataloader, split: str = "val", imgsz: int = 640, batch_size: int = 32,
            workers: int | None = None, single_cls: bool = False, **_):
    if dataloader is not None:
        return dataloader
    if data is None:
        raise ValueError("validation needs data= (a data.yaml path or dict) or dataloader=")
    # as val_dual.py: rect batches padded by half a stride, no augmentation; labels that refuse to train are scored
    return create_dataloader(data, split, imgsz=imgsz, batch_size=batch_size, augment=False, rect=True,
                             shuffle=False, pad=0.5, workers=workers, single_cls=single_cls, allow_bad_labels=True)


@torch.no_grad()
def evaluate(model, data=None, *, split: str = "val", imgsz: int = 640, batch_size: int = 32,
             nms: NMSConfig | None = None, head: str = "main", dataloader=None, half: str | bool = "auto",
             device: str | torch.device | None = None, plots: bool = False, save_dir: str | Path | None = None,
             coco: bool = False, coco_gt: str | Path | dict | None = None, single_cls: bool = False,
             workers: int | None = None, progress_bar: bool = True) -> ValResult:
    """Validate a detector on a data split, as the official ``val_dual.py``.

    Args:
        model: DetectionModel or what :func:`~yolo9kit.models.load_model` takes; never moved or cast (a copy runs).
        data: data.yaml path or dict (optional with ``dataloader``, except to find COCO's annotation file).
        split, imgsz, batch_size, workers, single_cls: the loader's settings (single_cls: every class as one).
        nms: unset fields take ``VAL_NMS``; head: "main" (as val_dual.py) or "aux".
        dataloader: a loader of (images uint8 (B,3,H,W), targets (N,6), paths, shapes) to use instead.
        half: "auto" (FP16 on CUDA, FP32 on the CPU), True (FP16), False (val_dual.py's FP32 numbers) or "bf16".
        device: None: the first CUDA device when there is one, else the CPU.
        plots: confusion matrix, PR, F1, P and R figures in ``.figures``, written to ``save_dir`` when given.
        coco: also score with pycocotools (``.coco``) against ``coco_gt`` (JSON path or dict; None: COCO's own
            under the data path, else converted from the labels), its JSON files written to ``save_dir``.

    Raises:
        ValueError: neither ``data`` nor ``dataloader``; another head; a model whose classes differ from the data's.
    """
    if head not in ("main", "aux"):
        raise ValueError(f"head must be 'main' or 'aux', got {head!r}")
    model = load_model(model)
    device = resolve_device(device)
    dtype = resolve_half(half, device)
    dataloader = _loader(data, dataloader, split, imgsz, batch_size, workers, single_cls)
    config = load_data_config(data) if data is not None else None
    names = getattr(getattr(dataloader, "dataset", None), "names", None) or (config.names if config else None)
    if names is None:
        raise ValueError("cannot tell the data's classes: pass data= (a data.yaml) or a loader whose dataset "
                         "has .names")
    names = list(names.values()) if isinstance(names, dict) else list(names)
    if single_cls and len(names) != 1:
        names = ["item"]  # every class counted as one, as the official --single-cls
    if model.nc != len(names):
        raise ValueError(f"the model predicts {model.nc} classes but the data {data or 'loader'} has {len(names)} "
                         f"({names[:5]}{'...' if len(names) > 5 else ''}); train or load a model for this data, "
                         "or pass matching data")
    coco_val = coco and config is not None and any(metrics.is_coco_val(s) for s in config.sources.get(split, []))
    nms = (nms or NMSConfig()).filled(VAL_NMS)
    nms = nms.replace(agnostic=nms.agnostic or single_cls)
    state = _Validation(names, nms, head, single_cls, coco, metrics.COCO80_TO_COCO91 if coco_val else None, imgsz,
                        metrics.ConfusionMatrix(len(names)))
    was_training = model.training
    try:
        run_model, dtype, nhwc = prepare(model, device, dtype)
        _run_batches(run_model, dtype, nhwc, dataloader, device, state, progress_bar)
    finally:
        model.train(was_training)
    return _finish(state, plots, Path(save_dir) if save_dir is not None else None, coco_gt, config)


@dataclass
class _Validation:
    """The settings of one ``evaluate`` call and what it gathers over the batches."""

    names: list[str]
    nms: NMSConfig
    head: str
    single_cls: bool
    coco: bool
    class_map: list[int] | None
    imgsz: int
    confusion: metrics.ConfusionMatrix
    stats: list = field(default_factory=list)  # (correct, conf, pred_cls, target_cls) per image
    times: np.ndarray = field(default_factory=lambda: np.zeros(3))
    seen: int = 0
    input_shape: tuple[int, ...] = ()  # (batch, 3, imgsz, imgsz) as the official Speed line
    records: list = field(default_factory=list)  # COCO result records
    gt_images: list = field(default_factory=list)  # (path, (h0, w0), labels) for COCO ground truth


def _run_batches(model, dtype, nhwc: bool, loader, device, state: _Validation, progress_bar: bool) -> None:
    """Match each image's detections to its labels and add its statistics (val_dual.py's per-image step)."""
    for images, targets, paths, shapes in tqdm(loader, desc=f"validate ({state.head} head)",
                                               disable=not progress_bar, leave=False):
        x, detections, times = detect_batch(model, images, device, dtype, nhwc, state.head, state.nms, True)
        batch, _, height, width = x.shape
        state.input_shape = state.input_shape or (batch, 3, state.imgsz, state.imgsz)
        state.times += times
        # boxes to input pixels; a new tensor, the loader's batch stays untouched
        targets = targets.to(device) * torch.tensor((1, 1, width, height, width, height), device=device)
        for si, pred in enumerate(detections):
            state.seen += 1
            labels, (original_hw, ratio_pad) = targets[targets[:, 0] == si, 1:], shapes[si]
            boxes = scale_boxes((height, width), cxcywh_to_xyxy(labels[:, 1:5]), original_hw, ratio_pad)
            labels_xyxy = torch.cat((labels[:, 0:1], boxes), 1)
            if state.coco:
                state.gt_images.append((paths[si], tuple(original_hw), labels_xyxy.cpu().numpy()))
            if not (pred.shape[0] or labels.shape[0]):
                continue
            pred = pred.float()
            if state.single_cls:
                pred[:, 5] = 0
            pred_original = pred.clone()
            scale_boxes((height, width), pred_original[:, :4], original_hw, ratio_pad)
            # without labels: no true positive, and the confusion matrix counts nothing (as the official code)
            state.confusion.process_batch(pred_original, labels_xyxy)
            correct = metrics.match_predictions(pred_original, labels_xyxy).cpu()
            state.stats.append((correct, pred[:, 4].cpu(), pred[:, 5].cpu(), labels[:, 0].cpu()))
            if state.coco:
                state.records += metrics.coco_predictions(pred_original, paths[si], state.class_map)


def _finish(state: _Validation, plots: bool, save_dir: Path | None, coco_gt, config) -> ValResult:
    tp, conf, pred_cls, target_cls = ([torch.cat(x, 0).numpy() for x in zip(*state.stats)] if state.stats
                                      else [np.zeros((0, 10))] * 4)
    result = metrics.ap_per_class(tp, conf, pred_cls, target_cls) if len(tp) and tp.any() else None
    mp, mr, map50, map50_95 = (0.0,) * 4 if result is None else (
        float(result.p.mean()), float(result.r.mean()), float(result.ap[:, 0].mean()), float(result.ap.mean(1).mean()))
    if len(target_cls) == 0:
        LOGGER.warning("no labels found in the validation set: metrics cannot be computed and are 0")
    names, images_per_class = state.names, np.zeros(len(state.names), dtype=int)
    for *_, labels_cls in state.stats:
        images_per_class[np.unique(labels_cls.numpy().astype(int))] += 1
    counts = np.bincount(target_cls.astype(int), minlength=len(names))
    if result is None:  # no true positive at all: every labelled class scores 0 (official prints no rows)
        rows = [(c, 0.0, 0.0, 0.0, 0.0) for c in np.flatnonzero(counts)]
    else:
        rows = [(c, result.p[i], result.r[i], result.ap[i, 0], result.ap[i].mean())
                for i, c in enumerate(result.classes)]
    per_class = pd.DataFrame([(int(c), names[c], int(images_per_class[c]), int(counts[c]), *scores)
                              for c, *scores in rows],
                             columns=["class", "name", "images", "instances", "P", "R", "mAP50", "mAP50-95"])
    speed = dict(zip(SPEED_COLUMNS, (state.times / max(state.seen, 1) * 1e3).tolist()))
    out = ValResult(mp, mr, map50, map50_95, metrics.fitness(map50, map50_95), per_class, speed, state.seen,
                    len(target_cls), state.confusion, result, head=state.head, input_shape=state.input_shape,
                    names=names)
    if plots:
        out.figures = plot_validation(state.confusion, result, state.names)
        for name, figure in out.figures.items() if save_dir is not None else ():
            save_figure(figure, save_dir / name, 150)
    if not state.coco:
        return out
    out.coco_predictions = state.records
    if save_dir is not None:
        write_text_atomically(save_dir / "predictions.json", json.dumps(state.records))
        LOGGER.info("COCO predictions written to %s", save_dir / "predictions.json")
    if coco_gt is None and state.class_map is not None and config is not None:
        candidate = config.path / "annotations" / "instances_val2017.json"
        coco_gt = candidate if candidate.is_file() else None
    if coco_gt is None:
        coco_gt = metrics.coco_ground_truth(state.gt_images, state.names, state.class_map)
        if save_dir is not None:
            write_text_atomically(save_dir / "ground_truth.json", json.dumps(coco_gt))
    try:
        out.coco = metrics.run_cocoeval(coco_gt, state.records,
                                        [metrics.image_id_from_path(p) for p, *_ in state.gt_images])
    except Exception as e:  # a foreign ground-truth file must not cost the official-method results
        LOGGER.warning("COCOeval failed (%s: %s); the official-method metrics are unaffected", type(e).__name__, e)
    return out


def compare_heads(model, data=None, dataloader=None, **kwargs):
    """A DataFrame indexed by head ("main", "aux") of P, R, mAP50, mAP50-95 and fitness, each head of a dual-head
    (YOLOv9) model evaluated on the same batches; the arguments as :func:`evaluate`. ValueError: a model with one
    head; neither ``data`` nor ``dataloader``."""
    model = load_model(model)
    if not getattr(model, "is_dual", False):
        raise ValueError("compare_heads needs a dual-head YOLOv9 model; GELAN / converted models have one head")
    dataloader = _loader(data, dataloader, **kwargs)
    rows = {head: evaluate(model, data, dataloader=dataloader, head=head, **kwargs).to_dict()
            for head in ("main", "aux")}
    return pd.DataFrame.from_dict(rows, orient="index")
