"""Count the bytes of every tensor storage a training step allocates, by category and over time.

``StorageTracker`` is a ``TorchDispatchMode``: it sees every ATen op below autograd, so it sees the
tensors autograd saves for backward, the gradients, the optimizer's buffers and every temporary. It
works the same on real tensors (CPU or CUDA) and on ``meta`` tensors (shapes, no data), which is what makes a GPU-less
estimate possible: a step traced on meta tensors allocates, op for op, what the real step allocates.

Each storage is recorded once, when the first op returns a tensor on it, and freed when its Python
object dies (a weakref callback; CPython runs it at once). The result is an event list: storage ``i``
becomes live at event ``alloc[i]`` and dead at event ``free[i]``. Categories are settled afterwards,
from the phase the storage was born in and from what it turned out to be (a ``.grad``, an optimizer
buffer, an EMA tensor).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

# The categories of a MemoryReport breakdown, in display order.
CATEGORIES = ("weights", "gradients", "optimizer_state", "ema", "activations", "loss_assigner", "workspace_other")

# phase a storage was born in -> category, unless its identity says otherwise
_PHASE_CATEGORY = {"forward": "activations", "loss": "loss_assigner", "loss_backward": "loss_assigner"}

CUDA_MIN_BLOCK = 512  # the CUDA caching allocator rounds every request up to a multiple of 512 bytes


def storage_bytes(nbytes: int, device_type: str) -> int:
    """Bytes a storage of ``nbytes`` takes: rounded up to 512 B on CUDA (kMinBlockSize), exact elsewhere."""
    if device_type == "cuda":
        return max(CUDA_MIN_BLOCK, math.ceil(nbytes / CUDA_MIN_BLOCK) * CUDA_MIN_BLOCK)
    return nbytes


@dataclass
class StorageRecord:
    nbytes: int
    phase: str
    alloc: int
    free: int | None = None  # event index; None while alive
    tag: str | None = None  # identity category (weights, gradients, ...) when known


@dataclass
class Trace:
    """What a tracker saw: storages with alloc/free event indices, phase boundaries, final categories."""

    records: list[StorageRecord]
    num_events: int
    phase_starts: list[tuple[str, int]] = field(default_factory=list)

    def category(self, rec: StorageRecord) -> str:
        return rec.tag or _PHASE_CATEGORY.get(rec.phase, "workspace_other")


class StorageTracker(TorchDispatchMode):
    """Record storages created by ops while active (see the module docstring).

    Args:
        device_type: "cuda" rounds sizes as the CUDA allocator does; anything else counts exact bytes.
            Pass "cuda" when tracing meta tensors that stand for a CUDA run.
    """

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type
        self.records: list[StorageRecord] = []
        self._index: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storage -> record index
        self._refs: list[weakref.ref] = []
        self.events = 0
        self.phase = "setup"
        self.phase_starts: list[tuple[str, int]] = [("setup", 0)]
        self.paused = False
        self.forward_flops = 0  # FLOPs of the convolutions in the "forward" phase (multiply-add = 2)
        self._param_storages: WeakIdKeyDictionary = WeakIdKeyDictionary()

    # ------------------------------------------------------------------------------------ phases
    def set_phase(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            self.phase_starts.append((phase, self.events))

    # ---------------------------------------------------------------------------------- storages
    def _record(self, storage: torch.UntypedStorage, tag: str | None) -> int:
        idx = self._index.get(storage)
        if idx is not None:
            if tag is not None and self.records[idx].tag is None:
                self.records[idx].tag = tag
            return idx
        idx = len(self.records)
        self.records.append(StorageRecord(storage_bytes(storage.nbytes(), self.device_type), self.phase,
                                          self.events, tag=tag))
        self.events += 1
        self._index[storage] = idx
        self._refs.append(weakref.ref(storage, lambda _ref, i=idx: self._on_free(i)))
        return idx

    def _on_free(self, idx: int) -> None:
        rec = self.records[idx]
        if rec.free is None:
            rec.free = self.events
            self.events += 1

    def register(self, tensors, tag: str) -> None:
        """Record tensors that exist already (parameters, EMA, inputs) under ``tag``."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                self._record(st, tag)
                if tag == "weights" and isinstance(t, torch.nn.Parameter):
                    self._param_storages[st] = True

    def tag(self, tensors, tag: str) -> None:
        """Give already recorded storages an identity category (e.g. they became ``.grad``)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                idx = self._index.get(t.untyped_storage())
                if idx is not None:
                    self.records[idx].tag = tag

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.paused:
            return out
        tag = None
        if func is torch.ops.aten.convolution.default and self.phase == "forward":
            w = args[1]
            self.forward_flops += 2 * out.numel() * w.shape[1] * w.shape[2] * w.shape[3]
        # autocast's low-precision copy of a parameter counts as weights (it lives from the forward
        # pass, where autocast caches it, until backward has used it)
        if func is torch.ops.aten._to_copy.default and isinstance(args[0], torch.Tensor) \
                and args[0].untyped_storage() in self._param_storages:
            tag = "weights"
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._record(t.untyped_storage(), tag)
        return out

    def trace(self) -> Trace:
        """A snapshot: storages freed after this call count as alive to the end."""
        records = [StorageRecord(r.nbytes, r.phase, r.alloc, r.free, r.tag) for r in self.records]
        return Trace(records, self.events, list(self.phase_starts))
