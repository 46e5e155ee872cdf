"""Task-aligned label assignment (TAL) for the YOLOv9 loss: the official ``utils/tal/assigner.py
TaskAlignedAssigner`` (topk 10, alpha 0.5, beta 6.0, eps 1e-9) in memory-bounded chunks of images and GT rows,
bit-identical to the unchunked result; how and what it saves: docs/loss.md, "Memory of the assigner"."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from yolo9kit.env import to_device_async


class AssignResult(NamedTuple):
    """Targets of the task-aligned assigner for every anchor (docs/loss.md, "The task-aligned assigner")."""

    target_labels: torch.Tensor  # (B, A) int64 class of the assigned GT (GT 0's where background, as official)
    target_bboxes: torch.Tensor  # (B, A, 4) xyxy box of the assigned GT, in the units of the GT input
    target_scores: torch.Tensor  # (B, A, C) float32: the normalised alignment at the assigned class, else 0
    fg_mask: torch.Tensor  # (B, A) bool, anchors that have a GT


class TaskAlignedAssigner:
    """Memory-bounded task-aligned assigner; matches the official ``TaskAlignedAssigner`` output.

    Args:
        num_classes: number of classes C.
        topk: candidate anchors per GT (official ComputeLoss: 10).
        alpha, beta: exponents of the class score (0.5) and of the CIoU (6.0) in the alignment metric.
        eps: in-box margin and normalisation epsilon (1e-9).
        max_pairs: most (image, GT, anchor) pairs whose intermediates are held at once; ``None``: the whole batch
            in one go (the official memory profile, minus its int64 one-hots).

    Raises:
        ValueError: ``max_pairs`` below 1.
    """

    def __init__(self, num_classes: int, *, topk: int = 10, alpha: float = 0.5, beta: float = 6.0,
                 eps: float = 1e-9, max_pairs: int | None = 8_388_608) -> None:
        if max_pairs is not None and max_pairs < 1:
            raise ValueError(f"max_pairs must be a positive pair count or None, got {max_pairs}")
        self.num_classes, self.topk, self.alpha, self.beta, self.eps = num_classes, topk, alpha, beta, eps
        self.max_pairs = max_pairs
        self._alpha_is_exact = alpha in (0.5, 1.0)  # pow runs as sqrt / identity: same bits anywhere

    @torch.no_grad()
    def __call__(self, pd_scores: torch.Tensor, pd_bboxes: torch.Tensor, anc_points: torch.Tensor,
                 gt_labels: torch.Tensor, gt_bboxes: torch.Tensor, gt_counts: torch.Tensor) -> AssignResult:
        """Assign GTs to anchors; returns an AssignResult. Boxes are xyxy, points and boxes in pixels.

        Args:
            pd_scores, pd_bboxes: (B, A, C) predicted class probabilities (sigmoid applied), (B, A, 4) boxes.
            anc_points: (A, 2) anchor centres.
            gt_labels, gt_bboxes: (B, M) class (float or int) and (B, M, 4) box of each GT row.
            gt_counts: (B,) int number of real GT rows of each image (they come first, the rest is padding).
        """
        batch_size, num_anchors, _ = pd_scores.shape
        device = pd_scores.device
        target_labels = torch.full((batch_size, num_anchors), self.num_classes, dtype=torch.long, device=device)
        target_bboxes = torch.zeros((batch_size, num_anchors, 4), dtype=gt_bboxes.dtype, device=device)
        target_scores = torch.zeros((batch_size, num_anchors, self.num_classes), dtype=torch.float32, device=device)
        fg_mask = torch.zeros((batch_size, num_anchors), dtype=torch.bool, device=device)
        counts = gt_counts.tolist()  # the loss passes CPU counts: no device synchronisation here
        gt_counts = to_device_async(gt_counts, device)
        if gt_bboxes.shape[1] == 0 or max(counts, default=0) == 0:  # no GT in the batch: all background
            return AssignResult(target_labels, target_bboxes, target_scores, fg_mask)
        # Per-box and per-score terms once for the whole batch (every chunking sees the same bits); an exact alpha
        # (sqrt) is taken later on the (b, r, A) gathered scores instead of on a (B, A, C) copy.
        scores_pow = pd_scores.float() if self._alpha_is_exact else pd_scores.float().pow(self.alpha)
        pred_atan, gt_atan = _aspect_atan(pd_bboxes), _aspect_atan(gt_bboxes)  # (B, A), (B, M)
        for start, stop in self._image_chunks(counts, num_anchors):
            num_rows = max(counts[start:stop])
            if num_rows == 0:  # no GT in these images: background everywhere (already filled)
                continue
            sl, rows = slice(start, stop), slice(0, num_rows)
            out = self._assign_chunk(scores_pow[sl], pd_bboxes[sl], pred_atan[sl], anc_points,
                                     gt_labels[sl, rows], gt_bboxes[sl, rows], gt_atan[sl, rows], gt_counts[sl])
            target_labels[sl], target_bboxes[sl], target_scores[sl], fg_mask[sl] = out
        return AssignResult(target_labels, target_bboxes, target_scores, fg_mask)

    def _image_chunks(self, counts: list[int], num_anchors: int) -> list[tuple[int, int]]:
        """Consecutive image ranges whose padded pair count fits ``max_pairs`` (at least one image each)."""
        if self.max_pairs is None:
            return [(0, len(counts))]
        chunks, start, rows = [], 0, 0
        for i, n in enumerate(counts):
            new_rows = max(rows, n)
            if i > start and (i + 1 - start) * new_rows * num_anchors > self.max_pairs:
                chunks.append((start, i))
                start, new_rows = i, n
            rows = new_rows
        chunks.append((start, len(counts)))
        return chunks

    def _assign_chunk(self, scores_pow, pd_bboxes, pred_atan, anc_points, gt_labels, gt_bboxes, gt_atan, gt_counts):
        """The official procedure on b images padded to M rows -> (labels, bboxes, scores, fg)."""
        b, num_anchors, _ = scores_pow.shape
        num_rows = gt_bboxes.shape[1]
        rows = torch.arange(num_rows, device=scores_pow.device)
        is_real = rows[None, :] < gt_counts[:, None]  # (b, M) bool; official mask_gt
        labels = gt_labels.long()
        overlaps, align, candidate = self._candidates(scores_pow, pd_bboxes, pred_atan, anc_points, labels,
                                                      gt_bboxes, gt_atan, is_real)

        # several candidates: the GT of most overlap among ALL GTs (official select_highest_overlaps), no device sync
        multi = candidate.sum(1) > 1  # (b, A)
        best = overlaps.argmax(1)  # (b, A); first maximum, padding rows are 0 and come last
        candidate = torch.where(multi[:, None, :], rows[None, :, None] == best[:, None, :], candidate)
        fg = candidate.any(1)  # (b, A)
        assigned = candidate.to(torch.uint8).argmax(1)  # (b, A); 0 where background, like the official

        # normalisation: a column now has at most one candidate, so the official max over GTs is at the assigned GT
        align.masked_fill_(~candidate, 0)
        overlaps.masked_fill_(~candidate, 0)
        pos_align = align.amax(-1)  # (b, M)
        pos_overlaps = overlaps.amax(-1)  # (b, M)
        del overlaps, candidate
        align_at = align.gather(1, assigned[:, None, :]).squeeze(1)  # (b, A)
        del align
        factor = align_at * pos_overlaps.gather(1, assigned) / (pos_align.gather(1, assigned) + self.eps)

        target_labels = labels.gather(1, assigned)  # (b, A)
        target_bboxes = gt_bboxes.gather(1, assigned[..., None].expand(-1, -1, 4))  # (b, A, 4)
        target_scores = torch.zeros((b, num_anchors, self.num_classes), dtype=torch.float32, device=fg.device)
        target_scores.scatter_(2, target_labels[..., None], torch.where(fg, factor, 0.0).float()[..., None])
        return target_labels, target_bboxes, target_scores, fg

    def _candidates(self, scores_pow, pd_bboxes, pred_atan, anc_points, labels, gt_bboxes, gt_atan, is_real):
        """CIoU overlaps, alignment metric and top-k-in-box candidates, (b, M, A) each, over slices of GT rows
        so that the CIoU temporaries stay under ``max_pairs`` pairs."""
        b, num_anchors, _ = scores_pow.shape
        num_rows = gt_bboxes.shape[1]
        step = num_rows if self.max_pairs is None else max(1, self.max_pairs // (b * num_anchors))
        args = (scores_pow, pd_bboxes, pred_atan, anc_points, labels, gt_bboxes, gt_atan, is_real)
        if step >= num_rows:
            return self._row_candidates(*args, rows=slice(0, num_rows))
        overlaps = torch.empty((b, num_rows, num_anchors), dtype=torch.float32, device=scores_pow.device)
        align = torch.empty_like(overlaps)
        candidate = torch.empty((b, num_rows, num_anchors), dtype=torch.bool, device=scores_pow.device)
        for r0 in range(0, num_rows, step):
            rows = slice(r0, min(r0 + step, num_rows))
            overlaps[:, rows], align[:, rows], candidate[:, rows] = self._row_candidates(*args, rows=rows)
        return overlaps, align, candidate

    def _row_candidates(self, scores_pow, pd_bboxes, pred_atan, anc_points, labels, gt_bboxes, gt_atan, is_real,
                        *, rows: slice):
        """Overlaps, alignment and candidates of GT rows ``rows``: (b, r, A) each."""
        boxes = gt_bboxes[:, rows]  # (b, r, 4)
        overlaps = _pairwise_ciou(boxes, gt_atan[:, rows], pd_bboxes, pred_atan).clamp_(0)  # (b, r, A)
        image = torch.arange(boxes.shape[0], device=boxes.device)[:, None]
        box_scores = scores_pow.transpose(1, 2)[image, labels[:, rows]]  # (b, r, A) score of the GT's class
        if self._alpha_is_exact:
            box_scores = box_scores.pow_(self.alpha)
        align = box_scores.mul_(self._pow_beta(overlaps))
        in_box = _anchors_in_boxes(anc_points, boxes, self.eps)  # (b, r, A) bool
        k = min(self.topk, scores_pow.shape[1])
        top = torch.where(in_box, align, 0.0).topk(k, dim=-1, largest=True).indices  # as the official topk
        candidate = torch.zeros_like(in_box).scatter_(-1, top, True)
        candidate &= in_box
        candidate &= is_real[:, rows, None]
        return overlaps, align, candidate

    def _pow_beta(self, x: torch.Tensor) -> torch.Tensor:
        """x ** beta; an integer beta (the official 6) as multiplications, which round the same anywhere in a
        vectorised loop (``Tensor.pow`` may not), so chunked and unchunked runs agree bit for bit."""
        n = self.beta
        if float(n).is_integer() and 1 <= n <= 16:
            n, result, base = int(n), None, x
            while n:
                if n & 1:
                    result = base if result is None else result * base
                n >>= 1
                if n:
                    base = base * base
            return result
        return x.pow(n)


def _pairwise_ciou(gt_xyxy: torch.Tensor, gt_atan: torch.Tensor, pred_xyxy: torch.Tensor,
                   pred_atan: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """CIoU of every GT against every prediction of the same image: (b, r, 4), (b, A, 4) -> (b, r, A);
    ``boxes.bbox_ciou(gt, pred)`` in the same operation order, in place, each ``atan(w / h)`` taken outside."""
    b1_x1, b1_y1, b1_x2, b1_y2 = (gt_xyxy[..., i, None] for i in range(4))  # (b, r, 1)
    b2_x1, b2_y1, b2_x2, b2_y2 = (pred_xyxy[:, None, :, i] for i in range(4))  # (b, 1, A)
    w1, h1 = b1_x2 - b1_x1, b1_y2 - b1_y1 + eps
    w2, h2 = b2_x2 - b2_x1, b2_y2 - b2_y1 + eps
    inter = torch.min(b1_x2, b2_x2).sub_(torch.max(b1_x1, b2_x1)).clamp_(0)
    inter.mul_(torch.min(b1_y2, b2_y2).sub_(torch.max(b1_y1, b2_y1)).clamp_(0))
    iou = inter.div_((w1 * h1 + w2 * h2).sub_(inter).add_(eps))  # the union is freed at once
    diag_sq = torch.max(b1_x2, b2_x2).sub_(torch.min(b1_x1, b2_x1)).pow_(2)
    diag_sq.add_(torch.max(b1_y2, b2_y2).sub_(torch.min(b1_y1, b2_y1)).pow_(2)).add_(eps)
    centre_dist_sq = (b2_x1 + b2_x2 - b1_x1).sub_(b1_x2).pow_(2)
    centre_dist_sq.add_((b2_y1 + b2_y2 - b1_y1).sub_(b1_y2).pow_(2)).div_(4)
    v = (pred_atan[:, None, :] - gt_atan[..., None]).pow_(2).mul_(4 / math.pi**2)
    alpha = v / (v - iou).add_(1 + eps)
    penalty = centre_dist_sq.div_(diag_sq).add_(v.mul_(alpha))
    return iou.sub_(penalty)


def _aspect_atan(boxes_xyxy: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """atan(w / h) of (..., 4) xyxy boxes -> (...), with the CIoU's eps on the height."""
    return torch.atan((boxes_xyxy[..., 2] - boxes_xyxy[..., 0]) / (boxes_xyxy[..., 3] - boxes_xyxy[..., 1] + eps))


def _anchors_in_boxes(anc_points: torch.Tensor, boxes_xyxy: torch.Tensor, eps: float) -> torch.Tensor:
    """(A, 2) points, (b, r, 4) boxes -> (b, r, A) bool: point strictly inside (margin > eps); the official
    ``select_candidates_in_gts`` without its (b, r, A, 4) float deltas."""
    x, y = anc_points[:, 0], anc_points[:, 1]
    x1, y1, x2, y2 = (boxes_xyxy[..., i, None] for i in range(4))
    margin = x - x1
    for high, low in ((y, y1), (x2, x), (y2, y)):
        torch.minimum(margin, high - low, out=margin)
    return margin > eps
