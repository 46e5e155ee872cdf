"""What the loop does when something goes wrong: a non-finite loss, out of memory, an interrupt."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

LOGGER = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """``MAX_NONFINITE_BATCHES`` non-finite losses in a row (``count``), or an epoch whose every batch had one;
    ``run_dir`` (``fit`` sets it) is the run folder, whose ``weights/last.pt``, if any, is the last good checkpoint."""

    def __init__(self, count: int, epoch: int, batch: int, *, from_start: bool = False, whole_epoch: bool = False):
        self.run_dir, self.count = None, count
        what = (f"every batch of epoch {epoch} had a non-finite loss ({count} in a row): nothing trained" if whole_epoch
                else f"{count} non-finite losses in a row (epoch {epoch}, batch {batch})")
        why = ("The loss was not finite from the run's first batch, before any optimizer step: check the loss gains "
               "(box, cls, dfl, cls_pw of --hyp), the labels (yolo9kit.data.check) or train with amp='off'."
               if from_start else
               "Lower lr0, check the labels (yolo9kit.data.check) or train with amp='off' or 'bf16'.")
        super().__init__(f"{what}: training stopped. {why}")


class NonFiniteWeightsError(RuntimeError):
    """The weights (or the EMA) hold NaN or Inf (the tensors ``names``) when a checkpoint is due: nothing is
    written, and ``run_dir``'s ``weights/last.pt`` stays the last good checkpoint."""

    def __init__(self, run_dir: Path | None, what: str, names: list[str]) -> None:
        self.run_dir, self.names = run_dir, names
        super().__init__(f"{what}: the weights hold NaN or Inf ({len(names)} tensors, e.g. {', '.join(names[:3])}): "
                         "not saved. Lower lr0, or start afresh from a checkpoint whose optimizer state is finite."
                         + last_good(run_dir))


def last_good(run_dir: Path | None) -> str:
    """`` The last good checkpoint is .../last.pt.`` when the run folder has one, else nothing."""
    last = Path(run_dir) / "weights" / "last.pt" if run_dir else None
    return f" The last good checkpoint is {last}." if last is not None and last.is_file() else ""


class OutOfMemoryAtMinimumError(RuntimeError):
    """Out of memory with a micro-batch of one image: nothing left to halve."""


class DistributedOutOfMemoryError(RuntimeError):
    """Out of memory under DDP in a micro-step that synchronises the ranks: one rank retrying it would hang the rest."""

    def __init__(self, rank_batch: int, error: BaseException) -> None:
        super().__init__(
            f"out of memory under DDP in a micro-step of {rank_batch} images that synchronises with the other ranks "
            "(buffer broadcast, gradient all-reduce): one rank cannot retry it alone without hanging the others. "
            "Give a smaller batch_size, or micro_batch_size (every rank splits its batch the same way; the "
            f"micro-steps before the last one back off on their own). The error was: {str(error)[:200]}")


class Interrupted(KeyboardInterrupt):
    """A ``KeyboardInterrupt`` raised for a stop signal; ``reason`` names it (``"SIGINT"``, ``"SIGTERM"``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason} received")
        self.reason = reason


def stopped_by(reason: str) -> str:
    """How a log line names what stopped a run (``FitResult.interrupted_by`` keeps the exception's name)."""
    return "stopped (Ctrl-C, Kernel > Interrupt or a callback's stop)" if reason == "KeyboardInterrupt" else reason


class StopSignals:
    """SIGTERM and SIGINT turned into a stop at a safe point (docs/faults.md): ``received``, asked by the loop before
    each batch, or ``Interrupted`` raised inside ``raising()`` (validation); a second signal is logged and ignored."""

    def __init__(self, install: bool = True) -> None:
        self.received: str | None = None
        self.install = install  # False: leave the handlers alone (DDP: the ranks must stop at the same batch)
        self._raising = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if self.install and threading.current_thread() is threading.main_thread():  # where Python delivers signals
            for sig, default in ((signal.SIGTERM, signal.SIG_DFL), (signal.SIGINT, signal.default_int_handler)):
                if signal.getsignal(sig) is default:  # a handler of the application's own stays in charge
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            LOGGER.warning("%s: already stopping for %s, saving first (SIGKILL ends the process at once)", name,
                           self.received)
            return
        self.received = name
        if self._raising:
            raise Interrupted(name)
        LOGGER.warning("%s received: stopping at the next batch (after the checkpoint being written)", name)

    @contextlib.contextmanager
    def raising(self) -> Iterator[None]:
        """A signal raises ``Interrupted`` right away inside this block (one received before raises on entry)."""
        if self.received is not None:
            raise Interrupted(self.received)
        self._raising = True
        try:
            yield
        finally:
            self._raising = False
