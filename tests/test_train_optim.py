"""Optimizer groups, weight-decay scaling, schedules, the warmup ramp and the EMA, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from train_toys import ToyNet, one_thread

from yolo9kit.config import TrainConfig
from yolo9kit.train.optim import (
    base_accumulate,
    build_optimizer,
    lr_factor,
    param_groups,
    scaled_weight_decay,
    step_settings,
    warmup_batches,
)
from yolo9kit.train.step import ModelEMA

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

# Warmup table written out by hand from the formulas of the official train_dual.py warmup block (not with the
# code under test):
# batch 16 (nominal 64), 50 batches per epoch, 10 epochs, linear schedule, lr0 0.01, lrf 0.01, warmup 3 epochs
# -> nw = max(round(3 * 50), 100) = 150. lf(e) = (1 - e/10) * 0.99 + 0.01: lf(0) 1, lf(1) 0.901, lf(2) 0.802,
# lf(3) 0.703, lf(4) 0.604. accumulate = max(1, round(1 + 3 ni / 150)) with halves rounded to even.
# bias lr = 0.1 + (0.01 lf - 0.1) ni / 150; other lrs = 0.01 lf ni / 150; momentum = 0.8 + 0.137 ni / 150.
WARMUP_TABLE = [
    # ni, epoch, accumulate, bias lr, other lr, momentum
    (0, 0, 1, 0.1, 0.0, 0.8),
    (25, 0, 2, 0.085, 0.0016666667, 0.82283333),  # 1.5 -> 2
    (50, 1, 2, 0.06967, 0.0030033333, 0.84566667),  # target 0.00901
    (75, 1, 2, 0.054505, 0.004505, 0.8685),  # 2.5 -> 2 (half to even)
    (100, 2, 3, 0.0386800000, 0.0053466667, 0.89133333),  # target 0.00802
    (125, 2, 4, 0.02335, 0.0066833333, 0.91416667),  # 3.5 -> 4
    (150, 3, 4, 0.00703, 0.00703, 0.937),  # end of warmup
    (151, 3, 4, 0.00703, 0.00703, 0.937),
    (200, 4, 4, 0.00604, 0.00604, 0.937),
]


@pytest.mark.parametrize("ni, epoch, accumulate, bias_lr, lr, momentum", WARMUP_TABLE)
def test_warmup_table(ni, epoch, accumulate, bias_lr, lr, momentum):
    config = TrainConfig(epochs=10, batch_size=16)
    nw = warmup_batches(config, batches_per_epoch=50)
    assert nw == 150
    s = step_settings(config, ni, epoch, nw)
    assert s.accumulate == accumulate
    assert s.lrs[0] == pytest.approx(bias_lr, abs=1e-9)
    assert s.lrs[1] == pytest.approx(lr, abs=1e-9) and s.lrs[2] == pytest.approx(lr, abs=1e-9)
    assert s.momentum == pytest.approx(momentum, abs=1e-8)


def test_warmup_minimum_and_disabled():
    assert warmup_batches(TrainConfig(), batches_per_epoch=10) == 100  # official floor of 100 batches
    config = TrainConfig(warmup_epochs=0, warmup_min_batches=0, batch_size=8)
    s = step_settings(config, 0, 0, warmup_batches(config, 10))
    assert s.accumulate == 8 and s.lrs == (0.01, 0.01, 0.01) and s.momentum == 0.937


@pytest.mark.parametrize("batch, accumulate, decay", [
    (16, 4, 0.0005), (24, 3, 0.0005 * 72 / 64), (40, 2, 0.0005 * 80 / 64), (48, 1, 0.0005 * 48 / 64),
    (64, 1, 0.0005), (128, 1, 0.001), (1, 64, 0.0005),
])
def test_accumulate_and_weight_decay_official(batch, accumulate, decay):
    config = TrainConfig(batch_size=batch)
    assert base_accumulate(config) == accumulate
    assert scaled_weight_decay(config) == pytest.approx(decay)


def test_explicit_accumulate_ramps_to_it():
    config = TrainConfig(batch_size=8, accumulate_steps=2, warmup_min_batches=10, warmup_epochs=0)
    assert [step_settings(config, ni, 0, 10).accumulate for ni in (0, 4, 6, 10, 11)] == [1, 1, 2, 2, 2]
    assert scaled_weight_decay(config) == pytest.approx(0.0005 * 16 / 64)


@pytest.mark.parametrize("schedule, epoch, factor", [
    ("linear", 0, 1.0), ("linear", 5, 0.505), ("linear", 10, 0.01),
    ("cosine", 0, 1.0), ("cosine", 5, 0.505), ("cosine", 10, 0.01),
    ("flat-cosine", 5, 1.0), ("flat-cosine", 6, 1 - 0.99 * (1 - math.cos(math.pi / 5)) / 2), ("flat-cosine", 10, 0.01),
    ("fixed", 7, 1.0),
])
def test_schedules(schedule, epoch, factor):
    assert lr_factor(TrainConfig(epochs=10, schedule=schedule), epoch) == pytest.approx(factor)


def test_param_groups_and_optimizers():
    model = ToyNet(batchnorm=True)
    biases, decayed, norm = param_groups(model)
    assert [p.shape for p in biases] == [torch.Size([8]), torch.Size([4])]  # bn.bias, conv2.bias (conv1 has none)
    assert [p.shape for p in decayed] == [model.conv1.weight.shape, model.conv2.weight.shape]
    assert norm == [model.bn.weight]
    sgd = build_optimizer(model, TrainConfig(batch_size=32))
    assert [g["weight_decay"] for g in sgd.param_groups] == [0.0, pytest.approx(0.0005 * 64 / 64), 0.0]
    assert all(g["nesterov"] and g["momentum"] == 0.937 for g in sgd.param_groups)
    adamw = build_optimizer(model, TrainConfig(optimizer="AdamW"))
    assert adamw.param_groups[0]["amsgrad"] and adamw.param_groups[1]["betas"] == (0.937, 0.999)


def test_param_group_counts_yolov9_t():
    models = pytest.importorskip("yolo9kit.models")
    b, d, n = param_groups(models.create_model("yolov9-t"))
    assert (len(b), len(d), len(n)) == (303, 305, 291)  # counts of the official smart_optimizer


def test_ema_matches_official_formula():
    torch.manual_seed(0)
    model = ToyNet(batchnorm=True)
    ema = ModelEMA(model, decay=0.9999, tau=2000)
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    for updates in (1, 2, 3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
            model.bn.running_mean.add_(1.0)
            model.bn.num_batches_tracked += 1
        ema.update(model)
        d = 0.9999 * (1 - math.exp(-updates / 2000))
        for k, v in model.state_dict().items():
            if v.dtype.is_floating_point:
                reference[k] = d * reference[k] + (1 - d) * v
    for k, v in ema.ema.state_dict().items():
        if v.dtype.is_floating_point:
            torch.testing.assert_close(v, reference[k], rtol=1e-6, atol=1e-7)
        else:  # integer buffers are not averaged
            assert int(v) == 0
    assert ema.updates == 3 and not any(p.requires_grad for p in ema.ema.parameters())
