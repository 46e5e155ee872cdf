"""BatchNorm + SiLU that keeps one activation for backward instead of two (training memory).

In a ``Conv`` block (conv -> BatchNorm -> SiLU) autograd normally keeps the convolution's output (for the
BatchNorm backward) and the BatchNorm's output (for the SiLU backward), and the next layer keeps the
SiLU's output: three tensors of the same size per block. :class:`BatchNormSiLU` keeps only the
convolution's output and the per-channel batch statistics, and recomputes the BatchNorm output in
backward (one element-wise pass). Forward values, running statistics and gradients are those of
``silu(batch_norm(x))`` (the same kernels; the recomputed normalisation may round differently in the last
bit). ``set_lean(model, True)`` switches every eligible ``Conv`` of a model; the trainer does it on CUDA
by default (``TrainConfig.lean_activations``).
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
        shape = (1, -1, 1, 1)
        y = ((x.float() - mean.view(shape)) * invstd.view(shape) * weight.float().view(shape)
             + bias.float().view(shape)).to(x.dtype)  # the BatchNorm output, recomputed
        grad_y = torch.ops.aten.silu_backward(grad_out, y)
        del y
        grad_x, grad_w, grad_b = torch.ops.aten.native_batch_norm_backward(
            grad_y, x, weight, None, None, mean, invstd, True, ctx.eps, [True, weight.requires_grad,
                                                                          bias.requires_grad])
        return grad_x, grad_w, grad_b, None, None, None, None


def lean_bn_silu(x: torch.Tensor, bn: nn.BatchNorm2d) -> torch.Tensor:
    """``silu(bn(x))`` in training mode through :class:`BatchNormSiLU`, with BatchNorm2d's bookkeeping
    (``num_batches_tracked``, the cumulative average when ``momentum`` is None)."""
    bn.num_batches_tracked.add_(1)
    momentum = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
    return BatchNormSiLU.apply(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, momentum, bn.eps)


def eligible(bn: nn.Module | None, act: nn.Module) -> bool:
    """A plain affine BatchNorm2d with running statistics followed by SiLU (not SyncBatchNorm)."""
    return (type(bn) is nn.BatchNorm2d and bn.affine and bn.track_running_stats and isinstance(act, nn.SiLU))


def set_lean(model: nn.Module, enabled: bool = True) -> int:
    """Switch the lean BatchNorm+SiLU on or off in every eligible ``Conv`` of ``model``; returns how many."""
    from yolo9kit.models.layers import Conv

    count = 0
    for m in model.modules():
        if isinstance(m, Conv) and eligible(m.bn, m.act):
            m.lean = enabled
            count += 1
    return count
