"""``train_dashboard()``: live plots of ``fit`` with stop and resume buttons, and its panel. ``await dash.fit(...)``
runs ``fit`` in a worker thread so that a click reaches it while it trains (docs/training.md)."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import html
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as w
import pandas as pd
from IPython.display import display

from yolo9kit.env import process_memory_bytes
from yolo9kit.files import format_bytes
from yolo9kit.train.fit import FitResult, fit
from yolo9kit.train.records import BatchRecord, EpochRecord
from yolo9kit.widgets.panel import NO_VRAM, draw_dashboard, html_table, show_figure

_TABLE_NOTE = ("finished epochs (counted from 1, as the progress bar and results.png count them; losses: means over "
               "the epoch; P, R, mAP: validation of the EMA)")
MAX_MESSAGES = 12  # message lines kept on screen; older ones stay in ``dash.messages``
_COLUMNS = ("epoch", "box", "cls", "dfl", "P", "R", "mAP50", "mAP50-95", "img/s", "time", "data", "val", "peak VRAM",
            "peak RSS")


@dataclass
class _Job:
    """One ``fit`` call in a worker thread: what it was called with and how it ended."""

    call: Any  # fit with the model, the data and the keyword arguments: call(config)
    config: Any
    resume: bool
    done: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    result: FitResult | None = None
    error: BaseException | None = None


class _LogToDashboard(logging.Handler):
    """The job thread's ``yolo9kit`` records go to the message line; other threads' where logging would send them."""

    def __init__(self, dash: TrainDashboard, thread_id: int | None):
        super().__init__(logging.INFO)
        self.dash, self.thread_id = dash, thread_id

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread_id:
            planned = self.dash.stop_requested  # the interrupt warning of a requested stop is no warning
            self.dash.note(record.getMessage(), warning=record.levelno >= logging.WARNING and not planned)
        elif not logging.getLogger().handlers and record.levelno >= logging.lastResort.level:
            logging.lastResort.handle(record)


@dataclass(repr=False)
class TrainDashboard:
    """Live plots of a training run with stop and resume buttons (docs/notebooks.md): ``history`` and ``epochs``
    hold the records drawn, ``resumes`` the ``ni`` where a resumed run started, ``process_memory`` the resident set
    size per ``ni`` off CUDA, ``messages`` the lines under the plots, ``result`` the last run's ``FitResult``."""

    title: str = "training"
    min_interval_s: float = 1.0
    interrupt_at: int | None = None
    history: list[BatchRecord] = field(default_factory=list)
    resumes: list[int] = field(default_factory=list)
    epochs: list[EpochRecord] = field(default_factory=list)
    process_memory: dict[int, int] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    result: FitResult | None = None
    figure: Any = None
    redraws: int = 0
    stop_requested: bool = False
    _widgets: dict[str, Any] | None = None
    _job: _Job | None = None
    _resume_pending: bool = False  # a resumed run started here: mark its first batch
    _last_draw: float = float("-inf")

    def __repr__(self) -> str:
        return f"TrainDashboard({self.title!r}, {len(self.history)} batches, {len(self.epochs)} epochs)"

    @property
    def callbacks(self) -> dict[str, Any]:
        return {"on_batch": self.on_batch, "on_epoch_end": self.on_epoch_end}

    def on_batch(self, record: BatchRecord) -> None:
        """fit's callback after each trained batch (in its thread)."""
        if self._resume_pending or (self.history and record.ni <= self.history[-1].ni):
            self.resumes.append(record.ni)  # a resumed run's first batch (it may repeat the accumulation window)
            self._resume_pending = False
        self.history.append(record)
        if record.peak_allocated is None and (rss := process_memory_bytes()) is not None:
            self.process_memory[record.ni] = rss
        planned = self.interrupt_at is not None and record.ni + 1 >= self.interrupt_at
        if planned or (self.stop_requested and self.running):
            self.interrupt_at, self.stop_requested = None, True  # once: the resumed run must not stop again
            self.update()
            raise KeyboardInterrupt(f"dashboard: stop requested at batch {record.ni + 1}")
        if time.monotonic() - self._last_draw >= self.min_interval_s:
            self.update()

    def on_epoch_end(self, record: EpochRecord) -> None:
        """fit's callback after each epoch."""
        self.epochs.append(record)
        self.update()

    @property
    def running(self) -> bool:
        """True while a run started by ``fit``, ``resume`` or the resume button is training."""
        return self._job is not None and self._job.result is None and self._job.error is None

    def request_stop(self) -> None:
        """What the stop button does: the next trained batch raises ``KeyboardInterrupt`` inside ``fit``."""
        if self.running:
            self.stop_requested = True
            self.note("stop requested: training ends after the current batch and saves last.pt")

    async def fit(self, model, data, config, **kwargs) -> FitResult:
        """``yolo9kit.train.fit(model, data, config, **kwargs)`` in a worker thread, drawn live here, with the
        dashboard's callbacks beside ``config.run.callbacks``; its ``FitResult`` is ``interrupted`` after a stop."""
        return await self._wait(self._start(_Job(functools.partial(fit, model, data, **kwargs), config, False)))

    async def resume(self) -> FitResult:
        """Continue the last stopped run from its last.pt (RuntimeError when there is none); waits for (or returns)
        the resume button's run."""
        job = self._job  # the resume button's run: wait for it (or return how it finished), else resume now
        if job is None or not job.resume or (job.done.is_set() and (job.error is not None or job.result.interrupted)):
            job = self._start()
        return await self._wait(job)

    def resume_in_background(self) -> None:
        """The resume button: start the resumed run and return at once (the kernel stays free for stop)."""
        try:
            self._start()
        except RuntimeError as error:
            self.note(str(error), warning=True)

    def _resume_job(self) -> _Job:
        job = self._job
        if job is None:
            raise RuntimeError("nothing to resume: start a run with `await dash.fit(model, data, config)` first")
        if job.error is not None or job.result is None:
            raise RuntimeError(f"the last run failed ({job.error!r}): fix the cause, then resume it with "
                               "fit(model, data, dataclasses.replace(config, resume='<run folder>'))")
        if not job.result.interrupted:
            raise RuntimeError(f"nothing to resume: the last run finished all {job.result.epochs_completed} "
                               f"epochs ({job.result.save_dir})")
        return _Job(job.call, dataclasses.replace(job.config, resume=str(job.result.last)), resume=True)

    def _start(self, job: _Job | None = None) -> _Job:
        if self.running:
            raise RuntimeError("a run is already training in this dashboard: press stop (or wait for it) first")
        job = job or self._resume_job()  # None: the last stopped run again, from its last.pt
        self.stop_requested, self._job = False, job
        self._resume_pending = job.resume and bool(self.history)
        context = contextvars.copy_context()  # outputs of the thread go to the cell that started it
        job.thread = threading.Thread(target=context.run, args=(self._work, job), name="yolo9kit-fit", daemon=True)
        self._set_buttons()
        job.thread.start()
        return job

    def _work(self, job: _Job) -> None:
        """The worker thread: fit with the dashboard's callbacks, its log records shown here."""
        merged = dict(job.config.run.callbacks or {})
        for name, own in self.callbacks.items():  # a user's own callback of the same name is called first
            theirs = merged.get(name)
            merged[name] = own if theirs in (None, own) else lambda record, a=theirs, b=own: (a(record), b(record))
        config = dataclasses.replace(job.config, callbacks=merged, progress_bar=False)
        logger, handler = logging.getLogger("yolo9kit"), _LogToDashboard(self, threading.get_ident())
        level = logger.level
        logger.addHandler(handler)
        logger.setLevel(min(level or logging.INFO, logging.INFO))  # show "run folder ...", "resuming ..." here
        try:
            job.result = job.call(config)
        except BaseException as error:  # noqa: BLE001 - handed to the awaiting cell, which raises it
            job.error = error
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
            self._finish(job)

    def _finish(self, job: _Job) -> None:
        self.result = job.result or self.result
        if job.error is not None:
            self.note(f"training failed: {job.error!r}", warning=True)
        elif job.result.interrupted:
            last = self.history[-1] if self.history else None
            where = f"after batch {last.ni + 1} (epoch {last.epoch + 1})" if last else "before the first batch"
            self.note(f"stopped {where}; last.pt saved: {job.result.last}. Resume continues from it "
                      "(the resume button, or `await dash.resume()`).")
        else:
            self.note(f"finished: {job.result.epochs_completed} epochs; weights in {job.result.save_dir}/weights")
        try:
            self._set_buttons()
            self.update()
        finally:
            job.done.set()  # last: a waiter may let the interpreter exit, which must not find this thread drawing

    async def _wait(self, job: _Job) -> FitResult:
        """Await the job without blocking the kernel; Kernel > Interrupt (a cancelled cell) stops it cleanly."""
        while not job.done.is_set():
            try:
                await asyncio.sleep(0.1)
            except asyncio.CancelledError:
                if self.stop_requested:
                    raise  # a second interrupt: stop waiting (the run still ends at its next batch)
                self.request_stop()
                if hasattr(asyncio.current_task(), "uncancel"):  # Python >= 3.11
                    asyncio.current_task().uncancel()
        job.thread.join(timeout=10)  # it only returns now; joined so that no thread outlives its run
        if job.error is not None:
            raise job.error
        return job.result

    @property
    def container(self):
        """The ipywidgets panel (built on first use); display it, or call ``show()``."""
        if self._widgets is None:
            stop = w.Button(description="stop", icon="stop", button_style="warning",
                            tooltip="stop after the current batch: fit saves last.pt and returns (interrupted=True)")
            resume = w.Button(description="resume", icon="play", button_style="success",
                              tooltip="continue the stopped run from its last.pt")
            stop.on_click(lambda _button: self.request_stop())
            resume.on_click(lambda _button: self.resume_in_background())
            wide = {"layout": w.Layout(width="100%")}
            parts = self._widgets = {"stop": stop, "resume": resume, "status": w.HTML(), "plot": w.Output(),
                                     "table": w.HTML(**wide), "messages": w.HTML(**wide)}
            parts["container"] = w.VBox([w.HBox([stop, resume, parts["status"]]), parts["plot"], parts["table"],
                                         parts["messages"]], **wide)
            self._show_messages()
            self._set_buttons()
            self.update()
        return self._widgets["container"]

    @property
    def controls(self) -> dict[str, Any]:
        """``stop`` and ``resume``: the buttons (``.click()`` drives them from code)."""
        _ = self.container  # builds the widgets on first use
        return {name: self._widgets[name] for name in ("stop", "resume")}

    def _repr_mimebundle_(self, **kwargs):
        return self.container._repr_mimebundle_(**kwargs)

    def show(self) -> None:
        """Put the panel in the current cell; every place it is shown follows the same run."""
        display(self.container)

    def note(self, text: str, warning: bool = False) -> None:
        """Add a line to the message area (``warning``: in orange, still not an error box)."""
        self.messages.append(("warning: " if warning else "") + text)
        self._show_messages()

    def _show_messages(self) -> None:
        if self._widgets is not None:
            rows = [f"<div style='color:{'#b35c00' if line.startswith('warning: ') else 'inherit'}; "
                    f"white-space:normal'>{html.escape(line)}</div>" for line in self.messages[-MAX_MESSAGES:]]
            self._widgets["messages"].value = "<div style='font-size:90%'>" + "".join(rows) + "</div>"

    def _set_buttons(self) -> None:
        if self._widgets is not None:
            result = self._job.result if self._job is not None else None  # set once the run is over
            self._widgets["stop"].disabled = not self.running
            self._widgets["resume"].disabled = result is None or not result.interrupted

    def update(self) -> None:
        """Redraw the plots, the status line and the table from what the callbacks received."""
        self._last_draw = time.monotonic()
        self.figure = draw_dashboard(self)
        self.redraws += 1
        if self._widgets is not None:
            show_figure(self._widgets["plot"], self.figure)
            self._widgets["status"].value = f"<b>{html.escape(self.status_text())}</b>"
            table = self.epoch_table()
            self._widgets["table"].value = html_table(table, _TABLE_NOTE, "{:g}") if len(table) else ""

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """(ni, values) of one ``BatchRecord`` field in batch order: a batch seen twice (resume) keeps its latest
        value, batches where it is None (``peak_allocated`` off CUDA) are left out."""
        points = {r.ni: getattr(r, name) for r in self.history}
        steps = sorted(k for k, v in points.items() if v is not None)
        return steps, [points[k] for k in steps]

    def memory_series(self) -> tuple[str, list[int], list[int]]:
        """(what, ni, bytes): the peak VRAM of the epoch on CUDA, else the process's resident set size."""
        x, y = self.series("peak_allocated")
        if x:
            return "peak VRAM in the epoch", x, y
        steps = sorted(self.process_memory)
        return "process memory, resident set", steps, [self.process_memory[k] for k in steps]

    def status_text(self) -> str:
        if not self.history:
            return "running: waiting for the first batch" if self.running else "no batch trained yet"
        last = self.history[-1]
        what, _, values = self.memory_series()
        label = "peak VRAM" if what.startswith("peak VRAM") else "process memory"
        memory = f"{label} {format_bytes(values[-1])}" if values else NO_VRAM
        state = "training" if self.running else "stopped" if self.result and self.result.interrupted else "idle"
        ahead = last.epochs - last.epoch - 1 if self.running and self.epochs else 0  # epochs after this one
        pace = sum(r.epoch_s + r.val_s for r in self.epochs) / max(len(self.epochs), 1)  # training and validation
        left = f", about {_format_seconds(pace * ahead)} after this epoch" if ahead > 0 else ""
        where = f"epoch {last.epoch + 1}" + (f" of {last.epochs}" if last.epochs else "")
        return f"{state}: {where}, batch {last.ni + 1}, {last.images_per_s:.1f} img/s, {memory}{left}"

    def epoch_table(self) -> pd.DataFrame:
        """The finished epochs, rounded and in readable units; columns never filled (metrics of epochs not
        validated, VRAM off CUDA) are left out."""
        epoch_of = {r.ni: r.epoch for r in self.history}
        rows = []
        for r in self.epochs:
            rss = [v for ni, v in self.process_memory.items() if epoch_of.get(ni) == r.epoch]
            metrics = {k: None if v is None else round(v, 3) for k, v in (
                ("P", r.precision), ("R", r.recall), ("mAP50", r.map50), ("mAP50-95", r.map50_95))}
            rows.append({"epoch": r.epoch + 1, "box": round(r.box_loss, 3), "cls": round(r.cls_loss, 3),
                         "dfl": round(r.dfl_loss, 3), **metrics, "img/s": round(r.images_per_s, 1),
                         "time": _format_seconds(r.epoch_s), "data": f"{r.data_s / max(r.epoch_s, 1e-9):.0%}",
                         "val": _format_seconds(r.val_s) if r.map50 is not None else None,
                         "peak VRAM": None if r.peak_allocated is None else format_bytes(r.peak_allocated),
                         "peak RSS": format_bytes(max(rss)) if rss and r.peak_allocated is None else None})
        return pd.DataFrame(rows, columns=list(_COLUMNS)).dropna(axis=1, how="all")


def _format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes} min {secs:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def train_dashboard(title: str = "training", *, min_interval_s: float = 1.0, interrupt_at: int | None = None,
                    show: bool = True) -> TrainDashboard:
    """A live dashboard for ``fit``: ``dash = train_dashboard(); result = await dash.fit(model, data, config)``;
    ``interrupt_at`` presses stop after that many batches, ``show`` displays the panel in the cell at once."""
    dash = TrainDashboard(title=title, min_interval_s=min_interval_s, interrupt_at=interrupt_at)
    if show:
        dash.show()
    return dash

