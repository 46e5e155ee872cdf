"""A small model of PyTorch's CUDA caching allocator: from a list of tensor allocations and frees to
the bytes the allocator reserves from the driver (what ``torch.cuda.memory_reserved`` reports).

The constants are those of c10's ``CUDACachingAllocator`` (default settings, no expandable segments):

* every request is rounded up to a multiple of 512 B (kMinBlockSize);
* requests up to 1 MiB (kSmallSize) come from the small pool, carved out of 2 MiB segments (kSmallBuffer);
* larger requests come from the large pool: a new segment is 20 MiB (kLargeBuffer) for requests under
  10 MiB (kMinLargeAlloc), otherwise the request rounded up to 2 MiB (kRoundLarge);
* a free block is found best-fit (smallest that fits) in the request's pool; it is split when the rest
  is at least 512 B (small pool) or more than 1 MiB (large pool); freed blocks merge with free
  neighbours in the same segment; segments are never returned (no ``empty_cache`` during a step).

Not modelled: streams (one stream assumed), ``max_split_size_mb`` and expandable segments, and the
allocator's release-and-retry when the card is full (so on a card near its limit the real reserved
peak can be lower than modelled: the model is the conservative side).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(nbytes: int) -> int:
    """Request size after rounding (kMinBlockSize)."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(nbytes: int) -> int:
    """Size of the segment the allocator asks the driver for when no cached block fits."""
    if nbytes <= SMALL_SIZE:
        return SMALL_BUFFER
    if nbytes < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-nbytes // ROUND_LARGE) * ROUND_LARGE


class CachingAllocatorModel:
    """Replay allocations and frees; ``reserved`` and ``peak_reserved`` in bytes."""

    def __init__(self) -> None:
        self.free_blocks = {True: [], False: []}  # small pool?, sorted [(size, segment, offset)]
        self.segments: list[dict[int, list]] = []  # per segment: offset -> [size, is_free]
        self.offsets: list[list[int]] = []  # per segment: sorted block offsets
        self.seg_small: list[bool] = []
        self.live: dict[int, tuple[int, int]] = {}  # allocation key -> (segment, offset)
        self.reserved = self.peak_reserved = self.allocated = self.peak_allocated = 0

    def malloc(self, key: int, nbytes: int) -> None:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self.free_blocks[small]
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i < len(pool):
            bsize, seg, off = pool.pop(i)
        else:
            bsize, off = segment_size(size), 0
            seg = len(self.segments)
            self.segments.append({0: [bsize, False]})
            self.offsets.append([0])
            self.seg_small.append(small)
            self.reserved += bsize
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        blocks = self.segments[seg]
        rest = bsize - size
        if (small and rest >= MIN_BLOCK) or (not small and rest > SMALL_SIZE):
            blocks[off] = [size, False]
            blocks[off + size] = [rest, True]
            bisect.insort(self.offsets[seg], off + size)
            bisect.insort(pool, (rest, seg, off + size))
        else:
            blocks[off] = [bsize, False]
            size = bsize
        self.live[key] = (seg, off)
        self.allocated += size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: int) -> None:
        seg, off = self.live.pop(key)
        blocks, offsets = self.segments[seg], self.offsets[seg]
        pool = self.free_blocks[self.seg_small[seg]]
        size = blocks[off][0]
        self.allocated -= size
        j = bisect.bisect_left(offsets, off)
        if j + 1 < len(offsets):  # merge with the next block
            nxt = offsets[j + 1]
            if blocks[nxt][1]:
                pool.remove((blocks[nxt][0], seg, nxt))
                size += blocks.pop(nxt)[0]
                offsets.pop(j + 1)
        if j > 0:  # merge with the previous block
            prv = offsets[j - 1]
            if blocks[prv][1]:
                pool.remove((blocks[prv][0], seg, prv))
                size += blocks[prv][0]
                blocks.pop(off)
                offsets.pop(j)
                off = prv
        blocks[off] = [size, True]
        bisect.insort(pool, (size, seg, off))


def replay(events: Iterable[tuple[int, int, int]]) -> CachingAllocatorModel:
    """Replay ``(kind, key, nbytes)`` events (kind +1 = malloc, -1 = free) and return the model."""
    model = CachingAllocatorModel()
    for kind, key, nbytes in events:
        if kind > 0:
            model.malloc(key, nbytes)
        else:
            model.free(key)
    return model
