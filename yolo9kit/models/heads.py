"""Detection heads: DFL decode, DDetect (GELAN) and DualDDetect (YOLOv9: auxiliary + main), as the official
``models/yolo.py`` DDetect and DualDDetect; outputs by name (:class:`DualOutput`), not the official ``[aux, main]``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import nn

from yolo9kit.boxes import ltrb_to_cxcywh, make_anchors
from yolo9kit.models.layers import Conv

REG_MAX = 16  # bins per box side of the distribution focal decode


class DualOutput(NamedTuple):
    """A detection model's outputs by head (``aux`` None for GELAN models).

    Training mode or ``raw=True``: lists of 3 raw maps (B, 64+nc, H_i, W_i). Eval mode: (B, 4+nc, A) tensors,
    boxes (cx, cy, w, h) in input pixels, then sigmoid class scores.
    """

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
        return self.conv(probs).reshape(b, 4, a)


def head_widths(ch0: int, nc: int) -> tuple[int, int]:
    """Hidden widths (box branch, class branch) of a head group from its first input's channels."""
    box = math.ceil(max(ch0 // 4, REG_MAX * 4, 16) / 4) * 4
    cls = max(ch0, min(nc * 2, 128))
    return box, cls


def _box_branches(ch: list[int], width: int) -> nn.ModuleList:
    # 3x3 Conv, grouped 3x3 Conv (g=4), grouped 1x1 conv to 4 sides x 16 bins
    return nn.ModuleList(
        nn.Sequential(Conv(x, width, 3), Conv(width, width, 3, g=4), nn.Conv2d(width, 4 * REG_MAX, 1, groups=4))
        for x in ch
    )


def _class_branches(ch: list[int], width: int, nc: int) -> nn.ModuleList:
    return nn.ModuleList(
        nn.Sequential(Conv(x, width, 3), Conv(width, width, 3), nn.Conv2d(width, nc, 1)) for x in ch
    )


class DDetect(nn.Module):
    """Anchor-free decoupled head: ``cv2`` box branches, ``cv3`` class branches, ``dfl`` (official names).

    ``stride`` is an (nl,) non-persistent buffer; ``strides`` the same values as floats, which the decode reads
    (reading the buffer on the GPU would make every eval forward wait for the device).
    """

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
        self._build(ch)

    def set_strides(self, strides) -> None:
        """The strides of the levels (floats, or a tensor on the host): the buffer and ``strides``."""
        values = tuple(float(s) for s in (strides.tolist() if isinstance(strides, torch.Tensor) else strides))
        if len(values) != self.nl:
            raise ValueError(f"{len(values)} strides for a head of {self.nl} levels")
        self.strides = values
        if not self.stride.is_meta:
            self.stride.copy_(torch.tensor(values, dtype=self.stride.dtype))

    def _build(self, ch: list[int]) -> None:
        c2, c3 = head_widths(ch[0], self.nc)
        self.cv2 = _box_branches(ch, c2)
        self.cv3 = _class_branches(ch, c3, self.nc)
        self.dfl = DFL(REG_MAX)

    def _groups(self) -> list[tuple[nn.ModuleList, nn.ModuleList, DFL]]:
        """(box branches, class branches, dfl) per head group, aux first."""
        return [(self.cv2, self.cv3, self.dfl)]

    def forward(self, xs: list[torch.Tensor], raw: bool = False) -> DualOutput:
        """Raw maps (B, 64+nc, H_i, W_i) per level and head group in training mode or with ``raw``, else decoded."""
        maps = []
        for g, (box, cls, _) in enumerate(self._groups()):
            feats = xs[g * self.nl:(g + 1) * self.nl]
            maps.append([torch.cat((box[i](x), cls[i](x)), 1) for i, x in enumerate(feats)])
        maps = DualOutput(maps[0], maps[1]) if len(maps) == 2 else DualOutput(None, maps[0])
        return maps if (raw or self.training) else self.decode(maps)

    def decode(self, maps: DualOutput) -> DualOutput:
        """Raw maps -> (B, 4+nc, A) per head (official eval path); both heads share one set of anchors."""
        ref = maps.main
        points, strides = make_anchors([tuple(m.shape[2:]) for m in ref], self.strides, 0.5,
                                       dtype=ref[0].dtype, device=ref[0].device)
        points, strides = points.T.unsqueeze(0), strides.T  # (1, 2, A), (1, A)
        dfls = [g[2] for g in self._groups()]
        outs = [None if m is None else self._decode_one(m, dfl, points, strides)
                for m, dfl in zip(maps if self.is_dual else [maps.main], dfls)]
        return DualOutput(outs[0], outs[1]) if self.is_dual else DualOutput(None, outs[0])

    def _decode_one(self, maps: list[torch.Tensor], dfl: DFL, points: torch.Tensor,
                    strides: torch.Tensor) -> torch.Tensor:
        b = maps[0].shape[0]
        flat = torch.cat([m.reshape(b, self.no, -1) for m in maps], 2)  # (B, no, A); reshape: channels_last
        box, cls = flat.split((4 * REG_MAX, self.nc), 1)
        boxes = ltrb_to_cxcywh(dfl(box), points, dim=1) * strides
        return torch.cat((boxes, cls.sigmoid()), 1)

    @torch.no_grad()
    def initialize_biases(self) -> None:
        """Box bias 1.0, class bias ln(5 / nc / (640 / stride)^2) (official prior); nothing on the meta device."""
        if self.stride.is_meta:
            return
        for box, cls, _ in self._groups():
            for a, b, s in zip(box, cls, self.strides):
                a[-1].bias.fill_(1.0)
                b[-1].bias[: self.nc] = math.log(5 / self.nc / (640 / s) ** 2)


class DualDDetect(DDetect):
    """YOLOv9 head: inputs aux P3-P5 then main P3-P5; ``cv2``/``cv3``/``dfl`` decode the auxiliary ones,
    ``cv4``/``cv5``/``dfl2`` the main ones (official names)."""

    is_dual = True

    def _build(self, ch: list[int]) -> None:
        if len(ch) % 2:
            raise ValueError(f"DualDDetect needs an even number of inputs (aux levels then main levels), got {ch}")
        nl = len(ch) // 2
        c2, c3 = head_widths(ch[0], self.nc)
        c4, c5 = head_widths(ch[nl], self.nc)
        self.cv2 = _box_branches(ch[:nl], c2)
        self.cv3 = _class_branches(ch[:nl], c3, self.nc)
        self.cv4 = _box_branches(ch[nl:], c4)
        self.cv5 = _class_branches(ch[nl:], c5, self.nc)
        self.dfl = DFL(REG_MAX)
        self.dfl2 = DFL(REG_MAX)

    def _groups(self) -> list[tuple[nn.ModuleList, nn.ModuleList, DFL]]:
        return [(self.cv2, self.cv3, self.dfl), (self.cv4, self.cv5, self.dfl2)]
