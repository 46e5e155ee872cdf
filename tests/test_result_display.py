"""What a prediction and a validation show a person: the readable per-image summary and the PR curve that is
there even when nothing was found."""

from __future__ import annotations

import numpy as np

from yolo9kit.detections import Prediction
from yolo9kit.figure import plot_validation
from yolo9kit.metrics import ConfusionMatrix

NAMES = ["rectangle", "ellipse", "triangle"]


def _prediction(classes: list[int]) -> Prediction:
    n = len(classes)
    return Prediction(np.zeros((n, 4), np.float32), np.ones(n, np.float32), np.array(classes, np.int64), NAMES,
                      (64, 64), (160, 160))


def test_summary_names_each_class_with_its_count():
    assert _prediction([2, 1, 2]).summary() == "160x160: 1 ellipse, 2 triangles"
    assert _prediction([]).summary() == "160x160: (no detections)"


def test_validation_without_a_true_positive_still_has_a_pr_curve_saying_so():
    figures = plot_validation(ConfusionMatrix(3), None, NAMES)
    assert set(figures) == {"confusion_matrix.png", "PR_curve.png"}
    texts = [t.get_text() for t in figures["PR_curve.png"].axes[0].texts]
    assert any("no true positive" in t for t in texts)
    assert figures["PR_curve.png"]._repr_png_().startswith(b"\x89PNG")
