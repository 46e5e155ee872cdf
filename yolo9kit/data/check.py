"""check(): the data set report without building a loader."""

from __future__ import annotations

from pathlib import Path

from yolo9kit.data.cache import build_report, scan_images
from yolo9kit.data.guard import DataError, refuse_bad_labels
from yolo9kit.data.report import DatasetReport
from yolo9kit.data.sources import DataConfig, load_data_config


def check(data: str | Path | dict | DataConfig, split: str = "train", use_cache: bool = True,
          for_training: bool = False) -> DatasetReport:
    """Check every image and label file of ``split`` and report counts and problems.

    The same check runs whenever a data set is opened (its result is cached beside the labels).

    Args:
        data: data.yaml path, dict or DataConfig.
        split: train / val / test.
        use_cache: reuse (and write) the label cache.
        for_training: also raise the ``DataError`` that training on ``split`` would raise before its first
            step (labels with unnamed class ids, no box at all, too many images left out: ``guard``), so a
            notebook stops at the check, with the reason, not at ``fit``.

    Returns:
        DatasetReport; ``report.to_frame()`` has one row per problem (file, severity, reason), label files
        without an image included.

    Raises:
        DataError: the split has no image at all (a wrong path in the data.yaml, or an empty folder).
    """
    config = load_data_config(data)
    images = config.images(split)
    if not images:
        raise DataError(f"{config.yaml_file or 'the data config'}: the {split} split has no images in "
                        f"{', '.join(map(str, config.sources[split]))}; put images there (folders are searched "
                        f"recursively) or fix its {split}: entry")
    records = scan_images(images, config.sources[split], config.nc, use_cache, desc=f"checking {split}")
    report = build_report(split, records, config.sources[split])
    if for_training:
        refuse_bad_labels(config, split, report, records)
    return report
