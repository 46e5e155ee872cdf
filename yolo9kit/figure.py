"""Matplotlib figures that a notebook shows inline without pyplot.

The result types (:class:`yolo9kit.detections.Prediction`) and the plots share this helper, so it sits below
both: a figure built here is not in pyplot's registry, so it is freed like any object, never shown twice, and
it renders itself as PNG when it is the last value of a notebook cell.
"""

from __future__ import annotations

import io

from matplotlib.figure import Figure

from yolo9kit.files import write_file

__all__ = ["InlineFigure", "axes_for", "new_figure", "save_figure"]


class InlineFigure(Figure):
    """A matplotlib Figure that Jupyter displays as PNG without pyplot (and so without a second copy)."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()


def save_figure(figure: Figure, path, dpi: int = 100):
    """Write ``figure`` to ``path`` (format from the suffix) through ``files.write_file``: whole or not at all.
    Not flushed to the disk like a checkpoint: a picture lost to a power cut is drawn again."""
    from pathlib import Path

    path = Path(path)
    return write_file(path, lambda tmp: figure.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".") or "png"),
                      needed=8 << 20, what=f"saving the picture {path}", durable=False)


def new_figure(figsize: tuple[float, float]) -> InlineFigure:
    """A figure outside pyplot's registry: it is freed like any object and never shown twice."""
    return InlineFigure(figsize=figsize, layout="tight")


def axes_for(ax, figsize: tuple[float, float]):
    """(figure, axes) to draw on: ``ax`` and its figure when given, else one axes on a new figure. The one
    convention of every plot of the kit: a plot takes ``ax=`` (or ``fig=`` when it lays out several axes),
    builds what it lacks with :func:`new_figure`, and returns the figure."""
    if ax is not None:
        return ax.figure, ax
    fig = new_figure(figsize)
    return fig, fig.add_subplot()
