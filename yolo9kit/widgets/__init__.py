"""ipywidgets front ends over the kit's functions, for notebooks (docs/notebooks.md): each builds its controls,
draws once and returns a ``WidgetApp``; it computes nothing of its own. ``memory_explorer``,
``detection_viewer`` and ``augmentation_viewer`` are defined here, ``train_dashboard`` in ``.dashboard``."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ipywidgets as w
import torch

from yolo9kit import memory
from yolo9kit.config import DEFAULT_AUGMENT_HYP, NMSConfig, StepConfig
from yolo9kit.data import create_dataloader
from yolo9kit.figure import new_figure
from yolo9kit.files import format_bytes
from yolo9kit.models import list_models, load_model
from yolo9kit.plots import memory_breakdown, memory_vs_batch, show_batch
from yolo9kit.prediction import IMAGE_SUFFIXES, predict
from yolo9kit.widgets.dashboard import TrainDashboard, train_dashboard
from yolo9kit.widgets.panel import WidgetApp, html_table, launch, output_png, show_error, show_figure
from yolo9kit.widgets.runs import runs_viewer

__all__ = ["TrainDashboard", "WidgetApp", "augmentation_viewer", "detection_viewer", "memory_explorer", "output_png",
           "runs_viewer", "train_dashboard"]

AMP_LABELS = {"auto": "auto", "fp16": "fp16", "bf16": "bf16", "off (fp32)": "off"}  # label -> ``amp``
CHECKPOINTING = {"none": None, "backbone": "backbone", "all": "all"}  # label -> ``activation_checkpointing``
STAGES = 4  # the steps of one update the progress bar counts: trace, curve, largest batch, plan and breakdown
SWITCHES = {"fit's defaults": None, "off (official layout)": False}  # label -> channels_last, lean, ... values
# Predictions below this confidence are never shown; caching at this floor lets the confidence slider
# work without running the model again.
CONF_FLOOR = 0.001
FIGURE_WIDTH_IN = 5.0  # the detection picture sits beside its table in one row of a notebook
# augmentation slider -> (official hyp key(s), min, max, step)
_SLIDERS: dict[str, tuple[tuple[str, ...], float, float, float]] = {
    "mosaic": (("mosaic",), 0.0, 1.0, 0.05),
    "mixup": (("mixup",), 0.0, 1.0, 0.05),
    "hsv": (("hsv_h", "hsv_s", "hsv_v"), 0.0, 2.0, 0.1),  # scales the three official HSV gains together
    "scale": (("scale",), 0.0, 0.9, 0.05),
    "fliplr": (("fliplr",), 0.0, 1.0, 0.05),
}


def memory_explorer(model: str = "yolov9-t", *, imgsz: int = 640, batch_range: tuple[int, int] = (1, 64),
                    amp: str = "auto", activation_checkpointing: str | None = None, gpu: str | None = None,
                    nominal_batch_size: int = 64, imgsz_range: tuple[int, int] = (64, 1280),
                    max_batch: int = 512, num_classes: int = 80, method: str = "auto") -> WidgetApp:
    """Peak VRAM against batch size (predicted anywhere, measured on CUDA), the breakdown and the batch plan.

    Args:
        model: starting model (any of ``yolo9kit.models.list_models()``).
        imgsz: starting image size (multiple of 32).
        batch_range: starting (low, high) batch sizes.
        amp: "auto", "fp16", "bf16" or "off".
        activation_checkpointing: None, "backbone" or "all".
        gpu: target card (a name of ``yolo9kit.memory.GPUS``); None: this machine's, else ``memory.DEFAULT_GPU``.
        nominal_batch_size: images per optimizer step the plan aims for.
        imgsz_range: the image size slider's limits.
        max_batch: the batch slider's and the largest batch search's limit.
        num_classes: classes of the described model.
        method: "auto" (measured where CUDA is, else estimated), "estimated" or "measured".

    Returns:
        WidgetApp with controls ``model``, ``imgsz``, ``batch``, ``amp``, ``activation_checkpointing``,
        ``switches``, ``gpu``, ``method``; outputs ``curve`` and ``breakdown`` (figures), ``plan`` (HTML),
        ``progress`` (shown while an update computes) and ``status``; ``state`` holds ``step``, ``frame`` (the
        curve's rows), ``search``, ``plan`` (a ``BatchPlan``) and ``report`` (the breakdown's).
    """
    controls = _explorer_controls(model, imgsz, batch_range, amp, activation_checkpointing, gpu, imgsz_range,
                                  max_batch, method)
    outputs = {"curve": w.Output(), "breakdown": w.Output(), "plan": w.HTML(), "status": w.HTML(),
               "progress": w.IntProgress(min=0, max=STAGES, layout=w.Layout(width="300px", visibility="hidden"))}

    def progress(done: int, text: str) -> None:  # sent to the page at once, while the cell still computes
        outputs["progress"].value, outputs["progress"].layout.visibility = done, "visible"
        outputs["status"].value = f"<i>{done + 1}/{STAGES} {text}...</i>"

    def update() -> None:
        settings = {k: c.value for k, c in controls.items()}
        t0 = time.perf_counter()
        try:
            drawn = _compute(settings, num_classes, nominal_batch_size, max_batch, progress)
        except (ValueError, RuntimeError) as error:
            show_error(outputs["curve"], f"cannot compute this setting: {error}")
            outputs["status"].value = ""
            return
        finally:
            outputs["progress"].layout.visibility = "hidden"
        _draw(app, drawn, settings, time.perf_counter() - t0)

    left = w.VBox([controls[k] for k in ("model", "imgsz", "batch", "amp")])
    right = w.VBox([controls[k] for k in ("activation_checkpointing", "switches", "gpu", "method")]
                   + [outputs["progress"], outputs["status"]])
    container = w.VBox([w.HBox([left, right]), outputs["plan"], w.HBox([outputs["curve"], outputs["breakdown"]])])
    app = WidgetApp(container, controls, outputs, update)
    return launch(app)


def _explorer_controls(model, imgsz, batch_range, amp, activation_checkpointing, gpu, imgsz_range, max_batch,
                       method) -> dict[str, Any]:
    has_cuda = torch.cuda.is_available()
    local = memory.target_gpu(None)
    gpus: list[tuple[str, Any]] = [(name, name) for name in memory.GPUS]
    if has_cuda:  # the local card first, with its real capacity (its name may not be in the table)
        gpus.insert(0, (f"{local.name} (this machine)", local))
    amp_label = next(label for label, value in AMP_LABELS.items() if value == amp)
    ckpt_label = next(label for label, value in CHECKPOINTING.items() if value == activation_checkpointing)
    wide = {"continuous_update": False, "layout": w.Layout(width="420px")}  # 1-512 on ~100 px: 5 batches a pixel
    controls: dict[str, Any] = {
        "model": w.Dropdown(options=list_models(), value=model, description="model"),
        "imgsz": w.IntSlider(value=imgsz, min=imgsz_range[0], max=imgsz_range[1], step=32, description="image size",
                             **wide),
        "batch": w.IntRangeSlider(value=batch_range, min=1, max=max_batch, description="batch sizes", **wide),
        "amp": w.ToggleButtons(options=list(AMP_LABELS), value=amp_label, description="amp"),
        "activation_checkpointing": w.Dropdown(options=list(CHECKPOINTING), value=ckpt_label,
                                               description="act. checkpointing"),
        "switches": w.Dropdown(options=list(SWITCHES), value="fit's defaults", description="speed switches"),
        "gpu": w.Dropdown(options=gpus, value=gpu if gpu is not None else (local if has_cuda else local.name),
                          description="target GPU"),
        "method": w.ToggleButtons(options=["estimated", "measured"] if has_cuda else ["estimated"],
                                  value=("measured" if has_cuda else "estimated") if method == "auto" else method,
                                  description="memory"),
    }
    for c in controls.values():
        c.style.description_width = "120px"
    for name in ("amp", "method"):
        controls[name].style.button_width = "80px"
    return controls


def explorer_step(settings: dict[str, Any], num_classes: int) -> StepConfig:
    """The ``StepConfig`` the explorer's controls describe (``settings``: control name -> value)."""
    switch = SWITCHES[settings["switches"]]
    return StepConfig(settings["model"], imgsz=settings["imgsz"], amp=AMP_LABELS[settings["amp"]],
                      activation_checkpointing=CHECKPOINTING[settings["activation_checkpointing"]],
                      channels_last=switch, lean_activations=switch, fused_optimizer=switch,
                      num_classes=num_classes)


