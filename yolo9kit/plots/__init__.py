"""Matplotlib plots. Every function takes ``ax=None`` (or ``fig=None``) and returns the figure; none
calls ``plt.show()``, so a notebook shows it inline and a script can ``savefig`` it."""

from __future__ import annotations

from yolo9kit.plots.batch import show_batch  # noqa: F401
from yolo9kit.plots.memory import memory_breakdown, memory_vs_batch, vram_trace  # noqa: F401
from yolo9kit.plots.metrics import plot_confusion_matrix, plot_metric_curve, plot_pr_curve, plot_validation  # noqa: F401
from yolo9kit.plots.train import plot_results, plot_schedule  # noqa: F401
