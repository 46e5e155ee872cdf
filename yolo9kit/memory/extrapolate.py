"""From two traced steps at small batch sizes to the memory of any batch size.

Model (stated): for a fixed image size, every tensor of the step is either independent of the batch
(weights, gradients, optimizer state, EMA, per-parameter temporaries) or has the batch as a factor
(activations, their gradients, the loss's per-anchor tensors), so each storage's size is linear in the
batch: ``size(b) = size(b1) + (b - b1) * (size(b2) - size(b1)) / (b2 - b1)``. The model's forward,
backward and optimizer run the same ops in the same order at every batch size, so the two traces
align event for event and the live bytes at *every* moment extrapolate exactly; the peak is then the
maximum over all moments at the wanted batch (its position may move with the batch, e.g. from the
optimizer to early backward). The loss does not align (the assigner branches on data, and chunks its
(image, GT, anchor) pairs above ``LossConfig.max_assign_chunk``), so a loss phase is reduced to its
own peak moment, extrapolated the same way: with ``num_targets`` boxes in every image the loss is
linear in the batch up to the assigner's chunk size and flat beyond, so the line is an upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from yolo9kit.memory.allocator import replay
from yolo9kit.memory.tracker import CATEGORIES, Trace

_UNALIGNED_PHASES = {"loss", "loss_backward"}
_BATCH_CATEGORIES = {"activations", "loss_assigner", "workspace_other"}


def _live_matrix(trace: Trace) -> np.ndarray:
    """(num_events, K) live bytes per category after each event."""
    n = max(trace.num_events, 1)
    deltas = np.zeros((n, len(CATEGORIES)), dtype=np.int64)
    cat_index = {c: i for i, c in enumerate(CATEGORIES)}
    for rec in trace.records:
        k = cat_index[trace.category(rec)]
        deltas[rec.alloc, k] += rec.nbytes
        if rec.free is not None:
            deltas[rec.free, k] -= rec.nbytes
    return np.cumsum(deltas, axis=0)


def _segments(trace: Trace) -> list[tuple[str, int, int]]:
    starts = trace.phase_starts + [("<end>", trace.num_events)]
    return [(name, s, e) for (name, s), (_, e) in zip(starts[:-1], starts[1:])]


@dataclass
class StepMemoryModel:
    """Live bytes per category over the step as ``base + f * slope`` with ``f = (b - b1) / (b2 - b1)``."""

    b1: int
    b2: int
    base: np.ndarray  # (rows, K)
    slope: np.ndarray  # (rows, K)
    trace1: Trace
    trace2: Trace
    aligned: bool

    @classmethod
    def fit(cls, trace1: Trace, trace2: Trace, b1: int, b2: int) -> StepMemoryModel:
        live1, live2 = _live_matrix(trace1), _live_matrix(trace2)
        seg1 = _segments(trace1)
        seg2 = {(name, k): (s, e) for k, (name, s, e) in _numbered(_segments(trace2))}
        rows1, rows2, aligned = [], [], True
        for k, (name, s1, e1) in _numbered(seg1):
            if e1 == s1:
                continue
            r1 = live1[s1:e1]
            if (name, k) not in seg2:  # traced once only (optimizer, EMA): independent of the batch
                rows1.append(r1)
                rows2.append(r1)
                continue
            s2, e2 = seg2[(name, k)]
            r2 = live2[s2:e2]
            if name in _UNALIGNED_PHASES or len(r1) != len(r2) or len(r2) == 0:
                aligned = aligned and name in _UNALIGNED_PHASES
                r1 = r1[[int(r1.sum(1).argmax())]]
                r2 = r2[[int(r2.sum(1).argmax())]] if len(r2) else r1
            rows1.append(r1)
            rows2.append(r2)
        base = np.concatenate(rows1).astype(np.float64)
        slope = np.concatenate(rows2).astype(np.float64) - base
        return cls(b1, b2, base, slope, trace1, trace2, aligned)

    def peak(self, batch_size: int) -> tuple[int, dict[str, int]]:
        """(peak live bytes, breakdown at that moment) for ``batch_size``."""
        f = (batch_size - self.b1) / (self.b2 - self.b1)
        rows = np.maximum(self.base + f * self.slope, 0)
        i = int(rows.sum(1).argmax())
        breakdown = {c: int(round(v)) for c, v in zip(CATEGORIES, rows[i])}
        return sum(breakdown.values()), breakdown

    def allocator_events(self, batch_size: int, steps: int = 2) -> list[tuple[int, int, int]]:
        """Malloc/free events of ``steps`` consecutive steps at ``batch_size`` for the allocator model.

        Built on the second trace's order; record sizes are interpolated where the records of a phase
        pair up one to one, otherwise batch-dependent categories are scaled by ``b / b2``.
        """
        t1, t2 = self.trace1, self.trace2
        f = (batch_size - self.b1) / (self.b2 - self.b1)
        by_phase1: dict[tuple[int, str], list] = {}
        for rec in t1.records:
            by_phase1.setdefault(_segment_key(t1, rec.alloc), []).append(rec)
        by_phase2: dict[tuple[int, str], list] = {}
        for rec in t2.records:
            by_phase2.setdefault(_segment_key(t2, rec.alloc), []).append(rec)
        sizes: dict[int, int] = {}
        index2 = {id(rec): i for i, rec in enumerate(t2.records)}
        for key, recs2 in by_phase2.items():
            recs1 = by_phase1.get(key, [])
            paired = len(recs1) == len(recs2)
            for j, rec in enumerate(recs2):
                if paired:
                    size = recs1[j].nbytes + f * (rec.nbytes - recs1[j].nbytes)
                elif t2.category(rec) in _BATCH_CATEGORIES:
                    size = rec.nbytes * batch_size / self.b2
                else:
                    size = rec.nbytes
                sizes[index2[id(rec)]] = max(int(size), 1)
        persistent = [i for i, r in enumerate(t2.records) if r.phase == "setup" and r.free is None]
        is_persistent = set(persistent)
        step_recs = [i for i in range(len(t2.records)) if i not in is_persistent]
        events = [(1, i, sizes[i]) for i in persistent]
        for s in range(steps):
            timeline = []
            for i in step_recs:
                rec = t2.records[i]
                key = (s + 1) * len(t2.records) + i
                timeline.append((rec.alloc, 1, key, sizes[i]))
                end = rec.free if rec.free is not None else t2.num_events
                timeline.append((end, -1, key, 0))
            timeline.sort(key=lambda e: e[0])  # event indices are unique (never-freed ones end the step)
            events.extend((kind, key, size) for _, kind, key, size in timeline)
        return events

    def reserved_overhead(self, batch_size: int) -> int:
        """Allocator model: peak reserved minus peak allocated (rounding, segments, cached blocks)."""
        sim = replay(self.allocator_events(batch_size))
        return max(0, sim.peak_reserved - sim.peak_allocated)


def _numbered(segments: list[tuple[str, int, int]]) -> list[tuple[int, tuple[str, int, int]]]:
    """Each segment with its ordinal among segments of the same phase name."""
    seen: dict[str, int] = {}
    out = []
    for seg in segments:
        k = seen.get(seg[0], 0)
        seen[seg[0]] = k + 1
        out.append((k, seg))
    return out


def _segment_key(trace: Trace, event: int) -> tuple[int, str]:
    starts = trace.phase_starts
    j = 0
    lo, hi = 0, len(starts) - 1
    while lo <= hi:  # last phase start <= event
        mid = (lo + hi) // 2
        if starts[mid][1] <= event:
            j, lo = mid, mid + 1
        else:
            hi = mid - 1
    return j, starts[j][0]
