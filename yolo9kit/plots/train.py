"""Plots of a training run (results.csv) and of the LR / momentum / accumulation schedule."""

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
