"""ipywidgets front ends over the package's functions, for JupyterLab walkthroughs.

Each front end is a function that builds its controls, draws once, and returns a ``WidgetApp`` with
``.container`` (display it), ``.controls`` (set ``.value`` to drive it), ``.outputs`` and ``.update()``;
the training dashboard is a callback object for ``fit``. ipywidgets, IPython and matplotlib are
imported only when a front end is built, so importing ``yolo9kit`` never needs them.

- ``memory_explorer()``: peak VRAM against batch size, the breakdown, the largest batch and the
  accumulation plan for a model, image size, precision, activation checkpointing and target GPU.
- ``train_dashboard()``: live losses, learning rate, VRAM and images/s while ``fit`` runs.
- ``detection_viewer()``: predictions over images with confidence and IoU sliders.
- ``augmentation_viewer()``: a training batch under mosaic, mixup, HSV and scale settings.
- ``runs_viewer()``: the runs table of a folder and the chosen runs' curves of a metric side by side.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "WidgetApp": "yolo9kit.widgets._common",
    "output_png": "yolo9kit.widgets._common",
    "TrainDashboard": "yolo9kit.widgets.dashboard",
    "train_dashboard": "yolo9kit.widgets.dashboard",
    "memory_explorer": "yolo9kit.widgets.memory",
    "detection_viewer": "yolo9kit.widgets.detection",
    "augmentation_viewer": "yolo9kit.widgets.augmentation",
    "runs_viewer": "yolo9kit.widgets.runs",
}

__all__ = ["TrainDashboard", "WidgetApp", "augmentation_viewer", "detection_viewer", "memory_explorer", "output_png",
           "runs_viewer", "train_dashboard"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'yolo9kit.widgets' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover
    from yolo9kit.widgets._common import WidgetApp, output_png
    from yolo9kit.widgets.augmentation import augmentation_viewer
    from yolo9kit.widgets.dashboard import TrainDashboard, train_dashboard
    from yolo9kit.widgets.detection import detection_viewer
    from yolo9kit.widgets.memory import memory_explorer
    from yolo9kit.widgets.runs import runs_viewer
