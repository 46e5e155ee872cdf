"""Building blocks of YOLOv9 / GELAN, with the official attribute names so official weights load.

Each block computes what the class of the same name in the official ``models/common.py`` computes. Attribute
names such as ``cv1``/``cv2`` are kept because they are the state_dict keys of official checkpoints
(``model.4.cv2.0.m.0.cv1.conv1.conv.weight``); each class says what its parts are.

The blocks' own switches live here too: :func:`fuse_layers` folds BatchNorm into the convs for inference,
:func:`set_lean` turns on the lean BatchNorm+SiLU of :mod:`yolo9kit.models.lean` for training.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from yolo9kit.models.lean import lean_bn2_silu, lean_bn_silu


def autopad(k: int, p: int | None = None, d: int = 1) -> int:
    """'Same' padding for an odd kernel ``k`` with dilation ``d`` (official ``autopad``)."""
    if d > 1:
        k = d * (k - 1) + 1
    return k // 2 if p is None else p


class Conv(nn.Module):
    """Conv2d (no bias) -> BatchNorm2d -> SiLU. ``act=False`` gives no activation.

    Keys: ``conv.weight``, ``bn.*``. After :func:`fuse_layers` the ``bn`` is gone and ``conv`` has a bias.
    ``lean`` (set by :func:`set_lean`): in training, BatchNorm + SiLU keep one activation
    for backward instead of two.
    """

    lean = False

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None, g: int = 1,
                 d: int = 1, act: bool | nn.Module = True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p, d), groups=g, dilation=d, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.SiLU() if act is True else act if isinstance(act, nn.Module) else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bn is None:  # fused for inference
            return self.act(self.conv(x))
        if self.lean and self.training and torch.is_grad_enabled():
            return lean_bn_silu(self.conv(x), self.bn)
        return self.act(self.bn(self.conv(x)))


class AConv(nn.Module):
    """'Avg-conv down': 2x2 average pool (stride 1) then a 3x3 stride-2 Conv ``cv1`` (official
    ``models/common.py`` AConv)."""

    def __init__(self, c1: int, c2: int):
        super().__init__()
        self.cv1 = Conv(c1, c2, 3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv1(F.avg_pool2d(x, 2, 1, 0, False, True))


class ADown(nn.Module):
    """Two-path downsampling (official ``models/common.py`` ADown): half the channels through a 3x3 stride-2
    Conv ``cv1``, the other half through a 3x3 stride-2 max pool and a 1x1 Conv ``cv2``; outputs concatenated."""

    def __init__(self, c1: int, c2: int):
        super().__init__()
        self.c = c2 // 2
        self.cv1 = Conv(c1 // 2, self.c, 3, 2, 1)
        self.cv2 = Conv(c1 // 2, self.c, 1, 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.avg_pool2d(x, 2, 1, 0, False, True)
        x1, x2 = x.chunk(2, 1)
        x2 = F.max_pool2d(x2, 3, 2, 1)
        return torch.cat((self.cv1(x1), self.cv2(x2)), 1)


class ELAN1(nn.Module):
    """Small ELAN block of the -t/-s stems (official ``models/common.py`` ELAN1): 1x1 ``cv1`` split in halves
    a, b; two 3x3 Convs ``cv2``, ``cv3`` in series on b; 1x1 ``cv4`` over concat(a, b, y2, y3)."""

    def __init__(self, c1: int, c2: int, c3: int, c4: int):
        super().__init__()
        self.c = c3 // 2
        self.cv1 = Conv(c1, c3, 1, 1)
        self.cv2 = Conv(c3 // 2, c4, 3, 1)
        self.cv3 = Conv(c4, c4, 3, 1)
        self.cv4 = Conv(c3 + 2 * c4, c2, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.cv1(x).chunk(2, 1)
        y2 = self.cv2(b)
        y3 = self.cv3(y2)
        return self.cv4(torch.cat((a, b, y2, y3), 1))


class RepConvN(nn.Module):
    """Re-parameterisable 3x3 conv (official ``models/common.py`` RepConvN): SiLU(BN(3x3 conv) + BN(1x1 conv)),
    no identity branch.

    ``conv1`` is the 3x3 branch, ``conv2`` the 1x1 branch. :meth:`collapse` merges both into one biased
    3x3 ``conv`` for inference (the official ``fuse_convs``).
    """

    lean = False  # see set_lean

    def __init__(self, c1: int, c2: int, k: int = 3, s: int = 1, p: int = 1, g: int = 1, d: int = 1,
                 act: bool | nn.Module = True):
        super().__init__()
        assert k == 3 and p == 1, "RepConvN supports k=3, p=1 only"
        self.g = g
        self.act = nn.SiLU() if act is True else act if isinstance(act, nn.Module) else nn.Identity()
        self.conv1 = Conv(c1, c2, k, s, p=p, g=g, act=False)
        self.conv2 = Conv(c1, c2, 1, s, p=(p - k // 2), g=g, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "conv"):  # collapsed for inference
            return self.act(self.conv(x))
        if self.lean and self.training and torch.is_grad_enabled():
            return lean_bn2_silu(self.conv1.conv(x), self.conv1.bn, self.conv2.conv(x), self.conv2.bn)
        return self.act(self.conv1(x) + self.conv2(x))

    @torch.no_grad()
    def collapse(self) -> None:
        """Fold both branches (and their BatchNorms) into one 3x3 ``conv`` with bias; in place."""
        w3, b3 = conv_bn_weights(self.conv1)
        w1, b1 = conv_bn_weights(self.conv2)
        src = self.conv1.conv
        conv = nn.Conv2d(src.in_channels, src.out_channels, 3, src.stride, 1, groups=self.g, bias=True)
        conv = conv.to(device=w3.device, dtype=w3.dtype)
        conv.weight.copy_(w3 + F.pad(w1, [1, 1, 1, 1]))
        conv.bias.copy_(b3 + b1)
        conv.weight.requires_grad_(False)
        conv.bias.requires_grad_(False)
        self.conv = conv
        del self.conv1, self.conv2


def conv_bn_weights(m: Conv) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight and bias of the single conv equal to ``m.bn(m.conv(x))`` (official ``utils/torch_utils.py``
    fuse_conv_and_bn).

    W' = W * gamma / sqrt(var + eps) per output channel; b' = beta + (b - mean) * gamma / sqrt(var + eps).
    """
    w = m.conv.weight
    b = m.conv.bias if m.conv.bias is not None else torch.zeros(w.shape[0], device=w.device, dtype=w.dtype)
    if m.bn is None:
        return w, b
    scale = m.bn.weight / torch.sqrt(m.bn.running_var + m.bn.eps)
    return w * scale.view(-1, 1, 1, 1), m.bn.bias + (b - m.bn.running_mean) * scale


