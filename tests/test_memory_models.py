"""yolo9kit.memory on the real YOLOv9 / GELAN models (slow: each model is traced twice on fake tensors)."""

from __future__ import annotations

import time

import pytest

from yolo9kit.memory import StepEstimator
from yolo9kit.models import list_models

BATCHES = list(range(1, 129))


@pytest.mark.slow
@pytest.mark.parametrize("name", list_models())
def test_every_model_estimates_batches_1_to_128(name):
    t0 = time.perf_counter()
    est = StepEstimator(name, imgsz=256, amp="fp16")
    reports = est.reports(BATCHES, gpu="A100-80GB")
    print(f"{name}: curve of {len(BATCHES)} batch sizes in {time.perf_counter() - t0:.1f} s")  # timing: info only
    peaks = [r.peak_allocated for r in reports]
    assert all(a < b for a, b in zip(peaks, peaks[1:]))  # strictly more memory for every extra image
    for r in reports:
        assert sum(r.breakdown.values()) == r.peak_allocated
        assert r.peak_reserved >= r.peak_allocated
    first, last = reports[0].breakdown, reports[-1].breakdown
    # optimizer state and EMA do not grow with the batch; activations do. (The weights at the peak may
    # include autocast's fp16 copies or not, depending on where the peak falls.)
    for cat in ("optimizer_state", "ema"):
        assert first[cat] == last[cat], cat
    assert last["weights"] >= first["weights"]
    assert last["activations"] > 50 * first["activations"]
    assert 1 < est.gflops < 250  # forward GFLOPs per image at 256 px


@pytest.mark.slow
def test_switches_change_the_curve_as_expected():
    base = StepEstimator("yolov9-t", imgsz=128, amp="fp16")
    ckpt = StepEstimator("yolov9-t", imgsz=128, amp="fp16", checkpoint="all")
    fp32 = StepEstimator("yolov9-t", imgsz=128, amp="off")
    big = StepEstimator("yolov9-t", imgsz=256, amp="fp16")
    act = {k: e.memory.peak(32)[1]["activations"] for k, e in
           {"base": base, "ckpt": ckpt, "fp32": fp32, "big": big}.items()}
    assert act["ckpt"] < 0.5 * act["base"]  # checkpointing keeps only layer inputs
    assert act["fp32"] > 1.5 * act["base"]  # fp16 activations are half the bytes
    assert act["big"] == pytest.approx(4 * act["base"], rel=0.1)  # 4x the pixels
    assert ckpt.train_gflops_per_image > base.train_gflops_per_image  # recompute costs time


@pytest.mark.slow
def test_yolov9_t_meta_trace_equals_real_cpu_step():
    """The estimate's accounting against the same step executed for real on the CPU (yolov9-t, 64 px,
    no AMP): every category at the peak, byte for byte except the loss (its masks depend on values)."""
    import torch

    from yolo9kit.memory.extrapolate import _live_matrix
    from yolo9kit.memory.step import build_real_trainer, prime_optimizer, resolve_model, synthetic_batch
    from yolo9kit.memory.trace import trace_real_step
    from yolo9kit.memory.tracker import CATEGORIES

    est = StepEstimator("yolov9-t", imgsz=64, amp="off", num_targets=4)
    for b in (2, 4):
        peak, parts = est.memory.peak(b)
        model, _ = resolve_model("yolov9-t", 80, None)
        trainer = build_real_trainer(model, amp="off", channels_last=False, device=torch.device("cpu"))
        prime_optimizer(trainer.model, trainer.optimizer)
        images, targets = synthetic_batch(b, 64, 4, 80)
        live = _live_matrix(trace_real_step(trainer, images, targets, device_type="cuda"))
        real = dict(zip(CATEGORIES, live[int(live.sum(1).argmax())].tolist()))
        for cat in ("weights", "gradients", "optimizer_state", "ema", "activations"):
            assert parts[cat] == real[cat], (b, cat)
        assert peak == pytest.approx(sum(real.values()), rel=0.01)
