"""Peak memory of the task-aligned assigner: yolo9kit's chunked version against the official pattern.

    python benchmarks/assigner_memory.py [--batch-size 16] [--image-size 640] [--objects 10 50 100 300]
                                         [--device cpu|cuda] [--official-max-pairs 15000000]

For every object count M (all images of the batch hold M objects) it prints the pair count
B x M x A, the peak memory the assigner adds over its inputs, measured in a fresh process
(CPU: growth of the resident-set high-water mark, VmHWM, after resetting it; CUDA: max_memory_allocated), for

* ``official``: the (B, M, A) procedure of docs/loss.md written the way the official ``utils/tal/assigner.py``
  TaskAlignedAssigner is (float masks, (B, M, A, 4) in-box deltas, ``one_hot(topk_idxs, A)`` int64, one-hot
  conflict resolution); measured only up to ``--official-max-pairs`` pairs, then extrapolated linearly per pair;
* ``chunked``: yolo9kit.assigner.TaskAlignedAssigner with the default ``max_assign_chunk``;
* ``unchunked``: the same with ``max_assign_chunk=None``.

Numbers are for one head; the dual loss runs its two assignments one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F


def official_pattern(scores, boxes, points, labels, gt_boxes, real, topk=10, alpha=0.5, beta=6.0, eps=1e-9):
    """The assigner of docs/loss.md with the tensor shapes and dtypes of the official TaskAlignedAssigner."""
    from yolo9kit.boxes import bbox_ciou

    b, a, c = scores.shape
    m = gt_boxes.shape[1]
    lt, rb = gt_boxes.view(-1, 1, 4).chunk(2, 2)
    deltas = torch.cat((points[None] - lt, rb - points[None]), dim=2).view(b, m, a, -1)  # (B, M, A, 4) float
    in_gt = deltas.amin(3).gt_(eps)  # float 0/1
    del deltas
    box_scores = scores[torch.arange(b)[:, None], :, labels.long()]
    overlaps = bbox_ciou(gt_boxes.unsqueeze(2), boxes.unsqueeze(1)).squeeze(3).clamp(0)
    align = box_scores.pow(alpha) * overlaps.pow(beta)
    del box_scores
    idx = (align * in_gt).topk(topk, dim=-1).indices
    idx = torch.where(real.expand_as(idx), idx, 0)
    hits = F.one_hot(idx, a).sum(-2)  # (B, M, topk, A) int64, then (B, M, A)
    mask = torch.where(hits > 1, 0, hits).to(align.dtype) * in_gt * real.float()
    del hits
    fg = mask.sum(-2)
    if fg.max() > 1:
        multi = (fg.unsqueeze(1) > 1).repeat([1, m, 1])
        best = F.one_hot(overlaps.argmax(1), m).permute(0, 2, 1).to(overlaps.dtype)
        mask = torch.where(multi, best, mask)
        del multi, best
    gt_idx = mask.argmax(-2)
    target_scores = F.one_hot(labels.long().gather(1, gt_idx), c) * (mask.sum(-2) > 0)[..., None]
    align = align * mask
    norm = (align * (overlaps * mask).amax(-1, keepdim=True) / (align.amax(-1, keepdim=True) + eps)).amax(-2)
    return target_scores * norm[..., None]


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def child(variant: str, batch_size: int, image_size: int, objects: int, device: str) -> int:
    """Build inputs, run one assignment, return the peak bytes it added."""
    from yolo9kit.assigner import TaskAlignedAssigner
    from yolo9kit.boxes import make_anchors

    gen = torch.Generator().manual_seed(0)
    shapes = [(image_size // s, image_size // s) for s in (8, 16, 32)]
    points, stride = make_anchors(shapes, [8, 16, 32])
    points = points * stride
    a, c = len(points), 80
    scores = torch.rand(batch_size, a, c, generator=gen)
    centre = points[None].expand(batch_size, -1, -1)
    size = torch.rand(batch_size, a, 2, generator=gen) * 64 + 4
    boxes = torch.cat([centre - size / 2, centre + size / 2], -1)
    gt_c = torch.rand(batch_size, objects, 2, generator=gen) * image_size
    gt_s = torch.rand(batch_size, objects, 2, generator=gen) * 96 + 8
    gt_boxes = torch.cat([gt_c - gt_s / 2, gt_c + gt_s / 2], -1)
    labels = torch.randint(0, c, (batch_size, objects), generator=gen).float()
    counts = torch.full((batch_size,), objects)
    tensors = [t.to(device) for t in (scores, boxes, points, labels, gt_boxes, counts)]
    scores, boxes, points, labels, gt_boxes, counts = tensors
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
            f.write("5")
        base = _rss_bytes("VmRSS:")
    if variant == "official":
        real = (torch.arange(objects, device=device)[None] < counts[:, None])[..., None]
        out = official_pattern(scores, boxes, points, labels, gt_boxes, real)
    else:
        max_pairs = None if variant == "unchunked" else 8_388_608
        out = TaskAlignedAssigner(c, max_pairs=max_pairs)(scores, boxes, points, labels, gt_boxes, counts)
    del out
    if device == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    return _rss_bytes("VmHWM:") - base


def measure(variant: str, args, objects: int) -> int:
    # A fixed mmap threshold makes glibc return every freed block above 64 KiB to the system at once,
    # so the resident-set high-water mark tracks live tensors instead of allocator caching.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    cmd = [sys.executable, __file__, "--child", variant, "--batch-size", str(args.batch_size),
           "--image-size", str(args.image_size), "--objects", str(objects), "--device", args.device]
    return int(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=640)
    p.add_argument("--objects", type=int, nargs="+", default=[10, 50, 100, 300])
    p.add_argument("--device", default="cpu")
    p.add_argument("--official-max-pairs", type=float, default=15e6)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(child(args.child, args.batch_size, args.image_size, args.objects[0], args.device))
        return
    anchors = sum((args.image_size // s) ** 2 for s in (8, 16, 32))
    print(f"batch {args.batch_size}, image {args.image_size} ({anchors} anchors), 80 classes, device {args.device}")
    print(f"{'M':>5} {'pairs':>12} {'official MB':>12} {'B/pair':>7} {'chunked MB':>11} {'unchunked MB':>13}")
    per_pair = None
    for m in args.objects:
        pairs = args.batch_size * m * anchors
        if pairs <= args.official_max_pairs:
            official = measure("official", args, m)
            per_pair, note = official / pairs, " "
        else:
            official, note = int(per_pair * pairs) if per_pair else -1, "*"
        chunked, unchunked = measure("chunked", args, m), measure("unchunked", args, m)
        print(f"{m:>5} {pairs:>12,} {official / 1e6:>11.0f}{note} {official / pairs:>7.1f} "
              f"{chunked / 1e6:>11.0f} {unchunked / 1e6:>13.0f}")
    print("* extrapolated from the largest measured official run (bytes per pair)")


if __name__ == "__main__":
    main()
