"""The blocks of YOLOv9 / GELAN as the official ``models/common.py`` (same attribute names, so the same
state_dict keys), ``fuse`` for inference and ``set_lean``, a lean BatchNorm+SiLU for training."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Conv(nn.Module):
    """Conv2d (no bias) -> BatchNorm2d -> SiLU (``act=False``: none); fused, ``bn`` is None and ``conv`` biased."""

    lean = False  # set_lean: in training, BatchNorm + SiLU keep one activation for backward instead of two

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None, g: int = 1,
                 d: int = 1, act: bool = True):
        super().__init__()
        p = (d * (k - 1) + 1) // 2 if p is None else p  # 'same' padding (official autopad)
        self.conv = nn.Conv2d(c1, c2, k, s, p, groups=g, dilation=d, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.SiLU() if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bn is None:  # fused for inference
            return self.act(self.conv(x))
        if self.lean and self.training and torch.is_grad_enabled():
            return lean_bn_silu((self.conv(x), self.bn))
        return self.act(self.bn(self.conv(x)))


class AConv(nn.Module):
    """2x2 average pool (stride 1), then a 3x3 stride-2 Conv ``cv1``."""

    def __init__(self, c1: int, c2: int):
        super().__init__()
        self.cv1 = Conv(c1, c2, 3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv1(F.avg_pool2d(x, 2, 1, 0, False, True))


class ADown(nn.Module):
    """Half the channels through a 3x3 stride-2 Conv ``cv1``, half through a 3x3 stride-2 max pool and a 1x1
    Conv ``cv2``; concatenated."""

    def __init__(self, c1: int, c2: int):
        super().__init__()
        self.cv1 = Conv(c1 // 2, c2 // 2, 3, 2, 1)
        self.cv2 = Conv(c1 // 2, c2 // 2, 1, 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = F.avg_pool2d(x, 2, 1, 0, False, True).chunk(2, 1)
        return torch.cat((self.cv1(x1), self.cv2(F.max_pool2d(x2, 3, 2, 1))), 1)


class ELAN1(nn.Module):
    """1x1 ``cv1`` split in halves a, b; 3x3 ``cv2``, ``cv3`` in series on b; 1x1 ``cv4`` over (a, b, y2, y3)."""

    def __init__(self, c1: int, c2: int, c3: int, c4: int):
        super().__init__()
        self.cv1 = Conv(c1, c3, 1, 1)
        self.cv2 = Conv(c3 // 2, c4, 3, 1)
        self.cv3 = Conv(c4, c4, 3, 1)
        self.cv4 = Conv(c3 + 2 * c4, c2, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in (self.cv2, self.cv3))
        return self.cv4(torch.cat(y, 1))


class RepConvN(nn.Module):
    """SiLU(BN(3x3 ``conv1``) + BN(1x1 ``conv2``)); ``collapse`` merges them into one biased 3x3 ``conv``."""

    lean = False  # see Conv

    def __init__(self, c1: int, c2: int, k: int = 3, s: int = 1, p: int = 1, g: int = 1, d: int = 1, act: bool = True):
        super().__init__()
        assert k == 3 and p == 1, "RepConvN supports k=3, p=1 only"
        self.act = nn.SiLU() if act else nn.Identity()
        self.conv1 = Conv(c1, c2, k, s, p=p, g=g, act=False)
        self.conv2 = Conv(c1, c2, 1, s, p=(p - k // 2), g=g, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "conv"):  # collapsed for inference
            return self.act(self.conv(x))
        if self.lean and self.training and torch.is_grad_enabled():
            return lean_bn_silu((self.conv1.conv(x), self.conv1.bn), (self.conv2.conv(x), self.conv2.bn))
        return self.act(self.conv1(x) + self.conv2(x))

    @torch.no_grad()
    def collapse(self) -> None:
        """Fold both branches and their BatchNorms into one biased 3x3 ``conv`` (official ``fuse_convs``)."""
        w3, b3 = conv_bn_weights(self.conv1)
        w1, b1 = conv_bn_weights(self.conv2)
        self.conv = _biased_conv(self.conv1.conv, w3 + F.pad(w1, [1, 1, 1, 1]), b3 + b1)
        del self.conv1, self.conv2


class RepNBottleneck(nn.Module):
    """x + cv2(cv1(x)): ``cv1`` a RepConvN, ``cv2`` a 3x3 Conv (no shortcut when the widths differ)."""

    def __init__(self, c1: int, c2: int, shortcut: bool = True, g: int = 1, k: tuple[int, int] = (3, 3),
                 e: float = 1.0):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = RepConvN(c1, c_, k[0], 1)
        self.cv2 = Conv(c_, c2, k[1], 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class RepNCSP(nn.Module):
    """CSP block of ``n`` RepNBottlenecks: cv3(concat(m(cv1(x)), cv2(x)))."""

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = True, g: int = 1, e: float = 0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(RepNBottleneck(c_, c_, shortcut, g, e=1.0) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class RepNCSPELAN4(ELAN1):
    """The GELAN block: ELAN1 whose ``cv2``, ``cv3`` are a RepNCSP of depth ``c5`` + a 3x3 Conv."""

    def __init__(self, c1: int, c2: int, c3: int, c4: int, c5: int = 1):
        nn.Module.__init__(self)
        self.cv1 = Conv(c1, c3, 1, 1)
        self.cv2 = nn.Sequential(RepNCSP(c3 // 2, c4, c5), Conv(c4, c4, 3, 1))
        self.cv3 = nn.Sequential(RepNCSP(c4, c4, c5), Conv(c4, c4, 3, 1))
        self.cv4 = Conv(c3 + (2 * c4), c2, 1, 1)


def SP(k: int = 3, s: int = 1) -> nn.MaxPool2d:  # noqa: N802 - the official block's name
    """Max pool, kernel ``k``, stride ``s``, 'same' padding."""
    return nn.MaxPool2d(kernel_size=k, stride=s, padding=k // 2)


class SPPELAN(nn.Module):
    """1x1 ``cv1``, three 5x5 max pools ``cv2``-``cv4`` in series, 1x1 ``cv5`` over all four outputs."""

    def __init__(self, c1: int, c2: int, c3: int):
        super().__init__()
        self.cv1 = Conv(c1, c3, 1, 1)
        self.cv2, self.cv3, self.cv4 = SP(5), SP(5), SP(5)
        self.cv5 = Conv(4 * c3, c2, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        y.extend(m(y[-1]) for m in (self.cv2, self.cv3, self.cv4))
        return self.cv5(torch.cat(y, 1))


class CBLinear(nn.Module):
    """Biased conv whose output is split into a tuple of pieces of widths ``c2s``."""

    def __init__(self, c1: int, c2s: list[int], k: int = 1, s: int = 1, p: int | None = None, g: int = 1):
        super().__init__()
        self.c2s = list(c2s)
        self.conv = nn.Conv2d(c1, sum(self.c2s), k, s, k // 2 if p is None else p, groups=g, bias=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.conv(x).split(self.c2s, dim=1)


class CBFuse(nn.Module):
    """Input ``[tuple_0, ..., tuple_k, current]``: current + piece ``idx[j]`` of each ``tuple_j``, resized (nearest)."""

    def __init__(self, idx: list[int]):
        super().__init__()
        self.idx = list(idx)

    def forward(self, xs: list) -> torch.Tensor:
        size = xs[-1].shape[2:]
        resized = [F.interpolate(x[self.idx[j]], size=size, mode="nearest") for j, x in enumerate(xs[:-1])]
        return torch.stack([*resized, xs[-1]]).sum(0)


class Concat(nn.Module):
    """Concatenate a list of tensors along ``dimension``."""

    def __init__(self, dimension: int = 1):
        super().__init__()
        self.d = dimension

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(xs, self.d)


def conv_bn_weights(m: Conv) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight and bias of the one conv equal to ``m.bn(m.conv(x))`` (official ``fuse_conv_and_bn``)."""
    scale = m.bn.weight / torch.sqrt(m.bn.running_var + m.bn.eps)  # W' = W * scale, b' = beta - mean * scale
    return m.conv.weight * scale.view(-1, 1, 1, 1), m.bn.bias - m.bn.running_mean * scale


