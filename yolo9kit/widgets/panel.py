"""What the front ends show and how: the ``WidgetApp`` they return, figures written into an ``Output`` as one PNG
``display_data`` entry (the same in a kernel, in nbclient and in pytest, comparable byte for byte), HTML
tables, and the training dashboard's panel (its figure, epoch table, messages and buttons)."""

from __future__ import annotations

import base64
import html
import io
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as w
import pandas as pd
from matplotlib.ticker import MaxNLocator

from yolo9kit.figure import InlineFigure
from yolo9kit.files import format_bytes

NO_VRAM = "VRAM is measured on CUDA only"
MAX_MESSAGES = 8  # message lines kept on screen; older ones stay in ``dash.messages``
_POINT = {"marker": "o", "ms": 3}  # markers on every series: the first batch is already a visible point
# Table columns, shortest names that stay clear; units are in the values (``8.2 s``, ``1.21 GiB``).
_COLUMNS = ("epoch", "box", "cls", "dfl", "P", "R", "mAP50", "mAP50-95", "img/s", "time", "peak VRAM", "peak RSS")


@dataclass
class WidgetApp:
    """What every widget front end returns.

    Attributes:
        container: the top-level widget; display it (or leave the app as the last value of a cell).
        controls: name -> input widget (slider, dropdown, ...); set ``.value`` to drive the app.
        outputs: name -> output widget (``Output`` for figures, ``HTML`` for tables and text).
        update: recompute and redraw from the current control values (called on every change).
        figures: name -> the last matplotlib figure drawn.
        state: name -> the last computed results (DataFrames, plans, predictions).
    """

    container: Any
    controls: dict[str, Any]
    outputs: dict[str, Any]
    update: Callable[[], None]
    figures: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)

    def _repr_mimebundle_(self, **kwargs):
        return self.container._repr_mimebundle_(**kwargs)


def launch(app: WidgetApp) -> WidgetApp:
    """Redraw ``app`` whenever one of its controls changes, draw it once, and return it."""
    for control in app.controls.values():
        control.observe(lambda change: app.update(), names="value")
    app.update()
    return app


def show_figure(output, fig) -> None:
    """Replace what ``output`` (an ``ipywidgets.Output``) shows with ``fig`` as a PNG image."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=fig.get_dpi(), bbox_inches="tight")
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close(fig)  # a pyplot figure would show a second copy under the cell
    png = base64.b64encode(buffer.getvalue()).decode("ascii")
    output.outputs = ({"output_type": "display_data", "data": {"image/png": png, "text/plain": repr(fig)},
                       "metadata": {}},)


def show_error(output, message: str) -> None:
    """Show a one-line error in ``output`` instead of a figure (a bad control combination must not crash)."""
    output.outputs = ({"output_type": "stream", "name": "stderr", "text": message + "\n"},)


def html_table(df, caption: str | None = None, float_format: str = "{:.3g}") -> str:
    """An HTML table of a DataFrame for an ``ipywidgets.HTML``."""
    head = f"<b>{html.escape(caption)}</b>" if caption else ""
    return head + df.to_html(index=False, float_format=lambda v: float_format.format(v), border=0)


def output_png(output) -> bytes | None:
    """The PNG an ``Output`` shows (None when it shows none).

    Args:
        output: an ``ipywidgets.Output`` of a ``WidgetApp`` or of the dashboard.

    Returns:
        The PNG bytes, or None.
    """
    for item in output.outputs:
        if "image/png" in item.get("data", {}):
            return base64.b64decode(item["data"]["image/png"])
    return None


def epoch_frame(dash) -> pd.DataFrame:
    """``dash.epoch_table()``: the finished epochs of a ``TrainDashboard``, rounded and in readable units;
    columns never filled (metrics of epochs not validated, VRAM off CUDA) are left out."""
    epoch_of = {r.ni: r.epoch for r in dash.history}
    rows = []
    for r in dash.epochs:
        rss = [v for ni, v in dash.process_memory.items() if epoch_of.get(ni) == r.epoch]
        rows.append({
            "epoch": r.epoch + 1, "box": round(r.box_loss, 3), "cls": round(r.cls_loss, 3),
            "dfl": round(r.dfl_loss, 3), "P": _round(r.precision), "R": _round(r.recall), "mAP50": _round(r.map50),
            "mAP50-95": _round(r.map50_95), "img/s": round(r.images_per_s, 1), "time": format_seconds(r.epoch_s),
            "peak VRAM": None if r.peak_allocated is None else format_bytes(r.peak_allocated),
            "peak RSS": format_bytes(max(rss)) if rss and r.peak_allocated is None else None,
        })
    return pd.DataFrame(rows, columns=list(_COLUMNS)).dropna(axis=1, how="all")


def draw_dashboard(dash) -> InlineFigure:
    """A ``TrainDashboard``'s losses, learning rates, memory and images/s against the batch counted from 1
    (dotted: where a resumed run starts), 2 x 2."""
    fig = InlineFigure(figsize=(10, 5.6), layout="constrained")  # outside pyplot: drawn in fit's thread
    ax_loss, ax_lr, ax_mem, ax_speed = fig.subplots(2, 2).flat
    # the norm weights follow the weights' schedule (both warm up from 0): their line would hide under it
    for ax, names, labels in ((ax_loss, ("box_loss", "cls_loss", "dfl_loss"), ("box", "cls", "dfl")),
                              (ax_lr, ("lr_bias", "lr_weight"), ("biases", "weights"))):
        for name, label in zip(names, labels):
            steps, values = dash.series(name)
            ax.plot([n + 1 for n in steps], values, label=label, ls="--" if name == "lr_bias" else "-", **_POINT)
        if dash.history:
            ax.legend(loc="best", fontsize="small")
    ax_loss.set_title("loss (running mean over the epoch)")
    ax_lr.set_title("learning rate")
    what, x, y = dash.memory_series()
    unit, size = ("GiB", 1024**3) if y and max(y) >= 1024**3 else ("MiB", 1024**2)
    ax_mem.plot([n + 1 for n in x], [v / size for v in y], color="C2", **_POINT)
    ax_mem.set_title(f"{what} ({unit})")
    if dash.history and dash.series("peak_allocated")[0] == []:
        ax_mem.text(0.02, 0.95, NO_VRAM, ha="left", va="top", transform=ax_mem.transAxes, color="gray",
                    fontsize="small")
    steps, values = dash.series("images_per_s")
    ax_speed.plot([n + 1 for n in steps], values, color="C3", **_POINT)
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


def table_html(table: pd.DataFrame) -> str:
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


def messages_html(lines: list[str]) -> str:
    rows = [f"<div style='color:{'#b35c00' if line.startswith('warning: ') else 'inherit'}; white-space:normal'>"
            f"{html.escape(line)}</div>" for line in lines]
    return "<div style='font-size:90%'>" + "".join(rows) + "</div>"


def build_panel(dash) -> dict[str, Any]:
    """The widgets of a ``TrainDashboard``'s panel by name, ``container`` holding them all."""
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
