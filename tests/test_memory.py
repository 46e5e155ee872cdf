"""yolo9kit.memory on a toy conv net (fast): tracing on meta tensors equals real CPU execution, extrapolation,
AMP emulation, the allocator model, find_max_batch with simulated OOM, plan, sweep, reports."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from yolo9kit.config import StepConfig
from yolo9kit.memory import (
    CATEGORIES,
    GPUSpec,
    MemoryReport,
    StepEstimator,
    estimate,
    find_max_batch,
    measure,
    plan,
    sweep,
)
from yolo9kit.memory.estimate import build_meta_trainer, prime
from yolo9kit.memory.gpus import LARGE_BUFFER, SMALL_BUFFER, CachingAllocatorModel, round_size, segment_size
from yolo9kit.memory.measure import build_real_trainer, fit_to_total
from yolo9kit.memory.tracer import AutocastEmulation, synthetic_batch, trace_meta_step, trace_real_step

GIB = 1 << 30


def toy_gpu(mib: int) -> GPUSpec:
    return GPUSpec(f"{mib} MiB test card", mib << 20, True, 100.0, 1000.0, context_bytes=0)


class ToyDetector(nn.Module):
    """Conv-BN-SiLU stages to stride 8, a 1x1 head: the shape of a detector, 60k parameters."""

    def __init__(self, nc: int = 3) -> None:
        super().__init__()
        self.nc = nc
        chans = [3, 16, 32, 64]
        self.stages = nn.ModuleList(nn.Sequential(nn.Conv2d(a, b, 3, 2, 1, bias=False), nn.BatchNorm2d(b), nn.SiLU())
                                    for a, b in zip(chans[:-1], chans[1:]))
        self.head = nn.Conv2d(64, 4 + nc, 1)

    def forward(self, x):
        for stage in self.stages:
            x = stage(x)
        return [self.head(x)]


def toy_loss(outputs, targets):
    """A loss with a data-dependent part (boolean mask), like the assigner's."""
    out = outputs[0].float()
    positive = out[:, 4:].sigmoid() > 0.5
    cls = nn.functional.binary_cross_entropy_with_logits(out[:, 4:], positive.float())
    box = out[:, :4][positive[:, :1].expand(-1, 4, -1, -1)].pow(2).sum() / (1 + targets.shape[0])
    loss = cls + box
    return loss * out.shape[0], torch.stack([box, cls, cls]).detach()


# the plain step (the layout of a real CPU step), a synthetic batch of 4 boxes per image, the toy loss
PLAIN = {"channels_last": False, "lean_activations": False, "fused_optimizer": False}


def toy_step(**kw) -> StepConfig:
    return StepConfig(ToyDetector(), **{"imgsz": 64, "amp": "off", "num_targets": 4, "num_classes": 3,
                                        "loss_fn": toy_loss, **PLAIN, **kw})


def toy_estimator(**kw) -> StepEstimator:
    return StepEstimator(toy_step(**kw))


def real_trainer():
    return build_real_trainer(ToyDetector(), toy_step().resolve("cpu"), torch.device("cpu"))


def real_trace(batch_size: int, imgsz: int = 64):
    torch.manual_seed(0)
    trainer = real_trainer()
    prime(trainer)
    images, targets = synthetic_batch(batch_size, imgsz, 4, 3)
    return trace_real_step(trainer, images, targets, device_type="cuda")


# ------------------------------------------------------------------- meta trace == real CPU step
def test_meta_trace_equals_real_cpu_execution():
    est = toy_estimator()
    meta_peak, meta_parts = est.memory.peak(2)
    real_parts = real_trace(2).peak()
    assert meta_peak == sum(real_parts.values())
    # every category at the peak, bytes for bytes (loss tensors: the mask size depends on values)
    for cat in ("weights", "gradients", "optimizer_state", "ema", "activations"):
        assert meta_parts[cat] == real_parts[cat], cat


