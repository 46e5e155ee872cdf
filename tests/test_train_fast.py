"""The fast step (the CUDA defaults: channels_last, fused optimizer, lean BatchNorm+SiLU) trains the same as the
plain step, here on the CPU where every one of those switches also runs."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from train_toys import ToyNet, make_batches, one_thread, params_of, toy_loss

from yolo9kit.config import TrainConfig
from yolo9kit.models import create_model
from yolo9kit.train.guards import NonFiniteLossError
from yolo9kit.train.loop import train_one_epoch
from yolo9kit.train.state import Progress
from yolo9kit.train.step import build_trainer, train_step

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

PLAIN = {"channels_last": False, "fused_optimizer": False, "lean_activations": False}
FAST = {"channels_last": True, "fused_optimizer": True, "lean_activations": True}
NO_WARMUP = {"warmup_epochs": 0.0, "warmup_min_batches": 0}


def _detection_batches(n: int, batch: int, size: int, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        images = torch.randint(0, 256, (batch, 3, size, size), generator=g, dtype=torch.uint8)
        rows = []
        for i in range(batch):
            for _ in range(1 + int(torch.randint(0, 3, (1,), generator=g))):
                cx, cy = (0.2 + 0.6 * torch.rand(2, generator=g)).tolist()
                w, h = (0.05 + 0.3 * torch.rand(2, generator=g)).tolist()
                rows.append([i, int(torch.randint(0, 4, (1,), generator=g)), cx, cy, w, h])
        out.append((images, torch.tensor(rows, dtype=torch.float32)))
    return out


def _switches(config: TrainConfig, device: str, bf16: bool = True) -> dict:
    step = config.step.resolve(device, bf16=bf16)
    return {name: getattr(step, name) for name in PLAIN}


def test_defaults_are_fast_on_cuda_channels_last_on_the_cpu_and_explicit_values_win():
    config = TrainConfig()
    assert _switches(config, "cpu") == {**PLAIN, "channels_last": torch.backends.mkldnn.is_available()}
    assert _switches(config, "cuda") == FAST
    forced = TrainConfig(channels_last=False, fused_optimizer=True)
    assert _switches(forced, "cpu") == {**PLAIN, "fused_optimizer": True}
    steps = {(dev, bf16): config.step.resolve(dev, bf16=bf16).amp
             for dev, bf16 in (("cpu", True), ("cpu", False), ("cuda", True), ("cuda", False))}
    assert steps == {("cpu", True): "bf16", ("cpu", False): "off", ("cuda", True): "bf16",
                     ("cuda", False): "fp16"}  # amp="auto"


def _trajectory(base, batches, switches: dict, lr0: float = 0.001):
    model = copy.deepcopy(base)
    trainer = build_trainer(model, TrainConfig(amp="off", device="cpu", lr0=lr0, **switches, **NO_WARMUP))
    assert trainer.channels_last == switches["channels_last"]
    steps = []
    for ni, (images, targets) in enumerate(batches):
        steps.append(train_step(trainer, images, targets, ni=ni, accumulate_steps=1).cpu())
    return torch.stack(steps), params_of(model)


@pytest.fixture(scope="module")
def yolov9_t():
    torch.manual_seed(0)
    return create_model("yolov9-t", num_classes=4), _detection_batches(6, 2, 96)


def test_fused_step_gives_the_same_loss_trajectory_as_the_plain_step(yolov9_t):
    """yolov9-t, 6 optimizer steps from the same weights on the same data: the fused SGD changes nothing but
    float summation order."""
    base, batches = yolov9_t
    plain, plain_w = _trajectory(base, batches, PLAIN)
    fast, fast_w = _trajectory(base, batches, {**PLAIN, "fused_optimizer": True})
    assert torch.allclose(fast, plain, rtol=1e-5, atol=1e-7), fast - plain
    assert not torch.equal(plain_w["model.0.conv.weight"], params_of(base)["model.0.conv.weight"])
    for key, value in plain_w.items():
        assert (fast_w[key] - value).abs().max() <= 1e-5 * value.abs().max().clamp(min=1e-3), key


def test_full_fast_step_follows_the_plain_trajectory(yolov9_t):
    """All switches, channels_last and the lean BatchNorm+SiLU included: those round differently (other
    convolution kernels; a recomputed normalisation), so the first loss agrees to 1e-4 and over 6 steps
    the total loss stays within 1 % (rounding differences grow through the assigner's discrete choices,
    as with any change of kernels)."""
    base, batches = yolov9_t
    plain, _ = _trajectory(base, batches, PLAIN)
    fast, _ = _trajectory(base, batches, FAST)
    assert torch.allclose(fast[0], plain[0], rtol=1e-4)
    relative = (fast.sum(1) - plain.sum(1)).abs() / plain.sum(1)
    assert relative.max() < 0.01, relative


def test_epoch_logs_the_same_values_and_stops_on_nonfinite_losses(monkeypatch):
    """The losses are read back every LOG_INTERVAL batches: the on_batch records of the fast and the plain step
    agree, and a run of non-finite losses stops with the error naming the batch."""
    batches = make_batches(8, 4)
    seen = {}
    monkeypatch.setattr("yolo9kit.train.loop.MAX_NONFINITE_BATCHES", 3)
    monkeypatch.setattr("yolo9kit.train.loop.LOG_INTERVAL", 3)
    for name, switches in (("plain", PLAIN), ("fast", FAST)):
        calls = {"n": 0}

        def nan_from_batch_4(outputs, targets, calls=calls):
            calls["n"] += 1
            loss, items = toy_loss(outputs, targets)
            return (loss * float("nan"), items * float("nan")) if calls["n"] >= 5 else (loss, items)

        records = []
        config = TrainConfig(amp="off", device="cpu", batch_size=4, accumulate_steps=1, epochs=1, **switches,
                             **NO_WARMUP)
        torch.manual_seed(0)
        trainer = build_trainer(ToyNet(), config, loss_fn=nan_from_batch_4)
        with pytest.raises(NonFiniteLossError, match="batch 7"):  # index 6, counted from 1 in the message
            train_one_epoch(trainer, batches, config, Progress(), batches_per_epoch=len(batches), warmup=0,
                            on_batch=records.append, progress_bar=False)
        assert [r.batch_index for r in records] == [0, 1, 2, 3], name  # batches 4, 5, 6 were non-finite
        seen[name] = [r.box_loss for r in records]
    assert seen["fast"] == pytest.approx(seen["plain"], rel=1e-5)


def test_compile_option_trains_like_eager():
    """``compile=True`` runs the forward through torch.compile (inductor, here on the CPU) with the same result."""
    batches = make_batches(2, 4)
    results = {}
    for compile_ in (False, True):
        torch.manual_seed(0)
        model = ToyNet(batchnorm=True)
        trainer = build_trainer(model, TrainConfig(amp="off", device="cpu", compile=compile_, **NO_WARMUP),
                                loss_fn=toy_loss)
        assert (trainer.compiled is not None) == compile_
        results[compile_] = [train_step(trainer, images, targets, ni=ni, accumulate_steps=1)
                             for ni, (images, targets, *_) in enumerate(batches)]
    for eager, compiled in zip(results[False], results[True]):
        assert torch.allclose(eager, compiled, rtol=1e-4)


def test_config_round_trip_keeps_the_new_switches():
    config = TrainConfig(compile="reduce-overhead", fused_optimizer=True, colour_on_device=False)
    again = TrainConfig.from_dict(config.to_dict())
    assert dataclasses.asdict(again) == dataclasses.asdict(config)


def test_lean_batchnorm_silu_keeps_less_for_backward_and_gives_the_same_gradients():
    from yolo9kit.loss import DetectionLoss
    from yolo9kit.models.layers import set_lean

    torch.manual_seed(0)
    base = create_model("yolov9-t", num_classes=4).train()
    (images, targets), = _detection_batches(1, 2, 128)
    x = images.float() / 255
    out = {}
    for lean in (False, True):
        model = copy.deepcopy(base)
        assert set_lean(model, lean) == 237  # every Conv block (183) and RepConvN (54) of yolov9-t
        storages = {}

        def pack(t, storages=storages):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss, _ = DetectionLoss(model)(model(x), targets)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        out[lean] = loss.detach(), grads, dict(model.named_buffers()), sum(storages.values())
    assert torch.equal(out[True][0], out[False][0])  # forward values are those of batch_norm + silu
    assert all(torch.equal(out[True][2][k], v) for k, v in out[False][2].items())  # running stats, counters
    assert (out[True][1] - out[False][1]).norm() <= 1e-5 * out[False][1].norm()
    assert out[True][3] <= 0.80 * out[False][3]  # measured 0.77 (yolov9-s and -c: 0.76, 0.78)


def test_to_device_async_leaves_tensors_on_their_device_alone():
    from yolo9kit.env import to_device_async

    t = torch.arange(6)
    assert to_device_async(t, torch.device("cpu")) is t
    meta = to_device_async(t, torch.device("meta"))  # another device: copied (here without pinning)
    assert meta.device.type == "meta" and meta.shape == t.shape