def _compute(settings: dict[str, Any], num_classes: int, nominal_batch_size: int, max_batch: int,
             progress: Callable[[int, str], None]) -> dict:
    """Everything the explorer shows, from ``yolo9kit.memory``; ``progress(stage, text)`` before each stage."""
    step = explorer_step(settings, num_classes)
    spec = memory.target_gpu(settings["gpu"])
    method = settings["method"]
    if method == "measured":
        progress(0, "measuring the step on this card")
    elif memory.is_traced(step, spec):
        progress(0, "this setting was traced before")
    else:
        progress(0, f"tracing {step.model_name} at {step.imgsz} px, once for this setting (seconds to a minute; "
                    "a setting seen before is instant)")
        memory.estimate(step, 1, gpu=spec)  # the trace every figure below reads
    grid = memory.batch_grid(*settings["batch"])
    progress(1, f"the curve at {len(grid)} batch sizes")
    frame = memory.sweep(step, grid, gpu=spec, method=method)
    progress(2, "the largest batch")
    search = memory.find_max_batch(step, gpu=spec, max_batch=max_batch, method=method)
    progress(3, "the plan and the breakdown")
    batch_plan = memory.plan(step, nominal_batch_size, gpu=spec, method=method)
    fitting = frame[frame["device_bytes"] <= search.budget_bytes]["batch_size"]
    shown = int(fitting.max()) if len(fitting) else int(frame["batch_size"].min())
    report = memory.measure(step, shown) if method == "measured" else memory.estimate(step, shown, gpu=spec)
    return {"step": step, "spec": spec, "frame": frame, "search": search, "plan": batch_plan, "report": report}


