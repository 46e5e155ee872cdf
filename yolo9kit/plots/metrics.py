"""Validation plots: confusion matrix, precision-recall curve, metric-vs-confidence curves.

Each function takes ``ax=None`` and returns the matplotlib figure (a new one when ``ax`` is None,
built without pyplot so nothing is shown twice or kept alive by a global figure manager; it renders
itself as PNG when it is the last value of a notebook cell).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from yolo9kit.figure import axes_for

__all__ = ["plot_confusion_matrix", "plot_metric_curve", "plot_pr_curve", "plot_validation", "validation_figure_makers"]

_MAX_LEGEND_CLASSES = 20  # beyond this, per-class curves are grey and unlabelled


def _smooth(y: np.ndarray, fraction: float = 0.05) -> np.ndarray:
    from yolo9kit.metrics import smooth

    return smooth(y, fraction)


def plot_confusion_matrix(matrix, names: Sequence[str] = (), normalize: bool = True, ax=None):
    """Heat map of a (nc+1, nc+1) confusion matrix (rows predicted, columns true, last = background).

    Args:
        matrix: a :class:`yolo9kit.metrics.ConfusionMatrix` or its ``.matrix`` array.
        names: class names; used as tick labels when there are fewer than 99 and they match nc.
        normalize: divide each column by its sum (values < 0.005 left blank), as the official plot.
        ax: axes to draw on.

    Returns:
        The figure.
    """
    counts = np.asarray(getattr(matrix, "matrix", matrix), dtype=float)
    nc = counts.shape[0] - 1
    array = counts / (counts.sum(0, keepdims=True) + 1e-9) if normalize else counts.copy()
    array[array < 0.005] = np.nan
    fig, ax = axes_for(ax, (12, 9) if nc >= 10 else (7, 5.5))
    image = ax.imshow(np.ma.masked_invalid(array), cmap="Blues", vmin=0.0, vmax=1.0 if normalize else None)
    fig.colorbar(image, ax=ax)
    ticks = list(names) + ["background"] if 0 < len(names) < 99 and len(names) == nc else None
    if ticks is not None:
        ax.set_xticks(range(nc + 1), ticks, rotation=90)
        ax.set_yticks(range(nc + 1), ticks)
    if nc < 30:
        for (i, j), value in np.ndenumerate(array):
            if np.isfinite(value):
                ax.text(j, i, f"{value:.2f}" if normalize else f"{value:g}", ha="center", va="center",
                        fontsize=8, color="white" if normalize and value > 0.5 else "black")
    ax.set_xlabel("True")
    ax.set_ylabel("Predicted")
    ax.set_title("Confusion Matrix" + (" (column-normalised)" if normalize else ""))
    return fig


def plot_pr_curve(ap_result, names: Sequence[str] = (), ax=None):
    """Precision-recall curve at IoU 0.5 per class and their mean, with mAP@0.5 in the legend.

    Args:
        ap_result: :class:`yolo9kit.metrics.APResult`; None (a validation without any true positive) draws
            the empty axes with that said in the middle, so the figure a notebook promises is always there.
        names: names of ``ap_result.classes`` in order (or of every class, indexed by class id).
        ax: axes to draw on.
    """
    fig, ax = axes_for(ax, (9, 6))
    if ap_result is None:
        ax.text(0.5, 0.5, "no true positive at any confidence:\nno precision-recall curve (mAP 0)",
                ha="center", va="center", transform=ax.transAxes)
        _finish(ax, "Recall", "Precision", "Precision-Recall Curve")
        return fig
    px, curves, ap = ap_result.px, ap_result.pr_curve, ap_result.ap
    labels = _class_labels(ap_result, names)
    if 0 < len(curves) <= _MAX_LEGEND_CLASSES:
        for label, curve, ap_class in zip(labels, curves, ap[:, 0]):
            ax.plot(px, curve, linewidth=1, label=f"{label} {ap_class:.3f}")
    elif len(curves):
        ax.plot(px, curves.T, linewidth=1, color="grey")
    if len(curves):
        ax.plot(px, curves.mean(0), linewidth=3, color="blue", label=f"all classes {ap[:, 0].mean():.3f} mAP@0.5")
    _finish(ax, "Recall", "Precision", "Precision-Recall Curve")
    return fig


def plot_metric_curve(ap_result, metric: str = "f1", names: Sequence[str] = (), ax=None):
    """A metric against confidence per class, and the smoothed class mean with its best point.

    Args:
        ap_result: :class:`yolo9kit.metrics.APResult`.
        metric: ``"f1"``, ``"p"`` (precision) or ``"r"`` (recall).
        names: class names (see :func:`plot_pr_curve`).
        ax: axes to draw on.
    """
    curves = {"f1": ap_result.f1_curve, "p": ap_result.p_curve, "r": ap_result.r_curve}
    if metric not in curves:
        raise ValueError(f"metric must be one of 'f1', 'p', 'r', got {metric!r}")
    ylabel = {"f1": "F1", "p": "Precision", "r": "Recall"}[metric]
    fig, ax = axes_for(ax, (9, 6))
    px, y = ap_result.px, curves[metric]
    if 0 < len(y) <= _MAX_LEGEND_CLASSES:
        for label, curve in zip(_class_labels(ap_result, names), y):
            ax.plot(px, curve, linewidth=1, label=str(label))
    elif len(y):
        ax.plot(px, y.T, linewidth=1, color="grey")
    if len(y):
        mean = _smooth(y.mean(0), 0.05)
        best = int(mean.argmax())
        ax.plot(px, mean, linewidth=3, color="blue", label=f"all classes {mean[best]:.2f} at {px[best]:.3f}")
    _finish(ax, "Confidence", ylabel, f"{ylabel}-Confidence Curve")
    return fig


def plot_validation(confusion, ap_result, names: Sequence[str] = ()) -> dict:
    """The five official validation plots as a dict of figures keyed by their official file names.

    Without any true positive (``ap_result`` None) the confusion matrix and an empty PR curve saying so; the
    F1, P and R curves are left out (there is nothing to draw against confidence).
    """
    return {name: make() for name, make in validation_figure_makers(confusion, ap_result, names).items()}


def validation_figure_makers(confusion, ap_result, names: Sequence[str] = ()) -> dict:
    """What :func:`plot_validation` draws, one function per file name, not called yet: a caller that must not
    fail on one picture (a training run's folder) draws and saves them one by one."""
    makers = {"confusion_matrix.png": functools.partial(plot_confusion_matrix, confusion, names),
              "PR_curve.png": functools.partial(plot_pr_curve, ap_result, names)}
    if ap_result is not None:
        for metric, stem in (("f1", "F1"), ("p", "P"), ("r", "R")):
            makers[f"{stem}_curve.png"] = functools.partial(plot_metric_curve, ap_result, metric, names)
    return makers


def _class_labels(ap_result, names: Sequence[str]) -> list[str]:
    classes = [int(c) for c in ap_result.classes]
    names = list(names)
    if names and max(classes, default=-1) < len(names):
        return [names[c] for c in classes]
    return [str(c) for c in classes]


def _finish(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(bbox_to_anchor=(1.04, 1), loc="upper left")
