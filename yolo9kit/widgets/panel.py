"""What the front ends return (``WidgetApp``) and show: a figure as one PNG ``display_data`` entry of an
``Output`` (the same in a kernel, in nbclient and in pytest), errors, HTML tables, the dashboard's plots."""

from __future__ import annotations

import base64
import html
import io
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from matplotlib.ticker import MaxNLocator

from yolo9kit.figure import InlineFigure

NO_VRAM = "VRAM is measured on CUDA only"
_POINT = {"marker": "o", "ms": 3}  # markers on every series: the first batch is already a visible point


@dataclass
class WidgetApp:
    """What every widget front end returns; a control's ``.value`` set from code redraws it."""

    container: Any  # the top-level widget: the app displays it
    controls: dict[str, Any]  # name -> input widget (slider, dropdown, ...)
    outputs: dict[str, Any]  # name -> ``Output`` (figures) or ``HTML`` (tables and text)
    update: Callable[[], None]  # recompute and redraw from the controls (called on every change)
    figures: dict[str, Any] = field(default_factory=dict)  # name -> the last figure drawn
    state: dict[str, Any] = field(default_factory=dict)  # name -> the last computed results

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
    if (pyplot := sys.modules.get("matplotlib.pyplot")) is not None:
        pyplot.close(fig)  # a pyplot figure would show a second copy under the cell
    png = base64.b64encode(buffer.getvalue()).decode("ascii")
    output.outputs = ({"output_type": "display_data", "data": {"image/png": png, "text/plain": repr(fig)},
                       "metadata": {}},)


def show_error(output, message: str) -> None:
    """Show a one-line error in ``output`` instead of a figure (a bad control combination must not crash)."""
    output.outputs = ({"output_type": "stream", "name": "stderr", "text": message + "\n"},)


def html_table(df, caption: str | None = None, float_format: str = "{:.3g}") -> str:
    """An HTML table of a DataFrame for an ``ipywidgets.HTML``, scrolling rather than cut off."""
    head = f"<b>{html.escape(caption)}</b>" if caption else ""
    body = df.to_html(index=False, float_format=lambda v: float_format.format(v), border=0, na_rep="-")
    return f"<div style='max-width:100%; overflow-x:auto'>{head}{body}</div>"


def output_png(output) -> bytes | None:
    """The PNG bytes an ``Output`` of a ``WidgetApp`` or of the dashboard shows, None when it shows none."""
    for item in output.outputs:
        if "image/png" in item.get("data", {}):
            return base64.b64decode(item["data"]["image/png"])
    return None


def draw_dashboard(dash) -> InlineFigure:
    """A ``TrainDashboard``'s losses, learning rates, memory and images/s against the batch counted from 1
    (dotted: where a resumed run starts), 2 x 2."""
    fig = InlineFigure(figsize=(10, 5.6), layout="constrained")  # outside pyplot: drawn in fit's thread
    what, x, y = dash.memory_series()
    unit, size = ("GiB", 1024**3) if y and max(y) >= 1024**3 else ("MiB", 1024**2)
    # the norm weights follow the weights' schedule (both warm up from 0): their line would hide under it
    panels = {"loss (running mean over the epoch)": [(n, *dash.series(f"{n}_loss")) for n in ("box", "cls", "dfl")],
              "learning rate": [("biases", *dash.series("lr_bias")), ("weights", *dash.series("lr_weight"))],
              f"{what} ({unit})": [("", x, [v / size for v in y])],
              "images / s (since the epoch started)": [("", *dash.series("images_per_s"))]}
    for (title, lines), ax, colour in zip(panels.items(), fig.subplots(2, 2).flat, (None, None, "C2", "C3")):
        for label, steps, values in lines:
            ax.plot([n + 1 for n in steps], values, label=label, ls="--" if label == "biases" else "-", color=colour,
                    **_POINT)
        if dash.history and len(lines) > 1:
            ax.legend(loc="best", fontsize="small")
        ax.set_title(title)
        ax.set_xlabel("batch (counted from 1 across epochs)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        for ni in dash.resumes:
            ax.axvline(ni + 1, color="gray", ls=":", lw=1)
        if not dash.history:  # no ticks of an empty plot (matplotlib would number them -0.04 to 0.04)
            ax.set(xticks=[], yticks=[], xlim=(0, 1), ylim=(0, 1))
            ax.text(0.5, 0.5, "waiting for the first batch", ha="center", va="center", transform=ax.transAxes,
                    color="gray")
    if dash.history and not dash.series("peak_allocated")[0]:
        fig.axes[2].text(0.02, 0.95, NO_VRAM, ha="left", va="top", transform=fig.axes[2].transAxes, color="gray",
                         fontsize="small")
    fig.suptitle(dash.title)
    return fig
