"""Refuse a training split that lost its labels, before the first step, instead of training on what is left.

The official code refuses two of these cases (an assert on the largest class id, "no labels found"); the
kit also refuses a split that would lose more than :data:`MAX_DROPPED_SHARE` of its labelled images to
errors. ``allow_bad_labels=True`` (``TrainConfig``, ``create_dataloader``, ``YOLODataset``) trains on the
images that are left, as before.
"""

from __future__ import annotations

import os

from yolo9kit.data.labels import ImageRecord
from yolo9kit.data.report import DatasetReport
from yolo9kit.data.sources import DataConfig

# A few unreadable files in a large data set are normal (downloads, editors); beyond a tenth of the labelled
# images something systematic is wrong (a names list, a label format, a folder layout), and training on the
# rest gives a model of a different data set without saying so.
MAX_DROPPED_SHARE = 0.10
_PROCEED = "or pass allow_bad_labels=True (TrainConfig, create_dataloader) to train on the images that are left"


class DataError(ValueError):
    """A data set that cannot be used as it is; the message names the data.yaml, the split, the counts and
    what to do."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for it in a notebook: the message, without the traceback through the kit (the
        message says what to do; ``%tb`` still prints the traceback)."""
        return [f"\x1b[31mDataError\x1b[0m: {self}"]


def check_command(config: DataConfig, split: str) -> str:
    """What a shell user runs to see every problem of ``split`` (a Python call for a dict config)."""
    if config.yaml_file is None:
        return f"yolo9kit.data.check(data, split={split!r})"
    return f"python -m yolo9kit data check {config.yaml_file} --split {split}"


def refuse_bad_labels(config: DataConfig, split: str, report: DatasetReport, records: list[ImageRecord]) -> None:
    """Raise :class:`DataError` when ``split`` cannot train as it is.

    Refused: label files that use class ids ``names`` does not have (the official assert); a split whose
    usable images hold no box at all (official "no labels found"); more than :data:`MAX_DROPPED_SHARE` of
    the images that are not background left out because of errors. A split with no usable image at all is
    left to the caller's own error.
    """
    where = f"{config.yaml_file or 'the data config'} ({split} split)"
    unnamed = sorted({c for r in records for c in r.unnamed_classes})
    if unnamed:
        files = [r.lb_file for r in records if r.unnamed_classes]
        raise DataError(
            f"{where}: labels use class id{'s' * (len(unnamed) > 1)} {', '.join(map(str, unnamed))} but names has "
            f"{config.nc} (ids 0..{config.nc - 1}): {len(files)} of {report.n_images} images would be left out "
            f"(e.g. {files[0]}); add the missing names to data.yaml or fix the label files, {_PROCEED}")
    if report.n_usable == 0:
        return
    if report.n_instances == 0:
        missing = sum(not os.path.isfile(r.lb_file) for r in records if r.usable)
        example = next(r for r in records if r.usable)
        raise DataError(
            f"{where}: none of the {report.n_usable} usable images has a box ({missing} without a label file, "
            f"{report.n_usable - missing} with an empty one); the label of {example.im_file} is expected at "
            f"{example.lb_file} (the last images/ of the path becomes labels/, the suffix .txt): put the labels "
            f"there, {_PROCEED}")
    candidates = report.n_images - report.n_background
    if report.n_skipped > MAX_DROPPED_SHARE * candidates:
        raise DataError(
            f"{where}: {report.n_skipped} of {candidates} images with labels would be left out because of errors "
            f"(more than {MAX_DROPPED_SHARE:.0%}), {report.n_labelled} kept; `{check_command(config, split)}` "
            f"lists the files and reasons: fix them, {_PROCEED}")
