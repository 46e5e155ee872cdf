"""ipywidgets front ends over the kit's functions, for notebooks (docs/notebooks.md): each builds its controls,
draws once and returns a ``WidgetApp``; it computes nothing of its own."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import ipywidgets as w
import torch

from yolo9kit import memory
from yolo9kit.config import DEFAULT_AUGMENT_HYP, NMSConfig, StepConfig
from yolo9kit.data import create_dataloader
from yolo9kit.data.sources import expand_sources, is_video
from yolo9kit.figure import new_figure
from yolo9kit.files import format_bytes
from yolo9kit.models import list_models, load_model
from yolo9kit.plots import memory_breakdown, memory_vs_batch, show_batch
from yolo9kit.prediction import predict
from yolo9kit.widgets.dashboard import TrainDashboard, train_dashboard
from yolo9kit.widgets.panel import WidgetApp, html_table, launch, output_png, show_error, show_figure

__all__ = ["TrainDashboard", "WidgetApp", "augmentation_viewer", "detection_viewer", "memory_explorer", "output_png",
           "train_dashboard"]

STAGES = 4  # the steps of one update the progress bar counts: trace, curve, largest batch, plan and breakdown
SWITCHES = ("fit's defaults", "off (official layout)")  # channels_last, lean_activations, ...: None or False
CONF_FLOOR = 0.001  # predictions cached at this confidence: the confidence slider then only filters
# augmentation slider -> (official hyp key(s), min, max, step); hsv scales the three official HSV gains together
_SLIDERS = {"mosaic": (("mosaic",), 0.0, 1.0, 0.05), "mixup": (("mixup",), 0.0, 1.0, 0.05),
            "hsv": (("hsv_h", "hsv_s", "hsv_v"), 0.0, 2.0, 0.1), "scale": (("scale",), 0.0, 0.9, 0.05),
            "fliplr": (("fliplr",), 0.0, 1.0, 0.05)}


def memory_explorer(model: str = "yolov9-t", *, imgsz: int = 640, batch_range: tuple[int, int] = (1, 64),
                    amp: str = "auto", activation_checkpointing: str | None = None, gpu: str | None = None,
                    nominal_batch_size: int = 64, imgsz_range: tuple[int, int] = (64, 1280),
                    max_batch: int = 512, num_classes: int = 80, method: str = "auto") -> WidgetApp:
    """Peak VRAM against batch size (estimated anywhere, measured on CUDA), the breakdown and the batch plan; the
    WidgetApp's ``state`` holds ``step``, ``frame`` (the curve's rows), ``search``, ``plan`` and ``report``.

    Args:
        gpu: target card (a name of ``memory.GPUS``); None: this machine's, else ``memory.DEFAULT_GPU``.
        nominal_batch_size: images per optimizer step the plan aims for; max_batch: also the largest batch search's.
        method: "auto" (measured where CUDA is, else estimated), "estimated" or "measured".
    """
    has_cuda = torch.cuda.is_available()
    local = memory.target_gpu(None)
    # the local card first, with its real capacity (its name may not be in the table)
    gpus = [(f"{local.name} (this machine)", local)] * has_cuda + [(name, name) for name in memory.GPUS]
    wide = {"continuous_update": False, "layout": w.Layout(width="420px")}  # 1-512 on ~100 px: 5 batches a pixel
    controls: dict[str, Any] = {
        "model": w.Dropdown(options=list_models(), value=model, description="model"),
        "imgsz": w.IntSlider(value=imgsz, min=imgsz_range[0], max=imgsz_range[1], step=32, description="image size",
                             **wide),
        "batch": w.IntRangeSlider(value=batch_range, min=1, max=max_batch, description="batch sizes", **wide),
        "amp": w.ToggleButtons(options=[("auto", "auto"), ("fp16", "fp16"), ("bf16", "bf16"), ("off (fp32)", "off")],
                               value=amp, description="amp"),
        "activation_checkpointing": w.Dropdown(options=["none", "backbone", "all"], description="act. checkpointing",
                                               value=activation_checkpointing or "none"),
        "switches": w.Dropdown(options=SWITCHES, value=SWITCHES[0], description="speed switches"),
        "gpu": w.Dropdown(options=gpus, value=gpu if gpu is not None else (local if has_cuda else local.name),
                          description="target GPU"),
        "method": w.ToggleButtons(options=["estimated", "measured"] if has_cuda else ["estimated"],
                                  value=("measured" if has_cuda else "estimated") if method == "auto" else method,
                                  description="memory"),
    }
    for c in controls.values():
        c.style.description_width = "120px"
    controls["amp"].style.button_width = controls["method"].style.button_width = "80px"
    outputs = {"curve": w.Output(), "breakdown": w.Output(), "plan": w.HTML(), "status": w.HTML(),
               "progress": w.IntProgress(min=0, max=STAGES, layout=w.Layout(width="300px", visibility="hidden"))}

    left = w.VBox([controls[k] for k in ("model", "imgsz", "batch", "amp")])
    right = w.VBox([controls[k] for k in ("activation_checkpointing", "switches", "gpu", "method")]
                   + [outputs["progress"], outputs["status"]])
    container = w.VBox([w.HBox([left, right]), outputs["plan"], w.HBox([outputs["curve"], outputs["breakdown"]])])
    app = WidgetApp(container, controls, outputs, lambda: _explore(app, num_classes, nominal_batch_size, max_batch))
    return launch(app)


def _explore(app: WidgetApp, num_classes: int, nominal_batch_size: int, max_batch: int) -> None:
    """Compute with ``yolo9kit.memory`` what the explorer's controls describe, saying each stage, and draw it."""
    settings, outputs, t0 = {k: c.value for k, c in app.controls.items()}, app.outputs, time.perf_counter()

    def progress(done: int, text: str) -> None:  # sent to the page at once, while the cell still computes
        outputs["progress"].value, outputs["progress"].layout.visibility = done, "visible"
        outputs["status"].value = f"<i>{done + 1}/{STAGES} {text}...</i>"

    switch = None if settings["switches"] == SWITCHES[0] else False
    checkpointing = None if settings["activation_checkpointing"] == "none" else settings["activation_checkpointing"]
    spec, method = memory.target_gpu(settings["gpu"]), settings["method"]
    try:
        step = StepConfig(settings["model"], imgsz=settings["imgsz"], amp=settings["amp"], num_classes=num_classes,
                          activation_checkpointing=checkpointing, channels_last=switch, lean_activations=switch,
                          fused_optimizer=switch)
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
    except (ValueError, RuntimeError) as error:
        show_error(outputs["curve"], f"cannot compute this setting: {error}")
        outputs["status"].value = ""
        return
    finally:
        outputs["progress"].layout.visibility = "hidden"
    curve = memory_vs_batch(frame, gpu=spec, margin=search.margin)
    curve.axes[0].set_title(f"{settings['model']}, {report.step.label}: {method} for {spec.name}", fontsize=9)
    app.figures.update(curve=curve, breakdown=memory_breakdown(report))
    app.state.update(step=step, spec=spec, frame=frame, search=search, plan=batch_plan, report=report,
                     max_batch=search.batch_size)
    show_figure(outputs["curve"], curve)
    show_figure(outputs["breakdown"], app.figures["breakdown"])
    best = batch_plan.recommended
    outputs["plan"].value = f"<b>Largest batch on {spec.name}: {search.batch_size}</b> ({search.reason}).<br>" + (
        batch_plan.reason if best is None else f"Plan (yolo9kit.memory.plan): <b>batch {best['batch_size']} x "
        f"accumulate {best['accumulate']} = {best['effective_batch']} images per optimizer step</b> for a nominal "
        f"{nominal_batch_size}.")
    outputs["status"].value = (f"breakdown at batch {report.batch_size}: {format_bytes(report.device_bytes)} on the "
                               f"card (computed in {time.perf_counter() - t0:.1f} s)")


