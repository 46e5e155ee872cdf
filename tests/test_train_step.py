"""Accumulation equals one large batch; the OOM back-off keeps the result of training at the smaller micro-batch."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from train_toys import OOMAbove, ToyNet, assert_equal_states, make_batches, one_thread, params_of, rebatch, toy_loss

from yolo9kit.config import TrainConfig
from yolo9kit.config.train import LOG_INTERVAL
from yolo9kit.train.guards import OutOfMemoryAtMinimumError
from yolo9kit.train.loop import train_one_epoch
from yolo9kit.train.state import Progress
from yolo9kit.train.step import BatchNormSnapshot, Trainer, build_trainer, train_step, train_step_with_backoff

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

NO_WARMUP = {"warmup_epochs": 0.0, "warmup_min_batches": 0}


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_micro_steps_sum_to_one_batch_gradient():
    """k micro-batches of b images give the gradient of one batch of k*b (BatchNorm-free, sum-type loss)."""
    torch.manual_seed(0)
    (images, targets, *_), = make_batches(1, 8)
    grads = {}
    for micro in (None, 2, 3):  # 3 leaves a ragged last micro-batch of 2
        torch.manual_seed(1)
        model = ToyNet()
        calls = []

        def counted(outputs, targets, calls=calls):
            calls.append(outputs.shape[0])
            return toy_loss(outputs, targets)

        trainer = build_trainer(model, TrainConfig(micro_batch_size=micro, amp="off", device="cpu"), loss_fn=counted)
        train_step(trainer, images, targets, ni=0, accumulate_steps=2)  # the window's first batch: no optimizer step
        assert calls == {None: [8], 2: [2] * 4, 3: [3, 3, 2]}[micro] and trainer.optimizer_steps == 0
        grads[micro] = _grads(model)
    for micro in (2, 3):
        for name, g in grads[None].items():
            torch.testing.assert_close(grads[micro][name], g, rtol=1e-5, atol=1e-6)


def _train(batches, config, model_seed=1, loss_fn=toy_loss, wrap=None, batchnorm=False):
    torch.manual_seed(model_seed)
    model = ToyNet(batchnorm=batchnorm)
    trainer = build_trainer(wrap(model) if wrap else model, config, loss_fn=loss_fn)
    progress = Progress()
    stats = train_one_epoch(trainer, batches, config, progress, batches_per_epoch=len(batches), warmup=0,
                            progress_bar=False)
    return model, trainer, stats


def test_accumulated_loader_batches_equal_one_large_batch():
    """4 loader batches of 2 with accumulate 4 == 1 batch of 8: same weights and EMA after the optimizer step."""
    small = make_batches(4, 2)
    large = rebatch(small, 8)
    base = {"epochs": 1, "amp": "off", "device": "cpu", **NO_WARMUP}
    m_small, t_small, _ = _train(small, TrainConfig(batch_size=2, accumulate_steps=4, **base))
    m_large, t_large, _ = _train(large, TrainConfig(batch_size=8, accumulate_steps=1, **base))
    assert t_small.optimizer_steps == t_large.optimizer_steps == 1
    torch.testing.assert_close(params_of(m_small), params_of(m_large), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(t_small.ema.ema.state_dict(), t_large.ema.ema.state_dict(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("in_backward", [False, True])
def test_oom_backoff_equals_training_at_the_smaller_micro_batch(in_backward):
    """A simulated CUDA OOM above 2 images, in the forward or the backward: batch 8 is retried as micro-batches 4
    then 2 (accumulation x4, same 8 images per step) and the run equals one configured with micro_batch_size=2
    from the start (with BatchNorm: the micro-batches are the same images, so even the batch statistics agree)."""
    batches = make_batches(3, 8)
    base = {"epochs": 1, "batch_size": 8, "accumulate_steps": 1, "amp": "off", "device": "cpu", **NO_WARMUP}
    m_oom, t_oom, s_oom = _train(batches, TrainConfig(**base), batchnorm=True,
                                 wrap=lambda m: OOMAbove(m, 2, in_backward=in_backward))
    m_ref, t_ref, s_ref = _train(batches, TrainConfig(micro_batch_size=2, **base), batchnorm=True)
    assert t_oom.micro_batch_size == 2 and t_oom.oom_events == 2
    assert t_oom.optimizer_steps == t_ref.optimizer_steps == 3
    assert s_oom.images == s_ref.images == 24
    assert_equal_states(m_ref, m_oom)
    torch.testing.assert_close(s_oom.mean_items, s_ref.mean_items)


class _OOMOnce(torch.nn.Module):
    """Raises a simulated CUDA out-of-memory error in its ``at``-th forward (counted from 1)."""

    def __init__(self, model, at: int) -> None:
        super().__init__()
        self.model, self.at, self.calls = model, at, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.at:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return self.model(x)


def test_oom_drops_the_window_and_starts_a_new_one_with_the_batch():
    """accumulate 2, out of memory in batch 1 (the second of its window): batch 0's gradients and BatchNorm updates
    are dropped and a new window starts at batch 1 with half the micro-batch. The one optimizer step (at batch 2)
    then equals a fresh run over batches 1 and 2 configured with that micro-batch."""
    batches = make_batches(4, 4)
    base = {"epochs": 1, "batch_size": 4, "accumulate_steps": 2, "amp": "off", "device": "cpu", **NO_WARMUP}
    m_oom, t_oom, _ = _train(batches, TrainConfig(**base), batchnorm=True, wrap=lambda m: _OOMOnce(m, 2))
    m_ref, t_ref, _ = _train(batches[1:3], TrainConfig(micro_batch_size=2, **base), batchnorm=True)
    assert t_oom.micro_batch_size == 2 and t_oom.oom_events == 1 and t_oom.last_opt_step == 2
    assert t_oom.optimizer_steps == t_ref.optimizer_steps == 1
    oom_parameters = dict(m_oom.named_parameters())  # the weights: batch 3, not stepped yet, moved BatchNorm only
    for name, value in m_ref.named_parameters():
        assert torch.equal(oom_parameters[name], value), name


def test_the_progress_bar_shows_the_process_memory_on_the_cpu(capsys):
    """Off CUDA the bar shows the process's resident set ("rss", as the dashboard does), not a VRAM of 0."""
    config = TrainConfig(epochs=1, batch_size=2, amp="off", device="cpu", **NO_WARMUP)
    trainer = build_trainer(ToyNet(), config, loss_fn=toy_loss)
    batches = make_batches(LOG_INTERVAL, 2)  # read back (and shown) every LOG_INTERVAL batches
    train_one_epoch(trainer, batches, config, Progress(), batches_per_epoch=len(batches), warmup=0)
    bar = capsys.readouterr().err
    assert re.search(r"dfl [\d.]+ rss [\d.]+G [\d.]+ img/s", bar) and "mem " not in bar, bar


