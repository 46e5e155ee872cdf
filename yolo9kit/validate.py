"""Validation as the official ``val_dual.py``: rectangular batches, multi-label NMS, 10-threshold
matching, 101-point AP; plus an optional COCOeval of the same predictions.

``evaluate(model, "data.yaml")`` returns a :class:`ValResult`; ``compare_heads`` evaluates the main
and auxiliary heads of a YOLOv9 model on the same batches. Prediction on image files lives in
:mod:`yolo9kit.prediction`, which builds on this layer, not the other way round.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from yolo9kit.boxes import cxcywh_to_xyxy
from yolo9kit.config import VAL_NMS, NMSConfig
from yolo9kit.detections import speed_line
from yolo9kit.env import resolve_device
from yolo9kit.figure import save_figure
from yolo9kit.files import write_text_atomically
from yolo9kit.metrics import IOU_THRESHOLDS, APResult, ConfusionMatrix, ap_per_class, fitness, match_predictions
from yolo9kit.models import load_model
from yolo9kit.models.deploy import inference_layout, prepare_model, resolve_half, select_head
from yolo9kit.ops import non_max_suppression, scale_boxes

LOGGER = logging.getLogger(__name__)

__all__ = ["ValResult", "compare_heads", "evaluate"]


@dataclass
class ValResult:
    """Metrics of one validation run (official method), and what is needed to look into them.

    Attributes:
        precision, recall: mean precision / recall over classes with labels, at the max-mean-F1 confidence
            (the official mp, mr).
        map50, map50_95: mean AP at IoU 0.5 and averaged over IoU 0.50:0.95 (the official map50, map).
        fitness: 0.1 * map50 + 0.9 * map50_95 (the score used to pick best.pt).
        per_class: DataFrame (class, name, images, instances, P, R, mAP50, mAP50-95), one row per class
            with labels; ``images`` = images containing the class.
        speed: ms per image for preprocess / inference / nms (means over the images seen).
        maps: (nc,) mAP50-95 per class id; classes without labels get ``map50_95`` (official convention).
        seen, instances: images evaluated and labels in them.
        confusion_matrix: :class:`~yolo9kit.metrics.ConfusionMatrix` (score > 0.25, IoU > 0.45).
        ap_result: the full :class:`~yolo9kit.metrics.APResult` (curves), None without any true positive.
        figures: name -> matplotlib figure (with ``plots=True``). coco: the 12 COCOeval numbers (``coco=True``).
        head, input_shape: the head evaluated and the (batch, 3, imgsz, imgsz) shape of the Speed line.
    """

    precision: float
    recall: float
    map50: float
    map50_95: float
    fitness: float
    per_class: Any
    speed: dict[str, float]
    maps: np.ndarray
    seen: int
    instances: int
    confusion_matrix: ConfusionMatrix
    ap_result: APResult | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    coco: dict[str, float] | None = None
    coco_predictions: list[dict] | None = field(default=None, repr=False)
    head: str = "main"
    input_shape: tuple[int, ...] = ()
    names: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """The official printout: header, the ``all`` row, one row per class (when nc > 1)."""
        lines = [("%22s" + "%11s" * 6) % ("Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95"),
                 ("%22s" + "%11i" * 2 + "%11.3g" * 4) % ("all", self.seen, self.instances, self.precision, self.recall,
                                                         self.map50, self.map50_95)]
        if len(self.names) > 1:
            for row in self.per_class.itertuples(index=False, name=None):  # class, name, images, ... mAP50-95
                lines.append(("%22s" + "%11i" * 2 + "%11.3g" * 4) % row[1:])
        return "\n".join(lines)

    def __str__(self) -> str:
        return f"{self.summary()}\n{self.speed_line()}"

    def speed_line(self) -> str:
        """The official Speed line: ms per image, at shape (batch, 3, imgsz, imgsz)."""
        return speed_line([self.speed[k] for k in ("preprocess_ms", "inference_ms", "nms_ms")], self.input_shape)

    def to_dict(self) -> dict[str, float]:
        """The headline numbers (plus COCOeval's, prefixed ``coco/``) as plain floats."""
        out = {"P": self.precision, "R": self.recall, "mAP50": self.map50, "mAP50-95": self.map50_95,
               "fitness": self.fitness}
        out.update({f"coco/{k}": v for k, v in (self.coco or {}).items()})
        return out


def _build_loader(data, split: str, imgsz: int, batch_size: int, workers: int | None, single_cls: bool = False):
    from yolo9kit.data import create_dataloader

    # rectangular batches padded by half a stride, no augmentation, no shuffle: as val_dual.py. Validation
    # scores what it can read, also of a train split whose labels would refuse to train (allow_bad_labels).
    return create_dataloader(data, split, imgsz=imgsz, batch_size=batch_size, augment=False, rect=True,
                             shuffle=False, pad=0.5, workers=workers, single_cls=single_cls, allow_bad_labels=True)


def _data_names(data, loader) -> tuple[list[str], Any]:
    config = None
    if data is not None:
        from yolo9kit.data import load_data_config

        config = load_data_config(data)
    dataset = getattr(loader, "dataset", None)
    names = getattr(dataset, "names", None) or (config.names if config is not None else None)
    if names is None:
        raise ValueError("cannot tell the data's classes: pass data= (a data.yaml) or a loader whose dataset "
                         "has .names")
    return list(names.values()) if isinstance(names, dict) else list(names), config


@torch.no_grad()
def evaluate(model, data=None, *, split: str = "val", imgsz: int = 640, batch_size: int = 32,
             nms: NMSConfig | None = None, head: str = "main", dataloader=None, half: str | bool = "auto",
             device: str | torch.device | None = None, plots: bool = False, save_dir: str | Path | None = None,
             coco: bool = False, coco_gt: str | Path | dict | None = None, single_cls: bool = False,
             workers: int | None = None, progress_bar: bool = True) -> ValResult:
    """Validate a detector on a data split, as the official ``val_dual.py``.

    Rectangular batches (the data layer's val loader, pad 0.5); NMS with ``multi_label`` (one row
    per class above ``conf``), ``iou`` 0.7, ``max_det`` 300; predictions and labels scaled to the
    original images; matching at IoU 0.50:0.95 (:func:`~yolo9kit.metrics.match_predictions`);
    AP per class with 101-point interpolation (:func:`~yolo9kit.metrics.ap_per_class`).

    The caller's model is never moved or cast: when ``device`` or ``half`` differ from its own, a copy
    is evaluated (:func:`~yolo9kit.models.deploy.prepare_model`); its train/eval mode is restored.

    Args:
        model: DetectionModel (or a checkpoint path / model name, see :func:`~yolo9kit.models.load_model`).
        data: data.yaml path or dict (not needed when ``dataloader`` is given, except for COCO detection).
        split: "val", "test" or "train". imgsz, batch_size, workers: loader settings.
        nms: an :class:`~yolo9kit.config.NMSConfig`; its unset fields (and None) take
            :data:`~yolo9kit.config.VAL_NMS`: conf 0.001, iou 0.7, max_det 300, as val_dual.py. ``classes``
            keeps only those classes' detections (the others then score 0); ``single_cls`` implies ``agnostic``.
        head: "main" (default, as val_dual.py) or "aux".
        dataloader: reuse a loader yielding (images uint8 (B,3,H,W), targets (N,6), paths, shapes).
        half: FP16 forward: "auto" on CUDA, not on the CPU; True or False (the trainer passes its AMP
            setting). The official standalone ``val_dual.py`` runs FP32 unless ``--half``: pass False to
            reproduce its numbers exactly (FP16 rounding can move them slightly).
        device: None: the first CUDA device when there is one, else the CPU (not the model's device).
        plots: build the confusion matrix, PR, F1, P and R figures (``.figures``), saved as PNG in
            ``save_dir`` when given.
        coco: also write COCO-format predictions (``save_dir/predictions.json``) and score them with
            pycocotools against ``coco_gt`` (JSON path or dict); without it COCO data uses
            ``<data path>/annotations/instances_val2017.json`` and other data is converted from the labels.
        single_cls: treat every class as one (class-agnostic NMS, predicted classes set to 0).
        progress_bar: a tqdm bar over the batches.

    Raises:
        ValueError: the model's number of classes differs from the data's.
    """
    if head not in ("main", "aux"):
        raise ValueError(f"head must be 'main' or 'aux', got {head!r}")
    nms = (nms or NMSConfig()).filled(VAL_NMS)
    model = load_model(model)
    device = resolve_device(device)
    half = resolve_half(half, device)
    if dataloader is None:
        if data is None:
            raise ValueError("evaluate needs data= (a data.yaml path or dict) or dataloader=")
        dataloader = _build_loader(data, split, imgsz, batch_size, workers, single_cls)
    names, config = _data_names(data, dataloader)
    if single_cls and len(names) != 1:
        names = ["item"]  # every class counted as one, as the official --single-cls
    if model.nc != len(names):
        raise ValueError(f"the model predicts {model.nc} classes but the data {data or 'loader'} has {len(names)} "
                         f"({names[:5]}{'...' if len(names) > 5 else ''}); train or load a model for this data, "
                         "or pass matching data")
    class_map = None
    if coco and config is not None:
        from yolo9kit.coco import COCO80_TO_COCO91, is_coco_val

        if any(is_coco_val(s) for s in config.sources.get(split, [])):
            class_map = COCO80_TO_COCO91
    was_training, caller_model = model.training, model
    model = prepare_model(model, device, half)
    layout = inference_layout(model, device, own_copy=model is not caller_model)
    if layout is torch.channels_last and model is not caller_model:
        model = model.to(memory_format=layout)
    state = _Accumulator(len(names), coco, class_map, imgsz=imgsz)
    try:
        _run_batches(model, dataloader, device, half, head, nms, single_cls, state, progress_bar, layout)
    finally:
        caller_model.train(was_training)
    return _finish(state, names, head, plots, save_dir, coco, coco_gt, config, class_map)


@dataclass
class _Accumulator:
    nc: int
    coco: bool
    class_map: list[int] | None
    stats: list = field(default_factory=list)
    times: np.ndarray = field(default_factory=lambda: np.zeros(3))
    imgsz: int = 640
    seen: int = 0
    input_shape: tuple[int, ...] = ()  # (batch, 3, imgsz, imgsz) as the official Speed line
    records: list = field(default_factory=list)
    gt_images: list = field(default_factory=list)

    def __post_init__(self):
        self.confusion = ConfusionMatrix(self.nc)


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # wait for queued kernels so the stage timers are honest
    return time.perf_counter()


def _run_batches(model, loader, device, half, head, nms: NMSConfig, single_cls, state, progress_bar,
                 layout=torch.contiguous_format) -> None:
    from tqdm.auto import tqdm

    for images, targets, paths, shapes in tqdm(loader, desc=f"validate ({head} head)", disable=not progress_bar,
                                               leave=False):
        t0 = _sync(device)
        images = images.to(device, non_blocking=True)
        images = ((images.half() if half else images.float()) / 255).contiguous(memory_format=layout)
        targets = targets.to(device)
        batch, _, height, width = images.shape
        state.input_shape = state.input_shape or (batch, 3, state.imgsz, state.imgsz)
        t1 = _sync(device)
        prediction = select_head(model(images), head)
        t2 = _sync(device)
        scale = torch.tensor((1, 1, width, height, width, height), device=device)
        targets = targets * scale  # boxes to input pixels; a new tensor, the loader's batch stays untouched
        detections = non_max_suppression(prediction, nms.conf, nms.iou, nms.classes, nms.agnostic or single_cls,
                                         multi_label=True, max_det=nms.max_det)
        t3 = _sync(device)
        state.times += (t1 - t0, t2 - t1, t3 - t2)
        for si, pred in enumerate(detections):
            _score_image(pred.float(), targets[targets[:, 0] == si, 1:], paths[si], shapes[si],
                         (height, width), single_cls, state)


def _score_image(pred, labels, path, shape, input_hw, single_cls, state: _Accumulator) -> None:
    """Match one image's detections to its labels and append its statistics (val_dual.py per-image step)."""
    state.seen += 1
    num_labels, num_pred = labels.shape[0], pred.shape[0]
    original_hw, ratio_pad = shape[0], shape[1]
    labels_xyxy = torch.zeros((0, 5), device=labels.device)
    if num_labels:
        boxes = scale_boxes(input_hw, cxcywh_to_xyxy(labels[:, 1:5]), original_hw, ratio_pad)
        labels_xyxy = torch.cat((labels[:, 0:1], boxes), 1)
    if state.coco:
        state.gt_images.append((path, tuple(original_hw), labels_xyxy.cpu().numpy()))
    if num_pred == 0:
        if num_labels:
            state.stats.append((torch.zeros((0, len(IOU_THRESHOLDS)), dtype=torch.bool), torch.zeros(0),
                                torch.zeros(0), labels[:, 0].cpu()))
            state.confusion.process_batch(None, labels[:, 0])
        return
    if single_cls:
        pred[:, 5] = 0
    pred_original = pred.clone()
    scale_boxes(input_hw, pred_original[:, :4], original_hw, ratio_pad)
    correct = torch.zeros((num_pred, len(IOU_THRESHOLDS)), dtype=torch.bool)
    if num_labels:
        correct = match_predictions(pred_original, labels_xyxy).cpu()
        state.confusion.process_batch(pred_original, labels_xyxy)
    state.stats.append((correct, pred[:, 4].cpu(), pred[:, 5].cpu(), labels[:, 0].cpu()))
    if state.coco:
        from yolo9kit.coco import coco_predictions

        state.records += coco_predictions(pred_original, path, state.class_map)


def _per_class_frame(result: APResult | None, names: list[str], state: _Accumulator, target_cls: np.ndarray):
    import pandas as pd

    columns = ["class", "name", "images", "instances", "P", "R", "mAP50", "mAP50-95"]
    images_per_class = np.zeros(len(names), dtype=int)
    for *_, labels_cls in state.stats:
        images_per_class[np.unique(labels_cls.numpy().astype(int))] += 1
    counts = np.bincount(target_cls.astype(int), minlength=len(names))
    if result is None:  # no true positive at all: every labelled class scores 0 (official prints no rows)
        rows = [(int(c), names[c], int(images_per_class[c]), int(counts[c]), 0.0, 0.0, 0.0, 0.0)
                for c in np.flatnonzero(counts)]
        return pd.DataFrame(rows, columns=columns)
    rows = [(int(c), names[c], int(images_per_class[c]), int(counts[c]), result.p[i], result.r[i],
             result.ap[i, 0], result.ap[i].mean()) for i, c in enumerate(result.classes)]
    return pd.DataFrame(rows, columns=columns)


def _finish(state: _Accumulator, names, head, plots, save_dir, coco, coco_gt, config, class_map) -> ValResult:
    nc = len(names)
    columns = [torch.cat(x, 0).numpy() for x in zip(*state.stats)] if state.stats else [np.zeros((0, 10))] * 4
    tp, confidences, pred_cls, target_cls = columns
    result = None
    mp = mr = map50 = map50_95 = 0.0
    maps = np.zeros(nc)
    if len(tp) and tp.any():
        result = ap_per_class(tp, confidences, pred_cls, target_cls)
        mp, mr = float(result.p.mean()), float(result.r.mean())
        map50, map50_95 = float(result.ap[:, 0].mean()), float(result.ap.mean(1).mean())
        maps += map50_95
        maps[result.classes] = result.ap.mean(1)
    instances = int(len(target_cls))
    if instances == 0:
        LOGGER.warning("no labels found in the validation set: metrics cannot be computed and are 0")
    seen = max(state.seen, 1)
    speed = dict(zip(("preprocess_ms", "inference_ms", "nms_ms"), (state.times / seen * 1e3).tolist()))
    out = ValResult(mp, mr, map50, map50_95, fitness(map50, map50_95), _per_class_frame(result, names, state,
                    target_cls), speed, maps, state.seen, instances, state.confusion, result, head=head,
                    input_shape=state.input_shape, names=names)
    save_dir = Path(save_dir) if save_dir is not None else None
    if save_dir is not None:
        save_dir.mkdir(parents=True, exist_ok=True)
    if plots:
        from yolo9kit.plots.metrics import plot_validation

        out.figures = plot_validation(state.confusion, result, names)
        for name, figure in out.figures.items() if save_dir is not None else ():
            save_figure(figure, save_dir / name, 150)
    if coco:
        out.coco_predictions = state.records
        out.coco = _cocoeval(state, names, save_dir, coco_gt, config, class_map)
    return out


def _cocoeval(state: _Accumulator, names, save_dir, coco_gt, config, class_map) -> dict[str, float] | None:
    from yolo9kit.coco import coco_ground_truth, image_id_from_path, run_cocoeval

    if save_dir is not None:
        write_text_atomically(save_dir / "predictions.json", json.dumps(state.records))
        LOGGER.info("COCO predictions written to %s", save_dir / "predictions.json")
    if coco_gt is None and class_map is not None and config is not None:
        candidate = config.path / "annotations" / "instances_val2017.json"
        coco_gt = candidate if candidate.is_file() else None
    if coco_gt is None:
        coco_gt = coco_ground_truth(state.gt_images, names, class_map)
        if save_dir is not None:
            write_text_atomically(save_dir / "ground_truth.json", json.dumps(coco_gt))
    image_ids = [image_id_from_path(p) for p, *_ in state.gt_images]
    try:
        return run_cocoeval(coco_gt, state.records, image_ids)
    except Exception as e:  # a foreign ground-truth file must not cost the official-method results
        LOGGER.warning("COCOeval failed (%s: %s); the official-method metrics are unaffected", type(e).__name__, e)
        return None


def compare_heads(model, data=None, dataloader=None, **kwargs):
    """Evaluate the main and the auxiliary head of a dual-head (YOLOv9) model on the same batches.

    Args:
        model, data, dataloader, kwargs: as :func:`evaluate` (``head`` is set here).

    Returns:
        DataFrame indexed by head ("main", "aux") with P, R, mAP50, mAP50-95, fitness.
    """
    import pandas as pd

    model = load_model(model)
    if not getattr(model, "is_dual", False):
        raise ValueError("compare_heads needs a dual-head YOLOv9 model; GELAN / converted models have one head")
    if dataloader is None:
        if data is None:
            raise ValueError("compare_heads needs data= or dataloader=")
        dataloader = _build_loader(data, kwargs.get("split", "val"), kwargs.get("imgsz", 640),
                                   kwargs.get("batch_size", 32), kwargs.get("workers"), kwargs.get("single_cls", False))
    rows = {head: evaluate(model, data, dataloader=dataloader, head=head, **kwargs).to_dict()
            for head in ("main", "aux")}
    return pd.DataFrame.from_dict(rows, orient="index")
