"""BatchNorm + SiLU that keeps one activation for backward instead of two (training memory).

In a ``Conv`` block (conv -> BatchNorm -> SiLU) autograd normally keeps the convolution's output (for the
BatchNorm backward) and the BatchNorm's output (for the SiLU backward), and the next layer keeps the
SiLU's output: three tensors of the same size per block. :class:`BatchNormSiLU` keeps only the
convolution's output and the per-channel batch statistics, and recomputes the BatchNorm output in
backward (one element-wise pass). :class:`BatchNorm2SiLU` does the same for RepConvN's
``silu(bn1(conv3x3(x)) + bn2(conv1x1(x)))``, which would otherwise also keep the sum. Forward values,
running statistics and gradients are those of the plain modules (the same kernels; the recomputed
normalisation may round differently in the last bit). ``yolo9kit.models.layers.set_lean(model, True)``
switches every eligible module of a model; the trainer does it on CUDA by default
(the setting ``lean_activations``, ``config.step.lean_activations``).
"""

from __future__ import annotations

import torch
from torch import nn


class BatchNormSiLU(torch.autograd.Function):
    """``silu(batch_norm(x, training=True))`` that saves ``x`` and the batch statistics only."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum: float, eps: float):
        y, mean, invstd = torch.native_batch_norm(x, weight, bias, running_mean, running_var, True, momentum, eps)
        ctx.save_for_backward(x, weight, bias, mean, invstd)
        ctx.eps = eps
        return torch.nn.functional.silu(y)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, bias, mean, invstd = ctx.saved_tensors
        y = _recompute(x, weight, bias, mean, invstd)  # the BatchNorm output
        grad_y = torch.ops.aten.silu_backward(grad_out, y)
        del y
        grad_x, grad_w, grad_b = torch.ops.aten.native_batch_norm_backward(
            grad_y, x, weight, None, None, mean, invstd, True, ctx.eps, [True, weight.requires_grad,
                                                                          bias.requires_grad])
        return grad_x, grad_w, grad_b, None, None, None, None


def _recompute(x, weight, bias, mean, invstd) -> torch.Tensor:
    """The training-mode BatchNorm output from its input and batch statistics, in the input's dtype."""
    shape = (1, -1, 1, 1)
    return ((x.float() - mean.view(shape)) * invstd.view(shape) * weight.float().view(shape)
            + bias.float().view(shape)).to(x.dtype)


class BatchNorm2SiLU(torch.autograd.Function):
    """``silu(batch_norm(a) + batch_norm(b))`` (RepConvN's two branches) that saves ``a``, ``b`` and the
    batch statistics, not the sum."""

    @staticmethod
    def forward(ctx, a, w1, b1, rm1, rv1, b, w2, b2, rm2, rv2, momentum1: float, eps1: float, momentum2: float,
                eps2: float):
        y1, mean1, invstd1 = torch.native_batch_norm(a, w1, b1, rm1, rv1, True, momentum1, eps1)
        y2, mean2, invstd2 = torch.native_batch_norm(b, w2, b2, rm2, rv2, True, momentum2, eps2)
        ctx.save_for_backward(a, w1, b1, mean1, invstd1, b, w2, b2, mean2, invstd2)
        ctx.eps = (eps1, eps2)
        return torch.nn.functional.silu(y1 + y2)

    @staticmethod
    def backward(ctx, grad_out):
        a, w1, b1, mean1, invstd1, b, w2, b2, mean2, invstd2 = ctx.saved_tensors
        total = _recompute(a, w1, b1, mean1, invstd1) + _recompute(b, w2, b2, mean2, invstd2)
        grad_sum = torch.ops.aten.silu_backward(grad_out, total)
        del total
        grads = []
        for x, w, bias, mean, invstd, eps in ((a, w1, b1, mean1, invstd1, ctx.eps[0]),
                                              (b, w2, b2, mean2, invstd2, ctx.eps[1])):
            grads.append(torch.ops.aten.native_batch_norm_backward(
                grad_sum, x, w, None, None, mean, invstd, True, eps, [True, w.requires_grad, bias.requires_grad]))
        (ga, gw1, gb1), (gb, gw2, gb2) = grads
        return ga, gw1, gb1, None, None, gb, gw2, gb2, None, None, None, None, None, None


def _momentum(bn: nn.BatchNorm2d) -> float:
    """BatchNorm2d's bookkeeping for one training forward: count the batch, return the averaging factor."""
    bn.num_batches_tracked.add_(1)
    return bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)


def lean_bn2_silu(a: torch.Tensor, bn1: nn.BatchNorm2d, b: torch.Tensor, bn2: nn.BatchNorm2d) -> torch.Tensor:
    """``silu(bn1(a) + bn2(b))`` in training mode through :class:`BatchNorm2SiLU`."""
    m1, m2 = _momentum(bn1), _momentum(bn2)
    return BatchNorm2SiLU.apply(a, bn1.weight, bn1.bias, bn1.running_mean, bn1.running_var,
                                b, bn2.weight, bn2.bias, bn2.running_mean, bn2.running_var, m1, bn1.eps, m2, bn2.eps)


def lean_bn_silu(x: torch.Tensor, bn: nn.BatchNorm2d) -> torch.Tensor:
    """``silu(bn(x))`` in training mode through :class:`BatchNormSiLU`, with BatchNorm2d's bookkeeping
    (``num_batches_tracked``, the cumulative average when ``momentum`` is None)."""
    return BatchNormSiLU.apply(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, _momentum(bn), bn.eps)
