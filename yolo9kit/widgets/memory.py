"""``memory_explorer()``: peak memory against batch size for a training step and a target GPU; the
breakdown at the largest batch that fits; the batch x accumulation plan.

The explorer only draws: its controls make a ``StepConfig`` and every figure and sentence comes from
``yolo9kit.memory`` (``sweep``, ``find_max_batch``, ``plan``, ``estimate``/``measure``). Estimating traces
the step once per setting (seconds to a minute on a laptop CPU; ``yolo9kit.memory`` keeps the traced
steps), after which any batch range and card is instant. Measuring (a CUDA machine) runs the real step at
every batch size of the range.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from yolo9kit.files import format_bytes
from yolo9kit.widgets._common import WidgetApp, show_error, show_figure

AMP_LABELS = {"auto": "auto", "fp16": "fp16", "bf16": "bf16", "off (fp32)": "off"}  # label -> ``amp``
CHECKPOINTING = {"none": None, "backbone": "backbone", "all": "all"}  # label -> ``activation_checkpointing``
STAGES = 4  # the steps of one update the progress bar counts: trace, curve, largest batch, plan and breakdown
SWITCHES = {"fit's defaults": None, "off (official layout)": False}  # label -> channels_last, lean, ... values


def explorer_step(settings: dict[str, Any], num_classes: int):
    """The ``StepConfig`` the controls describe (``settings``: control name -> value)."""
    from yolo9kit.config import StepConfig

    switch = SWITCHES[settings["switches"]]
    return StepConfig(settings["model"], imgsz=settings["imgsz"], amp=AMP_LABELS[settings["amp"]],
                      activation_checkpointing=CHECKPOINTING[settings["activation_checkpointing"]],
                      channels_last=switch, lean_activations=switch, fused_optimizer=switch,
                      num_classes=num_classes)


def _plan_html(search, batch_plan) -> str:
    """The largest batch and the plan's recommendation, in the package's own words."""
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


def memory_explorer(model: str = "yolov9-t", *, imgsz: int = 640, batch_range: tuple[int, int] = (1, 64),
                    amp: str = "auto", activation_checkpointing: str | None = None, gpu: str | None = None,
                    nominal_batch_size: int = 64, imgsz_range: tuple[int, int] = (64, 1280),
                    max_batch: int = 512, num_classes: int = 80, method: str = "auto") -> WidgetApp:
    """VRAM-against-batch explorer: predicted on any machine, measured on a CUDA machine.

    Args:
        model: starting model (any of ``yolo9kit.models.list_models()``).
        imgsz: starting image size (multiple of 32). batch_range: starting (low, high) batch sizes.
        amp: "auto", "fp16", "bf16" or "off". activation_checkpointing: None, "backbone" or "all".
        gpu: target card (a name from ``yolo9kit.memory.GPUS``); None: this machine's card, else
            ``yolo9kit.memory.DEFAULT_GPU``.
        nominal_batch_size: images per optimizer step the plan aims for.
        imgsz_range, max_batch: slider limits. num_classes: classes of the described model.
        method: "auto" (measured where CUDA is, else estimated), "estimated" or "measured".

    Returns:
        WidgetApp with controls ``model``, ``imgsz``, ``batch``, ``amp``, ``activation_checkpointing``,
        ``switches``, ``gpu``, ``method``; outputs ``curve`` and ``breakdown`` (figures), ``plan`` (HTML),
        ``progress`` (a bar shown while an update computes) and ``status`` (what it does, then the time it took);
        ``state`` holds ``step``, ``frame`` (the curve's rows), ``search``, ``plan`` (a ``BatchPlan``) and
        ``report`` (the breakdown's).
    """
    import ipywidgets as w
    import torch

    from yolo9kit.memory import GPUS, target_gpu
    from yolo9kit.models import list_models

    has_cuda = torch.cuda.is_available()
    local = target_gpu(None)
    gpus: list[tuple[str, Any]] = [(name, name) for name in GPUS]
    if has_cuda:  # the local card first, with its real capacity (its name may not be in the table)
        gpus.insert(0, (f"{local.name} (this machine)", local))
    start_gpu = gpu if gpu is not None else (local if has_cuda else local.name)
    methods = ["estimated", "measured"] if has_cuda else ["estimated"]
    start_method = ("measured" if has_cuda else "estimated") if method == "auto" else method
    amp_label = next(label for label, value in AMP_LABELS.items() if value == amp)
    ckpt_label = next(label for label, value in CHECKPOINTING.items() if value == activation_checkpointing)
    controls: dict[str, Any] = {
        "model": w.Dropdown(options=list_models(), value=model, description="model"),
        # wide sliders: a 1-512 batch range on a ~100 px track moves five batches per pixel
        "imgsz": w.IntSlider(value=imgsz, min=imgsz_range[0], max=imgsz_range[1], step=32, description="image size",
                             continuous_update=False, layout=w.Layout(width="420px")),
        "batch": w.IntRangeSlider(value=batch_range, min=1, max=max_batch, description="batch sizes",
                                  continuous_update=False, layout=w.Layout(width="420px")),
        "amp": w.ToggleButtons(options=list(AMP_LABELS), value=amp_label, description="amp"),
        "activation_checkpointing": w.Dropdown(options=list(CHECKPOINTING), value=ckpt_label,
                                               description="act. checkpointing"),
        "switches": w.Dropdown(options=list(SWITCHES), value="fit's defaults", description="speed switches"),
        "gpu": w.Dropdown(options=gpus, value=start_gpu, description="target GPU"),
        "method": w.ToggleButtons(options=methods, value=start_method, description="memory"),
    }
    for c in controls.values():
        c.style.description_width = "120px"
    for name in ("amp", "method"):
        controls[name].style.button_width = "80px"
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
    app = WidgetApp(container=container, controls=controls, outputs=outputs, update=update)
    for control in controls.values():
        control.observe(lambda change: update(), names="value")
    update()
    return app


def _compute(settings: dict[str, Any], num_classes: int, nominal_batch_size: int, max_batch: int,
             progress: Callable[[int, str], None]) -> dict:
    """Everything the explorer shows, from the package's public functions; ``progress(stage, text)`` is called
    before each of the ``STAGES``."""
    from yolo9kit import memory

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
    report = (memory.measure(step, shown) if method == "measured" else memory.estimate(step, shown, gpu=spec))
    return {"step": step, "spec": spec, "frame": frame, "search": search, "plan": batch_plan, "report": report}


def _draw(app: WidgetApp, drawn: dict, settings: dict[str, Any], seconds: float) -> None:
    from yolo9kit.plots import memory_breakdown, memory_vs_batch

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