@torch.no_grad()
def _fold_conv(m: Conv) -> None:
    if m.bn is None:
        return
    w, b = conv_bn_weights(m)
    src = m.conv
    conv = nn.Conv2d(src.in_channels, src.out_channels, src.kernel_size, src.stride, src.padding,
                     dilation=src.dilation, groups=src.groups, bias=True).to(device=w.device, dtype=w.dtype)
    conv.weight.copy_(w)
    conv.bias.copy_(b)
    conv.requires_grad_(False)
    m.conv, m.bn = conv, None


@torch.no_grad()
def fuse_layers(model: nn.Module) -> nn.Module:
    """Fold every BatchNorm into its conv and collapse every RepConvN of a module tree, in place; eval mode.

    The layer work of :func:`yolo9kit.models.fuse` (which also marks a DetectionModel as fused). Returns
    ``model``.
    """
    model.eval()
    for m in list(model.modules()):
        if isinstance(m, RepConvN) and not hasattr(m, "conv"):
            m.collapse()
    for m in list(model.modules()):
        if isinstance(m, Conv):
            _fold_conv(m)
    return model


def _lean_eligible(bn: nn.Module | None, act: nn.Module) -> bool:
    """A plain affine BatchNorm2d with running statistics followed by SiLU (not SyncBatchNorm)."""
    return (type(bn) is nn.BatchNorm2d and bn.affine and bn.track_running_stats and isinstance(act, nn.SiLU))


def set_lean(model: nn.Module, enabled: bool = True) -> int:
    """Switch the lean BatchNorm+SiLU (:mod:`yolo9kit.models.lean`) on or off in every eligible ``Conv`` and
    ``RepConvN`` of ``model``; returns how many modules it applies to."""
    count = 0
    for m in model.modules():
        if isinstance(m, Conv) and _lean_eligible(m.bn, m.act):
            m.lean = enabled
            count += 1
        elif isinstance(m, RepConvN) and hasattr(m, "conv1") and _lean_eligible(m.conv1.bn, m.act) and \
                _lean_eligible(m.conv2.bn, m.act):
            m.lean = enabled
            count += 1
    return count


