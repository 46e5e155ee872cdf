"""Detection heads as the official ``models/yolo.py``: DDetect (GELAN) and DualDDetect (YOLOv9: auxiliary +
main), with outputs by name (:class:`DualOutput`) instead of the official ``[aux, main]``."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import nn

from yolo9kit.boxes import ltrb_to_cxcywh, make_anchors
from yolo9kit.models.layers import Conv

REG_MAX = 16  # bins per box side of the distribution focal decode


class DualOutput(NamedTuple):
    """A detection model's outputs by head (``aux`` None for GELAN models): lists of 3 raw maps (B, 64+nc, H_i, W_i)
    in training mode or with ``raw=True``, else (B, 4+nc, A) tensors (docs/models.md, "Outputs: the dual head")."""

    aux: Any
    main: Any


class DFL(nn.Module):
    """(B, 64, A) bin logits (side-major: left, top, right, bottom) -> (B, 4, A) expected distances; ``conv`` is
    a frozen 1x1 conv with weights 0..15."""

    def __init__(self, c1: int = REG_MAX):
        super().__init__()
        self.c1 = c1
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.arange(c1, dtype=torch.float32).view(1, c1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, a = x.shape
        probs = x.reshape(b, 4, self.c1, a).transpose(2, 1).softmax(1)  # (B, 16 bins, 4 sides, A)
        return nn.functional.conv2d(probs, self.conv.weight.to(probs.dtype)).reshape(b, 4, a)  # fp32 under bf16


def _branches(ch: list[int], nc: int) -> tuple[nn.ModuleList, nn.ModuleList]:
    """Box branches (3x3 Conv, grouped 3x3 Conv, grouped 1x1 conv to 4 sides x 16 bins) and class branches of
    one head group, their widths from its first input's channels."""
    c2, c3 = math.ceil(max(ch[0] // 4, REG_MAX * 4, 16) / 4) * 4, max(ch[0], min(nc * 2, 128))
    box = nn.ModuleList(nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3, g=4), nn.Conv2d(c2, 4 * REG_MAX, 1, groups=4))
                        for x in ch)
    cls = nn.ModuleList(nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1)) for x in ch)
    return box, cls


class DDetect(nn.Module):
    """Anchor-free decoupled head: ``cv2`` box branches, ``cv3`` class branches, ``dfl`` (official names).
    ``stride`` is an (nl,) non-persistent buffer, ``strides`` its host copy that the decode reads."""

    is_dual = False

    def __init__(self, nc: int = 80, ch: list[int] | tuple[int, ...] = ()):
        super().__init__()
        ch = list(ch)
        self.nc = int(nc)
        self.nl = len(ch) // (2 if self.is_dual else 1)
        self.reg_max = REG_MAX
        self.no = self.nc + 4 * REG_MAX
        self.register_buffer("stride", torch.zeros(self.nl), persistent=False)
        self.strides: tuple[float, ...] = (0.0,) * self.nl
        if self.is_dual and len(ch) % 2:
            raise ValueError(f"DualDDetect needs an even number of inputs (aux levels then main levels), got {ch}")
        self.cv2, self.cv3 = _branches(ch[:self.nl], self.nc)
        if self.is_dual:  # official registration order: cv2, cv3, cv4, cv5, dfl, dfl2
            self.cv4, self.cv5 = _branches(ch[self.nl:], self.nc)
        self.dfl = DFL()
        if self.is_dual:
            self.dfl2 = DFL()

    def _groups(self) -> list[tuple[nn.ModuleList, nn.ModuleList, DFL]]:
        """(box branches, class branches, dfl) per head group, aux first."""
        return [(self.cv2, self.cv3, self.dfl)] + ([(self.cv4, self.cv5, self.dfl2)] if self.is_dual else [])

    def set_strides(self, strides) -> None:
        """The strides of the levels (floats, or a host tensor): ``strides`` and the buffer."""
        self.strides = tuple(float(s) for s in (strides.tolist() if isinstance(strides, torch.Tensor) else strides))
        self.stride.copy_(torch.tensor(self.strides, dtype=self.stride.dtype))

    def forward(self, xs: list[torch.Tensor], raw: bool = False) -> DualOutput:
        """Raw maps (B, 64+nc, H_i, W_i) per level and head group in training mode or with ``raw``, else decoded."""
        maps = [[torch.cat((box[i](x), cls[i](x)), 1) for i, x in enumerate(xs[g * self.nl:(g + 1) * self.nl])]
                for g, (box, cls, _) in enumerate(self._groups())]
        out = DualOutput(*maps) if self.is_dual else DualOutput(None, maps[0])
        return out if raw or self.training else self.decode(out)

    def decode(self, maps: DualOutput) -> DualOutput:
        """Raw maps -> (B, 4+nc, A) per head (official eval path); both heads share one set of anchors."""
        ref = maps.main  # bf16 decodes in fp32: its 8 significant bits would move a box edge near 640 px by 2 px
        dtype = torch.float32 if ref[0].dtype == torch.bfloat16 else ref[0].dtype
        points, strides = make_anchors([tuple(m.shape[2:]) for m in ref], self.strides, 0.5, dtype=dtype,
                                       device=ref[0].device)
        points, strides = points.T.unsqueeze(0), strides.T  # (1, 2, A), (1, A)
        outs = []
        for head, (_, _, dfl) in zip([m for m in maps if m is not None], self._groups()):
            flat = torch.cat([m.reshape(m.shape[0], self.no, -1) for m in head], 2).to(dtype)  # (B, no, A)
            box, cls = flat.split((4 * REG_MAX, self.nc), 1)
            outs.append(torch.cat((ltrb_to_cxcywh(dfl(box), points, dim=1) * strides, cls.sigmoid()), 1))
        return DualOutput(*outs) if self.is_dual else DualOutput(None, outs[0])

    @torch.no_grad()
    def initialize_biases(self) -> None:
        """Box bias 1.0, class bias ln(5 / nc / (640 / stride)^2) (official prior)."""
        for box, cls, _ in self._groups():
            for a, b, s in zip(box, cls, self.strides):
                a[-1].bias.fill_(1.0)
                b[-1].bias[: self.nc] = math.log(5 / self.nc / (640 / s) ** 2)


class DualDDetect(DDetect):
    """YOLOv9 head: inputs aux P3-P5 then main P3-P5; ``cv2``/``cv3``/``dfl`` decode the auxiliary ones,
    ``cv4``/``cv5``/``dfl2`` the main ones (official names)."""

    is_dual = True
