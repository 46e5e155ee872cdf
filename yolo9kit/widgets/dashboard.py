"""``train_dashboard()``: live training plots for ``yolo9kit.train.fit``.

The dashboard is a callback object: ``TrainConfig(callbacks=dash.callbacks)``. Each optimizer step it
records the losses, the learning rate, the peak VRAM and the throughput, and redraws one figure in
place through a display handle (``display(..., display_id=True)`` then ``handle.update(...)``): one
image in the cell, no ``clear_output`` flicker, nothing left over when the notebook is saved.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from yolo9kit.widgets._common import figure_png, format_bytes

# The trainer's metric names, with the older/alternative spellings accepted for each series.
_SERIES: dict[str, tuple[str, ...]] = {
    "box": ("box_loss", "box", "train/box_loss"),
    "cls": ("cls_loss", "cls", "train/cls_loss"),
    "dfl": ("dfl_loss", "dfl", "train/dfl_loss"),
    "accumulate": ("accumulate",),
    "lr": ("lr", "lr0", "learning_rate"),
    "memory_bytes": ("memory_bytes", "vram_bytes", "max_memory_allocated", "peak_memory_bytes", "gpu_mem_bytes"),
    "images_per_s": ("images_per_s", "img_per_s", "throughput", "images_per_second"),
}
# x axis: the integrated batch index (``ni``); "step" (optimizer updates) repeats while accumulating.
_EPOCH_COLUMNS = ("epoch", "train/box_loss", "train/cls_loss", "train/dfl_loss", "metrics/precision",
                  "metrics/recall", "metrics/mAP50", "metrics/mAP50-95", "images_per_s", "epoch_s", "map50")
_STEP_KEYS = ("ni", "global_step", "iteration", "step")


def _pick(metrics: Mapping[str, Any], names: tuple[str, ...]) -> float | None:
    for name in names:
        value = metrics.get(name)
        if value is None:
            continue
        if isinstance(value, (list, tuple)):  # e.g. one learning rate per parameter group: show the first
            value = value[0] if value else None
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return None


@dataclass
class TrainDashboard:
    """Live plots of a training run; pass ``dash.callbacks`` to ``TrainConfig(callbacks=...)``.

    Attributes:
        history: one dict per loader batch: ``step`` (the integrated batch index ``ni``), ``epoch`` and
            the series in ``_SERIES`` that the trainer reported (running mean losses, learning rate,
            batches per optimizer step, VRAM in bytes, images per second).
        epochs: one dict per finished epoch as the trainer reported it (the results.csv row).
        min_interval_s: redraw at most this often (drawing costs ~0.1 s); the last step is always drawn
            by ``on_epoch_end``.
        interrupt_at: raise ``KeyboardInterrupt`` once this batch index is reached, exactly what the
            notebook's stop button (Kernel > Interrupt) does; ``fit`` then saves last.pt and returns
            with ``interrupted=True``. Used to demonstrate stop-and-resume; None never interrupts.
    """

    title: str = "training"
    min_interval_s: float = 1.0
    interrupt_at: int | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    resumes: list[float] = field(default_factory=list)  # batch indices where a resumed run started
    epochs: list[dict[str, Any]] = field(default_factory=list)
    figure: Any = None
    redraws: int = 0
    _handle: Any = None
    _text_handle: Any = None
    _last_draw: float = float("-inf")

    @property
    def callbacks(self) -> dict[str, Any]:
        return {"on_step": self.on_step, "on_epoch_end": self.on_epoch_end}

    # -- callbacks -------------------------------------------------------------------------------
    def on_step(self, metrics: Mapping[str, Any]) -> None:
        index = _pick(metrics, _STEP_KEYS)
        row: dict[str, float] = {"step": float(len(self.history) if index is None else index)}
        epoch = _pick(metrics, ("epoch",))
        if epoch is not None:
            row["epoch"] = epoch
        for name, aliases in _SERIES.items():
            value = _pick(metrics, aliases)
            if value is not None and not (name == "memory_bytes" and value <= 0):  # 0: no GPU to measure
                row[name] = value
        lrs = metrics.get("lr")
        if isinstance(lrs, (list, tuple)) and len(lrs) == 3:  # official groups: biases, weights, norm weights
            row["lr_bias"], row["lr"] = float(lrs[0]), float(lrs[1])
        if self.history and row["step"] <= self.history[-1]["step"]:
            self.resumes.append(row["step"])  # a resumed run repeats the unfinished accumulation window
        self.history.append(row)
        if self.interrupt_at is not None and row["step"] >= self.interrupt_at:
            self.interrupt_at = None  # once: the resumed run must not stop again
            self.update()
            raise KeyboardInterrupt(f"dashboard: stop requested at batch {int(row['step'])}")
        if time.monotonic() - self._last_draw >= self.min_interval_s:
            self.update()

    def on_epoch_end(self, metrics: Mapping[str, Any]) -> None:
        self.epochs.append(dict(metrics))
        self.update()

    # -- drawing ---------------------------------------------------------------------------------
    def show(self) -> TrainDashboard:
        """Put the (empty) figure and the status line in the notebook cell; later draws update them."""
        from IPython.display import HTML, display

        self._handle = display({"text/plain": "waiting for the first step"}, raw=True, display_id=True)
        self._text_handle = display(HTML(self.status_html()), display_id=True)
        return self

    def update(self) -> None:
        """Redraw the figure from ``history`` and push it to the display handle (if shown)."""
        self._last_draw = time.monotonic()
        self.figure = self.draw()
        self.redraws += 1
        if self._handle is not None:
            self._handle.update({"image/png": figure_png(self.figure), "text/plain": self.status_text()}, raw=True)
        else:
            import matplotlib.pyplot as plt

            plt.close(self.figure)
        if self._text_handle is not None:
            from IPython.display import HTML

            self._text_handle.update(HTML(self.status_html()))

    def series(self, name: str) -> tuple[list[float], list[float]]:
        """(steps, values) of one series in step order; a step seen twice (resume) keeps its latest value."""
        points = {r["step"]: r[name] for r in self.history if name in r}
        steps = sorted(points)
        return steps, [points[k] for k in steps]

    def draw(self):
        """A 2x2 figure: losses, learning rates, VRAM, images/s against the batch index (dotted: resumed)."""
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(2, 2, figsize=(10, 6), constrained_layout=True)
        ax_loss, ax_lr, ax_mem, ax_speed = axes.flat
        for name in ("box", "cls", "dfl"):
            x, y = self.series(name)
            if x:
                ax_loss.plot(x, y, label=name)
        if ax_loss.lines:
            ax_loss.legend(loc="upper right")
        ax_loss.set_title("loss (running mean over the epoch)")
        x, y = self.series("lr_bias")
        if x:
            ax_lr.plot(x, y, label="biases", ls="--")
        for ax, name, title, scale in (
            (ax_lr, "lr", "learning rate", 1.0),
            (ax_mem, "memory_bytes", "peak VRAM (GiB)", 1024**-3),
            (ax_speed, "images_per_s", "images / s", 1.0),
        ):
            x, y = self.series(name)
            if x:
                ax.plot(x, [v * scale for v in y])
            else:
                ax.text(0.5, 0.5, "not reported", ha="center", va="center", transform=ax.transAxes, color="gray")
            ax.set_title(title)
        if len(ax_lr.lines) == 2:
            ax_lr.lines[1].set_label("weights")
            ax_lr.legend(loc="upper right")
        from matplotlib.ticker import MaxNLocator

        for ax in axes.flat:
            ax.set_xlabel("batch")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            for step in self.resumes:
                ax.axvline(step, color="gray", ls=":", lw=1)
        fig.suptitle(f"{self.title}: {self.status_text()}")
        return fig

    def status_text(self) -> str:
        if not self.history:
            return "no step yet"
        last = self.history[-1]
        parts = [f"batch {int(last['step'])}"]
        if "epoch" in last:
            parts.append(f"epoch {int(last['epoch'])}")
        if "memory_bytes" in last:
            parts.append(f"peak VRAM {format_bytes(last['memory_bytes'])}")
        if "images_per_s" in last:
            parts.append(f"{last['images_per_s']:.1f} img/s")
        return ", ".join(parts)

    def epoch_table(self):
        """The finished epochs as a DataFrame (the trainer's results rows, numeric columns)."""
        import pandas as pd

        frame = pd.DataFrame(self.epochs)
        return frame[[c for c in frame.columns if c in _EPOCH_COLUMNS]] if len(frame) else frame

    def status_html(self) -> str:
        import html

        table = self.epoch_table()
        body = table.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0) if len(table) else ""
        return f"<div><b>{html.escape(self.status_text())}</b>{body}</div>"


def train_dashboard(title: str = "training", *, min_interval_s: float = 1.0, interrupt_at: int | None = None,
                    show: bool = True) -> TrainDashboard:
    """A live dashboard for ``fit``: ``fit(model, data, TrainConfig(callbacks=train_dashboard().callbacks))``.

    Args:
        title: shown above the plots.
        min_interval_s: redraw at most this often during an epoch (each redraw renders a PNG).
        interrupt_at: stop training at this batch index as the stop button would (see ``TrainDashboard``).
        show: display it in the current cell now (False in scripts and tests).

    Returns:
        The ``TrainDashboard``; ``.history`` holds what it plotted, ``.figure`` the last figure.
    """
    dash = TrainDashboard(title=title, min_interval_s=min_interval_s, interrupt_at=interrupt_at)
    if show:
        dash.show()
    return dash
