"""The YOLOv9 training loss (task-aligned assignment, CIoU box loss, DFL, BCE class loss), per head, with the
dual (auxiliary + main) combination: the official ``utils/loss_tal_dual.py`` / ``loss_tal.py`` ``ComputeLoss``.
The official constants are the fields of :class:`LossConfig`; docs/loss.md explains the loss."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from yolo9kit.assigner import TaskAlignedAssigner
from yolo9kit.boxes import bbox_ciou, cxcywh_to_xyxy, ltrb_to_xyxy, make_anchors, xyxy_to_ltrb
from yolo9kit.config import LossConfig  # re-exported: yolo9kit.loss.LossConfig
from yolo9kit.env import to_device_async

__all__ = ["DetectionLoss", "LossConfig", "HeadTargets"]


class HeadTargets(NamedTuple):
    """Targets padded per image, shared by both heads."""

    labels: torch.Tensor  # (B, M) float class per GT row
    boxes_xyxy: torch.Tensor  # (B, M, 4) GT boxes in input pixels; rows ``>= counts[b]`` are zeros
    counts: torch.Tensor  # (B,) int64 real GT rows per image, on the targets' device (loader batches: the CPU, no sync)


class DetectionLoss:
    """YOLOv9 loss for dual-head (yolov9-*) and single-head (gelan-*) models.

    Args:
        model: a DetectionModel (uses ``.nc``, ``.stride``, ``.head.reg_max``); or None with ``num_classes`` and
            ``strides`` given.
        config: LossConfig; defaults to the official constants.
        num_classes, strides, reg_max: without a model: the number of classes, the stride of each level in input
            pixels (e.g. [8, 16, 32]) and the DFL bins per box side (16).

    Call with ``(outputs, targets)``, the training-mode maps and the (N, 6) normalised targets; returns ``(loss,
    loss_items)``: the scalar (box + cls + dfl) x B for backward and the detached (3,) ``[box, cls, dfl]`` after the
    gains (docs/loss.md).
    """

    def __init__(self, model: torch.nn.Module | None = None, config: LossConfig | None = None, *,
                 num_classes: int | None = None, strides: Sequence[float] | torch.Tensor | None = None,
                 reg_max: int | None = None) -> None:
        if model is not None:
            head = getattr(model, "head", None)
            num_classes = int(model.nc) if num_classes is None else num_classes
            if strides is None:  # the head's host copy: no read from the device when the model is on a GPU
                strides = getattr(head, "strides", None) or model.stride
            reg_max = int(getattr(head, "reg_max", 16)) if reg_max is None else reg_max
        if num_classes is None or strides is None:
            raise ValueError("DetectionLoss needs a model, or num_classes and strides "
                             "(e.g. DetectionLoss(num_classes=80, strides=[8, 16, 32]))")
        self.config = config or LossConfig()
        self.num_classes = int(num_classes)
        self.strides = [float(s) for s in torch.as_tensor(strides, dtype=torch.float32).tolist()]
        self.reg_max = 16 if reg_max is None else int(reg_max)
        self.num_outputs = self.num_classes + 4 * self.reg_max
        # The official code keeps one assigner per head; they have no state, one serves both.
        self.assigner = TaskAlignedAssigner(self.num_classes, topk=self.config.topk, alpha=self.config.alpha,
                                            beta=self.config.beta, eps=self.config.eps,
                                            max_pairs=self.config.max_assign_chunk)

    def __call__(self, outputs: Any, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        heads = self._split_heads(outputs)
        batch_size, _, height, width = heads[-1][0].shape
        device = heads[-1][0].device
        image_hw = (height * self.strides[0], width * self.strides[0])
        gt = self.pad_targets(targets, batch_size, image_hw)  # on the targets' device (CPU: no sync)
        gt = HeadTargets(to_device_async(gt.labels, device), to_device_async(gt.boxes_xyxy, device), gt.counts)
        cfg = self.config
        # float32 also inside an AMP autocast region (docs/loss.md, "Precision"); head_loss upcasts the maps
        with torch.autocast(device.type, enabled=False):
            parts = [self.head_loss(maps, gt) for maps in heads]  # each [box, cls, dfl]
        # official order: aux x 0.25 first, then + main
        items = [aux * cfg.aux_weight + main_ for aux, main_ in zip(*parts)] if len(parts) == 2 else parts[0]
        loss_items = torch.stack([items[0] * cfg.box_gain, items[1] * cfg.cls_gain, items[2] * cfg.dfl_gain])
        return loss_items.sum() * batch_size, loss_items.detach()

    def _split_heads(self, outputs: Any) -> list[list[torch.Tensor]]:
        """DualOutput or official order -> [aux maps, main maps] or [main maps], each 3 (B, no, H, W)."""
        if hasattr(outputs, "main") and hasattr(outputs, "aux"):
            heads = [outputs.main] if outputs.aux is None else [outputs.aux, outputs.main]
        elif isinstance(outputs, (list, tuple)) and outputs and isinstance(outputs[0], torch.Tensor):
            heads = [outputs]
        elif isinstance(outputs, (list, tuple)) and len(outputs) in (1, 2):
            heads = list(outputs)
        else:
            raise TypeError("DetectionLoss expects training-mode outputs: a DualOutput, [aux maps, main maps] "
                            f"or a list of maps; got {type(outputs).__name__}")
        for maps in heads:
            if not isinstance(maps, (list, tuple)) or len(maps) != len(self.strides):
                raise ValueError(f"each head must give {len(self.strides)} maps (one per stride "
                                 f"{self.strides}); got {type(maps).__name__} of length "
                                 f"{len(maps) if isinstance(maps, (list, tuple)) else '?'}")
            for m in maps:
                if m.ndim != 4 or m.shape[1] != self.num_outputs:
                    raise ValueError(f"expected training-mode maps (B, {self.num_outputs}, H, W) = 4*reg_max "
                                     f"{4 * self.reg_max} + nc {self.num_classes} channels; got {tuple(m.shape)}. "
                                     "Put the model in train() mode, and build the loss with the model's nc.")
        return [list(maps) for maps in heads]

    def pad_targets(self, targets: torch.Tensor, batch_size: int, image_hw: tuple[float, float]) -> HeadTargets:
        """(N, 6) normalised targets -> per-image padded pixel boxes (official ComputeLoss.preprocess); rows keep
        their order within an image; M = most GT rows of any image."""
        if targets.ndim != 2 or targets.shape[1] != 6:
            raise ValueError(f"targets must be (N, 6) rows [image_index, class, cx, cy, w, h]; "
                             f"got shape {tuple(targets.shape)}")
        targets = targets.float()
        device = targets.device
        image_index = targets[:, 0].long()
        if targets.shape[0] and (int(image_index.min()) < 0 or int(image_index.max()) >= batch_size):
            raise ValueError(f"targets image_index must be in [0, {batch_size - 1}] for a batch of "
                             f"{batch_size}; got range [{int(image_index.min())}, {int(image_index.max())}]")
        counts = torch.bincount(image_index, minlength=batch_size)
        num_rows = int(counts.max()) if targets.shape[0] else 0
        out = torch.zeros((batch_size, num_rows, 5), device=device)
        if num_rows:
            order = torch.argsort(image_index, stable=True)
            slot = torch.arange(targets.shape[0], device=device) - (counts.cumsum(0) - counts)[image_index[order]]
            out[image_index[order], slot] = targets[order, 1:]
            scale = torch.tensor([image_hw[1], image_hw[0], image_hw[1], image_hw[0]], device=device)
            out[..., 1:5] = cxcywh_to_xyxy(out[..., 1:5].mul_(scale))
        return HeadTargets(out[..., 0], out[..., 1:5], counts)

    def head_loss(self, maps: list[torch.Tensor], gt: HeadTargets) -> list[torch.Tensor]:
        """Unweighted [box, cls, dfl] of one head (official ComputeLoss per-head body) from its raw ``maps``, per level
        (B, 4*reg_max + nc, H, W), and the padded targets ``gt`` of :meth:`pad_targets`."""
        flat = torch.cat([m.float().reshape(m.shape[0], self.num_outputs, -1) for m in maps], 2)
        pred_dist, pred_logits = flat.split((4 * self.reg_max, self.num_classes), 1)
        pred_dist = pred_dist.permute(0, 2, 1).contiguous()  # (B, A, 64)
        pred_logits = pred_logits.permute(0, 2, 1).contiguous()  # (B, A, nc)
        anchor_points, stride_per_anchor = make_anchors([m.shape[2:] for m in maps], self.strides,
                                                        dtype=flat.dtype, device=flat.device)
        pred_boxes = self.decode_boxes(anchor_points, pred_dist)  # (B, A, 4) xyxy, grid units

        assigned = self.assigner(pred_logits.detach().sigmoid(), pred_boxes.detach() * stride_per_anchor,
                                 anchor_points * stride_per_anchor, gt.labels, gt.boxes_xyxy, gt.counts)
        target_boxes = assigned.target_bboxes / stride_per_anchor  # grid units
        target_scores = assigned.target_scores
        target_scores_sum = target_scores.sum().clamp(min=1)  # official max(sum, 1)

        pos_weight = flat.new_full((1,), self.config.cls_pos_weight)  # a fill, not a host-to-device copy
        if flat.device.type == "cpu":  # an AVX-512 masked load does not fault its page in: the BCE's log1p paid a
            torch.log1p(flat.new_full((16,), -0.0))  # suppressed fault per call until -0.0 reads its constant
        cls_loss = F.binary_cross_entropy_with_logits(pred_logits, target_scores, pos_weight=pos_weight,
                                                      reduction="none").sum() / target_scores_sum
        # box (CIoU) and DFL over every anchor, background weighted 0: no boolean indexing, so no device sync;
        # background anchors get harmless stand-in targets (their own prediction, DFL bin 0.5): no NaN to mask
        fg = assigned.fg_mask.unsqueeze(-1)  # (B, A, 1)
        weight = target_scores.sum(-1, keepdim=True) * fg  # (B, A, 1)
        safe_targets = torch.where(fg, target_boxes, pred_boxes.detach())
        box_loss = ((1.0 - bbox_ciou(pred_boxes, safe_targets)) * weight).sum() / target_scores_sum
        target_ltrb = torch.where(fg, xyxy_to_ltrb(anchor_points, safe_targets, self.reg_max - 1 - 0.01), 0.5)  # 14.99
        dfl = self.distribution_focal_loss(pred_dist.reshape(-1, 4 * self.reg_max), target_ltrb.reshape(-1, 4))
        return [box_loss, cls_loss, (dfl * weight.reshape(-1, 1)).sum() / target_scores_sum]

    def decode_boxes(self, anchor_points: torch.Tensor, pred_dist: torch.Tensor) -> torch.Tensor:
        """(A, 2) points, (B, A, 4*reg_max) logits -> (B, A, 4) xyxy boxes, grid units (softmax expectation)."""
        b, a, c = pred_dist.shape
        bins = torch.arange(self.reg_max, dtype=pred_dist.dtype, device=pred_dist.device)
        return ltrb_to_xyxy(pred_dist.view(b, a, 4, c // 4).softmax(3).matmul(bins), anchor_points)

    def distribution_focal_loss(self, pred_dist: torch.Tensor, target_ltrb: torch.Tensor) -> torch.Tensor:
        """DFL (official BboxLoss._df_loss, docs/loss.md): (n, 4*reg_max) logits, (n, 4) targets in bins -> (n, 1).
        Both cross-entropies read one log-softmax (``F.cross_entropy`` computes two): same values, less memory."""
        log_probs = F.log_softmax(pred_dist.reshape(-1, self.reg_max), dim=1)
        left = target_ltrb.long()
        right = left + 1
        weight_left = right.float() - target_ltrb
        weight_right = 1 - weight_left
        loss_left = -log_probs.gather(1, left.view(-1, 1)).view(left.shape) * weight_left
        loss_right = -log_probs.gather(1, right.view(-1, 1)).view(left.shape) * weight_right
        return (loss_left + loss_right).mean(-1, keepdim=True)
