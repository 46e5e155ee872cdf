"""Matplotlib plots, all by one convention (``yolo9kit.figure.axes_for``): every function takes ``ax=None``
(or ``fig=None`` when it lays out several axes), builds what it lacks outside pyplot (``figure.new_figure``)
and returns the figure, which a notebook shows as the value of a cell and a script can ``savefig``.

The names below are imported on first use: validation imports ``yolo9kit.plots.metrics``, and that must not
load the plots of training runs and memory (which read ``yolo9kit.train`` and ``yolo9kit.memory``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> module that defines it
_EXPORTS = {
    "show_batch": "yolo9kit.plots.batch",
    "memory_breakdown": "yolo9kit.plots.memory",
    "memory_vs_batch": "yolo9kit.plots.memory",
    "plot_confusion_matrix": "yolo9kit.plots.metrics",
    "plot_labels": "yolo9kit.plots.batch",
    "plot_metric_curve": "yolo9kit.plots.metrics",
    "plot_pr_curve": "yolo9kit.plots.metrics",
    "plot_validation": "yolo9kit.plots.metrics",
    "plot_results": "yolo9kit.plots.train",
    "compare": "yolo9kit.plots.train",
    "plot_schedule": "yolo9kit.plots.train",
}

__all__ = ["compare", "memory_breakdown", "memory_vs_batch", "plot_confusion_matrix", "plot_labels",
           "plot_metric_curve", "plot_pr_curve", "plot_results", "plot_schedule", "plot_validation", "show_batch"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'yolo9kit.plots' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from yolo9kit.plots.batch import plot_labels, show_batch
    from yolo9kit.plots.memory import memory_breakdown, memory_vs_batch
    from yolo9kit.plots.metrics import plot_confusion_matrix, plot_metric_curve, plot_pr_curve, plot_validation
    from yolo9kit.plots.train import compare, plot_results, plot_schedule