def test_activations_equal_saved_tensors_of_real_forward():
    """Independent count: unique storages autograd saves in the real forward (saved_tensors_hooks),
    minus parameters, equal the tracker's activations alive when backward starts."""
    torch.manual_seed(0)
    model = ToyDetector().train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            saved[st.data_ptr()] = st.nbytes()
        return t

    images, targets = synthetic_batch(4, 64, 4, 3)
    x = images.float().div_(255)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    saved_bytes = sum(saved.values())
    out_bytes = out[0].untyped_storage().nbytes()  # the output is alive too (not saved by any op)
    del out
    trace = real_trace(4)
    live = trace.live()
    start_backward = next(e for name, e in trace.phase_starts if name == "loss")
    activations = live[start_backward - 1, CATEGORIES.index("activations")]
    # the tracker rounds each storage to 512 B, as the CUDA allocator does
    assert activations == pytest.approx(saved_bytes + out_bytes, rel=0.01)


def test_extrapolated_peak_equals_direct_trace_at_larger_batch():
    est = toy_estimator()
    trainer, loss_fn = build_meta_trainer(ToyDetector(), toy_step().resolve("cuda"))
    direct, _ = trace_meta_step(trainer, loss_fn, 6, 3)  # the toy step: 64 px, 4 boxes per image, 3 classes
    direct_parts = direct.peak()
    peak, parts = est.memory.peak(6)
    assert peak == pytest.approx(sum(direct_parts.values()), rel=0.02)
    assert parts["activations"] == pytest.approx(direct_parts["activations"], rel=0.02)


def test_activations_linear_in_batch_and_area():
    est = toy_estimator()
    a = [est.memory.peak(b)[1]["activations"] for b in (8, 16, 32)]
    assert a[2] - a[1] == pytest.approx(2 * (a[1] - a[0]), rel=1e-6)
    big = toy_estimator(imgsz=128).memory.peak(8)[1]["activations"]
    assert big == pytest.approx(4 * a[0], rel=0.05)  # 4x the pixels, 4x the activations


def test_amp_fp16_halves_activations_and_adds_weight_copies():
    fp32 = toy_estimator(amp="off").memory.peak(16)[1]
    fp16 = toy_estimator(amp="fp16").memory.peak(16)[1]
    assert 0.4 < fp16["activations"] / fp32["activations"] < 0.75
    assert fp16["weights"] > fp32["weights"]  # fp16 copies of the conv weights live through the step


def test_autocast_emulation_follows_cuda_lists():
    conv, bn = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)
    emu = AutocastEmulation(torch.float16)
    x = torch.randn(1, 3, 8, 8)
    with emu:
        emu.set_enabled(True)
        y = conv(x)
        z = bn(y.float()).half() if False else y
        s = y.sum()
        e = torch.exp(y)
        c = torch.cat([y, y.float()])
        w1 = emu._cast(conv.weight, torch.float16)
        w2 = emu._cast(conv.weight, torch.float16)
        emu.set_enabled(False)
        off = conv(x)
    assert y.dtype == torch.float16 and z.dtype == torch.float16
    assert s.dtype == torch.float32 and e.dtype == torch.float32 and c.dtype == torch.float32
    assert w1 is w2  # the weight cast is cached inside the region
    assert off.dtype == torch.float32


def _autocast_dtypes(x: torch.Tensor, conv: nn.Module, bn: nn.Module) -> list[torch.dtype]:
    """The output dtypes of the ops the kit's forward and loss use, in order."""
    import torch.nn.functional as F

    y = conv(x)
    outs = [y, bn(y), F.silu(y), F.max_pool2d(y, 2), F.interpolate(y, scale_factor=2.0),
            torch.cat([y, x.repeat(1, 3, 1, 1)[:, :8]], 1)]
    outs += [y.sigmoid(), y.exp(), y.log_softmax(1), y.softmax(1), y.sum(), y.pow(2), y.mean(), y @ y.transpose(-1, -2)]
    outs += [F.binary_cross_entropy_with_logits(y, torch.rand_like(y)), torch.log(y.abs() + 1)]
    return [o.dtype for o in outs]


