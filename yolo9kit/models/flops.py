"""FLOP counting (the figures of :func:`yolo9kit.models.model_table`).

Method: :class:`torch.utils.flop_counter.FlopCounterMode` counts the floating-point operations of the
convolutions and matrix products of one eval-mode forward pass (a multiply-add counts as 2 FLOPs) on a
small square input, scaled by ``(imgsz / probe_size)^2``. Every layer's output area is proportional to
the input area, so the scaling is exact for convolutions. This is the same scaling trick the official
``model_info`` uses (thop on 32x32 x (640/32)^2), but the counters differ: thop also charges
BatchNorm, pooling and activations, so our figures are about 1% lower than the official GFLOPs
(e.g. yolov9-t 16.28 vs 16.53, yolov9-c 238.7 vs 239.9).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


@torch.no_grad()
def count_flops(model: nn.Module, imgsz: int = 640, probe_size: int = 64) -> float:
    """GFLOPs of one forward pass on a (1, ch, imgsz, imgsz) image, counted at ``probe_size`` and scaled.

    Args:
        model: a DetectionModel (its mode is restored afterwards).
        imgsz: image side the figure is reported for, pixels.
        probe_size: side actually run, a multiple of 32.

    Returns:
        GFLOPs (1e9 floating-point operations; multiply-add = 2).
    """
    was_training = model.training
    param = next(model.parameters())
    x = torch.zeros(1, getattr(model, "ch", 3), probe_size, probe_size, device=param.device, dtype=param.dtype)
    model.eval()
    try:
        with FlopCounterMode(display=False) as counter:
            model(x)
    finally:
        model.train(was_training)
    return counter.get_total_flops() / 1e9 * (imgsz / probe_size) ** 2