def _biased_conv(src: nn.Conv2d, w: torch.Tensor, b: torch.Tensor) -> nn.Conv2d:
    conv = nn.Conv2d(src.in_channels, src.out_channels, src.kernel_size, src.stride, src.padding,
                     dilation=src.dilation, groups=src.groups, bias=True).to(device=w.device, dtype=w.dtype)
    conv.weight.copy_(w)
    conv.bias.copy_(b)
    return conv.requires_grad_(False)


@torch.no_grad()
def fuse(model: nn.Module) -> nn.Module:
    """Fold every BatchNorm into its conv and collapse every RepConvN of ``model``, in place, as the official
    ``DetectionModel.fuse()``; for inference only (eval mode). Returns ``model``."""
    model.eval()
    for m in list(model.modules()):
        if isinstance(m, RepConvN) and not hasattr(m, "conv"):
            m.collapse()
    for m in list(model.modules()):
        if isinstance(m, Conv) and m.bn is not None:
            m.conv, m.bn = _biased_conv(m.conv, *conv_bn_weights(m)), None
    if hasattr(model, "fused"):  # a DetectionModel: its checkpoints record it
        model.fused = True
    return model


class _BatchNormSiLU(torch.autograd.Function):
    """silu(bn_1(x_1) + ... + bn_k(x_k)) in training mode, saving each x and its batch statistics only: the
    BatchNorm outputs are recomputed in backward (docs/training.md, lean activations)."""

    @staticmethod
    def forward(ctx, settings, *tensors):
        total, saved = None, []
        for (momentum, eps), i in zip(settings, range(0, len(tensors), 5)):  # x, w, b, running mean, running var
            y, mean, invstd = torch.native_batch_norm(*tensors[i:i + 5], True, momentum, eps)
            total = y if total is None else total + y
            saved += [*tensors[i:i + 3], mean, invstd]
        ctx.save_for_backward(*saved)
        ctx.eps = [eps for _, eps in settings]
        return F.silu(total)

    @staticmethod
    def backward(ctx, grad_out):
        saved = ctx.saved_tensors  # unpacked once: a checkpointed graph allows one unpack
        groups = [saved[i:i + 5] for i in range(0, len(saved), 5)]
        total, shape = None, (1, -1, 1, 1)
        for x, w, b, mean, invstd in groups:  # the BatchNorm outputs, recomputed
            y = ((x.float() - mean.view(shape)) * invstd.view(shape) * w.float().view(shape)
                 + b.float().view(shape)).to(x.dtype)
            total = y if total is None else total + y
            del y
        grad = torch.ops.aten.silu_backward(grad_out, total)
        del total
        grads: list = [None]
        for (x, w, b, mean, invstd), eps in zip(groups, ctx.eps):
            grads += [*torch.ops.aten.native_batch_norm_backward(
                grad, x, w, None, None, mean, invstd, True, eps, [True, w.requires_grad, b.requires_grad]), None, None]
        return tuple(grads)


