"""Small models, losses and loaders for the training tests (imported by tests/test_train_*.py)."""

from __future__ import annotations

import torch
from torch import nn


class ToyNet(nn.Module):
    """conv -> (BatchNorm) -> SiLU -> conv; with ``batchnorm=False`` every image's output depends only on itself,
    so a sum-over-images loss splits exactly across micro-batches."""

    def __init__(self, batchnorm: bool = False, channels: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1, bias=not batchnorm)
        self.bn = nn.BatchNorm2d(channels) if batchnorm else nn.Identity()
        self.act = nn.SiLU()
        self.conv2 = nn.Conv2d(channels, 4, 1)
        # attributes a DetectionModel has, for checkpoint writers
        self.nc, self.names, self.yaml = 1, ["thing"], {"toy": True}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.act(self.bn(self.conv1(x))))


def toy_loss(outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum-type loss like DetectionLoss: per-image mean squared error against a target map made from the
    image's boxes, averaged over the batch, times the batch size; items = [mean, 0, 0]."""
    b, _, h, w = outputs.shape
    goal = torch.zeros(b, device=outputs.device)
    if len(targets):
        goal = goal.index_add(0, targets[:, 0].long(), targets[:, 2:].sum(1).to(outputs.device))
    per_image = ((outputs - goal.view(b, 1, 1, 1)) ** 2).mean(dim=(1, 2, 3))
    mean = per_image.mean()
    return mean * b, torch.stack([mean, mean * 0, mean * 0]).detach()


def make_batches(n_batches: int, batch_size: int, size: int = 32, seed: int = 0) -> list:
    """Loader-like list of (images uint8 (B,3,H,W), targets (N,6), paths, shapes)."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n_batches):
        images = torch.randint(0, 256, (batch_size, 3, size, size), generator=g, dtype=torch.uint8)
        rows = []
        for i in range(batch_size):
            for _ in range(int(torch.randint(0, 3, (1,), generator=g))):
                rows.append([i, 0, *torch.rand(4, generator=g).tolist()])
        targets = torch.tensor(rows, dtype=torch.float32).reshape(-1, 6)
        batches.append((images, targets, [f"img{i}.jpg" for i in range(batch_size)], None))
    return batches


def rebatch(batches: list, batch_size: int) -> list:
    """The same images and targets, cut into loader batches of another size (order kept)."""
    images = torch.cat([b[0] for b in batches])
    rows, offset = [], 0
    for b in batches:
        t = b[1].clone()
        t[:, 0] += offset
        rows.append(t)
        offset += b[0].shape[0]
    targets = torch.cat(rows)
    out = []
    for start in range(0, images.shape[0], batch_size):
        end = start + batch_size
        keep = (targets[:, 0] >= start) & (targets[:, 0] < end)
        t = targets[keep].clone()
        t[:, 0] -= start
        out.append((images[start:end], t, [""] * (end - start), None))
    return out


class OOMAbove(nn.Module):
    """Wraps a model and raises a CUDA out-of-memory error when a micro-batch has more than ``limit`` images."""

    def __init__(self, model: nn.Module, limit: int, in_backward: bool = False) -> None:
        super().__init__()
        self.model, self.limit, self.in_backward = model, limit, in_backward
        self.nc, self.names, self.yaml = model.nc, model.names, model.yaml

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            if not self.in_backward:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
            return _FailInBackward.apply(self.model(x))
        return self.model(x)


class _FailInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("CUDA out of memory. Tried to allocate 1.00 GiB (simulated, in backward)")


def params_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_state(a, b) -> None:
    """Two ``FitResult``s ended with bitwise equal weights and EMA."""
    assert_equal_states(a.model, b.model)
    assert_equal_states(a.ema, b.ema)


def assert_equal_states(a: nn.Module, b: nn.Module) -> None:
    """Bitwise equal state dicts, each read once (a ``state_dict()`` per key makes a check quadratic)."""
    state = b.state_dict()
    for k, v in a.state_dict().items():
        assert torch.equal(state[k], v), k


def one_thread():
    """Generator for a module fixture: torch on one CPU thread (on a shared 2-core machine two threads per
    process spin against each other and a step runs many times slower), restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def spawn_ranks(body, *args, world: int = 2) -> None:
    """Run ``body(rank, *args)`` in ``world`` processes joined in a gloo process group (file store in the
    first argument's folder: ``args[0]`` is the init file). ``body`` must be a module-level function."""
    import torch.multiprocessing as mp

    mp.spawn(_rank_main, args=(body, world, *args), nprocs=world, join=True)


def _rank_main(rank, body, world, init_file, *args):
    import os
    import sys

    import torch.distributed as dist

    from yolo9kit.train.state import finish_processes

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    body(rank, *args)  # an error propagates: mp.spawn reports it and the test fails
    finish_processes()
    sys.stdout.flush()
    sys.stderr.flush()
    # A clean exit skips the interpreter's teardown: there torch's gloo worker threads can still drop tensors
    # after the group is destroyed and abort the process (SIGABRT about one run in twenty, a finished run).
    os._exit(0)
