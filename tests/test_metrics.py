"""yolo9kit.metrics: parity with the official matching and AP, tie-breaking, confusion matrix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from yolo9kit.metrics import ConfusionMatrix, ap_per_class, compute_ap, fitness, match_predictions

AP_FIELDS = [("tp", "tp_out"), ("fp", "fp_out"), ("p", "p"), ("r", "r"), ("f1", "f1"), ("ap", "ap"),
             ("classes", "unique_classes")]


def test_match_predictions_equals_official_process_batch(load_fixture):
    """Official val_dual.py process_batch on 30 detections of 10 labels, at the ten IoU thresholds."""
    case = load_fixture("ops.parity.pt")["match"]
    correct = match_predictions(case["detections"], case["labels"])
    assert correct.dtype == torch.bool and correct.shape == (30, 10)
    assert case["correct"].any() and not case["correct"].all()
    assert torch.equal(correct, case["correct"])


def test_ap_per_class_equals_official_on_matches(load_fixture):
    case = load_fixture("ops.parity.pt")["match"]
    det = case["detections"]
    result = ap_per_class(case["correct"], det[:, 4], det[:, 5], case["labels"][:, 0])
    for field, key in AP_FIELDS:
        np.testing.assert_allclose(getattr(result, field), case["ap"][key].numpy(), rtol=0, atol=1e-9, err_msg=field)


def test_ap_per_class_equals_official_on_400_detections(load_fixture):
    """Official utils/metrics.py ap_per_class, including a predicted class that no label has."""
    case = load_fixture("ops.parity.pt")["ap_per_class"]
    result = ap_per_class(case["tp"], case["conf"], case["pred_cls"], case["target_cls"])
    for field, key in AP_FIELDS:
        np.testing.assert_allclose(getattr(result, field), case[key].numpy(), rtol=0, atol=1e-9, err_msg=field)


def test_extra_matching_and_ap_equal_official_on_golden(load_extra_fixture):
    golden = load_extra_fixture("yolov9-t-golden.pt")
    det = golden["metrics_detections"]
    assert torch.equal(match_predictions(det, golden["metrics_labels"]), golden["metrics_correct"])
    result = ap_per_class(golden["metrics_correct"], det[:, 4], det[:, 5], golden["metrics_labels"][:, 0])
    for field, key in [("ap", "metrics_ap"), ("p", "metrics_p"), ("r", "metrics_r"), ("tp", "metrics_tp"),
                       ("fp", "metrics_fp"), ("classes", "metrics_ap_class")]:
        np.testing.assert_allclose(getattr(result, field), golden[key].numpy(), rtol=0, atol=1e-9, err_msg=field)


def _boxes(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_label_goes_to_most_confident_match_not_highest_iou():
    # one label; detection 0 (more confident) overlaps it with IoU 0.6, detection 1 with IoU 0.9
    labels = _boxes([0, 0, 0, 100, 100])
    detections = _boxes([0, 0, 60, 100, 0.9, 0], [0, 0, 90, 100, 0.8, 0])
    correct = match_predictions(detections, labels)
    thresholds = np.linspace(0.5, 0.95, 10)
    assert correct[0].tolist() == (thresholds <= 0.6 + 1e-6).tolist()  # wins wherever it qualifies
    assert correct[1].tolist() == ((thresholds > 0.6 + 1e-6) & (thresholds <= 0.9 + 1e-6)).tolist()


def test_detection_of_another_class_is_never_a_match():
    labels = _boxes([1, 0, 0, 100, 100])
    detections = _boxes([0, 0, 100, 100, 0.9, 0])
    assert not match_predictions(detections, labels).any()


def test_match_predictions_handles_empty_inputs():
    assert match_predictions(torch.zeros((0, 6)), _boxes([0, 0, 0, 10, 10])).shape == (0, 10)
    assert not match_predictions(_boxes([0, 0, 10, 10, 0.5, 0]), torch.zeros((0, 5))).any()


def test_compute_ap_of_perfect_and_half_recall_curves():
    # a perfect detector scores 0.995, not 1: the appended sentinel (recall 1, precision 0) makes the
    # envelope 0 at recall 1, so the last trapezoid is halved (official behaviour)
    assert compute_ap(np.array([0.5, 1.0]), np.array([1.0, 1.0]))[0] == pytest.approx(0.995)
    # precision 1 up to recall 0.5 then nothing: 101-point trapezoid of a step at 0.5
    ap = compute_ap(np.array([0.5]), np.array([1.0]))[0]
    x = np.linspace(0, 1, 101)
    assert ap == pytest.approx(np.trapezoid(np.interp(x, [0, 0.5, 1], [1, 1, 0]), x))


def test_ap_per_class_gives_zeros_to_a_class_never_predicted():
    tp = np.array([[True], [False]])
    result = ap_per_class(tp, np.array([0.9, 0.8]), np.array([0, 0]), np.array([0, 1]))
    assert result.classes.tolist() == [0, 1]
    assert result.ap[1, 0] == 0 and result.p[1] == 0 and result.r[1] == 0
    assert result.ap[0, 0] == pytest.approx(0.995)


def test_fitness_weights():
    assert fitness(0.5, 0.3) == pytest.approx(0.1 * 0.5 + 0.9 * 0.3)


def test_confusion_matrix_counts():
    cm = ConfusionMatrix(nc=2)
    labels = _boxes([0, 0, 0, 10, 10], [1, 20, 20, 30, 30], [1, 50, 50, 60, 60])
    detections = _boxes([0, 0, 10, 10, 0.9, 0],  # correct class 0
                        [20, 20, 30, 30, 0.8, 0],  # class 1 predicted as 0
                        [80, 80, 90, 90, 0.7, 1],  # background predicted as 1
                        [50, 50, 60, 60, 0.1, 1])  # below conf 0.25: ignored, so label 3 is missed
    cm.process_batch(detections, labels)
    expected = np.array([[1, 1, 0],
                         [0, 0, 1],
                         [0, 1, 0]])
    np.testing.assert_array_equal(cm.matrix, expected)
    cm.process_batch(None, torch.tensor([1.0]))  # image without predictions: label to background row
    assert cm.matrix[2, 1] == 2


def test_confusion_matrix_ignores_false_positives_of_an_image_without_matches():
    cm = ConfusionMatrix(nc=2)
    cm.process_batch(_boxes([0, 0, 10, 10, 0.9, 0]), torch.zeros((0, 5)))  # official behaviour
    assert cm.matrix.sum() == 0
