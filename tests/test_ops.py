"""yolo9kit.detections: NMS parity with the official outputs, equivalences, box rescaling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from yolo9kit.detections import non_max_suppression, scale_boxes

OFFICIAL_NAMES = {"conf_thres": "conf", "iou_thres": "iou"}  # official keyword -> ours


def test_nms_cases_recorded(load_fixture):
    assert sorted(load_fixture("ops.parity.pt")["nms"]["cases"]) == [
        "detect_0.25_0.45_1000", "detect_agnostic", "detect_classes_0_2", "val_0.001_0.7_multilabel_300"]


@pytest.mark.parametrize("key", ["detect_0.25_0.45_1000", "detect_agnostic", "detect_classes_0_2",
                                 "val_0.001_0.7_multilabel_300"])
def test_nms_rows_identical_to_official(load_fixture, key):
    """Official utils/general.py non_max_suppression on a (2, 10, 800) prediction of overlapping boxes:
    the same rows in the same order, per image."""
    nms = load_fixture("ops.parity.pt")["nms"]
    case = nms["cases"][key]
    kwargs = {OFFICIAL_NAMES.get(k, k): v for k, v in case["kwargs"].items()}
    # no time limit: on a busy CPU the official limit could (correctly) cut the second image short
    out = non_max_suppression(nms["input"], **kwargs, time_limit_s=float("inf"))
    expected = case["out"]
    assert len(out) == len(expected)
    assert sum(len(e) for e in expected) > 0
    for ours, theirs in zip(out, expected):
        assert ours.shape == theirs.shape
        assert torch.equal(ours, theirs)


def test_extra_nms_rows_identical_to_official_on_golden(load_extra_fixture):
    golden = load_extra_fixture("yolov9-t-golden.pt")
    cases = {"nms_val_0.001_0.7_multilabel_300": dict(conf=0.001, iou=0.7, multi_label=True, max_det=300),
             "nms_detect_0.25_0.45_1000": dict(conf=0.25, iou=0.45, max_det=1000),
             "nms_detect_agnostic": dict(conf=0.25, iou=0.45, max_det=1000, agnostic=True)}
    for key, kwargs in cases.items():
        out = non_max_suppression(golden["nms_input"], **kwargs, time_limit_s=float("inf"))
        assert all(torch.equal(o, e) for o, e in zip(out, golden[key], strict=True)), key


def _random_prediction(seed: int = 0, batch: int = 2, nc: int = 5, anchors: int = 400) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(batch, 2, anchors, generator=g) * 200
    wh = torch.rand(batch, 2, anchors, generator=g) * 60 + 4
    scores = torch.rand(batch, nc, anchors, generator=g) ** 4
    return torch.cat((xy, wh, scores), 1)


def test_nms_class_filter_equals_filtering_class_aware_output():
    pred = _random_prediction()
    full = non_max_suppression(pred, 0.1, 0.5, max_det=10_000)
    some = non_max_suppression(pred, 0.1, 0.5, classes=[1, 3], max_det=10_000)
    for f, s in zip(full, some):
        keep = (f[:, 5] == 1) | (f[:, 5] == 3)
        assert len(s) > 0
        assert torch.equal(f[keep], s)


def test_nms_max_det_keeps_the_most_confident_rows():
    pred = _random_prediction(1)
    full = non_max_suppression(pred, 0.05, 0.5, max_det=10_000)
    top = non_max_suppression(pred, 0.05, 0.5, max_det=7)
    for f, t in zip(full, top):
        assert len(f) > 7
        assert torch.equal(f[:7], t)


def test_nms_multi_label_gives_several_classes_per_box_and_agnostic_fewer_rows():
    pred = _random_prediction(2)
    single = non_max_suppression(pred, 0.2, 0.5, max_det=10_000)
    multi = non_max_suppression(pred, 0.2, 0.5, multi_label=True, max_det=10_000)
    agnostic = non_max_suppression(pred, 0.2, 0.5, agnostic=True, max_det=10_000)
    for s, m, a in zip(single, multi, agnostic):
        assert len(m) > len(s) > len(a)
        assert (s[:, 4][:-1] >= s[:, 4][1:]).all()  # sorted by confidence


def test_nms_nothing_above_threshold_gives_empty_rows():
    pred = _random_prediction()
    pred[:, 4:] = 0.001
    out = non_max_suppression(pred, 0.25, 0.45)
    assert [tuple(o.shape) for o in out] == [(0, 6), (0, 6)]


def test_nms_rejects_bad_thresholds_and_shapes():
    pred = _random_prediction()
    with pytest.raises(ValueError, match=r"conf=1.5 is outside"):
        non_max_suppression(pred, conf=1.5)
    with pytest.raises(ValueError, match=r"iou=-0.1 is outside"):
        non_max_suppression(pred, iou=-0.1)
    with pytest.raises(ValueError, match=r"\(B, 4\+nc, A\)"):
        non_max_suppression(pred[0])


def test_nms_time_limit_stops_with_a_warning(caplog):
    pred = _random_prediction()
    out = non_max_suppression(pred, 0.1, 0.5, time_limit_s=0.0)
    assert len(out[0]) > 0 and len(out[1]) == 0  # the first image is kept, the loop stops after it
    assert "NMS time limit" in caplog.text


def test_nms_accepts_the_decoded_raw_pair():
    pred = _random_prediction()
    a = non_max_suppression((pred, [torch.zeros(1)]), 0.2, 0.5)
    b = non_max_suppression(pred, 0.2, 0.5)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_scale_boxes_inverts_the_letterbox_geometry():
    original_hw, input_hw = (300, 500), (416, 640)  # gain 1.28, pad (0, 16)
    gain = min(input_hw[0] / original_hw[0], input_hw[1] / original_hw[1])
    pad_w, pad_h = (input_hw[1] - original_hw[1] * gain) / 2, (input_hw[0] - original_hw[0] * gain) / 2
    boxes = torch.tensor([[10.0, 20.0, 110.0, 220.0], [400.0, 0.0, 500.0, 300.0]])
    letterboxed = boxes * gain + torch.tensor([pad_w, pad_h, pad_w, pad_h])
    back = scale_boxes(input_hw, letterboxed.clone(), original_hw)
    torch.testing.assert_close(back, boxes)
    back2 = scale_boxes(input_hw, letterboxed.clone(), original_hw, ratio_pad=((gain, gain), (pad_w, pad_h)))
    torch.testing.assert_close(back2, boxes)


def test_scale_boxes_clips_to_the_image_for_tensors_and_arrays():
    for boxes in (torch.tensor([[-5.0, -5.0, 700.0, 700.0, 0.9, 1.0]]),
                  np.array([[-5.0, -5.0, 700.0, 700.0, 0.9, 1.0]])):
        out = scale_boxes((640, 640), boxes, (640, 640, 3))
        assert list(out[0, :4]) == [0, 0, 640, 640]
        assert float(out[0, 4]) == pytest.approx(0.9)  # score untouched