def test_the_cpu_policy_casts_as_the_real_cpu_autocast_does():
    conv, bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
    x = torch.randn(2, 3, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        real = _autocast_dtypes(x, conv, bn)
    emulated = {}
    for policy in ("cpu", "cuda"):
        emu = AutocastEmulation(torch.bfloat16, policy)
        with emu:
            emu.set_enabled(True)
            emulated[policy] = _autocast_dtypes(x, conv, bn)
    assert emulated["cpu"] == real
    assert emulated["cuda"] != real  # the CUDA lists compute exp, log, sum and the loss in fp32: not the CPU's
    assert real[0] == torch.bfloat16 and real[-2] == torch.float32  # conv in bf16, BCE with logits in fp32


# --------------------------------------------------------------------------------- allocator model
def test_allocator_rounding_and_segments():
    assert round_size(1) == 512 and round_size(513) == 1024
    assert segment_size(100) == SMALL_BUFFER and segment_size(3 << 20) == LARGE_BUFFER
    assert segment_size((10 << 20) + 1) == 12 << 20
    m = CachingAllocatorModel()
    m.malloc(1, 1000)
    m.malloc(2, 1000)
    assert m.reserved == SMALL_BUFFER  # both packed into one 2 MiB segment
    m.free(1)
    m.free(2)
    m.malloc(3, 1 << 20)
    assert m.reserved == SMALL_BUFFER  # freed blocks merged and reused
    m.malloc(4, 30 << 20)
    m.free(4)
    m.malloc(5, 20 << 20)
    assert m.reserved == SMALL_BUFFER + (30 << 20)  # best fit in the cached 30 MiB block, split


def test_reserved_at_least_allocated_and_breakdown_sums():
    reports = toy_estimator().reports([1, 4, 16], gpu="T4")
    for r in reports:
        assert sum(r.breakdown.values()) == r.peak_allocated
        assert r.peak_reserved >= r.peak_allocated
        assert r.device_bytes == r.peak_reserved + r.context_bytes
    assert [r.peak_allocated for r in reports] == sorted(r.peak_allocated for r in reports)


def test_report_rejects_missing_categories_and_fit_to_total():
    with pytest.raises(ValueError, match="breakdown lacks"):
        MemoryReport(StepConfig("m"), "estimated", "cpu", 10, 10, {"weights": 10})
    parts = dict.fromkeys(CATEGORIES, 10)
    assert sum(fit_to_total(parts, 100).values()) == 100
    assert sum(fit_to_total(parts, 50).values()) == 50


# ------------------------------------------------------------------------------- measure on CPU
def test_measure_without_cuda_points_to_estimate():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(RuntimeError, match=r"estimate\("):
        measure(toy_step(), 2)


# ---------------------------------------------------------------- find_max_batch, simulated OOM
def test_find_max_batch_recovers_from_oom_and_training_continues():
    calls = []

    def trial(b):
        calls.append(b)
        if b > 37:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {b} GiB")
        return None

    result = find_max_batch(trial=trial, max_batch=1024)
    assert result.batch_size == 37
    assert any(not t["ok"] and t["reason"] == "out of memory" for t in result.trials)
    assert calls[:7] == [1, 2, 4, 8, 16, 32, 64]  # grows, then bisects
    # the process goes on: a normal training step runs after the out-of-memory errors
    from yolo9kit.train.step import train_step

    trainer = real_trainer()
    images, targets = synthetic_batch(2, 64, 4, 3)
    assert torch.isfinite(train_step(trainer, images, targets, ni=0, accumulate_steps=1)).all()


def test_find_max_batch_keeps_the_margin():
    result = find_max_batch(trial=lambda b: b * GIB, gpu=20 * GIB, margin=0.1)
    assert result.batch_size == 18  # 18 GiB <= 0.9 * 20 GiB < 19 GiB
    assert result.budget_bytes == int(18 * GIB)
    nothing = find_max_batch(trial=lambda b: 100 * GIB, gpu=20 * GIB)
    assert nothing.batch_size == 0 and nothing.reason.startswith("batch 1 needs 100.00 GiB, over a budget of 18.00")


def test_find_max_batch_estimated_matches_curve():
    gpu = toy_gpu(160)
    step = toy_step()
    result = find_max_batch(step, gpu=gpu, margin=0.0, max_batch=256)
    assert 1 < result.batch_size < 256
    est = StepEstimator(step)
    fits = [r.device_bytes <= gpu.total_bytes for r in est.reports([result.batch_size, result.batch_size + 1], gpu)]
    assert fits == [True, False]


# ------------------------------------------------------------------------------------ plan, sweep
def _card_between(est: StepEstimator, fits: int, fails: int) -> GPUSpec:
    """A card on which batch ``fits`` fits and batch ``fails`` does not (no margin, no context)."""
    low, high = (r.device_bytes for r in est.reports([fits, fails], toy_gpu(1024)))
    return GPUSpec("test card", (low + high) // 2, True, 100.0, 1000.0, context_bytes=0)


def test_plan_reaches_nominal_batch_and_recommends_fastest_fitting():
    est = toy_estimator()
    p = plan(toy_step(), nominal_batch_size=64, gpu=_card_between(est, 16, 17), margin=0.0)
    assert (p.table["batch_size"] * p.table["accumulate"] == 64).all()  # 16 is a divisor: no other row
    assert p.table["fits"].any() and not p.table["fits"].all()
    fitting = p.table[p.table["fits"]]
    assert p.recommended["batch_size"] == fitting["batch_size"].max() == p.largest_batch == 16
    assert p.recommended["accumulate"] == 4
    assert "recommended" in p.reason


def test_plan_takes_the_largest_batch_with_the_official_accumulation():
    """A card that fits 24: the plan trains 24 x round(64 / 24) = 72 images per step, as fit does with
    batch 24, not the largest divisor 16 x 4."""
    p = plan(toy_step(), nominal_batch_size=64, gpu=_card_between(toy_estimator(), 24, 25), margin=0.0)
    assert p.largest_batch == 24
    assert 24 in p.table["batch_size"].tolist() and 16 in p.table["batch_size"].tolist()
    assert (p.recommended["batch_size"], p.recommended["accumulate"], p.recommended["effective_batch"]) == (24, 3, 72)
    config = p.train_config()
    assert config.batch_size == 24 and config.optim.nominal_batch_size == 64 and config.step.amp == "off"
    from yolo9kit.train.optim import base_accumulate

    assert base_accumulate(config) == 3  # what fit will accumulate


def test_sweep_columns_and_settings():
    df = sweep(toy_step(), [1, 2, 4], amp=["off", "fp16"], gpu="T4", method="estimated")
    for col in ["model", "batch_size", "method", "setting", "peak_allocated", "peak_reserved", "device_bytes",
                "activations_bytes", "images_per_s", "fits"]:
        assert col in df.columns, col
    assert set(df["method"]) == {"estimated"} and df["setting"].nunique() == 2
    assert len(df) == 6
    by = df.groupby("amp")["activations_bytes"].max()
    assert by["fp16"] < by["off"]
    assert math.isfinite(df["images_per_s"].iloc[0])


def test_estimate_single_report():
    r = estimate(toy_step(), 4, gpu="RTX 4090")
    assert r.method == "estimated" and r.batch_size == 4 and r.fits
    assert "RTX 4090" in r.device and r.gpu_total_bytes == 24_564 << 20


def test_measured_breakdown_names_the_tracked_peak_and_sums_to_the_counter():
    """measure()'s breakdown step, run on the CPU: the tracked categories plus the unnamed remainder
    (cuDNN workspace on a GPU) sum to the allocator's peak."""
    torch.manual_seed(0)
    trainer = real_trainer()
    prime(trainer)
    images, targets = synthetic_batch(4, 64, 4, 3)
    tracked = real_trace(4).peak()
    counter_peak = sum(tracked.values()) + (3 << 20)  # the counter saw 3 MiB more (workspace)
    parts = fit_to_total(trace_real_step(trainer, images, targets, device_type="cuda").peak(), counter_peak)
    assert sum(parts.values()) == counter_peak
    assert parts["activations"] == tracked["activations"] and parts["ema"] == tracked["ema"]
    assert parts["workspace_other"] >= 3 << 20


def test_the_memory_functions_take_the_step_s_words_only():
    """The memory functions before StepConfig took checkpoint=, lean=, source=, step_fn=: those spellings are
    gone (one word per idea); the functions work with the new ones."""
    assert find_max_batch(trial=lambda b: b * GIB, gpu=20 * GIB, margin=0.1).batch_size == 18
    with pytest.raises((TypeError, ValueError)):  # not a keyword of the function, nor a StepConfig field
        find_max_batch(step_fn=lambda b: b * GIB, gpu=20 * GIB, margin=0.1)
    df = sweep(toy_step(), [2], gpu="T4", method="estimated")
    assert set(df["method"]) == {"estimated"}
    import inspect

    for fn in (estimate, measure, sweep, find_max_batch, plan):
        old_names = {"checkpoint", "lean", "source", "step_fn", "steps", "warmup"}
        assert not old_names & set(inspect.signature(fn).parameters), fn
