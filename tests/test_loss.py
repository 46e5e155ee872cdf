"""yolo9kit.loss and yolo9kit.assigner: parity with the official ComputeLoss, chunking equivalence,
edge cases and error messages."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from official_parity import SMALL, run_kit

from yolo9kit.assigner import TaskAlignedAssigner
from yolo9kit.boxes import bbox_ciou, make_anchors
from yolo9kit.loss import DetectionLoss, LossConfig
from yolo9kit.models import list_models

STRIDES = [8, 16, 32]
NUM_CLASSES = 80


class _Dual(NamedTuple):  # same fields as yolo9kit.models.DualOutput
    aux: list | None
    main: list


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


def _fixture_outputs(data: dict) -> list:
    """Official-order training outputs of a fixture, fp32."""
    if "train_out" in data:
        out = data["train_out"]
        if isinstance(out[0], torch.Tensor):
            return [m.float() for m in out]
        return [[m.float() for m in head] for head in out]
    return [[m.float() for m in data["train_raw_aux"]], [m.float() for m in data["train_raw_main"]]]


def _random_maps(batch_size: int, image_size: int, num_classes: int, seed: int, scale: float = 1.0) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch_size, 64 + num_classes, image_size // s, image_size // s, generator=gen) * scale
            for s in STRIDES]


def _random_targets(counts: list[int], num_classes: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for image, n in enumerate(counts):
        centre = torch.rand(n, 2, generator=gen) * 0.8 + 0.1
        size = torch.rand(n, 2, generator=gen) * 0.3 + 0.02
        cls = torch.randint(0, num_classes, (n, 1), generator=gen).float()
        rows.append(torch.cat([torch.full((n, 1), float(image)), cls, centre, size], 1))
    return torch.cat(rows) if rows else torch.zeros(0, 6)


# --------------------------------------------------------------------------------------------- parity

MODELS = [name if name in SMALL else pytest.param(name, marks=pytest.mark.slow) for name in list_models()]


@pytest.mark.parametrize("name", list_models())
def test_loss_matches_official(load_fixture, name):
    """The official ComputeLoss (utils/loss_tal_dual.py for yolov9, utils/loss_tal.py for gelan,
    hyp.scratch-high) on the official training-mode maps of each model: same loss and items."""
    data = load_fixture(f"{name}.parity.pt")
    outputs = _fixture_outputs(data)
    main = outputs if isinstance(outputs[0], torch.Tensor) else outputs[-1]
    loss_fn = DetectionLoss(num_classes=main[0].shape[1] - 64, strides=data["stride"].tolist())
    loss, items = loss_fn(outputs, data["targets"])
    assert _rel(loss, data["loss"]) < 1e-4
    assert _rel(items, data["loss_items"].float()) < 1e-4
    assert not items.requires_grad
    # the same through the named output type (gelan: aux None)
    named = _Dual(None, outputs) if isinstance(outputs[0], torch.Tensor) else _Dual(*outputs)
    loss_named, items_named = loss_fn(named, data["targets"])
    assert torch.equal(loss_named, loss) and torch.equal(items_named, items)


def test_extra_loss_matches_official_on_golden(load_extra_fixture):
    data = load_extra_fixture("yolov9-t-golden.pt")
    loss, items = DetectionLoss(num_classes=80, strides=STRIDES)(_fixture_outputs(data), data["targets"])
    assert _rel(loss, data["loss"]) < 1e-4 and _rel(items, data["loss_items"].float()) < 1e-4


def test_loss_scales_with_batch_and_gains(load_fixture):
    data = load_fixture("yolov9-t.parity.pt")
    outputs = _fixture_outputs(data)
    loss, items = DetectionLoss(num_classes=80, strides=STRIDES)(outputs, data["targets"])
    assert torch.allclose(loss, items.sum() * 2, rtol=1e-6)  # batch of 2
    doubled = LossConfig(box_gain=15.0, cls_gain=1.0, dfl_gain=3.0)
    _, items2 = DetectionLoss(num_classes=80, strides=STRIDES, config=doubled)(outputs, data["targets"])
    assert torch.allclose(items2, items * 2, rtol=1e-6)


def test_dual_with_zero_aux_weight_equals_main_head_alone(load_fixture):
    data = load_fixture("yolov9-t.parity.pt")
    aux, main = _fixture_outputs(data)
    no_aux = DetectionLoss(num_classes=80, strides=STRIDES, config=LossConfig(aux_weight=0.0))
    loss_dual, items_dual = no_aux([aux, main], data["targets"])
    loss_main, items_main = DetectionLoss(num_classes=80, strides=STRIDES)(main, data["targets"])
    assert torch.allclose(items_dual, items_main, rtol=1e-6)
    assert torch.allclose(loss_dual, loss_main, rtol=1e-6)


# ------------------------------------------------------------------------------------------ gradients

@pytest.mark.parametrize("name", MODELS)
def test_gradient_norms_match_official(load_fixture, name):
    """Our model with the parity weights, its own training forward (float64, as the reference) and our
    loss: the loss items, the total gradient norm and every parameter's gradient norm equal the official
    ones. A norm under 1e-9 of the largest is an exact zero up to rounding (a conv bias in front of a
    training-mode BatchNorm has no gradient): there both sides must be such a zero."""
    data, ours = load_fixture(f"{name}.parity.pt"), run_kit(name)
    assert _rel(ours["loss_items"].double(), data["loss_items"].double()) < 1e-4
    assert set(ours["grad_norms"]) == set(data["grad_norms"])
    assert abs(ours["grad_norm"] - data["grad_norm"]) / data["grad_norm"] < 1e-4
    zero = 1e-9 * max(data["grad_norms"].values())
    worst = max(abs(ours["grad_norms"][n] - ref) / ref for n, ref in data["grad_norms"].items() if ref > zero)
    assert worst < 1e-4
    assert all(ours["grad_norms"][n] < zero for n, ref in data["grad_norms"].items() if ref <= zero)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    counts=st.lists(st.integers(0, 6), min_size=1, max_size=3),
    tiny=st.booleans(),
    border=st.sampled_from(["none", "crossing", "touching", "whole_image"]),
    scale=st.sampled_from([0.1, 1.0, 8.0]),
    seed=st.integers(0, 2**16),
)
def test_loss_finite_and_non_negative_for_random_targets(counts, tiny, border, scale, seed):
    num_classes = 3
    gen = torch.Generator().manual_seed(seed)
    targets = _random_targets(counts, num_classes, seed)
    if len(targets) and tiny:  # degenerate boxes: a fraction of a pixel, or no width at all
        targets[::2, 4:6] = torch.tensor([1e-4, 0.0])[torch.randint(0, 2, (1,), generator=gen)]
    if len(targets) and border == "crossing":  # centres on the border: half the box outside
        targets[::2, 2:4] = torch.tensor([0.0, 1.0])[torch.randint(0, 2, (2,), generator=gen)]
    elif len(targets) and border == "touching":  # left edge on x = 0, bottom edge on y = 1
        targets[::2, 2] = targets[::2, 4] / 2
        targets[::2, 3] = 1 - targets[::2, 5] / 2
    elif len(targets) and border == "whole_image":
        targets[::2, 2:6] = torch.tensor([0.5, 0.5, 1.0, 1.0])
    maps = [[m.requires_grad_() for m in _random_maps(len(counts), 64, num_classes, seed + head, scale)]
            for head in range(2)]
    loss, items = DetectionLoss(num_classes=num_classes, strides=STRIDES)(maps, targets)
    assert torch.isfinite(loss) and torch.isfinite(items).all()
    assert (items >= 0).all() and loss >= 0
    loss.backward()
    assert all(torch.isfinite(m.grad).all() for head in maps for m in head)


# -------------------------------------------------------------------------------------- edge cases

def test_batch_without_targets_gives_class_loss_only():
    maps = [m.requires_grad_() for m in _random_maps(2, 64, 4, seed=1)]
    loss, items = DetectionLoss(num_classes=4, strides=STRIDES)(maps, torch.zeros(0, 6))
    assert items[0] == 0 and items[2] == 0 and items[1] > 0
    loss.backward()
    assert all(torch.isfinite(m.grad).all() for m in maps)


def test_image_without_targets_only_contributes_background():
    """Image 1 has no targets: its anchors get zero class targets, and the loss of image 0 is unchanged
    apart from image 1's background BCE."""
    num_classes = 4
    maps = _random_maps(2, 64, num_classes, seed=2)
    targets = _random_targets([3, 0], num_classes, seed=2)
    loss_fn = DetectionLoss(num_classes=num_classes, strides=STRIDES)
    _, items = loss_fn(maps, targets)
    _, items_alone = loss_fn([m[:1] for m in maps], targets)
    assert torch.allclose(items[0], items_alone[0]) and torch.allclose(items[2], items_alone[2])
    assert items[1] > items_alone[1]  # extra background BCE of image 1 over the same normaliser


