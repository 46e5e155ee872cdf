"""Exponential moving average of the weights (what validation, best.pt and predict use)."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside a DistributedDataParallel / DataParallel wrapper."""
    return model.module if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)) else model


class ModelEMA:
    """EMA of every floating-point state_dict entry: parameters and BatchNorm running statistics.

    Matches the official ``ModelEMA``: after each optimizer step ``updates += 1``,
    ``d = decay * (1 - exp(-updates / tau))`` and ``ema = d * ema + (1 - d) * model`` for floating
    entries; integer buffers (``num_batches_tracked``) are left alone. The update runs as two
    ``torch._foreach_*`` kernels over all tensors instead of a Python loop over ~1,800 tensors (the
    official loop costs ~70 ms per step on a GPU).

    Frozen parameters (``requires_grad=False`` in the model: frozen layers, the DFL's fixed convolution) are
    left out of the update when their EMA value equals the model's, checked once when the tensor lists are
    built (after ``load_state_dict`` again). That is exact: ``d * x + (1 - d) * x`` is ``x`` in real arithmetic
    (the official update recomputes it every step and can move it by a rounding step); the EMA copy then
    stays bit-identical to the frozen weight. A frozen parameter whose EMA differs (an EMA loaded from
    elsewhere) keeps being averaged, as the official code does. BatchNorm running statistics of frozen
    layers still change (BatchNorm stays in training mode) and are always averaged.

    Args:
        model: the model being trained (a DDP wrapper is unwrapped). Its tensors must not be replaced
            after the EMA is built (build it after ``.to(device)`` and SyncBatchNorm conversion).
        decay: the asymptotic decay (0.9999).
        tau: ramp time constant in updates (2000).
        updates: number of updates already done (when resuming).
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000.0, updates: int = 0) -> None:
        self.ema = copy.deepcopy(unwrap(model)).eval()
        for p in self.ema.parameters():
            p.requires_grad_(False)
        self.decay, self.tau, self.updates = decay, tau, updates
        self._pairs_of = None  # id of the model the tensor lists were built for

    def _pairs(self, model: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if self._pairs_of is not model:
            ema_sd, model_sd = self.ema.state_dict(), unwrap(model).state_dict()
            fixed = {k for k, p in unwrap(model).named_parameters() if not p.requires_grad and _same(ema_sd[k], p)}
            keys = [k for k, v in ema_sd.items() if v.dtype.is_floating_point and k not in fixed]
            self._ema_tensors = [ema_sd[k] for k in keys]
            self._model_tensors = [model_sd[k].detach() for k in keys]
            self._pairs_of = model
        return self._ema_tensors, self._model_tensors

    def current_decay(self) -> float:
        """Decay the next update would use."""
        return self.decay * (1 - math.exp(-(self.updates + 1) / self.tau))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """One EMA update from ``model`` (call after every optimizer step)."""
        d = self.current_decay()
        self.updates += 1
        ema_tensors, model_tensors = self._pairs(model)
        torch._foreach_mul_(ema_tensors, d)
        torch._foreach_add_(ema_tensors, model_tensors, alpha=1 - d)

    def state_dict(self) -> dict:
        """Weights and update count, for checkpoints."""
        return {"model": self.ema.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.ema.load_state_dict(state["model"])
        self.updates = int(state["updates"])
        self._pairs_of = None  # which frozen tensors equal the model's is decided again


def _same(ema: torch.Tensor, param: torch.Tensor) -> bool:
    """Bit-identical values; on ``meta`` tensors (the memory trace) a copy counts as identical."""
    if ema.is_meta or param.is_meta:
        return ema.shape == param.shape
    return ema.shape == param.shape and torch.equal(ema, param.detach().to(ema.device))
