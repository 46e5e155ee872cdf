"""Plots of a training run (results.csv), of several runs side by side, and of the LR / momentum / accumulation
schedule."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_results(results: Any, fig=None):
    """Losses, mAP, learning rates and throughput per epoch.

    Args:
        results: a run folder, a results.csv path, a DataFrame, or ``FitResult.results`` (list of dicts).
        fig: a matplotlib figure to draw into (cleared), or None for a new one.

    Returns:
        The figure (2 x 2 axes).
    """
    import pandas as pd

    from yolo9kit.plots.results import draw_results

    if isinstance(results, (str, Path)):
        from yolo9kit.train.records import read_results

        df = read_results(results)
    else:
        df = results if isinstance(results, pd.DataFrame) else pd.DataFrame(list(results))
    return draw_results(df, fig)


def compare(runs: Any, metric: str = "metrics/mAP50-95", ax=None):
    """The chosen runs' curves of ``metric`` against the epoch (counted from 1), on shared axes, each labelled by
    the settings that differ between them (by its folder when none differ).

    Args:
        runs: rows of a ``yolo9kit.runs()`` table, or run folders (what ``runs`` takes).
        metric: a results.csv column: ``metrics/mAP50-95`` (default), ``metrics/mAP50``, ``train/box_loss``,
            ``images_per_s``, ...
        ax: axes to draw into, or None for a new figure.

    Returns:
        The figure. A run without that column, or without rows, is named in the legend as "(no data)".
    """
    import pandas as pd

    from yolo9kit.experiments import differing_settings
    from yolo9kit.experiments import runs as table_of
    from yolo9kit.figure import axes_for
    from yolo9kit.train.records import read_results

    table = runs if isinstance(runs, pd.DataFrame) else table_of(list(runs))
    if table.empty:
        raise ValueError("compare: no runs to draw")
    differ = differing_settings(table)
    _, ax = axes_for(ax, (7, 4))
    for _, row in table.iterrows():
        label = ", ".join(f"{name}={row[name]}" for name in differ) or str(row["run"])
        try:
            df = read_results(row["path"])
            ax.plot(df["epoch"] + 1, df[metric], marker="o", markersize=3, label=label)
        except (OSError, KeyError, ValueError, pd.errors.ParserError):
            ax.plot([], [], label=f"{label} (no data)")
    ax.set(xlabel="epoch", ylabel=metric, title=f"{metric}, {len(table)} runs")
    ax.legend(fontsize=8)
    return ax.figure


def plot_schedule(config: Any, batches_per_epoch: int, ax=None):
    """LR of each group, momentum and batches per optimizer step against the batch index, as ``fit`` uses them.

    Args:
        config: a TrainConfig.
        batches_per_epoch: loader batches per epoch (``len(train_loader)``).
        ax: axes for the learning rates (a twin axis shows accumulate), or None.

    Returns:
        The figure.
    """
    from yolo9kit.figure import axes_for
    from yolo9kit.train.optim import step_settings, warmup_batches

    nw = warmup_batches(config, batches_per_epoch)
    steps = range(config.epochs * batches_per_epoch)
    settings = [step_settings(config, ni, ni // batches_per_epoch, nw) for ni in steps]
    _, ax = axes_for(ax, (8, 4))
    for i, label in enumerate(("lr bias", "lr weights/norm")):
        ax.plot(list(steps), [s.lrs[i] for s in settings], label=label)
    ax.axvline(nw, color="grey", linestyle=":", label=f"end of warmup ({nw})")
    ax.set(xlabel="batch (ni)", ylabel="learning rate", title=f"{config.optim.schedule} schedule")
    twin = ax.twinx()
    twin.step(list(steps), [s.accumulate for s in settings], color="tab:red", where="post", label="accumulate")
    twin.set_ylabel("batches per optimizer step", color="tab:red")
    ax.legend(loc="upper right", fontsize=8)
    return ax.figure