class RepNBottleneck(nn.Module):
    """Residual bottleneck (official ``models/common.py`` RepNBottleneck): x + cv2(cv1(x)), ``cv1`` a RepConvN,
    ``cv2`` a 3x3 Conv."""

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
    """CSP block of n RepNBottlenecks (official ``models/common.py`` RepNCSP): cv3(concat(m(cv1(x)), cv2(x)))."""

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = True, g: int = 1, e: float = 0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(RepNBottleneck(c_, c_, shortcut, g, e=1.0) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class RepNCSPELAN4(nn.Module):
    """The GELAN block (official ``models/common.py`` RepNCSPELAN4): 1x1 ``cv1`` split in halves a, b; ``cv2`` =
    RepNCSP + 3x3 Conv on b; ``cv3`` = RepNCSP + 3x3 Conv on that; 1x1 ``cv4`` over concat(a, b, y2, y3).
    ``c5`` = RepNCSP depth."""

    def __init__(self, c1: int, c2: int, c3: int, c4: int, c5: int = 1):
        super().__init__()
        self.c = c3 // 2
        self.cv1 = Conv(c1, c3, 1, 1)
        self.cv2 = nn.Sequential(RepNCSP(c3 // 2, c4, c5), Conv(c4, c4, 3, 1))
        self.cv3 = nn.Sequential(RepNCSP(c4, c4, c5), Conv(c4, c4, 3, 1))
        self.cv4 = Conv(c3 + (2 * c4), c2, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.cv1(x).chunk(2, 1)
        y2 = self.cv2(b)
        y3 = self.cv3(y2)
        return self.cv4(torch.cat((a, b, y2, y3), 1))


class SP(nn.Module):
    """Max pool, kernel ``k``, stride ``s``, 'same' padding (attribute ``m``, no parameters)."""

    def __init__(self, k: int = 3, s: int = 1):
        super().__init__()
        self.m = nn.MaxPool2d(kernel_size=k, stride=s, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(x)


class SPPELAN(nn.Module):
    """Spatial pyramid pooling ELAN (official ``models/common.py`` SPPELAN): 1x1 ``cv1``, three 5x5 max pools
    ``cv2``-``cv4`` in series, 1x1 ``cv5`` over the concatenation of all four."""

    def __init__(self, c1: int, c2: int, c3: int):
        super().__init__()
        self.c = c3
        self.cv1 = Conv(c1, c3, 1, 1)
        self.cv2 = SP(5)
        self.cv3 = SP(5)
        self.cv4 = SP(5)
        self.cv5 = Conv(4 * c3, c2, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y1 = self.cv1(x)
        y2 = self.cv2(y1)
        y3 = self.cv3(y2)
        y4 = self.cv4(y3)
        return self.cv5(torch.cat((y1, y2, y3, y4), 1))


class CBLinear(nn.Module):
    """Biased conv (no BN, no activation) whose output is split into pieces of widths ``c2s`` (official
    ``models/common.py`` CBLinear).

    Returns a tuple of tensors, one per entry of ``c2s``.
    """

    def __init__(self, c1: int, c2s: list[int], k: int = 1, s: int = 1, p: int | None = None, g: int = 1):
        super().__init__()
        self.c2s = list(c2s)
        self.conv = nn.Conv2d(c1, sum(self.c2s), k, s, autopad(k, p), groups=g, bias=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.conv(x).split(self.c2s, dim=1)


class CBFuse(nn.Module):
    """Sum of the current map and nearest-resized pieces of earlier CBLinear outputs (official
    ``models/common.py`` CBFuse).

    Input: list ``[tuple_0, ..., tuple_k, current]``; piece ``idx[j]`` of ``tuple_j`` is used.
    """

    def __init__(self, idx: list[int]):
        super().__init__()
        self.idx = list(idx)

    def forward(self, xs: list) -> torch.Tensor:
        target = xs[-1]
        size = target.shape[2:]
        resized = [F.interpolate(x[self.idx[j]], size=size, mode="nearest") for j, x in enumerate(xs[:-1])]
        return torch.stack([*resized, target]).sum(0)


class Silence(nn.Module):
    """Identity; as layer 0 it lets later rows refer to the raw image as layer ``0``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Concat(nn.Module):
    """Concatenate a list of tensors along ``dimension`` (channels by default)."""

    def __init__(self, dimension: int = 1):
        super().__init__()
        self.d = dimension

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(xs, self.d)
