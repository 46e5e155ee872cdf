"""Two-process DDP (gloo, CPU) equals one process on the same global batches.

The toy model has no BatchNorm: with BatchNorm each rank normalises over its own half of the batch, so DDP
without SyncBatchNorm is not the same computation as one process, and the comparison would test that
difference instead of gradient synchronisation. With a sum-type loss multiplied by the world size and
DDP's gradient averaging, the gradient of every optimizer step is the sum over the global batch, as in one
process; only the order of floating-point additions differs (tolerance 1e-5 relative)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
from train_toys import ToyNet, make_batches, one_thread, rebatch, spawn_ranks, toy_loss

from yolo9kit.config import TrainConfig
from yolo9kit.train.fit import fit

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

GLOBAL_BATCH, WORLD = 4, 2


def _config(project, name):
    # accumulate 2 -> the first micro-step of each step runs under no_sync, the second all-reduces
    return TrainConfig(epochs=2, batch_size=GLOBAL_BATCH, accumulate_steps=2, amp="off", device="cpu",
                       warmup_epochs=0.0, warmup_min_batches=2, lr0=0.05, project=str(project), name=name)


def _rank_batches(rank):
    """This rank's half of every global batch (what a DistributedSampler-style split gives)."""
    out = []
    for images, targets, *_ in make_batches(4, GLOBAL_BATCH):
        half = GLOBAL_BATCH // WORLD
        out.extend(rebatch([(images, targets, None, None)], half)[rank:rank + 1])
    return out


def _worker(rank, project, out_file):
    torch.manual_seed(0)
    model = ToyNet()
    result = fit(model, None, _config(project, "ddp"), loss_fn=toy_loss, train_loader=_rank_batches(rank))
    weights = {k: v.detach().clone() for k, v in result.model.state_dict().items()}
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, weights)
    if rank == 0:
        torch.save({"ranks": gathered, "steps": result.optimizer_steps, "save_dir": str(result.save_dir)}, out_file)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_two_process_ddp_matches_one_process(tmp_path):
    out_file = tmp_path / "ddp.pt"
    spawn_ranks(_worker, str(tmp_path / "init"), tmp_path / "runs", str(out_file), world=WORLD)
    ddp = torch.load(out_file, weights_only=False)

    torch.manual_seed(0)
    single = fit(ToyNet(), None, _config(tmp_path / "runs", "single"), loss_fn=toy_loss,
                 train_loader=make_batches(4, GLOBAL_BATCH))
    assert ddp["steps"] == single.optimizer_steps == 4  # at ni 0, 2, 4, 6 (accumulate ramps 1 -> 2)
    for k, v in single.model.state_dict().items():
        assert torch.equal(ddp["ranks"][0][k], ddp["ranks"][1][k]), f"ranks differ in {k}"
        torch.testing.assert_close(ddp["ranks"][0][k], v, rtol=1e-5, atol=1e-6)
    assert (tmp_path / "runs" / "ddp" / "weights" / "last.pt").is_file()  # written by rank 0 only


def _nan_worker(rank, project, out_file):
    calls = {"n": 0}

    def nan_on_rank1_once(outputs, targets):
        calls["n"] += 1
        loss, items = toy_loss(outputs, targets)
        return (loss * float("nan"), items) if rank == 1 and calls["n"] == 3 else (loss, items)

    torch.manual_seed(0)
    result = fit(ToyNet(), None, _config(project, "nan"), loss_fn=nan_on_rank1_once, train_loader=_rank_batches(rank))
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, (result.nonfinite_batches, result.optimizer_steps,
                                      {k: v.clone() for k, v in result.model.state_dict().items()}))
    if rank == 0:
        torch.save(gathered, out_file)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_ddp_ranks_agree_to_skip_a_nonfinite_step(tmp_path):
    """A NaN loss on one rank only: both ranks skip that step (no hang, weights stay identical and finite)."""
    out_file = tmp_path / "nan.pt"
    spawn_ranks(_nan_worker, str(tmp_path / "init"), tmp_path / "runs", str(out_file), world=WORLD)
    (skips0, steps0, w0), (skips1, steps1, w1) = torch.load(out_file, weights_only=False)
    # both ranks count the skip; the step due at ni 2 was skipped by the scalers on the device (the NaN
    # gradients reach both through the all-reduce), and it is counted among the steps the schedule took
    assert skips0 == skips1 == 1 and steps0 == steps1 == 4
    for k, v in w0.items():
        assert torch.equal(v, w1[k]) and torch.isfinite(v).all(), k


def _channels_last_worker(rank, project, out_file):
    import warnings

    torch.manual_seed(0)
    config = dataclasses.replace(_config(project, "channels_last"), channels_last=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = fit(ToyNet(), None, config, loss_fn=toy_loss, train_loader=_rank_batches(rank))
    layouts = [p.is_contiguous(memory_format=torch.channels_last) for p in result.model.parameters() if p.dim() == 4]
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, ([str(w.message) for w in seen], layouts))
    if rank == 0:
        torch.save(gathered, out_file)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_ddp_buckets_see_the_channels_last_layout(tmp_path):
    """The parameters are channels_last before DDP lays out its gradient buckets: no stride warning, no copy
    of every gradient (switched after the wrapper, DDP warns that the strides do not match its buckets)."""
    out_file = tmp_path / "cl.pt"
    spawn_ranks(_channels_last_worker, str(tmp_path / "init"), tmp_path / "runs", str(out_file), world=WORLD)
    for messages, layouts in torch.load(out_file, weights_only=False):
        assert layouts and all(layouts)
        assert not [m for m in messages if "strides do not match" in m], messages
