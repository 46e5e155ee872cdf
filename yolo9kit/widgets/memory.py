"""``memory_explorer()``: peak VRAM against batch size for a model, image size, precision, activation
checkpointing and target GPU; the breakdown at the largest batch; the accumulation plan.

Estimating (no GPU needed) traces the training step once per (model, image size, precision,
checkpointing) with ``yolo9kit.memory.StepEstimator`` (tens of seconds on a laptop CPU); the traced
step answers any batch size and any GPU at once, so moving the batch range or changing the GPU is
instant. Measuring (a CUDA machine) runs the real step at every batch size of the range.
"""

from __future__ import annotations

from typing import Any

from yolo9kit.widgets._common import WidgetApp, format_bytes, show_error, show_figure

PRECISIONS = {"fp32": "off", "fp16": "fp16", "bf16": "bf16"}  # label -> ``amp`` argument
CHECKPOINTING = {"none": None, "backbone": "backbone", "all": "all"}


def batch_grid(lo: int, hi: int) -> list[int]:
    """Batch sizes to evaluate in [lo, hi]: the ends, powers of two and 1.5x powers of two (~2 per octave)."""
    if lo < 1 or hi < lo:
        raise ValueError(f"batch range ({lo}, {hi}): expected 1 <= low <= high")
    grid = {lo, hi}
    k = 1
    while k <= hi:
        grid.update(b for b in (k, k + k // 2) if lo <= b <= hi)
        k *= 2
    return sorted(grid)


class _Estimators:
    """Traced steps, one per (model, imgsz, amp, checkpoint), kept for the widget's lifetime."""

    def __init__(self, num_classes: int) -> None:
        self.num_classes, self._cache = num_classes, {}

    def get(self, model: str, imgsz: int, amp: str, checkpoint: Any):
        from yolo9kit.memory import StepEstimator

        key = (model, imgsz, amp, checkpoint)
        if key not in self._cache:
            self._cache[key] = StepEstimator(model, imgsz=imgsz, amp=amp, checkpoint=checkpoint,
                                             num_classes=self.num_classes)
        return self._cache[key]


def _curve(settings: dict[str, Any], estimators: _Estimators, measured: bool):
    """(sweep-style DataFrame over the batch range, GPUSpec, function batch -> device bytes)."""
    import pandas as pd

    from yolo9kit.memory import measure, resolve_gpu

    batches = batch_grid(*settings["batch"])
    amp, ckpt = PRECISIONS[settings["precision"]], CHECKPOINTING[settings["checkpointing"]]
    spec = resolve_gpu(settings["gpu"])
    setting = f"{settings['precision']} ckpt={settings['checkpointing']} {settings['imgsz']}px"
    if measured:
        def used(b: int) -> int:
            return measure(settings["model"], b, imgsz=settings["imgsz"], amp=amp, checkpoint=ckpt,
                           breakdown=False).device_bytes
        reports = [measure(settings["model"], b, imgsz=settings["imgsz"], amp=amp, checkpoint=ckpt)
                   for b in batches]
    else:
        est = estimators.get(settings["model"], settings["imgsz"], amp, ckpt)

        def used(b: int) -> int:
            return est.reports([b], spec)[0].device_bytes
        reports = est.reports(batches, spec)
    frame = pd.DataFrame([{**r.as_row(), "setting": setting, "oom": False} for r in reports])
    return frame, spec, used, reports


def _plan_text(model: str, max_batch: int, nominal: int, reason: str, spec) -> str:
    """Largest batch and the official accumulation for it, as the trainer would apply it."""
    from yolo9kit.config import TrainConfig
    from yolo9kit.train.optim import base_accumulate

    if max_batch < 1:
        return f"<b>{model}: nothing fits on {spec.name}</b> ({reason}). Try checkpointing, fp16 or a smaller image."
    batch = min(max_batch, nominal)
    accumulate = base_accumulate(TrainConfig(batch_size=batch, nominal_batch_size=nominal))
    return (f"<b>Largest batch on {spec.name}: {max_batch}</b> ({reason}).<br>"
            f"Plan: <b>batch {batch} x accumulate {accumulate} = {batch * accumulate} images per optimizer "
            f"step</b> (nominal {nominal}; official rule max(round({nominal} / batch), 1)).")


def memory_explorer(model: str = "yolov9-t", *, imgsz: int = 640, batch_range: tuple[int, int] = (1, 64),
                    precision: str = "fp16", checkpointing: str = "none", gpu: str | None = None,
                    nominal_batch_size: int = 64, imgsz_range: tuple[int, int] = (64, 1280),
                    max_batch: int = 512, num_classes: int = 80, measure: bool | None = None) -> WidgetApp:
    """VRAM-against-batch explorer: predicted on any machine, measured on a CUDA machine.

    Args:
        model: starting model (any of ``yolo9kit.models.list_models()``).
        imgsz: starting image size (multiple of 32). batch_range: starting (low, high) batch sizes.
        precision: "fp32", "fp16" or "bf16". checkpointing: "none", "backbone" or "all".
        gpu: target card (a name from ``yolo9kit.memory.GPUS``); default: this machine's card, else "RTX 4090".
        nominal_batch_size: images per optimizer step the plan aims for.
        imgsz_range, max_batch: slider limits. num_classes: classes of the estimated model.
        measure: start in measured mode (default: when CUDA is available).

    Returns:
        WidgetApp with controls ``model``, ``imgsz``, ``batch``, ``precision``, ``checkpointing``,
        ``gpu``, ``source``; outputs ``curve`` and ``breakdown`` (figures) and ``plan`` (HTML);
        ``state`` holds ``frame`` (the curve's rows), ``max_batch`` and ``report`` (the breakdown's).
    """
    import ipywidgets as w
    import torch

    from yolo9kit.memory import GPUS, find_max_batch
    from yolo9kit.models import list_models
    from yolo9kit.plots import memory_breakdown, memory_vs_batch

    has_cuda = torch.cuda.is_available()
    gpus: list[tuple[str, Any]] = [(name, name) for name in GPUS]
    if has_cuda:  # the local card first, with its real capacity (its name may not be in the table)
        from yolo9kit.memory.gpus import gpu_from_device

        local = gpu_from_device(0)
        gpus.insert(0, (f"{local.name} (this machine)", local))
    gpu = gpu if gpu is not None else gpus[0][1] if has_cuda else "RTX 4090"
    sources = ["estimated", "measured"] if has_cuda else ["estimated"]
    controls: dict[str, Any] = {
        "model": w.Dropdown(options=list_models(), value=model, description="model"),
        "imgsz": w.IntSlider(value=imgsz, min=imgsz_range[0], max=imgsz_range[1], step=32, description="image size",
                             continuous_update=False),
        "batch": w.IntRangeSlider(value=batch_range, min=1, max=max_batch, description="batch sizes",
                                  continuous_update=False),
        "precision": w.ToggleButtons(options=list(PRECISIONS), value=precision, description="precision"),
        "checkpointing": w.Dropdown(options=list(CHECKPOINTING), value=checkpointing, description="checkpointing"),
        "gpu": w.Dropdown(options=gpus, value=gpu, description="target GPU"),
        "source": w.ToggleButtons(options=sources, value="measured" if (measure or (measure is None and has_cuda))
                                  and has_cuda else "estimated", description="memory"),
    }
    for c in controls.values():
        c.style.description_width = "100px"
    for name in ("precision", "source"):
        controls[name].style.button_width = "95px"
    outputs = {"curve": w.Output(), "breakdown": w.Output(), "plan": w.HTML(), "status": w.HTML()}
    estimators = _Estimators(num_classes)

    def update() -> None:
        settings = {k: c.value for k, c in controls.items()}
        measured = settings["source"] == "measured"
        outputs["status"].value = "<i>computing...</i>"
        try:
            frame, spec, used, reports = _curve(settings, estimators, measured)
            search = find_max_batch(gpu=spec, step_fn=used, max_batch=max_batch)
        except (ValueError, RuntimeError) as error:
            show_error(outputs["curve"], f"cannot compute this setting: {error}")
            outputs["status"].value = ""
            return
        curve = memory_vs_batch(frame, gpu=spec, margin=search.margin)
        curve.axes[0].set_title(f"{settings['model']} {settings['imgsz']} px, {settings['precision']}, "
                                f"checkpointing {settings['checkpointing']}: {settings['source']} on {spec.name}")
        fitting = [r for r in reports if r.device_bytes <= (search.budget_bytes or 0)] or reports[:1]
        breakdown = memory_breakdown(fitting[-1])
        app.figures.update(curve=curve, breakdown=breakdown)
        app.state.update(frame=frame, max_batch=search.batch_size, report=fitting[-1], search=search)
        show_figure(outputs["curve"], curve)
        show_figure(outputs["breakdown"], breakdown)
        outputs["plan"].value = _plan_text(settings["model"], search.batch_size, nominal_batch_size,
                                           search.reason, spec)
        outputs["status"].value = (f"peak at batch {fitting[-1].batch_size}: "
                                   f"{format_bytes(fitting[-1].device_bytes)} on the card")

    left = w.VBox([controls[k] for k in ("model", "imgsz", "batch", "precision")])
    right = w.VBox([controls[k] for k in ("checkpointing", "gpu", "source")] + [outputs["status"]])
    container = w.VBox([w.HBox([left, right]), outputs["plan"], w.HBox([outputs["curve"], outputs["breakdown"]])])
    app = WidgetApp(container=container, controls=controls, outputs=outputs, update=update)
    for control in controls.values():
        control.observe(lambda change: update(), names="value")
    update()
    return app