def _draw(app: WidgetApp, drawn: dict, settings: dict[str, Any], seconds: float) -> None:
    spec, search, report = drawn["spec"], drawn["search"], drawn["report"]
    curve = memory_vs_batch(drawn["frame"], gpu=spec, margin=search.margin)
    curve.axes[0].set_title(f"{settings['model']}, {report.step.label}: {settings['method']} for {spec.name}",
                            fontsize=9)
    breakdown = memory_breakdown(report)
    app.figures.update(curve=curve, breakdown=breakdown)
    app.state.update(drawn)
    app.state["max_batch"] = search.batch_size
    show_figure(app.outputs["curve"], curve)
    show_figure(app.outputs["breakdown"], breakdown)
    app.outputs["plan"].value = _plan_html(search, drawn["plan"])
    app.outputs["status"].value = (f"breakdown at batch {report.batch_size}: {format_bytes(report.device_bytes)} "
                                   f"on the card (computed in {seconds:.1f} s)")


def _plan_html(search, batch_plan) -> str:
    spec = batch_plan.gpu
    if search.batch_size < 1:
        return f"<b>Nothing fits on {spec.name}</b>: {search.reason}. {batch_plan.reason}."
    text = f"<b>Largest batch on {spec.name}: {search.batch_size}</b> ({search.reason}).<br>"
    best = batch_plan.recommended
    if best is None:
        return text + batch_plan.reason
    return text + (f"Plan: <b>batch {best['batch_size']} x accumulate {best['accumulate']} = "
                   f"{best['effective_batch']} images per optimizer step</b> for a nominal "
                   f"{batch_plan.nominal_batch_size} (yolo9kit.memory.plan; official accumulation "
                   f"max(round({batch_plan.nominal_batch_size} / batch), 1)).")


