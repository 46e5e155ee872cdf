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
    est = StepEstimator(name, imgsz=256, amp="fp16")  # fit's CUDA step: channels_last, lean, dense loss
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
    ckpt = StepEstimator("yolov9-t", imgsz=128, amp="fp16", activation_checkpointing="all")
    fp32 = StepEstimator("yolov9-t", imgsz=128, amp="off")
    big = StepEstimator("yolov9-t", imgsz=256, amp="fp16")
    act = {k: e.memory.peak(32)[1]["activations"] for k, e in
           {"base": base, "ckpt": ckpt, "fp32": fp32, "big": big}.items()}
    assert act["ckpt"] < 0.5 * act["base"]  # checkpointing keeps only layer inputs
    assert act["fp32"] > 1.5 * act["base"]  # fp16 activations are half the bytes
    assert act["big"] == pytest.approx(4 * act["base"], rel=0.1)  # 4x the pixels
    assert ckpt.train_gflops_per_image > base.train_gflops_per_image  # recompute costs time


@pytest.mark.slow
@pytest.mark.parametrize("switches", ["plain", "cuda defaults"])
def test_the_described_step_is_the_step_fit_builds(switches):
    """The step ``describe_step`` gives for a TrainConfig and a device is the step ``build_trainer`` (what
    ``fit`` calls) builds: the same switches on the trainer and the model, and the estimate's traced memory
    equals the built trainer's real step on the CPU, every category at the peak byte for byte except the
    loss (its masks depend on values; to the 512-byte rounding of a few tiny storages). "cuda defaults":
    channels_last, lean activations and the fused optimizer forced on the CPU, as CUDA turns them on."""
    import dataclasses

    import torch

    from yolo9kit.config import TrainConfig
    from yolo9kit.memory.tracer import synthetic_batch, trace_real_step
    from yolo9kit.models import create_model
    from yolo9kit.train.step import build_trainer, describe_step, train_step

    on = switches == "cuda defaults"
    config = TrainConfig(batch_size=2, imgsz=64, amp="off", device="cpu", channels_last=on, lean_activations=on,
                         fused_optimizer=on)
    cpu = torch.device("cpu")
    step = describe_step(config, create_model("yolov9-t"), cpu)
    assert (step.channels_last, step.lean_activations, step.fused_optimizer) == (on,) * 3
    est = StepEstimator(dataclasses.replace(step, model="yolov9-t", num_targets=4, num_classes=80))
    for b in (2, 4):
        torch.manual_seed(0)
        model = create_model("yolov9-t")
        trainer = build_trainer(model, dataclasses.replace(config, batch_size=b), device=cpu)
        assert trainer.step == dataclasses.replace(step, batch_size=b, model=model)
        assert trainer.channels_last == on
        assert model.model[0].conv.weight.is_contiguous(memory_format=torch.channels_last) == on
        assert any(getattr(m, "lean", False) for m in model.modules()) == on
        assert trainer.optimizer.defaults.get("fused") in ((True,) if on else (False, None))
        for group in trainer.optimizer.param_groups:  # the multi-tensor kernels, CUDA's default (as the estimate)
            group["foreach"] = not group.get("fused")
        images, targets = synthetic_batch(b, 64, 4, 80)
        train_step(trainer, images, targets, ni=0, accumulate_steps=1)  # steady state: momentum exists, as estimated
        real = trace_real_step(trainer, images, targets, device_type="cuda").peak()
        peak, parts = est.memory.peak(b)
        for cat in ("weights", "gradients", "optimizer_state", "ema", "activations"):
            # exact but for the 512-byte rounding of a few tiny per-channel storages, which the linear
            # extrapolation from batches 1 and 2 cannot follow
            assert abs(parts[cat] - real[cat]) <= 4 * 512, (b, cat, parts[cat], real[cat])
        assert peak == pytest.approx(sum(real.values()), rel=0.01)
