"""The optimizer and what train_dual.py sets per batch: pure functions of the config and ``ni`` (docs/training.md)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
from torch import nn

from yolo9kit.config import TrainConfig
from yolo9kit.config.step import multi_scale_side
from yolo9kit.config.train import official_accumulate

# Normalisation layers, whose weights get no weight decay (official: "Norm" in the class name of torch.nn).
_NORM_TYPES = tuple(v for k, v in vars(nn).items() if "Norm" in k and isinstance(v, type))


def param_groups(model: nn.Module, trainable_only: bool = False
                 ) -> tuple[list[nn.Parameter], list[nn.Parameter], list[nn.Parameter]]:
    """The official ``smart_optimizer`` groups (biases, decayed weights, norm weights); ``trainable_only``: unfrozen."""
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
    explicit = config.optim.accumulate_steps
    return official_accumulate(config.optim.nominal_batch_size, config.batch_size) if explicit is None else explicit


def scaled_weight_decay(config: TrainConfig) -> float:
    """``weight_decay * batch * accumulate / nominal`` (official): decay per image stays the same."""
    return config.optim.weight_decay * config.batch_size * base_accumulate(config) / config.optim.nominal_batch_size


def build_optimizer(model: nn.Module, config: TrainConfig, fused_optimizer: bool = False) -> torch.optim.Optimizer:
    """The official optimizer (``smart_optimizer``, docs/training.md) over the three ``param_groups`` of what trains;
    ``fused_optimizer``: torch's fused implementation, the same update up to float rounding."""
    biases, decayed, norm_weights = param_groups(model, trainable_only=config.step.freeze is not None)
    lr, momentum, decay = config.optim.lr0, config.optim.momentum, scaled_weight_decay(config)
    kw = {"fused": True} if fused_optimizer else {}
    if config.step.optimizer == "SGD":
        opt = torch.optim.SGD(biases, lr=lr, momentum=momentum, nesterov=True, **kw)
    elif config.step.optimizer == "Adam":
        opt = torch.optim.Adam(biases, lr=lr, betas=(momentum, 0.999), **kw)
    else:  # AdamW (TrainConfig validates the name)
        opt = torch.optim.AdamW(biases, lr=lr, betas=(momentum, 0.999), weight_decay=0.0, amsgrad=True, **kw)
    opt.add_param_group({"params": decayed, "weight_decay": decay})
    opt.add_param_group({"params": norm_weights, "weight_decay": 0.0})
    return opt


def lr_factor(config: TrainConfig, epoch: int) -> float:
    """Multiplier of lr0 in ``epoch`` (official LambdaLR; docs/training.md, learning-rate schedules)."""
    e, n, lrf = epoch, config.epochs, config.optim.lrf
    if config.optim.schedule == "linear":
        return (1 - e / n) * (1.0 - lrf) + lrf
    if config.optim.schedule == "cosine":
        return 1 + (lrf - 1) * (1 - math.cos(math.pi * e / n)) / 2
    if config.optim.schedule == "flat-cosine" and e > n // 2 > 0:
        return 1 + (lrf - 1) * (1 - math.cos(math.pi * (e - n // 2) / (n // 2))) / 2
    return 1.0  # fixed, and the flat half of flat-cosine


def warmup_batches(config: TrainConfig, batches_per_epoch: int) -> int:
    """Number of warmup batches: ``max(round(warmup_epochs * batches_per_epoch), warmup_min_batches)``."""
    return max(round(config.optim.warmup_epochs * batches_per_epoch), config.optim.warmup_min_batches)


def _interp(x: float, x1: float, y0: float, y1: float) -> float:
    """``numpy.interp(x, [0, x1], [y0, y1])``."""
    return y1 if x1 <= 0 or x >= x1 else y0 + (y1 - y0) * x / x1


@dataclass(frozen=True)
class StepSettings:
    """What the schedule says for one batch: batches per optimizer step, LR per group, momentum."""

    accumulate: int
    lrs: tuple[float, float, float]
    momentum: float


def step_settings(config: TrainConfig, ni: int, epoch: int, warmup: int) -> StepSettings:
    """Accumulation, learning rates and momentum for batch ``ni`` in ``epoch``, ramped up over the first ``warmup``
    batches as officially (docs/training.md, warmup)."""
    o = config.optim
    target_lr = o.lr0 * lr_factor(config, epoch)
    accumulate = base_accumulate(config)
    if ni > warmup or warmup <= 0:
        return StepSettings(accumulate, (target_lr,) * 3, o.momentum)
    end = o.nominal_batch_size / config.batch_size if o.accumulate_steps is None else accumulate
    accumulate = max(1, round(_interp(ni, warmup, 1.0, end)))  # ramped up from 1 (official)
    weights_lr = _interp(ni, warmup, 0.0, target_lr)
    lrs = (_interp(ni, warmup, o.warmup_bias_lr, target_lr), weights_lr, weights_lr)
    return StepSettings(accumulate, lrs, _interp(ni, warmup, o.warmup_momentum, o.momentum))


def apply_settings(optimizer: torch.optim.Optimizer, settings: StepSettings) -> None:
    """Write the LRs (and momentum, for optimizers that have one) into the three param groups."""
    for group, lr in zip(optimizer.param_groups, settings.lrs):
        group["lr"] = lr
        if "momentum" in group:  # SGD only; Adam's beta1 is not ramped (official)
            group["momentum"] = settings.momentum


def multi_scale_shape(shape_hw: tuple[int, int], imgsz: int, stride: int, rng: random.Random) -> tuple[int, int] | None:
    """The (h, w) a batch of ``shape_hw`` is resized to in multi-scale training (official ``--multi-scale``: each
    side ``ceil(x * size / max(h, w) / stride) * stride``), or None when it stays."""
    factor = multi_scale_side(imgsz, stride, rng) / max(shape_hw)
    return None if factor == 1 else tuple(math.ceil(x * factor / stride) * stride for x in shape_hw)


def multi_scale_rng(seed: int, ni: int) -> random.Random:
    """The generator of batch ``ni``'s size, a function of (seed, ni) only, so a resumed run draws the same sizes."""
    return random.Random(f"multi-scale {seed} {ni}")
