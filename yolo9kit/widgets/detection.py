"""``detection_viewer()``: step through images and watch the confidence and IoU thresholds act.

The model runs once per (image, IoU threshold, head) at a very low confidence and the result is
cached; the confidence slider then only filters boxes (instant), the IoU slider re-runs NMS through
``yolo9kit.predict`` (one forward pass for the shown image).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from yolo9kit.widgets._common import WidgetApp, html_table, show_error, show_figure

# Predictions below this confidence are never shown; caching at this floor lets the confidence slider
# work without running the model again.
CONF_FLOOR = 0.001
# The picture's width, inches: it sits beside the detections table in one row of a notebook.
FIGURE_WIDTH_IN = 5.0


def _image_list(source: str | Path | Sequence[Any]) -> list[Any]:
    """A list of image sources: a folder becomes its sorted image files; a list stays as it is."""
    if isinstance(source, (str, Path)) and Path(source).is_dir():
        from yolo9kit.prediction import IMAGE_SUFFIXES

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


def filter_confidence(prediction, conf: float):
    """A copy of a ``Prediction`` keeping only boxes with score >= ``conf``."""
    keep = prediction.scores >= conf
    return dataclasses.replace(prediction, boxes=prediction.boxes[keep], scores=prediction.scores[keep],
                               classes=prediction.classes[keep])


def detection_viewer(model, source, *, imgsz: int = 640, conf: float = 0.25, iou: float = 0.45,
                     head: str = "main", device: str | None = None) -> WidgetApp:
    """Image slider, confidence and IoU sliders (and a head switch for dual-head models) over ``predict``.

    Args:
        model: a DetectionModel (or anything ``yolo9kit.load_model`` accepts: a checkpoint, a model name).
        source: an image folder, one image path, or a list of paths / BGR arrays.
        imgsz: inference size. conf, iou: starting thresholds of the sliders. head: "main" or "aux".
        device: None: the first CUDA device when there is one, else the CPU.

    Returns:
        WidgetApp with controls ``image``, ``conf``, ``iou`` (and ``head`` for dual-head models),
        outputs ``image`` (the annotated picture) and ``table`` (detections and per-class counts);
        ``state["prediction"]`` is the filtered ``Prediction`` shown.
    """
    import ipywidgets as w

    from yolo9kit.config import NMSConfig
    from yolo9kit.figure import new_figure
    from yolo9kit.models import load_model
    from yolo9kit.prediction import predict

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
        fig.axes[0].set_title(f"{_name(images[index], index)}: {len(shown)} boxes\n"
                              f"(conf >= {controls['conf'].value:.2f}, IoU {key[1]:.2f}, {chosen_head} head)",
                              fontsize=10)
        app.figures["image"], app.state["prediction"] = fig, shown
        show_figure(outputs["image"], fig)
        frame = shown.to_frame().round(1)
        counts = frame.groupby("name").size().rename("boxes").reset_index() if len(frame) else frame
        outputs["table"].value = (html_table(counts, "boxes per class") +
                                  html_table(frame.head(20), "detections (top 20 by confidence)"))

    container = w.VBox([w.HBox([controls["image"], *(c for k, c in controls.items() if k == "head")]),
                        w.HBox([controls["conf"], controls["iou"]]),
                        w.HBox([outputs["image"], outputs["table"]])])
    app = WidgetApp(container=container, controls=controls, outputs=outputs, update=update)
    for control in controls.values():
        control.observe(lambda change: update(), names="value")
    update()
    return app


def _name(item: Any, index: int) -> str:
    return Path(item).name if isinstance(item, (str, Path)) else f"image {index}"
