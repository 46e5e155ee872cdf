"""The run folder's pictures: what a person looks at after ``fit``.

- ``labels.jpg`` at the start: boxes per class, box centres and sizes of the training labels;
- ``train_batch0.jpg`` .. ``train_batch2.jpg`` after the first epoch: its first batches with their boxes, as
  the model gets them (augmented; the colour jitter is missing when it runs on the device, after the loader);
- ``results.png`` after every epoch: the curves of results.csv;
- after the last epoch: ``confusion_matrix.png``, ``PR_curve.png``, ``F1_curve.png``, ``P_curve.png`` and
  ``R_curve.png`` of the final validation (the EMA of the last validated epoch, from the default validation).

``TrainConfig(plots=False)`` writes none of them. A picture that fails to draw or save is a warning that names
it; training goes on and nothing already written is touched. The figures are built outside pyplot
(``yolo9kit.figure``) and rendered by Agg when saved: no display, no global backend change, safe in the worker
thread of the notebook dashboard, and freed like any object (nothing is left in pyplot's registry).

The drawing lives in ``yolo9kit.figure``, a layer below; this module only decides when and where, so the
training run imports nothing above itself.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from yolo9kit.figure import draw_results, new_figure, plot_labels, save_figure, show_batch, validation_figure_makers

LOGGER = logging.getLogger(__name__)

LABELS_PICTURE = "labels.jpg"
RESULTS_PICTURE = "results.png"
BATCH_PICTURES = 3  # train_batch0.jpg .. train_batch2.jpg, as the official run folder
_DPI = 100  # ~1000 px wide figures: readable, and cheap enough to redraw results.png after every epoch


class RunPictures:
    """Draws the pictures of one run into ``run_dir`` (None: a rank that writes nothing, or pictures off).

    Args:
        run_dir: the run folder, or None.
        names: class names for the labels of boxes and axes.
        written: a list that receives each file written (the run folder removes them when the run fails
            before its first checkpoint, so that a failed start leaves no folder behind).
    """

    def __init__(self, run_dir: Path | None, names: Sequence[str] | Mapping[int, str] | None,
                 written: list[Path] | None = None):
        self.run_dir = run_dir
        if isinstance(names, Mapping):  # {id: name} as in a data.yaml
            names = [str(names[k]) for k in sorted(names)]
        self.names = list(names) if names is not None else None
        self.written = written if written is not None else []
        self.pending: list[tuple[int, tuple]] = []  # (index, first images of a batch) to draw after the epoch

    @property
    def enabled(self) -> bool:
        return self.run_dir is not None

    def draw(self, name: str, make: Callable[[], Any]) -> Path | None:
        """Save ``make()`` (a matplotlib figure) as ``run_dir/name``; on any error log a warning naming the
        picture and return None (a picture is never worth a training run)."""
        if self.run_dir is None:
            return None
        path, figure = self.run_dir / name, None
        try:
            figure = make()
            save_figure(figure, path, _DPI)  # in one step: a failed save keeps the previous picture
        except Exception as e:  # noqa: BLE001 - any plotting error: the picture is lost, the run is not
            LOGGER.warning("%s: picture not drawn (%s: %s); training goes on without it", path, type(e).__name__, e)
            return None
        finally:
            _release(figure)
        if path not in self.written:
            self.written.append(path)
        return path

    def labels(self, loader: Iterable) -> None:
        """``labels.jpg`` from the training dataset's labels (a loader without ``dataset.labels``: none)."""
        labels = getattr(getattr(loader, "dataset", None), "labels", None)
        if not self.enabled or labels is None or (self.run_dir / LABELS_PICTURE).exists():
            return  # a resumed run keeps the picture it started with

        def make():
            return plot_labels(labels, self.names)

        self.draw(LABELS_PICTURE, make)

    def batches(self, loader: Iterable, epoch: int) -> Iterable:
        """The loader to train ``epoch`` on: in the first epoch, one that keeps its first batches for
        ``epoch_end`` to draw."""
        return _FirstBatches(loader, self) if self.enabled and epoch == 0 else loader

    def epoch_end(self, rows: list[dict]) -> None:
        """After an epoch: the batch pictures kept in it (``batches``), and ``results.png`` from the results.csv
        rows so far (``FitResult.results``)."""
        pending, self.pending = self.pending, []
        for i, batch in pending:
            self.draw(f"train_batch{i}.jpg", lambda batch=batch, i=i: _batch_figure(batch, i, self))
        if not self.enabled or not rows:
            return

        def make():
            import pandas as pd

            return draw_results(pd.DataFrame(rows))

        self.draw(RESULTS_PICTURE, make)

    def validation(self, validate_fn: Any) -> None:
        """The confusion matrix and the PR, F1, P and R curves of the last validation, when it was the default
        one (``train.inputs.EMAValidation`` keeps its ``ValResult``; a custom function gets no such pictures)."""
        from yolo9kit.train.inputs import EMAValidation

        result = validate_fn.result if isinstance(validate_fn, EMAValidation) else None
        if not self.enabled or result is None:
            if self.enabled and validate_fn is not None:
                LOGGER.info("no validation pictures: a custom validation function keeps no ValResult")
            return
        names = self.names or result.names
        for name, make in validation_figure_makers(result.confusion_matrix, result.ap_result, names).items():
            self.draw(name, make)


def _release(figure: Any) -> None:
    """Free a saved figure now, not at the next garbage collection (a long run draws one per epoch); one made
    through pyplot also leaves pyplot's registry."""
    if figure is None:
        return
    pyplot = sys.modules.get("matplotlib.pyplot")
    try:
        if pyplot is not None and pyplot.fignum_exists(getattr(figure, "number", -1)):
            pyplot.close(figure)
        figure.clear()
    except Exception:  # noqa: BLE001 - releasing is a courtesy: a figure that will not clear is left to the GC
        pass


class _FirstBatches:
    """A loader that keeps a copy of its first ``BATCH_PICTURES`` batches (at most 16 images each, what a picture
    shows) for ``RunPictures.epoch_end`` to draw: drawing them here would count in the epoch's time and images/s.
    """

    def __init__(self, loader: Iterable, pictures: RunPictures):
        self.loader, self.pictures = loader, pictures

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator:
        for i, batch in enumerate(self.loader):
            if i < BATCH_PICTURES:
                try:
                    self.pictures.pending.append((i, _first_images(batch, 16)))
                except Exception as e:  # noqa: BLE001 - a batch the picture cannot read is still trained on
                    LOGGER.warning("%s: picture not drawn (%s: %s); training goes on without it",
                                   self.pictures.run_dir / f"train_batch{i}.jpg", type(e).__name__, e)
            yield batch


def _first_images(batch, n: int) -> tuple:
    """``(images[:n], their targets)`` copied: the loop may reuse or change the batch it is given."""
    images, targets = batch[0], batch[1]
    keep = targets[:, 0] < n
    return _copy(images[:n]), _copy(targets[keep])


def _copy(x):
    return x.clone() if hasattr(x, "clone") else x.copy()


def _batch_figure(batch, i: int, pictures: RunPictures):
    n = max(min(len(batch[0]), 16), 1)
    ncols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / ncols)
    return show_batch(batch, pictures.names, max_images=16, ncols=ncols, fig=new_figure((2.5 * ncols, 2.5 * rows)),
                      title=f"training batch {i}")
