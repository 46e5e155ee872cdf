"""Figures outside pyplot (shown inline as PNG, never twice), and those of what training and validation produce.
Every plot takes ``ax=None`` (or ``fig=None``), builds what it lacks and returns the figure."""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from yolo9kit.files import write_file
from yolo9kit.metrics import smooth

_MAX_LEGEND_CLASSES = 20
_METRICS = (("metrics/mAP50", "mAP50"), ("metrics/mAP50-95", "mAP50-95"), ("metrics/precision", "P"),
            ("metrics/recall", "R"))


class InlineFigure(Figure):
    """A matplotlib Figure that Jupyter displays as PNG without pyplot (and so without a second copy)."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()


def new_figure(figsize: tuple[float, float]) -> InlineFigure:
    """A figure outside pyplot's registry, laid out when drawn."""
    return InlineFigure(figsize=figsize, layout="tight")


def axes_for(ax, figsize: tuple[float, float]):
    """(figure, axes): ``ax`` and its figure, else one axes on a new figure of ``figsize``."""
    if ax is not None:
        return ax.figure, ax
    fig = new_figure(figsize)
    return fig, fig.add_subplot()


def save_figure(figure: Figure, path, dpi: int = 100) -> Path:
    """Write ``figure`` to ``path`` (format from the suffix), whole or not at all; returns the path."""
    path = Path(path)
    # not flushed to the disk like a checkpoint: a picture lost to a power cut is drawn again
    return write_file(path, lambda tmp: figure.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".") or "png"),
                      needed=8 << 20, what=f"saving the picture {path}", durable=False)


def _tight(fig):
    if fig.get_layout_engine() is None:  # a figure with its own layout (new_figure) lays out when drawn
        fig.tight_layout()
    return fig


def _class_name(names: Sequence[str] | dict[int, str] | None, c: int) -> str:
    if isinstance(names, dict):
        return str(names.get(c, c))
    return str(names[c]) if names is not None and c < len(names) else str(c)


