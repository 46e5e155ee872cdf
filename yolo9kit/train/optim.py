"""Optimizer, learning-rate schedules, warmup and the accumulation rule of the official train_dual.py.

Everything here is a small pure function of the config and the integrated batch index ``ni`` (batches
seen since the start of training), so the values can be tabulated, tested and plotted without a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from yolo9kit.config import TrainConfig
from yolo9kit.config.train import official_accumulate

# Normalisation layers, whose weights get no weight decay (matches the official smart_optimizer test
# "Norm in the class name of torch.nn").
_NORM_TYPES = tuple(v for k, v in vars(nn).items() if "Norm" in k and isinstance(v, type))


def param_groups(model: nn.Module, trainable_only: bool = False
                 ) -> tuple[list[nn.Parameter], list[nn.Parameter], list[nn.Parameter]]:
    """Split parameters as the official ``smart_optimizer``: (biases, decayed weights, norm weights).

    Walks every module's own parameters: ``bias`` -> group 0 (no decay); ``weight`` of a
    normalisation layer -> group 2 (no decay); anything else -> group 1 (decayed). For yolov9-t this
    gives 303 / 305 / 291 tensors. Parameters with ``requires_grad=False`` are included as in the official
    code (they get no gradient, so the optimizer skips them) unless ``trainable_only``: then they are left
    out, and the optimizer holds no state for them (frozen layers).
    """
    biases, decayed, norm_weights = [], [], []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if trainable_only and not p.requires_grad:
                continue
            if name == "bias":
                biases.append(p)
            elif name == "weight" and isinstance(module, _NORM_TYPES):
                norm_weights.append(p)
            else:
                decayed.append(p)
    return biases, decayed, norm_weights


def base_accumulate(config: TrainConfig) -> int:
    """Batches per optimizer step after warmup: explicit, or the official rule (``official_accumulate``)."""
    if config.optim.accumulate_steps is not None:
        return config.optim.accumulate_steps
    return official_accumulate(config.optim.nominal_batch_size, config.batch_size)


def scaled_weight_decay(config: TrainConfig) -> float:
    """``weight_decay * batch * accumulate / nominal`` (official): decay per image stays the same."""
    return config.optim.weight_decay * config.batch_size * base_accumulate(config) / config.optim.nominal_batch_size


def build_optimizer(model: nn.Module, config: TrainConfig, fused_optimizer: bool = False) -> torch.optim.Optimizer:
    """The official three groups [biases, decayed weights, norm weights] with lr0 and scaled decay.

    SGD: momentum, nesterov=True. Adam: betas (momentum, 0.999). AdamW: betas (momentum, 0.999),
    amsgrad=True, decoupled decay on group 1 only. Matches ``smart_optimizer`` in the official utils.
    ``fused_optimizer``: torch's fused implementation (one kernel group for all tensors, and the GradScaler's
    skip of a non-finite step happens on the device); the same update up to float rounding.

    With ``config.step.freeze`` the groups hold only the parameters that train: a parameter without a gradient is
    skipped by every torch optimizer (no decay, no momentum), so leaving it out changes no update and keeps
    no state. Without it the groups are the official ones (the DFL's fixed convolution included), so the
    optimizer state of runs started before freezing existed still loads.
    """
    biases, decayed, norm_weights = param_groups(model, trainable_only=config.step.freeze is not None)
    lr, momentum, decay = config.optim.lr0, config.optim.momentum, scaled_weight_decay(config)
    kw = {"fused": True} if fused_optimizer else {}
    if config.step.optimizer == "SGD":
        opt = torch.optim.SGD(biases, lr=lr, momentum=momentum, nesterov=True, **kw)
    elif config.step.optimizer == "Adam":
        opt = torch.optim.Adam(biases, lr=lr, betas=(momentum, 0.999), **kw)
    elif config.step.optimizer == "AdamW":
        opt = torch.optim.AdamW(biases, lr=lr, betas=(momentum, 0.999), weight_decay=0.0, amsgrad=True, **kw)
    else:  # TrainConfig validates the name; this guards direct callers
        raise ValueError(f"optimizer {config.step.optimizer!r}: expected SGD, Adam or AdamW")
    opt.add_param_group({"params": decayed, "weight_decay": decay})
    opt.add_param_group({"params": norm_weights, "weight_decay": 0.0})
    return opt


def lr_factor(config: TrainConfig, epoch: int) -> float:
    """Multiplier of lr0 for ``epoch`` (0-based), stepped once per epoch like the official LambdaLR.

    linear: (1 - e/E)(1 - lrf) + lrf; cosine: 1 + (lrf - 1)(1 - cos(pi e/E))/2; flat-cosine: 1 for the
    first half (e <= E//2), then a cosine from 1 to lrf over the second half; fixed: 1.
    """
    e, n, lrf = epoch, config.epochs, config.optim.lrf
    if config.optim.schedule == "linear":
        return (1 - e / n) * (1.0 - lrf) + lrf
    if config.optim.schedule == "cosine":
        return 1 + (lrf - 1) * (1 - math.cos(math.pi * e / n)) / 2
    if config.optim.schedule == "flat-cosine":
        half = n // 2
        if e <= half or half == 0:
            return 1.0
        return 1 + (lrf - 1) * (1 - math.cos(math.pi * (e - half) / half)) / 2
    return 1.0


def warmup_batches(config: TrainConfig, batches_per_epoch: int) -> int:
    """Number of warmup batches: ``max(round(warmup_epochs * batches_per_epoch), warmup_min_batches)``."""
    return max(round(config.optim.warmup_epochs * batches_per_epoch), config.optim.warmup_min_batches)


def _interp(x: float, x1: float, y0: float, y1: float) -> float:
    """Linear interpolation on [0, x1], like ``numpy.interp(x, [0, x1], [y0, y1])``."""
    if x1 <= 0 or x >= x1:
        return y1
    return y0 + (y1 - y0) * x / x1


@dataclass(frozen=True)
class StepSettings:
    """What the schedule says for one batch: batches per optimizer step, LR per group, momentum."""

    accumulate: int
    lrs: tuple[float, float, float]
    momentum: float


def step_settings(config: TrainConfig, ni: int, epoch: int, warmup: int) -> StepSettings:
    """Accumulation, learning rates and momentum for integrated batch ``ni`` in ``epoch``.

    Official warmup (train_dual.py), for ni <= warmup: accumulate = max(1, round(interp(ni, [0, nw],
    [1, nominal/batch]))); bias LR warmup_bias_lr -> lr0*lf(epoch); other LRs 0 -> lr0*lf(epoch);
    momentum warmup_momentum -> momentum. After warmup: accumulate as ``base_accumulate``, every LR
    lr0*lf(epoch), momentum as configured.
    """
    o = config.optim
    target_lr = o.lr0 * lr_factor(config, epoch)
    accumulate = base_accumulate(config)
    if ni > warmup or warmup <= 0:
        return StepSettings(accumulate, (target_lr,) * 3, o.momentum)
    end = o.nominal_batch_size / config.batch_size if o.accumulate_steps is None else accumulate
    accumulate = max(1, round(_interp(ni, warmup, 1.0, end)))  # ramped up from 1 (official)
    lrs = (
        _interp(ni, warmup, o.warmup_bias_lr, target_lr),
        _interp(ni, warmup, 0.0, target_lr),
        _interp(ni, warmup, 0.0, target_lr),
    )
    return StepSettings(accumulate, lrs, _interp(ni, warmup, o.warmup_momentum, o.momentum))


def apply_settings(optimizer: torch.optim.Optimizer, settings: StepSettings) -> None:
    """Write the LRs (and momentum, for optimizers that have one) into the three param groups."""
    for group, lr in zip(optimizer.param_groups, settings.lrs):
        group["lr"] = lr
        if "momentum" in group:  # SGD only; Adam's beta1 is not ramped (official)
            group["momentum"] = settings.momentum
