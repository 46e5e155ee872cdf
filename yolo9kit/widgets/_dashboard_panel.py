"""The training dashboard's panel: its widgets, the four plots, the table of finished epochs, the messages.

The figure is built outside pyplot (``yolo9kit.figure``): the dashboard redraws from fit's worker thread, and
pyplot's global figure registry is not safe there. Every series is drawn with markers so that the first batch
is already a visible point (a line needs two).
"""

from __future__ import annotations

import html
import os
import sys
from typing import TYPE_CHECKING, Any

from yolo9kit.files import format_bytes

if TYPE_CHECKING:
    from yolo9kit.widgets.dashboard import TrainDashboard

NO_VRAM = "VRAM is measured on CUDA only"
MAX_MESSAGES = 8  # message lines kept on screen; older ones stay in ``dash.messages``
_POINT = {"marker": "o", "ms": 3}
# Table columns, shortest names that stay clear; units are in the values (``8.2 s``, ``1.21 GiB``).
_COLUMNS = ("epoch", "box", "cls", "dfl", "P", "R", "mAP50", "mAP50-95", "img/s", "time", "peak VRAM", "peak RSS")


def draw_dashboard(dash: TrainDashboard):
    """A 2x2 figure: losses, learning rates, memory, images/s against the batch index (dotted: resumed)."""
    from matplotlib.ticker import MaxNLocator

    from yolo9kit.figure import InlineFigure

    fig = InlineFigure(figsize=(10, 5.6), layout="constrained")
    ax_loss, ax_lr, ax_mem, ax_speed = fig.subplots(2, 2).flat
    # The norm weights follow the weights' schedule (both warm up from 0): their line would hide under it.
    for ax, names, labels in (
        (ax_loss, ("box_loss", "cls_loss", "dfl_loss"), ("box", "cls", "dfl")),
        (ax_lr, ("lr_bias", "lr_weight"), ("biases", "weights")),
    ):
        for name, label in zip(names, labels):
            ax.plot(*_counted(dash.series(name)), label=label, ls="--" if name == "lr_bias" else "-", **_POINT)
        if dash.history:
            ax.legend(loc="best", fontsize="small")
    ax_loss.set_title("loss (running mean over the epoch)")
    ax_lr.set_title("learning rate")
    _draw_memory(ax_mem, dash)
    ax_speed.plot(*_counted(dash.series("images_per_s")), color="C3", **_POINT)
    ax_speed.set_title("images / s (since the epoch started)")
    for ax in (ax_loss, ax_lr, ax_mem, ax_speed):
        ax.set_xlabel("batch (counted from 1 across epochs)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        for ni in dash.resumes:
            ax.axvline(ni + 1, color="gray", ls=":", lw=1)
        if not dash.history:  # no ticks of an empty plot (matplotlib would number them -0.04 to 0.04)
            ax.set(xticks=[], yticks=[], xlim=(0, 1), ylim=(0, 1))
            ax.text(0.5, 0.5, "waiting for the first batch", ha="center", va="center", transform=ax.transAxes,
                    color="gray")
    fig.suptitle(dash.title)
    return fig


def _counted(series: tuple[list[int], list]) -> tuple[list[int], list]:
    """A series against the batch counted from 1 (``BatchRecord.ni`` is an index from 0)."""
    steps, values = series
    return [n + 1 for n in steps], values


def _draw_memory(ax, dash: TrainDashboard) -> None:
    what, x, y = dash.memory_series()
    unit, size = ("GiB", 1024**3) if y and max(y) >= 1024**3 else ("MiB", 1024**2)
    ax.plot([n + 1 for n in x], [v / size for v in y], color="C2", **_POINT)
    ax.set_title(f"{what} ({unit})")
    if dash.history and dash.series("peak_allocated")[0] == []:
        ax.text(0.02, 0.95, NO_VRAM, ha="left", va="top", transform=ax.transAxes, color="gray", fontsize="small")


def epoch_table(dash: TrainDashboard):
    """The finished epochs as a DataFrame of rounded numbers and readable units; columns never filled (the
    metrics of epochs that were not validated, VRAM off CUDA) are left out."""
    import pandas as pd

    epoch_of = {r.ni: r.epoch for r in dash.history}
    rows = []
    for r in dash.epochs:
        rss = [v for ni, v in dash.process_memory.items() if epoch_of.get(ni) == r.epoch]
        rows.append({
            "epoch": r.epoch + 1, "box": round(r.box_loss, 3), "cls": round(r.cls_loss, 3), "dfl": round(r.dfl_loss, 3),
            "P": _round(r.precision), "R": _round(r.recall), "mAP50": _round(r.map50),
            "mAP50-95": _round(r.map50_95), "img/s": round(r.images_per_s, 1), "time": format_seconds(r.epoch_s),
            "peak VRAM": None if r.peak_allocated is None else format_bytes(r.peak_allocated),
            "peak RSS": format_bytes(max(rss)) if rss and r.peak_allocated is None else None,
        })
    return pd.DataFrame(rows, columns=list(_COLUMNS)).dropna(axis=1, how="all")


def table_html(table) -> str:
    """The epoch table for the panel: small, as wide as its content, scrolling rather than cut off."""
    if not len(table):
        return ""
    body = table.to_html(index=False, border=0, na_rep="-", float_format=lambda v: f"{v:g}",
                         classes="yolo9kit-epochs")
    style = ("<style>.yolo9kit-epochs {font-size: 90%; width: auto; border-collapse: collapse}"
             ".yolo9kit-epochs th, .yolo9kit-epochs td {padding: 1px 10px; text-align: right}"
             ".yolo9kit-epochs thead th {border-bottom: 1px solid #999}</style>")
    note = ("finished epochs (counted from 1, as the progress bar and results.png count them; losses: means over "
            "the epoch; P, R, mAP: validation of the EMA)")
    return f"<div style='max-width:100%; overflow-x:auto'>{style}<div>{note}</div>{body}</div>"


def format_seconds(seconds: float) -> str:
    """``8.2 s``, ``3 min 05 s``, ``1 h 02 min`` for tables."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes} min {secs:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def process_memory_bytes() -> int | None:
    """Resident set size of this process in bytes (``/proc/self/statm``; elsewhere the peak from ``getrusage``);
    None where neither exists. What a CPU run has instead of VRAM."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB elsewhere


def messages_html(lines: list[str]) -> str:
    rows = []
    for line in lines:
        colour = "#b35c00" if line.startswith("warning: ") else "inherit"
        rows.append(f"<div style='color:{colour}; white-space:normal'>{html.escape(line)}</div>")
    return "<div style='font-size:90%'>" + "".join(rows) + "</div>"


def build_widgets(dash: TrainDashboard) -> dict[str, Any]:
    import ipywidgets as w

    stop = w.Button(description="stop", icon="stop", button_style="warning",
                    tooltip="stop after the current batch: fit saves last.pt and returns (interrupted=True)")
    resume = w.Button(description="resume", icon="play", button_style="success",
                      tooltip="continue the stopped run from its last.pt")
    stop.on_click(lambda _button: dash.request_stop())
    resume.on_click(lambda _button: dash.resume_in_background())
    parts = {"stop": stop, "resume": resume, "status": w.HTML(), "plot": w.Output(),
             "table": w.HTML(layout=w.Layout(width="100%")), "messages": w.HTML(layout=w.Layout(width="100%"))}
    parts["container"] = w.VBox([w.HBox([stop, resume, parts["status"]]), parts["plot"], parts["table"],
                                 parts["messages"]], layout=w.Layout(width="100%"))
    parts["messages"].value = messages_html(dash.messages[-MAX_MESSAGES:])
    return parts
