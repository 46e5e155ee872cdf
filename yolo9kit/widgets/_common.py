"""Shared pieces of the widget front ends: the returned app object and figure-to-output plumbing.

Figures are rendered to PNG here and written straight into an ``ipywidgets.Output``'s ``outputs``
(one ``display_data`` entry). That works the same inside a kernel, in nbclient and in plain pytest
(no capture context, no ``clear_output`` flicker), and a test can compare the bytes before and after a
control changes.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class WidgetApp:
    """What every widget front end returns.

    Attributes:
        container: the top-level widget; display it (it is also the notebook cell's value via
            ``_repr_mimebundle_``, so ``app`` on the last line of a cell shows it).
        controls: name -> input widget (slider, dropdown, ...); set ``.value`` to drive the app.
        outputs: name -> output widget (``Output`` for figures, ``HTML`` for tables and text).
        update: recompute and redraw from the current control values (called on every change).
        figures: name -> the last matplotlib figure drawn, for tests and ``savefig``.
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


def figure_png(fig) -> bytes:
    """PNG bytes of a matplotlib figure (closed afterwards so the inline backend shows no extra copy)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.get_dpi(), bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def show_figure(output, fig) -> None:
    """Replace what ``output`` (an ``ipywidgets.Output``) shows with ``fig`` as a PNG image."""
    png = figure_png(fig)
    output.outputs = (
        {
            "output_type": "display_data",
            "data": {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": repr(fig)},
            "metadata": {},
        },
    )


def show_error(output, message: str) -> None:
    """Show a one-line error in ``output`` instead of a figure (a bad control combination must not crash)."""
    output.outputs = ({"output_type": "stream", "name": "stderr", "text": message + "\n"},)


def html_table(df, caption: str | None = None, float_format: str = "{:.3g}") -> str:
    """An HTML table of a DataFrame for an ``ipywidgets.HTML``."""
    head = f"<b>{html.escape(caption)}</b>" if caption else ""
    body = df.to_html(index=False, float_format=lambda v: float_format.format(v), border=0)
    return head + body


def output_png(output) -> bytes | None:
    """The PNG an ``Output`` currently shows (None when it shows none): what tests compare."""
    for item in output.outputs:
        data = item.get("data", {})
        if "image/png" in data:
            return base64.b64decode(data["image/png"])
    return None