def detection_viewer(model, source, *, imgsz: int = 640, conf: float = 0.25, iou: float = 0.45,
                     head: str = "main", device: str | None = None) -> WidgetApp:
    """Image, confidence and IoU sliders (and a head switch for dual-head models) over ``predict``; the model runs
    once per (image, IoU, head), the confidence slider only filters.

    Args:
        model: a DetectionModel (or anything ``yolo9kit.load_model`` accepts: a checkpoint, a model name).
        source: an image folder, one image path, or a list of paths / BGR arrays.
        imgsz: inference size.
        conf: the confidence slider's starting value.
        iou: the NMS IoU slider's starting value.
        head: "main" or "aux".
        device: None: the first CUDA device when there is one, else the CPU.

    Returns:
        WidgetApp with controls ``image``, ``conf``, ``iou`` (and ``head`` for dual-head models), outputs
        ``image`` (the annotated picture) and ``table``; ``state["prediction"]`` is the filtered ``Prediction``.

    Raises:
        ValueError: no images in ``source``.
    """
    model = load_model(model)
    images = _image_list(source)
    controls: dict[str, Any] = {
        "image": w.IntSlider(value=0, min=0, max=len(images) - 1, description="image", continuous_update=False),
        # min 0, not CONF_FLOOR: on a 0.01 grid from 0 every two-decimal value (0.25) is a stop, so the
        # browser does not snap the starting value to 0.251 and disagree with the caller's conf
        "conf": w.FloatSlider(value=conf, min=0.0, max=1.0, step=0.01, description="confidence",
                              continuous_update=False, readout_format=".2f"),
        "iou": w.FloatSlider(value=iou, min=0.05, max=0.95, step=0.05, description="NMS IoU",
                             continuous_update=False, readout_format=".2f"),
    }
    if getattr(model, "is_dual", False):
        controls["head"] = w.ToggleButtons(options=["main", "aux"], value=head, description="head")
    outputs = {"image": w.Output(), "table": w.HTML()}
    cache: dict[tuple, Any] = {}

    def update() -> None:
        index, chosen_head = controls["image"].value, controls["head"].value if "head" in controls else "main"
        key = (index, round(controls["iou"].value, 4), chosen_head)
        try:
            if key not in cache:
                cache[key] = predict(model, images[index], imgsz=imgsz, nms=NMSConfig(conf=CONF_FLOOR, iou=key[1]),
                                     head=chosen_head, device=device)[0]
        except (OSError, ValueError, RuntimeError) as error:
            show_error(outputs["image"], f"cannot predict on image {index}: {error}")
            return
        shown = filter_confidence(cache[key], controls["conf"].value)
        h0, w0 = shown.orig_shape
        fig = shown.plot(new_figure((FIGURE_WIDTH_IN, FIGURE_WIDTH_IN * h0 / max(w0, 1))).add_subplot())
        name = Path(images[index]).name if isinstance(images[index], (str, Path)) else f"image {index}"
        fig.axes[0].set_title(f"{name}: {len(shown)} boxes\n(conf >= {controls['conf'].value:.2f}, "
                              f"IoU {key[1]:.2f}, {chosen_head} head)", fontsize=10)
        app.figures["image"], app.state["prediction"] = fig, shown
        show_figure(outputs["image"], fig)
        outputs["table"].value = _detections_html(shown)

    container = w.VBox([w.HBox([controls["image"], *(c for k, c in controls.items() if k == "head")]),
                        w.HBox([controls["conf"], controls["iou"]]), w.HBox([outputs["image"], outputs["table"]])])
    app = WidgetApp(container, controls, outputs, update)
    return launch(app)


