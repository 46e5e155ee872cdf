"""The curves of a training run from its results.csv rows: losses, validation metrics, learning rates and
throughput per epoch.

Drawn from rows already in memory (a DataFrame), with no import of the training package: ``fit`` redraws
``results.png`` after every epoch through this module, and ``yolo9kit.plots.train.plot_results`` (which also
reads a run folder or a CSV file) draws with it too.
"""

from __future__ import annotations

from typing import Any

__all__ = ["draw_results"]

_METRICS = (("metrics/mAP50", "mAP50"), ("metrics/mAP50-95", "mAP50-95"), ("metrics/precision", "P"),
            ("metrics/recall", "R"))


def draw_results(df: Any, fig=None):
    """Losses, mAP, learning rates and images/s per epoch (2 x 2 axes).

    Args:
        df: a DataFrame with the results.csv columns (``yolo9kit.train.records.RESULTS_COLUMNS``), one row
            per epoch; epochs without validation hold NaN metrics and are left out of those curves.
        fig: a matplotlib figure to draw into (cleared), or None for a new one outside pyplot (rendered with
            Agg when saved, so it is safe in a worker thread and needs no display).

    Returns:
        The figure.
    """
    from matplotlib.ticker import MaxNLocator

    if fig is None:
        from yolo9kit.figure import new_figure

        fig = new_figure((10, 6))
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
    if fig.get_layout_engine() is None:  # a figure with its own layout (new_figure) lays out when drawn
        fig.tight_layout()
    return fig
