"""Widget front ends: setting a control's value redraws the outputs (no kernel, no browser).

ipywidgets run their observers synchronously in plain Python, so a test sets ``control.value`` and
checks that the figure (its title, its data) and the PNG in the ``Output`` widget changed.
"""

from __future__ import annotations

import importlib

import pytest

pytest.importorskip("ipywidgets")
matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")


def _has(module: str, *names: str) -> bool:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return False
    return all(hasattr(mod, n) for n in names)


def needs(module: str, *names: str):
    return pytest.mark.skipif(not _has(module, *names), reason=f"{module}.{'/'.join(names)} is not available yet")


# -- training dashboard ----------------------------------------------------------------------------

def _step(i: int, **extra) -> dict:
    return {"step": i, "epoch": 0, "box": 3.0 - 0.1 * i, "cls": 2.0, "dfl": 1.5, "lr": [0.01 * i, 0.01, 0.01],
            "memory_bytes": 1024**3 * (1 + i), "images_per_s": 10.0 + i, **extra}


def test_dashboard_records_steps_and_redraws_with_the_new_values():
    from yolo9kit.widgets import train_dashboard

    dash = train_dashboard("run", min_interval_s=0.0, show=False)
    dash.on_step(_step(1))
    first = dash.figure
    dash.on_step(_step(2))
    assert dash.redraws == 2 and dash.figure is not first
    ax_loss, ax_lr, ax_mem, ax_speed = dash.figure.axes
    box = [line for line in ax_loss.lines if line.get_label() == "box"][0]
    assert list(box.get_ydata()) == pytest.approx([2.9, 2.8])
    assert list(ax_lr.lines[0].get_ydata()) == pytest.approx([0.01, 0.02])  # first param group
    assert list(ax_mem.lines[0].get_ydata()) == pytest.approx([2.0, 3.0])  # GiB
    assert "step 2" in dash.figure._suptitle.get_text() and "12.0 img/s" in dash.status_text()


def test_dashboard_throttles_redraws_but_always_draws_at_epoch_end():
    from yolo9kit.widgets import train_dashboard

    dash = train_dashboard(min_interval_s=3600.0, show=False)
    for i in range(1, 6):
        dash.on_step(_step(i))
    assert dash.redraws == 1 and len(dash.history) == 5
    dash.on_epoch_end({"epoch": 0, "map50": 0.5})
    assert dash.redraws == 2 and "map50=0.5" in dash.status_html()
    assert len(dash.figure.axes[0].lines[0].get_xdata()) == 5


def test_dashboard_marks_series_the_trainer_did_not_report():
    from yolo9kit.widgets import train_dashboard

    dash = train_dashboard(min_interval_s=0.0, show=False)
    dash.on_step({"step": 1, "box": 1.0, "cls": 1.0, "dfl": 1.0, "lr": 0.01})  # CPU run: no VRAM
    texts = [t.get_text() for t in dash.figure.axes[2].texts]
    assert texts == ["not reported"]
    assert set(dash.callbacks) == {"on_step", "on_epoch_end"}


def test_output_png_round_trip():
    import ipywidgets as w
    import matplotlib.pyplot as plt

    from yolo9kit.widgets._common import output_png, show_figure

    out = w.Output()
    assert output_png(out) is None
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    show_figure(out, fig)
    png = output_png(out)
    assert png is not None and png.startswith(b"\x89PNG")
