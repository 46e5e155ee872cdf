"""Memory plots: peak memory against batch size and the breakdown of a step.

Each function takes ``ax=None`` and returns the figure (``yolo9kit.figure.axes_for``: built without pyplot
when ``ax`` is None).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from yolo9kit.config.step import precision_name
from yolo9kit.figure import axes_for

__all__ = ["memory_breakdown", "memory_vs_batch"]

GIB = 1 << 30
_COLORS = {"weights": "#4c72b0", "gradients": "#55a868", "optimizer_state": "#c44e52", "ema": "#8172b2",
           "activations": "#ccb974", "loss_assigner": "#64b5cd", "workspace_other": "#8c8c8c"}


def memory_vs_batch(df, gpu: Any = None, ax=None, *, value: str = "device_bytes", margin: float | None = None):
    """Peak memory against batch size, one curve per ``setting`` (step) of a ``memory.sweep`` DataFrame.

    Estimated rows are drawn as lines, measured rows as points on the same colour, so measured points
    sit against predicted lines. ``gpu`` (a name, bytes or GPUSpec; default: the rows'
    ``gpu_total_bytes``) draws the capacity line and shades the out-of-memory region above it;
    ``margin`` also draws the budget line at ``(1 - margin)`` of it. Measured out-of-memory rows are
    marked with an x on the capacity line.

    Args:
        value: column to plot, "device_bytes" (reserved + context, what must fit), "peak_reserved"
            or "peak_allocated".
    """
    from yolo9kit.memory.gpus import resolve_gpu

    fig, ax = axes_for(ax, (7, 4.5))
    spec = resolve_gpu(gpu) if gpu is not None else None
    capacity = spec.total_bytes if spec is not None else _capacity(df)
    settings = list(dict.fromkeys(df["setting"])) if "setting" in df else [None]
    colors = [f"C{i % 10}" for i in range(len(settings))]
    # a style and a marker of its own per setting: two settings with the same memory (fp16 and bf16) would
    # otherwise draw one curve exactly over the other
    styles = [("-", "s"), ("--", "^"), (":", "D"), ("-.", "v")]
    for k, (setting, color) in enumerate(zip(settings, colors)):
        part = df if setting is None else df[df["setting"] == setting]
        label = precision_name(setting) if setting else "peak"
        est = part[part["method"] == "estimated"].sort_values("batch_size")
        oom_mask = part["oom"].fillna(False).astype(bool) if "oom" in part else False
        meas = part[(part["method"] == "measured") & ~oom_mask]
        line, marker = styles[k % len(styles)]
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
        name = spec.name if spec is not None else "GPU"
        ax.axhline(capacity / GIB, color="k", lw=1)
        # the card's capacity sets the scale: a curve far above it would flatten the part that matters
        top = min(max(ax.get_ylim()[1], capacity / GIB * 1.15), capacity / GIB * 1.35)
        ax.axhspan(capacity / GIB, top, color="#d62728", alpha=0.12, label=f"out of memory ({name})")
        ax.set_ylim(0, top)
        _note_clipped(ax, df, value, top)
        if margin:
            ax.axhline(capacity * (1 - margin) / GIB, color="k", ls="--", lw=0.8, label=f"{1 - margin:.0%} budget")
    ax.set_xlabel("batch size (images per micro-step)")
    ax.set_ylabel(f"{value.replace('_', ' ')} (GiB)")
    ax.set_title(f"{value.replace('_', ' ')} of one training step against the batch size", fontsize=10)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _note_clipped(ax, df, value: str, top_gib: float) -> None:
    """Say where a curve leaves the plot (its largest batch and memory) instead of stretching the axis."""
    values = df[value].dropna() / GIB if value in df else []
    if len(values) and values.max() > top_gib:
        row = df.loc[(df[value] / GIB).idxmax()]
        ax.text(0.98, 0.97, f"up to {row[value] / GIB:.0f} GiB at batch {int(row['batch_size'])} (off scale)",
                transform=ax.transAxes, ha="right", va="top", fontsize=8, color="#a00")


def _capacity(df) -> int | None:
    if "gpu_total_bytes" in df and df["gpu_total_bytes"].notna().any():
        return int(df["gpu_total_bytes"].dropna().iloc[0])
    return None


def memory_breakdown(reports, ax=None, *, labels: Sequence[str] | None = None):
    """Stacked bars of the breakdown of one ``MemoryReport`` or a list (one bar each), in GiB, with the
    reserved peak marked above each bar."""
    from yolo9kit.memory.tracer import CATEGORIES

    reports = reports if isinstance(reports, (list, tuple)) else [reports]
    fig, ax = axes_for(ax, (max(4.0, 1.1 * len(reports) + 3), 4.5))
    labels = list(labels) if labels is not None else \
        [f"{r.model}\nb{r.batch_size} {precision_name(r.step.amp)}{' ckpt' if r.step.activation_checkpointing else ''}"
         f"\n{r.method}"
         for r in reports]
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