def lean_bn_silu(*pairs: tuple[torch.Tensor, nn.BatchNorm2d]) -> torch.Tensor:
    """``silu(bn_1(x_1) + ...)`` for (x, bn) pairs in training mode, with BatchNorm2d's bookkeeping."""
    settings = []
    for _, bn in pairs:
        bn.num_batches_tracked.add_(1)
        settings.append((bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked), bn.eps))
    tensors = [t for x, bn in pairs for t in (x, bn.weight, bn.bias, bn.running_mean, bn.running_var)]
    return _BatchNormSiLU.apply(tuple(settings), *tensors)


def set_lean(model: nn.Module, enabled: bool = True) -> int:
    """Switch the lean BatchNorm+SiLU on or off in every ``Conv`` and ``RepConvN`` whose BatchNorms are plain
    affine BatchNorm2d with running statistics, followed by SiLU; returns their count."""
    count = 0
    for m in model.modules():
        bns = [m.bn] if isinstance(m, Conv) else []
        if isinstance(m, RepConvN) and hasattr(m, "conv1"):  # none once collapsed
            bns = [m.conv1.bn, m.conv2.bn]
        if bns and isinstance(m.act, nn.SiLU) and all(
                type(bn) is nn.BatchNorm2d and bn.affine and bn.track_running_stats for bn in bns):
            m.lean = enabled
            count += 1
    return count
