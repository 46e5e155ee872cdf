"""The deterministic weights both sides of a parity test use, keyed by parameter name.

Parity references store no weights: the reference tool (``tools/official_reference.py``) fills the official
model's state_dict with :func:`parity_state_dict` and records its outputs; a test fills our model's
state_dict (same keys and shapes) with the same function and compares. Each tensor's values come from a
``torch.Generator`` seeded with the CRC-32 of its name, so they do not depend on the order of the keys, on
the process (Python's ``hash()`` is salted per process) or on the machine.

Scales keep activations of a deep network in eval mode of the order of one: conv weights have a standard
deviation of ``1 / sqrt(fan_in)``, BatchNorm running variances are positive (0.5..1.5) and running means
small, so no layer overflows or collapses to zero and a relative tolerance stays meaningful.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import torch


def _generator(name: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(name.encode("utf-8")))


def parity_tensor(name: str, like: torch.Tensor, is_batchnorm: bool) -> torch.Tensor:
    """The value of one state_dict entry: float32, the shape of ``like``.

    Args:
        name: state_dict key (``model.3.cv1.conv.weight``); it alone seeds the values.
        like: the current tensor (only its shape and dtype are used).
        is_batchnorm: the entry belongs to a BatchNorm layer (its ``weight``/``bias``/running statistics).
    """
    g = _generator(name)
    shape = like.shape
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith(("dfl.conv.weight", "dfl2.conv.weight")):  # the fixed DFL projection 0..reg_max-1
        return torch.arange(shape[1], dtype=torch.float32).view(shape)
    if leaf == "running_var":
        return torch.rand(shape, generator=g) + 0.5
    if leaf == "running_mean":
        return torch.randn(shape, generator=g) * 0.1
    if is_batchnorm and leaf == "weight":
        return torch.rand(shape, generator=g) * 0.5 + 0.75
    if leaf == "bias":
        return torch.randn(shape, generator=g) * 0.1
    if len(shape) == 4:  # conv weight (c_out, c_in / groups, k, k)
        fan_in = shape[1] * shape[2] * shape[3]
        return torch.randn(shape, generator=g) / fan_in ** 0.5
    return torch.randn(shape, generator=g) * 0.1


def parity_state_dict(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A full state_dict of parity weights for ``state``'s keys: float entries replaced, integer ones
    (``num_batches_tracked``) kept.

    Args:
        state: a model's ``state_dict()`` (ours or the official one: the keys are the same).

    Returns:
        name -> tensor, float32 for the float entries; load it with ``load_state_dict(..., strict=True)``.
    """
    bn_prefixes = {k[: -len("running_var")] for k in state if k.endswith("running_var")}
    out = {}
    for name, value in state.items():
        if not value.is_floating_point():
            out[name] = value.clone()
            continue
        prefix = name[: name.rfind(".") + 1]
        out[name] = parity_tensor(name, value, prefix in bn_prefixes)
    return out
