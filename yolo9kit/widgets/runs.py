"""``runs_viewer()``: the runs table of a folder, and the chosen runs' curves side by side.

The viewer only draws: the table is ``yolo9kit.runs`` and the figure ``yolo9kit.plots.compare``.
"""

from __future__ import annotations

from pathlib import Path

import ipywidgets as w

from yolo9kit.experiments import runs
from yolo9kit.plots import compare
from yolo9kit.widgets.panel import WidgetApp, html_table, launch, show_error, show_figure

# the results.csv columns one can compare, as the viewer's dropdown names them
METRICS = {"mAP50-95": "metrics/mAP50-95", "mAP50": "metrics/mAP50", "precision": "metrics/precision",
           "recall": "metrics/recall", "box loss": "train/box_loss", "cls loss": "train/cls_loss",
           "dfl loss": "train/dfl_loss", "images/s": "images_per_s"}


def runs_viewer(root: str | Path = "runs", metric: str = "metrics/mAP50-95") -> WidgetApp:
    """Pick run folders under ``root`` and a metric; the table shows the chosen runs, the figure their curves.

    Args:
        root: the folder of run folders (as for ``yolo9kit.runs``). metric: the starting results.csv column.

    Returns:
        WidgetApp with controls ``runs`` (the chosen folders, at most the four newest to start with) and
        ``metric``; outputs ``table`` (HTML) and ``curves`` (the figure); ``state`` holds ``table`` (the whole
        runs table) and ``chosen`` (its chosen rows).
    """
    table = runs(root)
    label = next((k for k, v in METRICS.items() if v == metric), None)
    if label is None:
        raise ValueError(f"metric {metric!r}: one of {', '.join(METRICS.values())}")
    names = list(table["run"])
    controls = {
        "runs": w.SelectMultiple(options=names, value=tuple(names[:4]), rows=min(max(len(names), 2), 8),
                                 description="runs", layout=w.Layout(width="420px")),
        "metric": w.Dropdown(options=list(METRICS), value=label, description="metric"),
    }
    outputs = {"table": w.HTML(), "curves": w.Output()}

    def update() -> None:
        chosen = table[table["run"].isin(controls["runs"].value)]
        app.state.update(table=table, chosen=chosen)
        shown = chosen.drop(columns=["path"]).astype(object)
        outputs["table"].value = html_table(shown.where(shown.notna(), ""), float_format="{:.4g}")
        if chosen.empty:
            show_error(outputs["curves"], "choose one or more runs")
            return
        figure = compare(chosen, metric=METRICS[controls["metric"].value])
        app.figures["curves"] = figure
        show_figure(outputs["curves"], figure)

    container = w.VBox([w.HBox([controls["runs"], controls["metric"]]), outputs["table"], outputs["curves"]])
    app = WidgetApp(container, controls, outputs, update)
    return launch(app)