def test_oom_at_one_image_is_a_clear_error():
    torch.manual_seed(0)
    trainer = build_trainer(OOMAbove(ToyNet(), 0), TrainConfig(amp="off", device="cpu"), loss_fn=toy_loss)
    (images, targets, *_), = make_batches(1, 2)
    with pytest.raises(OutOfMemoryAtMinimumError, match="micro-batch of 1 image"):
        train_step_with_backoff(trainer, images, targets, BatchNormSnapshot(trainer.model), ni=0, accumulate_steps=1)


def test_other_runtime_errors_are_not_swallowed():
    def broken(outputs, targets):
        raise RuntimeError("shape mismatch")

    trainer = build_trainer(ToyNet(), TrainConfig(amp="off", device="cpu"), loss_fn=broken)
    (images, targets, *_), = make_batches(1, 2)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        train_step_with_backoff(trainer, images, targets, BatchNormSnapshot(trainer.model), ni=0, accumulate_steps=1)
    assert trainer.micro_batch_size is None and trainer.oom_events == 0


def test_train_step_skips_a_nonfinite_loss_on_the_device():
    """No host check: the fixed-scale GradScaler skips the step on the device (weights unchanged, gradients
    dropped), keeps its scale at 1, and the loss items come back non-finite for the loop to count."""
    def nan_loss(outputs, targets):
        loss, items = toy_loss(outputs, targets)
        return loss * float("nan"), items * float("nan")

    model = ToyNet()
    before = params_of(model)
    trainer: Trainer = build_trainer(model, TrainConfig(amp="off", device="cpu", ema=False), loss_fn=nan_loss)
    (images, targets, *_), = make_batches(1, 4)
    for ni in range(3):
        items = train_step(trainer, images, targets, ni=ni, accumulate_steps=1)
        assert not torch.isfinite(items).any() and trainer.last_opt_step == ni
        assert all(p.grad is None for p in model.parameters())
        assert all(torch.equal(v, before[k]) for k, v in params_of(model).items())
        assert trainer.scaler.get_scale() == 1.0  # the fixed scale: a skipped step does not halve it
    good = build_trainer(ToyNet(), TrainConfig(amp="off", device="cpu", ema=False), loss_fn=toy_loss)
    assert torch.isfinite(train_step(good, images, targets, ni=0, accumulate_steps=1)).all()
    assert good.scaler.get_scale() == 1.0  # never grows past 1


def test_train_step_updates_weights_and_ema():
    model = ToyNet(batchnorm=True)
    trainer = build_trainer(model, TrainConfig(amp="off", device="cpu", micro_batch_size=2), loss_fn=toy_loss)
    ema_before = copy.deepcopy(trainer.ema.ema.state_dict())
    (images, targets, *_), = make_batches(1, 4)
    items = train_step(trainer, images, targets, ni=0, accumulate_steps=1)
    assert items.shape == (3,) and torch.isfinite(items).all()
    assert trainer.optimizer_steps == 1 and trainer.ema.updates == 1 and trainer.last_opt_step == 0
    assert not torch.equal(trainer.ema.ema.state_dict()["conv1.weight"], ema_before["conv1.weight"])