def _image_list(source: str | Path | Sequence[Any]) -> list[Any]:
    """A folder becomes its sorted image files, a path a list of one; a list stays as it is."""
    if isinstance(source, (str, Path)) and Path(source).is_dir():
        files = sorted(p for p in Path(source).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ValueError(f"{source}: no image files ({', '.join(sorted(IMAGE_SUFFIXES))}) in this folder")
        return [str(p) for p in files]
    if isinstance(source, (str, Path)):
        return [str(source)]
    items = list(source)
    if not items:
        raise ValueError("detection_viewer needs at least one image")
    return items


def _detections_html(shown) -> str:
    frame = shown.to_frame().round(1)
    counts = frame.groupby("name").size().rename("boxes").reset_index() if len(frame) else frame
    return html_table(counts, "boxes per class") + html_table(frame.head(20), "detections (top 20 by confidence)")


def filter_confidence(prediction, conf: float):
    """A copy of a ``Prediction`` keeping only boxes with score >= ``conf``."""
    keep = prediction.scores >= conf
    return dataclasses.replace(prediction, boxes=prediction.boxes[keep], scores=prediction.scores[keep],
                               classes=prediction.classes[keep])


def augmentation_hyp(values: dict[str, float], base: dict[str, float] | None = None) -> dict[str, float]:
    """The official augmentation defaults (or ``base``) with the sliders' ``values`` applied; ``hsv`` multiplies
    the base ``hsv_h``, ``hsv_s`` and ``hsv_v`` (1.0 = official strength, 0 = off)."""
    hyp = {**DEFAULT_AUGMENT_HYP, **(base or {})}
    for name, value in values.items():
        for key in _SLIDERS[name][0]:
            hyp[key] = hyp[key] * value if name == "hsv" else value
    return hyp


def augmentation_viewer(data, *, imgsz: int = 320, batch_size: int = 4, seed: int = 0,
                        hyp: dict[str, float] | None = None) -> WidgetApp:
    """Sliders for mosaic, mixup, HSV strength, scale and horizontal flip over a training batch, drawn by
    ``show_batch`` from a loader rebuilt on each change (``workers=0``, fixed seed: same sliders, same batch).

    Args:
        data: data.yaml path or dict (as ``create_dataloader``).
        imgsz: training image size.
        batch_size: images drawn.
        seed: the first batch's seed (a slider too).
        hyp: starting augmentation hyper-parameters (default: official hyp.scratch-high).

    Returns:
        WidgetApp with controls ``mosaic``, ``mixup``, ``hsv``, ``scale``, ``fliplr``, ``seed``; output
        ``batch``; ``state["hyp"]`` the hyper-parameters used, ``state["batch"]`` the batch.
    """
    start = augmentation_hyp({}, hyp)
    controls: dict[str, Any] = {
        name: w.FloatSlider(value=1.0 if name == "hsv" else start[keys[0]], min=lo, max=hi, step=step,
                            description=name, continuous_update=False, readout_format=".2f")
        for name, (keys, lo, hi, step) in _SLIDERS.items()}
    controls["seed"] = w.IntSlider(value=seed, min=0, max=99, description="seed", continuous_update=False)
    outputs = {"batch": w.Output(), "text": w.HTML()}

    def update() -> None:
        values = {k: c.value for k, c in controls.items() if k in _SLIDERS}
        used = augmentation_hyp(values, hyp)
        try:
            loader = create_dataloader(data, "train", imgsz=imgsz, batch_size=batch_size, workers=0,
                                       seed=controls["seed"].value, hyp=used, cache=None)
            batch = next(iter(loader))
        except (OSError, ValueError) as error:
            show_error(outputs["batch"], f"cannot load a training batch: {error}")
            return
        fig = show_batch(batch, names=getattr(loader.dataset, "names", None), max_images=batch_size,
                         title=f"mosaic {used['mosaic']:.2f}, mixup {used['mixup']:.2f}, HSV x{values['hsv']:.1f}, "
                               f"scale {used['scale']:.2f}, seed {controls['seed'].value}")
        app.figures["batch"], app.state["hyp"], app.state["batch"] = fig, used, batch
        show_figure(outputs["batch"], fig)
        outputs["text"].value = f"{len(batch[1])} boxes in {len(batch[0])} images of {tuple(batch[0].shape[2:])} px"

    sliders = list(controls.values())
    container = w.VBox([w.HBox(sliders[:3]), w.HBox(sliders[3:]), outputs["text"], outputs["batch"]])
    app = WidgetApp(container, controls, outputs, update)
    return launch(app)
