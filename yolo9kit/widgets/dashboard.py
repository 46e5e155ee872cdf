"""``train_dashboard()``: live training plots for ``yolo9kit.train.fit``.

The dashboard is a pair of callbacks: ``TrainConfig(callbacks=dash.callbacks)``. ``fit`` hands it a
``StepRecord`` after each trained batch and an ``EpochRecord`` after each epoch (``yolo9kit.train.records``);
it keeps them and redraws one figure (losses, learning rates, peak VRAM, throughput) in place through a
display handle (``display(..., display_id=True)`` then ``handle.update(...)``): one image in the cell, no
``clear_output`` flicker, nothing left over when the notebook is saved. It computes nothing about training.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from yolo9kit.widgets._common import figure_png, format_bytes

if TYPE_CHECKING:
    from yolo9kit.train.records import EpochRecord, StepRecord

# The EpochRecord fields in the table under the plots (the learning rates are plotted per batch instead).
_TABLE_FIELDS = ("epoch", "box_loss", "cls_loss", "dfl_loss", "precision", "recall", "map50", "map50_95",
                 "images_per_s", "epoch_s")
_NO_VRAM = "VRAM is measured on CUDA only"


@dataclass
class TrainDashboard:
    """Live plots of a training run; pass ``dash.callbacks`` to ``TrainConfig(callbacks=...)``.

    Attributes:
        history: the ``StepRecord`` of every trained batch, in the order received (a resumed run repeats
            the batches of its interrupted accumulation window).
        epochs: the ``EpochRecord`` of every finished epoch.
        resumes: integrated batch indices ``ni`` at which a resumed run started again (dotted lines).
        min_interval_s: redraw at most this often (drawing costs ~0.1 s); the last step is always drawn
            by ``on_epoch_end``.
        interrupt_at: raise ``KeyboardInterrupt`` once this batch index is reached, exactly what the
            notebook's stop button (Kernel > Interrupt) does; ``fit`` then saves last.pt and returns
            with ``interrupted=True``. Used to demonstrate stop-and-resume; None never interrupts.
    """

    title: str = "training"
    min_interval_s: float = 1.0
    interrupt_at: int | None = None
    history: list[StepRecord] = field(default_factory=list)
    resumes: list[int] = field(default_factory=list)
    epochs: list[EpochRecord] = field(default_factory=list)
    figure: Any = None
    redraws: int = 0
    _handle: Any = None
    _text_handle: Any = None
    _last_draw: float = float("-inf")

    @property
    def callbacks(self) -> dict[str, Any]:
        return {"on_step": self.on_step, "on_epoch_end": self.on_epoch_end}

    # -- callbacks -------------------------------------------------------------------------------
    def on_step(self, record: StepRecord) -> None:
        if self.history and record.ni <= self.history[-1].ni:
            self.resumes.append(record.ni)  # a resumed run repeats the unfinished accumulation window
        self.history.append(record)
        if self.interrupt_at is not None and record.ni >= self.interrupt_at:
            self.interrupt_at = None  # once: the resumed run must not stop again
            self.update()
            raise KeyboardInterrupt(f"dashboard: stop requested at batch {record.ni}")
        if time.monotonic() - self._last_draw >= self.min_interval_s:
            self.update()

    def on_epoch_end(self, record: EpochRecord) -> None:
        self.epochs.append(record)
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

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """(ni, values) of one ``StepRecord`` field in batch order; a batch seen twice (resume) keeps its latest
        value; batches where the field is None (``memory_bytes`` off CUDA) are left out."""
        points = {r.ni: getattr(r, name) for r in self.history}
        steps = sorted(k for k, v in points.items() if v is not None)
        return steps, [points[k] for k in steps]

    def draw(self):
        """A 2x2 figure: losses, learning rates, VRAM, images/s against the batch index (dotted: resumed)."""
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator

        fig, axes = plt.subplots(2, 2, figsize=(10, 6), constrained_layout=True)
        ax_loss, ax_lr, ax_mem, ax_speed = axes.flat
        # The norm weights follow the weights' schedule (both warm up from 0): their line would hide under it.
        for ax, names, labels in (
            (ax_loss, ("box_loss", "cls_loss", "dfl_loss"), ("box", "cls", "dfl")),
            (ax_lr, ("lr_bias", "lr_weight"), ("biases", "weights")),
        ):
            for name, label in zip(names, labels):
                ax.plot(*self.series(name), label=label, ls="--" if name == "lr_bias" else "-")
            ax.legend(loc="upper right")
        ax_loss.set_title("loss (running mean over the epoch)")
        ax_lr.set_title("learning rate")
        x, y = self.series("memory_bytes")
        ax_mem.plot(x, [v / 1024**3 for v in y])
        if self.history and not x:
            ax_mem.text(0.5, 0.5, _NO_VRAM, ha="center", va="center", transform=ax_mem.transAxes, color="gray")
        ax_mem.set_title("peak VRAM in the epoch (GiB)")
        ax_speed.plot(*self.series("images_per_s"))
        ax_speed.set_title("images / s")
        for ax in axes.flat:
            ax.set_xlabel("batch")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            for ni in self.resumes:
                ax.axvline(ni, color="gray", ls=":", lw=1)
        fig.suptitle(f"{self.title}: {self.status_text()}")
        return fig

    def status_text(self) -> str:
        if not self.history:
            return "no step yet"
        last = self.history[-1]
        memory = _NO_VRAM if last.memory_bytes is None else f"peak VRAM {format_bytes(last.memory_bytes)}"
        return f"batch {last.ni}, epoch {last.epoch}, {memory}, {last.images_per_s:.1f} img/s"

    def epoch_table(self):
        """The finished epochs as a DataFrame of ``EpochRecord`` fields (columns never filled, such as the
        metrics of a run that was not validated, are left out)."""
        import pandas as pd

        rows = [{name: getattr(r, name) for name in _TABLE_FIELDS} for r in self.epochs]
        return pd.DataFrame(rows, columns=list(_TABLE_FIELDS)).dropna(axis=1, how="all")

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
        The ``TrainDashboard``; ``.history`` and ``.epochs`` hold the records it drew, ``.figure`` the last figure.
    """
    dash = TrainDashboard(title=title, min_interval_s=min_interval_s, interrupt_at=interrupt_at)
    if show:
        dash.show()
    return dash