def test_loss_is_computed_in_fp32_under_autocast(load_fixture):
    """Inside an autocast region (as in AMP training) the loss still runs in float32: same numbers."""
    data = load_fixture("yolov9-t.parity.pt")
    outputs = _fixture_outputs(data)
    loss_fn = DetectionLoss(num_classes=80, strides=STRIDES)
    loss, items = loss_fn(outputs, data["targets"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_amp, items_amp = loss_fn(outputs, data["targets"])
    assert loss_amp.dtype == torch.float32
    assert torch.equal(loss_amp, loss) and torch.equal(items_amp, items)
    half = [[m.half() for m in head] for head in outputs]  # fp16 maps are upcast, not an error
    assert _rel(loss_fn(half, data["targets"])[1], items) < 1e-2


def test_bad_inputs_have_clear_errors():
    loss_fn = DetectionLoss(num_classes=4, strides=STRIDES)
    maps = _random_maps(2, 64, 4, seed=3)
    with pytest.raises(ValueError, match=r"\(N, 6\)"):
        loss_fn(maps, torch.zeros(3, 5))
    with pytest.raises(ValueError, match="image_index"):
        loss_fn(maps, torch.tensor([[2.0, 0, 0.5, 0.5, 0.1, 0.1]]))
    with pytest.raises(ValueError, match="68"):
        DetectionLoss(num_classes=80, strides=STRIDES)(maps, torch.zeros(0, 6))
    with pytest.raises(ValueError, match="train"):
        loss_fn([torch.zeros(2, 68, 84)] * 3, torch.zeros(0, 6))
    with pytest.raises(ValueError, match="num_classes and strides"):
        DetectionLoss()


# ------------------------------------------------------------------------------- assigner chunking

def _assigner_inputs(counts: list[int], image_size: int = 128, num_classes: int = 5, seed: int = 0):
    loss_fn = DetectionLoss(num_classes=num_classes, strides=STRIDES)
    maps = _random_maps(len(counts), image_size, num_classes, seed)
    targets = _random_targets(counts, num_classes, seed)
    gt = loss_fn.pad_targets(targets, len(counts), (image_size, image_size))
    flat = torch.cat([m.reshape(len(counts), 64 + num_classes, -1) for m in maps], 2)
    dist, logits = flat.split((64, num_classes), 1)
    points, stride = make_anchors([m.shape[2:] for m in maps], STRIDES)
    boxes = loss_fn.decode_boxes(points, dist.permute(0, 2, 1).contiguous()) * stride
    return logits.permute(0, 2, 1).sigmoid(), boxes, points * stride, gt


@pytest.mark.parametrize("max_pairs", [1, 50_000, 336 * 300 + 1])
def test_crowded_batch_chunked_equals_unchunked(max_pairs):
    """300 objects in an image: any chunking (down to one GT row at a time) gives identical targets."""
    scores, boxes, points, gt = _assigner_inputs([300, 0, 37, 300])
    whole = TaskAlignedAssigner(5, max_pairs=None)(scores, boxes, points, gt.labels, gt.boxes_xyxy, gt.counts)
    chunked = TaskAlignedAssigner(5, max_pairs=max_pairs)(scores, boxes, points, gt.labels, gt.boxes_xyxy,
                                                          gt.counts)
    assert whole.fg_mask.sum() > 100
    assert torch.equal(whole.fg_mask, chunked.fg_mask)
    assert torch.equal(whole.target_scores, chunked.target_scores)
    fg = whole.fg_mask
    assert torch.equal(whole.target_labels[fg], chunked.target_labels[fg])
    assert torch.equal(whole.target_bboxes[fg], chunked.target_bboxes[fg])


def test_chunking_exact_with_other_exponents():
    """alpha off the sqrt path (powers precomputed for the batch) and another integer beta."""
    scores, boxes, points, gt = _assigner_inputs([120, 7], seed=8)
    args = (scores, boxes, points, gt.labels, gt.boxes_xyxy, gt.counts)
    whole = TaskAlignedAssigner(5, alpha=1.3, beta=4.0, max_pairs=None)(*args)
    chunked = TaskAlignedAssigner(5, alpha=1.3, beta=4.0, max_pairs=1000)(*args)
    assert whole.fg_mask.any()
    assert torch.equal(whole.fg_mask, chunked.fg_mask) and torch.equal(whole.target_scores, chunked.target_scores)


def test_crowded_loss_chunked_equals_unchunked():
    maps = _random_maps(2, 128, 5, seed=4)
    targets = _random_targets([300, 120], 5, seed=4)
    results = [DetectionLoss(num_classes=5, strides=STRIDES, config=LossConfig(max_assign_chunk=chunk))(
        [maps, maps], targets) for chunk in (None, 5_000)]
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    assert torch.isfinite(results[0][0])


def _reference_assign(scores, boxes, points, gt, topk=10, alpha=0.5, beta=6.0, eps=1e-9):
    """The assigner of docs/loss.md written out batched over (B, M, A), as the official
    utils/tal/assigner.py TaskAlignedAssigner is; test oracle."""
    b, a, c = scores.shape
    m = gt.boxes_xyxy.shape[1]
    real = (torch.arange(m)[None] < gt.counts[:, None]).float()[..., None]  # (B, M, 1)
    labels = gt.labels.long()
    lt, rb = gt.boxes_xyxy[..., None, :2], gt.boxes_xyxy[..., None, 2:]
    in_gt = torch.cat([points - lt, rb - points], -1).amin(-1).gt(eps).float()  # (B, M, A)
    box_scores = scores[torch.arange(b)[:, None], :, labels]  # (B, M, A)
    overlaps = bbox_ciou(gt.boxes_xyxy[:, :, None], boxes[:, None]).squeeze(-1).clamp(0)
    align = box_scores.pow(alpha) * overlaps.pow(beta)
    idx = (align * in_gt).topk(topk, -1).indices
    idx = torch.where(real.bool().expand_as(idx), idx, 0)
    hits = torch.nn.functional.one_hot(idx, a).sum(-2)
    mask = torch.where(hits > 1, 0, hits).float() * in_gt * real
    multi = mask.sum(1, keepdim=True) > 1
    best = torch.nn.functional.one_hot(overlaps.argmax(1), m).permute(0, 2, 1).float()
    mask = torch.where(multi, best, mask)
    fg = mask.sum(1) > 0
    gt_idx = mask.argmax(1)
    target_labels = labels.gather(1, gt_idx)
    one_hot = torch.nn.functional.one_hot(target_labels, c) * fg[..., None]
    align = align * mask
    norm = (align * (overlaps * mask).amax(-1, keepdim=True) / (align.amax(-1, keepdim=True) + eps)).amax(1)
    return fg, target_labels, one_hot * norm[..., None]


def test_assigner_matches_batched_reference():
    """Conflict resolution, padding rows and normalisation against a literal (B, M, A) version."""
    scores, boxes, points, gt = _assigner_inputs([40, 3, 0, 25], image_size=96, seed=5)
    ours = TaskAlignedAssigner(5)(scores, boxes, points, gt.labels, gt.boxes_xyxy, gt.counts)
    fg, labels, target_scores = _reference_assign(scores, boxes, points, gt)
    assert fg.sum() > 20
    assert torch.equal(ours.fg_mask, fg)
    assert torch.equal(ours.target_labels[fg], labels[fg])
    assert torch.allclose(ours.target_scores, target_scores.float(), rtol=1e-5, atol=1e-7)


def test_best_anchor_of_each_gt_scores_its_best_ciou():
    """Normalisation: over the anchors assigned to a GT, the largest target score is that GT's
    largest CIoU with their predicted boxes (when the alignment is well above eps, as here: every
    anchor predicts a jittered copy of the nearest GT)."""
    scores, _, points, gt = _assigner_inputs([6], image_size=96, seed=6)
    gt_boxes = gt.boxes_xyxy[0]
    nearest = torch.cdist(points, (gt_boxes[:, :2] + gt_boxes[:, 2:]) / 2).argmin(1)
    jitter = 1 + 0.01 * torch.randn(len(points), 4, generator=torch.Generator().manual_seed(6))
    boxes = (gt_boxes[nearest] * jitter)[None]
    res = TaskAlignedAssigner(5)(scores, boxes, points, gt.labels, gt.boxes_xyxy, gt.counts)
    fg = res.fg_mask[0]
    assigned_boxes = res.target_bboxes[0, fg]
    ciou = bbox_ciou(assigned_boxes, boxes[0, fg]).squeeze(-1).clamp(0)
    best_score = res.target_scores[0, fg].amax(-1)
    groups = assigned_boxes.unique(dim=0)
    assert len(groups) >= 3
    for box in groups:
        same = (assigned_boxes == box).all(-1)
        assert torch.allclose(best_score[same].max(), ciou[same].max(), rtol=1e-3)  # eps / alignment
