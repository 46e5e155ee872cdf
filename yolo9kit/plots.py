"""Every plot of the kit in one place: those of ``yolo9kit.figure`` and, defined here, those of training runs
and memory. Each takes ``ax=None`` (or ``fig=None``) and returns the figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from yolo9kit.config.step import precision_name
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

__all__ = ["memory_breakdown", "memory_vs_batch", "plot_confusion_matrix", "plot_labels",
           "plot_metric_curve", "plot_pr_curve", "plot_results", "plot_schedule", "plot_validation", "show_batch"]

GIB = 1 << 30
_COLORS = {"weights": "#4c72b0", "gradients": "#55a868", "optimizer_state": "#c44e52", "ema": "#8172b2",
           "activations": "#ccb974", "loss_assigner": "#64b5cd", "workspace_other": "#8c8c8c"}
# a style and a marker per setting: two settings with the same memory (fp16, bf16) would draw one curve over the other
_STYLES = (("-", "s"), ("--", "^"), (":", "D"), ("-.", "v"))


def plot_results(results: Any, fig=None):
    """Losses, mAP, learning rates and throughput per epoch (2 x 2 axes) of a run folder, a results.csv path, a
    DataFrame or ``FitResult.results`` (list of dicts), into ``fig`` (cleared) or a new figure."""
    if isinstance(results, (str, Path)):
        results = read_results(results)
    return draw_results(results if isinstance(results, pd.DataFrame) else pd.DataFrame(list(results)), fig)


def plot_schedule(config: Any, batches_per_epoch: int, ax=None):
    """The LR of each group, and batches per optimizer step (twin axis), against the batch index, as ``fit`` uses
    them for a TrainConfig and ``len(train_loader)``."""
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


def memory_vs_batch(df, gpu: Any = None, ax=None, *, margin: float | None = None):
    """Peak memory (``device_bytes``) against batch size, a curve per ``setting`` of a ``memory.sweep`` DataFrame
    (estimated: lines, measured: points, out of memory: an x), under the capacity of ``gpu`` (default: the rows'
    card) and the budget line at ``1 - margin`` of it."""
    fig, ax = axes_for(ax, (7, 4.5))
    spec = resolve_gpu(gpu) if gpu is not None else None
    capacity = spec.total_bytes if spec is not None else None
    if capacity is None and "gpu_total_bytes" in df and df["gpu_total_bytes"].notna().any():
        capacity = int(df["gpu_total_bytes"].dropna().iloc[0])
    for k, setting in enumerate(list(dict.fromkeys(df["setting"])) if "setting" in df else [None]):
        color, (line, marker) = f"C{k % 10}", _STYLES[k % len(_STYLES)]
        part = df if setting is None else df[df["setting"] == setting]
        label = precision_name(setting) if setting else "peak"
        est = part[part["method"] == "estimated"].sort_values("batch_size")
        oom = part["oom"].fillna(False).astype(bool) if "oom" in part else pd.Series(False, index=part.index)
        meas = part[(part["method"] == "measured") & ~oom]
        if len(est):
            ax.plot(est["batch_size"], est["device_bytes"] / GIB, line, marker=marker, markersize=4, color=color,
                    markerfacecolor="none", label=f"{label} (estimated)")
        if len(meas):
            ax.plot(meas["batch_size"], meas["device_bytes"] / GIB, "o", color=color, label=f"{label} (measured)")
        if capacity and oom.any():
            ax.plot(part[oom]["batch_size"], [capacity / GIB] * int(oom.sum()), "x", color=color, markersize=9)
    if capacity:  # the capacity line, the out-of-memory region above it, a note where a curve leaves the plot
        ax.axhline(capacity / GIB, color="k", lw=1)
        # the card's capacity sets the scale: a curve far above it would flatten the part that matters
        top = min(max(ax.get_ylim()[1], capacity / GIB * 1.15), capacity / GIB * 1.35)
        ax.axhspan(capacity / GIB, top, color="#d62728", alpha=0.12,
                   label=f"out of memory ({spec.name if spec is not None else 'GPU'})")
        ax.set_ylim(0, top)
        if df["device_bytes"].max() / GIB > top:
            row = df.loc[df["device_bytes"].idxmax()]
            ax.text(0.98, 0.97, f"up to {row['device_bytes'] / GIB:.0f} GiB at batch {int(row['batch_size'])} (off "
                    "scale)", transform=ax.transAxes, ha="right", va="top", fontsize=8, color="#a00")
        if margin:
            ax.axhline(capacity * (1 - margin) / GIB, color="k", ls="--", lw=0.8, label=f"{1 - margin:.0%} budget")
    ax.set(xlabel="batch size (images per micro-step)", ylabel="device bytes (GiB)", xlim=(0, None))
    ax.set_title("device bytes of one training step against the batch size", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def memory_breakdown(reports, ax=None):
    """Stacked bars (GiB) of the breakdown of one ``MemoryReport`` or a list (a bar each), reserved peaks marked."""
    reports = reports if isinstance(reports, (list, tuple)) else [reports]
    fig, ax = axes_for(ax, (max(4.0, 1.1 * len(reports) + 3), 4.5))
    labels = [f"{r.model}\nb{r.batch_size} {precision_name(r.step.amp)}"
              f"{' ckpt' if r.step.activation_checkpointing else ''}\n{r.method}" for r in reports]
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