def show_batch(batch, names: list[str] | dict[int, str] | None = None, max_images: int = 16, ax=None, fig=None,
               ncols: int | None = None, tile_inches: float = 3.0, title: str | None = None):
    """Draw the images of a loader batch (uint8 RGB or float in [0, 1]) with their boxes and class names (a list,
    a dict or None: the ids): a mosaic into ``ax``, else a grid of ``ncols`` axes on ``fig`` (None: a new one)."""
    images, targets = batch[0], batch[1]
    n = min(len(images), max_images)
    ncols = ncols or math.ceil(math.sqrt(n))
    nrows = math.ceil(n / ncols)
    mosaic = ax is not None  # one axes: the images laid out on a grid in data coordinates
    if mosaic:
        fig, axes = ax.figure, [ax] * (nrows * ncols)
    else:
        fig = fig if fig is not None else new_figure((ncols * tile_inches, nrows * tile_inches))
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    targets = np.asarray(targets.cpu() if hasattr(targets, "cpu") else targets, dtype=np.float64)
    colours = matplotlib.colormaps["tab10"]
    for i in range(n):
        image = np.asarray(images[i].detach().cpu() if hasattr(images[i], "detach") else images[i]).transpose(1, 2, 0)
        if image.dtype != np.uint8:
            image = (image.clip(0, 1) * 255).astype(np.uint8)
        h, w = image.shape[:2]
        x_off, y_off = ((i % ncols) * w, (i // ncols) * h) if mosaic else (0, 0)
        axes[i].imshow(image, extent=(x_off, x_off + w, y_off + h, y_off))
        for _, cls, cx, cy, bw, bh in targets[targets[:, 0] == i]:
            colour = colours(int(cls) % 10)
            x1, y1 = x_off + (cx - bw / 2) * w, y_off + (cy - bh / 2) * h
            axes[i].add_patch(Rectangle((x1, y1), bw * w, bh * h, fill=False, edgecolor=colour, linewidth=1.5))
            axes[i].text(x1, y1, _class_name(names, int(cls)), color="white", fontsize=7, va="bottom",
                         bbox={"facecolor": colour, "alpha": 0.8, "pad": 1, "edgecolor": "none"})
    for a in axes:
        a.set_axis_off()
    if mosaic:
        ax.set(xlim=(0, ncols * w), ylim=(nrows * h, 0))
    if title:
        fig.suptitle(title, fontsize=10)
    return _tight(fig)  # after the title: the grid makes room for it


def plot_labels(labels, names: list[str] | dict[int, str] | None = None, fig=None):
    """Boxes per class, box centres, box sizes, and the outlines of the first 1000 boxes about one centre (2 x 2)
    of normalised ``[class, cx, cy, w, h]`` rows (N, 5), or a list of them per image, into ``fig`` (cleared)."""
    if isinstance(labels, (list, tuple)):
        labels = np.concatenate([np.zeros((0, 5)), *(np.asarray(x, dtype=np.float64).reshape(-1, 5) for x in labels)])
    labels = np.asarray(labels, dtype=np.float64).reshape(-1, 5)
    classes = labels[:, 0].astype(int)
    nc = max(len(names or ()), int(classes.max()) + 1 if len(classes) else 0)
    fig = fig if fig is not None else new_figure((8, 8))
    fig.clear()
    axes = fig.subplots(2, 2)
    axes[0, 0].bar(range(nc), np.bincount(classes, minlength=nc), color=[f"C{c % 10}" for c in range(nc)])
    if 0 < nc <= 30:  # beyond that the tick labels overlap
        axes[0, 0].set_xticks(range(nc), [_class_name(names, c) for c in range(nc)], rotation=90 if nc > 8 else 0,
                              fontsize=8)
    axes[0, 0].set(title=f"boxes per class ({len(labels)} boxes)", ylabel="boxes")
    for ax, (i, j), title, xlabel, ylabel in ((axes[1, 0], (1, 2), "box centres", "x", "y"),
                                              (axes[1, 1], (3, 4), "box sizes", "width", "height")):
        ax.hist2d(labels[:, i], labels[:, j], bins=50, range=((0, 1), (0, 1)), cmap="Blues", cmin=1)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel, xlim=(0, 1), ylim=(0, 1), aspect="equal")
    axes[1, 0].invert_yaxis()  # image coordinates: y grows downwards
    for cls, _, _, w, h in labels[:1000]:
        axes[0, 1].add_patch(Rectangle((0.5 - w / 2, 0.5 - h / 2), w, h, fill=False, linewidth=0.5, alpha=0.5,
                                       edgecolor=f"C{int(cls) % 10}"))
    axes[0, 1].set(title="box outlines about one centre", xlim=(0, 1), ylim=(1, 0), aspect="equal", xticks=[],
                   yticks=[])
    return _tight(fig)


def draw_results(df: Any, fig=None):
    """Losses, validation metrics, learning rates and images/s per epoch (2 x 2 axes) of results.csv rows (a
    DataFrame, metrics NaN where not validated), into ``fig`` (cleared) or a new figure."""
    fig = fig if fig is not None else new_figure((10, 6))
    fig.clear()
    axes = fig.subplots(2, 2)
    x = df["epoch"] + 1
    for name in ("box", "cls", "dfl"):
        axes[0, 0].plot(x, df[f"train/{name}_loss"], marker=".", label=name)
    axes[0, 0].set(title="train loss", xlabel="epoch")
    for col, label in _METRICS:
        values = df[col].astype(float) if col in df else None  # None (not validated) -> NaN
        if values is not None and values.notna().any():
            axes[0, 1].plot(x, values, marker=".", label=label)
    axes[0, 1].set(title="validation (EMA)", xlabel="epoch", ylim=(0, 1))
    for i, label in enumerate(("bias", "weights", "norm weights")):
        axes[1, 0].plot(x, df[f"lr/pg{i}"], label=label)
    axes[1, 0].set(title="learning rate (end of epoch)", xlabel="epoch")
    axes[1, 1].plot(x, df["images_per_s"], marker=".")
    axes[1, 1].set(title="training images / s", xlabel="epoch")
    for ax in axes.flat:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
        if ax is not axes[1, 1] and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return _tight(fig)


def plot_confusion_matrix(matrix, names: Sequence[str] = (), normalize: bool = True, ax=None):
    """Heat map of a ``ConfusionMatrix`` (or its array), rows predicted, columns true, the last background;
    ``normalize``: each column divided by its sum (values < 0.005 left blank), as the official plot."""
    counts = np.asarray(getattr(matrix, "matrix", matrix), dtype=float)
    nc = counts.shape[0] - 1
    array = counts / (counts.sum(0, keepdims=True) + 1e-9) if normalize else counts.copy()
    array[array < 0.005] = np.nan
    fig, ax = axes_for(ax, (12, 9) if nc >= 10 else (7, 5.5))
    fig.colorbar(ax.imshow(np.ma.masked_invalid(array), cmap="Blues", vmin=0.0, vmax=1.0 if normalize else None), ax=ax)
    if 0 < len(names) < 99 and len(names) == nc:
        ticks = list(names) + ["background"]
        ax.set_xticks(range(nc + 1), ticks, rotation=90)
        ax.set_yticks(range(nc + 1), ticks)
    if nc < 30:
        for (i, j), value in np.ndenumerate(array):
            if np.isfinite(value):
                ax.text(j, i, f"{value:.2f}" if normalize else f"{value:g}", ha="center", va="center",
                        fontsize=8, color="white" if normalize and value > 0.5 else "black")
    ax.set(xlabel="True", ylabel="Predicted", title="Confusion Matrix" + (" (column-normalised)" if normalize else ""))
    return fig


def plot_pr_curve(ap_result, names: Sequence[str] = (), ax=None):
    """Precision-recall curve at IoU 0.5 per class and their mean, with mAP@0.5 in the legend; ``ap_result`` None
    (no true positive) draws empty axes that say so. ``names``: of every class, by class id."""
    _, ax = axes_for(ax, (9, 6))
    if ap_result is None:
        ax.text(0.5, 0.5, "no true positive at any confidence:\nno precision-recall curve (mAP 0)",
                ha="center", va="center", transform=ax.transAxes)
        return _curves(ax, "Recall", "Precision")
    ap = ap_result.ap[:, 0]
    return _curves(ax, "Recall", "Precision", ap_result.px, ap_result.pr_curve,
                   [f"{_class_name(names, int(c))} {a:.3f}" for c, a in zip(ap_result.classes, ap)],
                   ap_result.pr_curve.mean(0), f"all classes {ap.mean():.3f} mAP@0.5")


def plot_metric_curve(ap_result, metric: str = "f1", names: Sequence[str] = (), ax=None):
    """``metric`` ("f1", "p" or "r"; else ValueError) per class and their smoothed mean, best point marked."""
    ylabel = {"f1": "F1", "p": "Precision", "r": "Recall"}.get(metric)
    if ylabel is None:
        raise ValueError(f"metric must be one of 'f1', 'p', 'r', got {metric!r}")
    y, px = getattr(ap_result, f"{metric}_curve"), ap_result.px
    mean = smooth(y.mean(0), 0.05)
    best = int(mean.argmax())
    return _curves(axes_for(ax, (9, 6))[1], "Confidence", ylabel, px, y,
                   [_class_name(names, int(c)) for c in ap_result.classes], mean,
                   f"all classes {mean[best]:.2f} at {px[best]:.3f}")


def plot_validation(confusion, ap_result, names: Sequence[str] = ()) -> dict:
    """The official validation plots, {file name: figure}; ``ap_result`` None: no F1, P, R curves."""
    return {name: make() for name, make in validation_figure_makers(confusion, ap_result, names).items()}


def validation_figure_makers(confusion, ap_result, names: Sequence[str] = ()) -> dict:
    """What :func:`plot_validation` draws, an uncalled function per file name (one failing costs no other)."""
    makers = {"confusion_matrix.png": functools.partial(plot_confusion_matrix, confusion, names),
              "PR_curve.png": functools.partial(plot_pr_curve, ap_result, names)}
    for metric in ("f1", "p", "r") if ap_result is not None else ():
        makers[f"{metric.upper()}_curve.png"] = functools.partial(plot_metric_curve, ap_result, metric, names)
    return makers


def _curves(ax, xlabel: str, ylabel: str, px=None, curves=(), labels=(), mean=None, mean_label: str = ""):
    """A curve per class (grey and unlabelled when too many to name) and their ``mean`` (bold), on labelled axes."""
    if len(curves) <= _MAX_LEGEND_CLASSES:
        for label, curve in zip(labels, curves):
            ax.plot(px, curve, linewidth=1, label=label)
    else:
        ax.plot(px, curves.T, linewidth=1, color="grey")
    if mean is not None:
        ax.plot(px, mean, linewidth=3, color="blue", label=mean_label)
    ax.set(xlabel=xlabel, ylabel=ylabel, xlim=(0, 1), ylim=(0, 1), title=f"{ylabel}-{xlabel} Curve")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(bbox_to_anchor=(1.04, 1), loc="upper left")
    return ax.figure
