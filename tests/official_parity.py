"""Our side of the model parity references (``tests/fixtures/official/{model}.parity.pt``).

:func:`run_kit` does with yolo9kit what ``tools/official_reference.py`` did with the official code, in the
same order: build with seed 0 (initial weights fingerprinted), fill the state_dict with
``parity_weights.parity_state_dict``, an eval forward in float32 (decoded outputs, per-layer statistics),
then in float64 a training forward, the loss and its backward pass. One run per model per session, shared
by the tests that read it.
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from conftest import committed_fixture
from parity_weights import parity_state_dict

from yolo9kit.loss import DetectionLoss
from yolo9kit.models import create_model

SMALL = ("yolov9-t", "yolov9-s", "gelan-t", "gelan-s")  # under a few seconds each on a 2-core CPU


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max abs difference over the reference's max abs value (0 when both are 0)."""
    a, b = a.detach().double(), b.detach().double()
    scale = b.abs().max().item()
    diff = (a - b).abs().max().item()
    return diff / scale if scale else diff


def layer_stats(model, x: torch.Tensor) -> dict:
    """Per layer index: shape, sum and abs sum of its tensor output in the current mode (no grad)."""
    stats = {}

    def hook(module, _inputs, output):
        if isinstance(output, torch.Tensor):
            stats[module.i] = {"shape": tuple(output.shape), "sum": float(output.double().sum()),
                               "abs_sum": float(output.double().abs().sum())}

    handles = [m.register_forward_hook(hook) for m in model.model]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return stats


def first_differing_layer(ours: dict, official: dict, rtol: float = 1e-4) -> str:
    """The first layer whose output shape or abs sum differs from the official statistics."""
    for i, ref in sorted(official.items()):
        got = ours.get(i)
        if got is None or got["shape"] != tuple(ref["shape"]):
            return f"layer {i}: output shape {None if got is None else got['shape']} vs official {ref['shape']}"
        if abs(got["abs_sum"] - ref["abs_sum"]) > rtol * (abs(ref["abs_sum"]) + 1e-12):
            return f"layer {i}: output abs sum {got['abs_sum']:.6g} vs official {ref['abs_sum']:.6g}"
    return "no layer statistic differs"


def seed0_state(name: str) -> dict[str, torch.Tensor]:
    """The seed-0 state_dict of our model ``name``, built in a new interpreter on one thread, as the reference.

    In m/c/e the stride probe's BatchNorm statistics downstream of CBLinear's biases are float32 rounding
    amplified (docs/parity.md): the thread count and whatever the process ran before (an autocast region, a
    precision setting, other kernels) move them by percents; a new process on one thread has none of that.
    """
    code = ("import sys, torch\nfrom yolo9kit.models import create_model\ntorch.set_num_threads(1)\n"
            "torch.manual_seed(0)\ntorch.save(create_model(sys.argv[1]).state_dict(), sys.argv[2])")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "state.pt"
        subprocess.run([sys.executable, "-c", code, name, str(path)], check=True)
        return torch.load(path, weights_only=True)


def init_fingerprint(state: dict) -> torch.Tensor:
    """(K, 2) float64 sum and abs sum of each float entry of a state_dict, as the references' ``init``."""
    return torch.tensor([(float(v.double().sum()), float(v.double().abs().sum()))
                         for v in state.values() if v.is_floating_point()], dtype=torch.float64)


@functools.cache
def run_kit(name: str) -> dict:
    """Our model ``name`` through the steps of the reference tool; returns small tensors and numbers only.

    Keys: ``params``, ``stride``, ``layout`` [(key, shape)], ``init`` (K, 2) float64 sum and abs sum of each
    float entry of the seed-0 state_dict, ``eval_out`` (official order: aux then main), ``eval_layer_stats``,
    ``train_out`` (official order), ``loss``, ``loss_items``, ``grad_norm``, ``grad_norms`` by parameter name.
    """
    fx = torch.load(committed_fixture(f"{name}.parity.pt"), map_location="cpu", weights_only=True)
    x = fx["image"].float() / 255
    state = seed0_state(name)
    layout = [(k, tuple(v.shape)) for k, v in state.items()]
    init = init_fingerprint(state)
    model = create_model(name)  # its own probe statistics do not matter: the parity weights replace them
    model.load_state_dict(parity_state_dict(state), strict=True)

    model.eval()
    stats = layer_stats(model, x)
    with torch.no_grad():
        out = model(x)
    eval_out = [out.aux, out.main] if model.is_dual else [out.main]

    model.double().train()  # float64, as the reference: see tools/official_reference.py model_case
    out = model(x.double())
    loss, items = DetectionLoss(model)(out, fx["targets"])
    loss.backward()
    grads = {n: float(p.grad.double().norm()) for n, p in model.named_parameters() if p.grad is not None}
    train_out = [[m.detach().float() for m in out.aux], [m.detach().float() for m in out.main]] if model.is_dual \
        else [m.detach().float() for m in out.main]
    return {
        "params": sum(p.numel() for p in model.parameters()), "stride": model.stride.float().clone(), "layout": layout,
        "init": init, "eval_out": eval_out, "eval_layer_stats": stats, "train_out": train_out,
        "loss": loss.detach(), "loss_items": items.detach(),
        "grad_norm": math.sqrt(sum(v * v for v in grads.values())), "grad_norms": grads,
    }
