"""Every plot of the kit in one place: the figures of batches, labels and validation (``yolo9kit.figure``) and,
defined here, those of training runs and memory. Each takes ``ax=None`` (or ``fig=None``) and returns the
figure, which a notebook shows as the value of a cell and a script saves."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from yolo9kit.config.step import precision_name
from yolo9kit.experiments import differing_settings
from yolo9kit.experiments import runs as runs_table
from yolo9kit.figure import (
    axes_for,
    draw_results,
    plot_confusion_matrix,
    plot_labels,
    plot_metric_curve,
    plot_pr_curve,
    plot_validation,
    show_batch,
)
from yolo9kit.memory import CATEGORIES, resolve_gpu
from yolo9kit.train.optim import step_settings, warmup_batches
from yolo9kit.train.records import read_results

__all__ = ["compare", "memory_breakdown", "memory_vs_batch", "plot_confusion_matrix", "plot_labels",
           "plot_metric_curve", "plot_pr_curve", "plot_results", "plot_schedule", "plot_validation", "show_batch"]

GIB = 1 << 30
_COLORS = {"weights": "#4c72b0", "gradients": "#55a868", "optimizer_state": "#c44e52", "ema": "#8172b2",
           "activations": "#ccb974", "loss_assigner": "#64b5cd", "workspace_other": "#8c8c8c"}
# a style and a marker per setting: two settings with the same memory (fp16, bf16) would draw one curve over the other
_STYLES = (("-", "s"), ("--", "^"), (":", "D"), ("-.", "v"))


def plot_results(results: Any, fig=None):
    """Losses, mAP, learning rates and throughput per epoch (2 x 2 axes).

    Args:
        results: a run folder, a results.csv path, a DataFrame, or ``FitResult.results`` (list of dicts).
        fig: a figure to draw into (cleared), or None for a new one.
    """
    if isinstance(results, (str, Path)):
        df = read_results(results)
    else:
        df = results if isinstance(results, pd.DataFrame) else pd.DataFrame(list(results))
    return draw_results(df, fig)


def compare(runs: Any, metric: str = "metrics/mAP50-95", ax=None):
    """The chosen runs' curves of ``metric`` against the epoch (from 1) on shared axes, each labelled by the
    settings that differ between them (by its folder when none differ).

    Args:
        runs: rows of a ``yolo9kit.runs()`` table, or run folders.
        metric: a results.csv column (``metrics/mAP50``, ``train/box_loss``, ``images_per_s``, ...).
        ax: axes to draw into, or None for a new figure.

    Returns:
        The figure; a run without that column or without rows is "(no data)" in the legend.

    Raises:
        ValueError: no runs.
    """
    table = runs if isinstance(runs, pd.DataFrame) else runs_table(list(runs))
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
    """LR of each group, and batches per optimizer step (twin axis), against the batch index, as ``fit`` uses them.

    Args:
        config: a TrainConfig.
        batches_per_epoch: loader batches per epoch (``len(train_loader)``).
        ax: axes for the learning rates, or None.
    """
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


def memory_vs_batch(df, gpu: Any = None, ax=None, *, value: str = "device_bytes", margin: float | None = None):
    """Peak memory against batch size, one curve per ``setting`` of a ``memory.sweep`` DataFrame: estimated rows
    as lines, measured rows as points, measured out-of-memory rows as an x on the capacity line.

    Args:
        df: the sweep's rows.
        gpu: a name, bytes or GPUSpec whose capacity line and out-of-memory region are drawn (default: the
            rows' ``gpu_total_bytes``).
        ax: axes to draw on.
        value: the column, "device_bytes" (reserved + context, what must fit), "peak_reserved" or "peak_allocated".
        margin: also draw the budget line at ``(1 - margin)`` of the capacity.
    """
    fig, ax = axes_for(ax, (7, 4.5))
    spec = resolve_gpu(gpu) if gpu is not None else None
    capacity = spec.total_bytes if spec is not None else _capacity(df)
    settings = list(dict.fromkeys(df["setting"])) if "setting" in df else [None]
    for k, setting in enumerate(settings):
        color, (line, marker) = f"C{k % 10}", _STYLES[k % len(_STYLES)]
        part = df if setting is None else df[df["setting"] == setting]
        label = precision_name(setting) if setting else "peak"
        est = part[part["method"] == "estimated"].sort_values("batch_size")
        oom_mask = part["oom"].fillna(False).astype(bool) if "oom" in part else False
        meas = part[(part["method"] == "measured") & ~oom_mask]
        if len(est):
            ax.plot(est["batch_size"], est[value] / GIB, line, marker=marker, markersize=4, color=color,
                    markerfacecolor="none", label=f"{label} (estimated)")
        if len(meas):
            ax.plot(meas["batch_size"], meas[value] / GIB, "o", color=color, label=f"{label} (measured)")
        if "oom" in part and capacity:
            oom = part[part["oom"].astype(bool)]
            if len(oom):
                ax.plot(oom["batch_size"], [capacity / GIB] * len(oom), "x", color=color, markersize=9)
    if capacity:
        _draw_capacity(ax, df, value, capacity, spec.name if spec is not None else "GPU", margin)
    title = value.replace("_", " ")
    ax.set(xlabel="batch size (images per micro-step)", ylabel=f"{title} (GiB)")
    ax.set_title(f"{title} of one training step against the batch size", fontsize=10)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _draw_capacity(ax, df, value: str, capacity: int, name: str, margin: float | None) -> None:
    """The capacity line, the out-of-memory region above it, and a note where a curve leaves the plot."""
    ax.axhline(capacity / GIB, color="k", lw=1)
    # the card's capacity sets the scale: a curve far above it would flatten the part that matters
    top = min(max(ax.get_ylim()[1], capacity / GIB * 1.15), capacity / GIB * 1.35)
    ax.axhspan(capacity / GIB, top, color="#d62728", alpha=0.12, label=f"out of memory ({name})")
    ax.set_ylim(0, top)
    values = df[value].dropna() / GIB if value in df else []
    if len(values) and values.max() > top:
        row = df.loc[(df[value] / GIB).idxmax()]
        ax.text(0.98, 0.97, f"up to {row[value] / GIB:.0f} GiB at batch {int(row['batch_size'])} (off scale)",
                transform=ax.transAxes, ha="right", va="top", fontsize=8, color="#a00")
    if margin:
        ax.axhline(capacity * (1 - margin) / GIB, color="k", ls="--", lw=0.8, label=f"{1 - margin:.0%} budget")


def _capacity(df) -> int | None:
    if "gpu_total_bytes" in df and df["gpu_total_bytes"].notna().any():
        return int(df["gpu_total_bytes"].dropna().iloc[0])
    return None


def memory_breakdown(reports, ax=None, *, labels: Sequence[str] | None = None):
    """Stacked bars of the breakdown of one ``MemoryReport`` or a list (one bar each), in GiB, with the
    reserved peak marked above each bar.

    Args:
        reports: a ``MemoryReport`` or a list of them.
        ax: axes to draw on.
        labels: a label per bar (default: model, batch, precision, checkpointing and method).
    """
    reports = reports if isinstance(reports, (list, tuple)) else [reports]
    fig, ax = axes_for(ax, (max(4.0, 1.1 * len(reports) + 3), 4.5))
    labels = list(labels) if labels is not None else \
        [f"{r.model}\nb{r.batch_size} {precision_name(r.step.amp)}{' ckpt' if r.step.activation_checkpointing else ''}"
         f"\n{r.method}" for r in reports]
    x = list(range(len(reports)))
    bottom = [0.0] * len(reports)
    for cat in CATEGORIES:
        heights = [r.breakdown[cat] / GIB for r in reports]
        ax.bar(x, heights, bottom=bottom, color=_COLORS[cat], label=cat.replace("_", " "), width=0.6)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.hlines([r.peak_reserved / GIB for r in reports], [i - 0.3 for i in x], [i + 0.3 for i in x], color="k", lw=2,
              label="reserved peak")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("GiB at the peak")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return fig
