"""The data set check report: counts plus one row per problem (file, reason, severity)."""

from __future__ import annotations

import html
from dataclasses import dataclass, field

ERROR, WARNING, INFO = "error", "warning", "info"


@dataclass(frozen=True)
class Problem:
    """One finding. ``error``: the image is left out; ``warning``: kept, something was fixed or is odd;
    ``info``: kept as it is (e.g. polygons read as boxes)."""

    file: str
    reason: str
    severity: str = ERROR


@dataclass
class DatasetReport:
    """What :func:`yolo9kit.data.check` found in one split.

    Attributes:
        split: train / val / test.
        n_images: image files found.
        n_usable: images kept (labelled or background).
        n_labelled: images with at least one box.
        n_background: images with no box (missing or empty label file).
        n_skipped: images left out because of an error.
        n_instances: boxes kept.
        n_duplicates_removed: duplicate label rows dropped.
        n_orphan_labels: label files (in the split's ``labels`` folders) with no image: not used.
        problems: every finding, in file order.
    """

    split: str
    n_images: int = 0
    n_usable: int = 0
    n_labelled: int = 0
    n_background: int = 0
    n_skipped: int = 0
    n_instances: int = 0
    n_duplicates_removed: int = 0
    n_orphan_labels: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def ok(self) -> bool:
        """True when no image had to be left out."""
        return not self.errors

    def counts(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("n_images", "n_usable", "n_labelled", "n_background", "n_skipped",
                                             "n_instances", "n_duplicates_removed", "n_orphan_labels")}

    def to_frame(self):
        """One row per problem: columns file, severity, reason (a pandas DataFrame)."""
        import pandas as pd

        return pd.DataFrame([(p.file, p.severity, p.reason) for p in self.problems],
                            columns=["file", "severity", "reason"])

    def summary(self) -> str:
        orphans = f", {self.n_orphan_labels} label files without an image" if self.n_orphan_labels else ""
        return (f"{self.split}: {self.n_images} images, {self.n_usable} usable ({self.n_labelled} labelled, "
                f"{self.n_background} background), {self.n_skipped} skipped, {self.n_instances} boxes, "
                f"{self.n_duplicates_removed} duplicate rows removed{orphans}, {len(self.problems)} problems")

    def __str__(self) -> str:
        lines = [self.summary()]
        if self.problems:
            width = min(max(len(p.file) for p in self.problems), 80)
            lines.append(f"{'severity':8}  {'file':{width}}  reason")
            lines += [f"{p.severity:8}  {p.file:{width}}  {p.reason}" for p in self.problems]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(p.severity)}</td><td>{html.escape(p.file)}</td>"
                       f"<td>{html.escape(p.reason)}</td></tr>" for p in self.problems)
        table = (f"<table><thead><tr><th>severity</th><th>file</th><th>reason</th></tr></thead>"
                 f"<tbody>{rows}</tbody></table>") if rows else "<p>no problems found</p>"
        return f"<div><p><b>{html.escape(self.summary())}</b></p>{table}</div>"