def detection_viewer(model, source, *, imgsz: int = 640, conf: float = 0.25, iou: float = 0.45,
                     head: str = "main", device: str | None = None) -> WidgetApp:
    """Image, confidence and IoU sliders (and a head switch for dual-head models) over ``predict``; the model runs
    once per (image, IoU, head), the confidence slider only filters. ``source``: images, as ``predict`` takes them
    (videos are left out); model, imgsz, head, device: as ``predict``. The WidgetApp's ``state["prediction"]`` is
    the filtered ``Prediction`` shown."""
    model = load_model(model)
    images = [item for item in expand_sources(source)[0] if not is_video(item)]
    if not images:
        raise ValueError(f"{source}: no images to show (videos are left out)")
    fine = {"continuous_update": False, "readout_format": ".2f"}
    controls: dict[str, Any] = {
        "image": w.IntSlider(value=0, min=0, max=len(images) - 1, description="image", continuous_update=False),
        # min 0, not CONF_FLOOR: on a 0.01 grid from 0 the caller's two-decimal conf is a stop the browser keeps
        "conf": w.FloatSlider(value=conf, min=0.0, max=1.0, step=0.01, description="confidence", **fine),
        "iou": w.FloatSlider(value=iou, min=0.05, max=0.95, step=0.05, description="NMS IoU", **fine),
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
        keep = cache[key].scores >= controls["conf"].value
        shown = dataclasses.replace(cache[key], boxes=cache[key].boxes[keep], scores=cache[key].scores[keep],
                                    classes=cache[key].classes[keep])
        h0, w0 = shown.orig_shape
        fig = shown.plot(new_figure((5, 5 * h0 / max(w0, 1))).add_subplot())  # beside its table in a notebook
        name = Path(images[index]).name if isinstance(images[index], (str, Path)) else f"image {index}"
        fig.axes[0].set_title(f"{name}: {len(shown)} boxes\n(conf >= {controls['conf'].value:.2f}, "
                              f"IoU {key[1]:.2f}, {chosen_head} head)", fontsize=10)
        app.figures["image"], app.state["prediction"] = fig, shown
        show_figure(outputs["image"], fig)
        frame = shown.to_frame().round(1)
        counts = frame.groupby("name").size().rename("boxes").reset_index() if len(frame) else frame
        outputs["table"].value = (html_table(counts, "boxes per class")
                                  + html_table(frame.head(20), "detections (top 20 by confidence)"))

    container = w.VBox([w.HBox([controls["image"], *(c for k, c in controls.items() if k == "head")]),
                        w.HBox([controls["conf"], controls["iou"]]), w.HBox([outputs["image"], outputs["table"]])])
    app = WidgetApp(container, controls, outputs, update)
    return launch(app)


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
    ``hyp``: the starting augmentation hyper-parameters (default: official hyp.scratch-high). The WidgetApp's
    ``state["hyp"]`` holds the hyper-parameters used, ``state["batch"]`` the batch."""
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
