"""Fake CUDA for the CPU tests: tensors that say ``cuda:N`` and hold real values on the CPU, simulated cards.

The kit's CUDA paths (the fast training step, AMP, the EMA, predict's FP16 path, the colour jitter on the
device) are written for a GPU that the test machines do not have. This harness runs them anyway:

- ``fake_cuda(card)`` enters a dispatch mode (a ``FakeTensorMode`` subclass, for the device-initialisation
  bypass that mode brings) in which every tensor made on or moved to ``cuda`` is a :class:`CudaTensor`: a
  wrapper that reports ``device == cuda:N`` and keeps a real CPU tensor inside. Every operation runs for real
  on those CPU tensors, so the step computes the values it would on a card, and the mode checks what a GPU
  would refuse or pay for:

  * an operation that mixes a CUDA tensor with a CPU tensor of more than 0 dimensions raises
    :class:`DeviceMismatchError` (CUDA kernels take 0-dim CPU scalars, and indexing takes CPU indices, as a
    GPU does);
  * every host read of a CUDA value is a host-device synchronisation and is recorded in ``fake.syncs`` with
    the kit's source line: ``.item()``, ``bool()``, ``.tolist()``, ``.cpu()`` / copies to the host,
    ``torch.equal``, ``nonzero``, boolean-mask indexing and the other ops PyTorch tags as data-dependent,
    and ``torch.cuda.synchronize()``.

- ``simulated_cards(...)`` patches what ``torch.cuda`` says about the machine (count, names, memory,
  compute capability, bf16, memory statistics) for the tests of decisions that depend on the card.

Stand-ins, where a GPU cannot be faked on a CPU (each stated so a test can be read against it):

- ``loss.backward()`` on a CUDA tensor cannot run (the autograd engine wants a CUDA context, pytorch issue
  92627). The stand-in walks the recorded graph to the parameters the backward would reach and adds
  ``grad_value`` (0 by default; NaN to plant a non-finite step) in each parameter's own shape and layout:
  the gradients arrive where and how a backward leaves them, not with its values.
- ``torch.autocast("cuda")`` and ``GradScaler("cuda")`` switch themselves off without CUDA; their gate
  (``amp_definitely_not_available``) is patched. Autocast's weight cache is off inside the harness (it
  makes autograd nodes that need a CUDA stream); the casts are the same.
- ``pin_memory()`` makes a copy that ``is_pinned()`` then answers True for.
- ``cudnn_batch_norm`` (what batch norm picks for a CUDA tensor) runs as the native batch norm.

What this cannot check: kernels, their speed and their numerics on a card, cuDNN's support per card, NCCL,
streams and the memory a card really uses (docs/gpu.md).
"""

from __future__ import annotations

import contextlib
import traceback
import unittest.mock as mock
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

aten = torch.ops.aten
MIB = 1 << 20


class DeviceMismatchError(AssertionError):
    """An operation mixed a CUDA tensor with a CPU tensor, as a GPU would refuse to."""


@dataclass(frozen=True)
class Card:
    """What ``torch.cuda.get_device_properties`` says about a card (the fields the kit reads)."""

    name: str
    total_memory: int
    major: int
    minor: int
    multi_processor_count: int = 80

    @property
    def capability(self) -> tuple[int, int]:
        return self.major, self.minor


# The cards the tests simulate: below 8.0 (no bf16 tensor cores), Ampere, Ada, Hopper. Names as CUDA reports
# them, memory in the MiB that nvidia-smi prints.
CARDS = {
    "T4": Card("Tesla T4", 15_360 * MIB, 7, 5, 40),
    "GTX 1660 Ti": Card("NVIDIA GeForce GTX 1660 Ti", 6_144 * MIB, 7, 5, 24),  # fp16 gives NaN losses on it
    "V100": Card("Tesla V100-SXM2-16GB", 16_160 * MIB, 7, 0, 80),
    "A100": Card("NVIDIA A100-SXM4-80GB", 81_920 * MIB, 8, 0, 108),
    "RTX 4090": Card("NVIDIA GeForce RTX 4090", 24_564 * MIB, 8, 9, 128),
    "H100": Card("NVIDIA H100 80GB HBM3", 81_559 * MIB, 9, 0, 132),
    "H200": Card("NVIDIA H200", 143_771 * MIB, 9, 0, 132),
}


@dataclass
class Sync:
    """One host-device synchronisation: the op and the innermost line of the kit that asked for it."""

    op: str
    where: str

    def __str__(self) -> str:
        return f"{self.op} at {self.where}"


@dataclass
class MemoryStats:
    """What the patched ``torch.cuda`` memory counters answer (bytes). Under ``fake_cuda`` they follow the
    fake CUDA tensors: ``allocated`` is the bytes of the live storages, ``peak_allocated`` its maximum since
    ``reset_peak_memory_stats``; reserved is taken as allocated (no caching allocator here). A test of
    ``simulated_cards`` alone may set them."""

    allocated: int = 0
    peak_allocated: int = 0
    reserved: int = 0
    peak_reserved: int = 0
    other_processes: int = 512 * MIB  # what mem_get_info sees used beyond this process (the CUDA context)

    def add(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.reserved = self.allocated
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def reset_peak(self) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved


class CudaTensor(torch.Tensor):
    """A tensor that reports a CUDA device and keeps its values in ``inner``, a real CPU tensor."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor, device: torch.device):
        out = torch.Tensor._make_wrapper_subclass(
            cls, inner.size(), strides=inner.stride(), storage_offset=inner.storage_offset(), dtype=inner.dtype,
            layout=inner.layout, device=device, requires_grad=inner.requires_grad)
        out.inner = inner
        return out

    def __repr__(self, *, tensor_contents=None) -> str:  # no host read just to print it
        return f"CudaTensor(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return NotImplemented  # only the mode handles them: outside fake_cuda() they are unusable, as on a CPU

    def __reduce_ex__(self, protocol):  # torch.save: stored as the CPU tensor of its values (loads anywhere)
        return self.inner.__reduce_ex__(protocol)

    def numpy(self, *, force: bool = False):  # what torch says of a CUDA tensor
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy the "
                        "tensor to host memory first.")

    def tolist(self):  # C++ refuses tolist for subclasses; on a card it is a read-back
        _active_mode().record_sync("tolist")
        return self.inner.tolist()


def _active_mode() -> FakeCuda:
    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, FakeCuda):
            return mode
    raise RuntimeError("a fake CUDA tensor was used outside fake_cuda()")


# Ops that take CPU tensors beside CUDA ones on a real GPU: copies between devices, and indices.
_MIXED_DEVICE_OPS = {aten.copy_.default, aten._to_copy.default, aten.index.Tensor, aten.index_put_.default,
                     aten.index_put.default, aten._index_put_impl_.default, aten._foreach_copy_.default}
_INDEX_OPS = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}
# Host reads PyTorch does not tag as data-dependent.
_READ_BACK_OPS = {aten.equal.default, aten.is_nonzero.default}


class FakeCuda(FakeTensorMode):
    """The dispatch mode of :func:`fake_cuda`: runs every op on the CPU values, checks devices, records syncs."""

    def __init__(self, grad_value: float = 0.0) -> None:
        super().__init__(allow_non_fake_inputs=True)
        self.syncs: list[Sync] = []
        self.grad_value = grad_value
        self.backward_calls = 0
        self.memory = MemoryStats()
        self.sync_debug_mode = 0  # torch.cuda.set_sync_debug_mode: 1 warns at each sync, 2 raises
        self._pinned = WeakIdKeyDictionary()
        self._storages: dict[int, list[int]] = {}  # data_ptr -> [wrappers alive, bytes]

    # ---- what a test reads ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def counting(self) -> Iterator[list[Sync]]:
        """The syncs of the block only: ``with fake.counting() as syncs: ...; assert not syncs``."""
        start = len(self.syncs)
        found: list[Sync] = []
        try:
            yield found
        finally:
            found.extend(self.syncs[start:])

    def record_sync(self, op: str) -> None:
        self.syncs.append(Sync(op, _kit_frame()))
        if self.sync_debug_mode == 1:  # what torch warns on a card in this mode
            warnings.warn(f"called a synchronizing CUDA operation ({op})", UserWarning, stacklevel=3)
        elif self.sync_debug_mode == 2:
            raise RuntimeError(f"called a synchronizing CUDA operation ({op})")

    def _track(self, tensor: CudaTensor) -> CudaTensor:
        """Count the bytes of the storage behind a new fake CUDA tensor while a tensor on it is alive."""
        inner = tensor.inner
        ptr, nbytes = inner.untyped_storage().data_ptr(), inner.untyped_storage().nbytes()
        entry = self._storages.setdefault(ptr, [0, nbytes])
        if entry[0] == 0:
            self.memory.add(nbytes)
        entry[0] += 1
        weakref.finalize(inner, self._release, ptr)  # not on the wrapper: Module.to swaps wrappers
        return tensor

    def _release(self, ptr: int) -> None:
        entry = self._storages.get(ptr)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.memory.add(-entry[1])
            del self._storages[ptr]

    # ---- the dispatch -----------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.is_pinned.default:
            return args[0] in self._pinned
        if func is aten._pin_memory.default:
            pinned = args[0].clone()
            self._pinned[pinned] = True
            return pinned
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        cuda_inputs = [t for t in tensors if isinstance(t, CudaTensor)]
        target = kwargs.get("device")
        target = torch.device(target) if target is not None else None
        if cuda_inputs:
            self._check_devices(func, tensors)
            self._check_sync(func, args, tensors, target)
        elif target is not None and target.type == "cuda" and target.index is None:
            # what a real card resolves to the current device; here, as there, the kit should say which one
            target = torch.device("cuda", torch.cuda.current_device())
        out = self._run(func, args, kwargs)
        device = self._output_device(func, args, cuda_inputs, target)
        inputs = {id(t.inner if isinstance(t, CudaTensor) else t): t for t in tensors}

        def wrap(x):
            if not isinstance(x, torch.Tensor):
                return x
            if id(x) in inputs:  # an in-place op returns its argument: keep the caller's object
                return inputs[id(x)]
            return self._track(CudaTensor(x, device)) if device is not None else x

        return tree_map(wrap, out)

    def _check_devices(self, func, tensors: list[torch.Tensor]) -> None:
        if func in _MIXED_DEVICE_OPS:
            return
        cpu = [t for t in tensors if not isinstance(t, CudaTensor) and t.dim() > 0]
        devices = {t.device for t in tensors if isinstance(t, CudaTensor)}
        if cpu:
            raise DeviceMismatchError(f"{func} mixes a CUDA tensor with a CPU tensor of shape {tuple(cpu[0].shape)} "
                                      f"at {_kit_frame()}")
        if len(devices) > 1:
            raise DeviceMismatchError(f"{func} mixes tensors on {sorted(map(str, devices))} at {_kit_frame()}")

    def _check_sync(self, func, args, tensors, target) -> None:
        tags = func.tags
        if func in _INDEX_OPS:  # only a boolean mask on the card makes the host wait (for its count)
            indices = args[1] if len(args) > 1 else []
            if any(isinstance(i, CudaTensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or []):
                self.record_sync(str(func))
        elif torch.Tag.data_dependent_output in tags or torch.Tag.dynamic_output_shape in tags \
                or func in _READ_BACK_OPS:
            self.record_sync(str(func))
        elif func is aten._to_copy.default and target is not None and target.type == "cpu":
            self.record_sync(f"{func} to the host")
        elif func is aten.copy_.default and not isinstance(args[0], CudaTensor) and isinstance(args[1], CudaTensor):
            self.record_sync(f"{func} to the host")

    def _run(self, func, args, kwargs):
        def inner(x):
            return x.inner if isinstance(x, CudaTensor) else x

        args, kwargs = tree_map(inner, args), tree_map(inner, dict(kwargs))
        if "device" in kwargs and kwargs["device"] is not None:
            kwargs["device"] = torch.device("cpu")
        kwargs.pop("pin_memory", None)
        if func is aten.cudnn_batch_norm.default:  # the native kernel, and cuDNN's (empty) reserve buffer
            return (*aten.native_batch_norm.default(*args[:8]), torch.empty(0, dtype=torch.uint8))
        return func(*args, **kwargs)

    @staticmethod
    def _output_device(func, args, cuda_inputs, target) -> torch.device | None:
        """The device of the op's outputs: the target of a copy or factory, else that of its CUDA inputs."""
        if func is aten.copy_.default:
            return args[0].device if isinstance(args[0], CudaTensor) else None
        if target is not None:
            return target if target.type == "cuda" else None
        return cuda_inputs[0].device if cuda_inputs else None


def _kit_frame() -> str:
    """``path:line function`` of the innermost frame of the kit or of a test that led here."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        for root in ("/yolo9kit/", "/tests/"):
            if root in frame.filename and frame.filename != __file__:
                return f"{root.strip('/') + '/' if root == '/tests/' else ''}" \
                       f"{frame.filename.rsplit(root, 1)[-1]}:{frame.lineno} {frame.name}"
    return "?"


def _stand_in_backward(mode: FakeCuda):
    real_backward = torch.Tensor.backward

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        if not isinstance(self, CudaTensor):
            return real_backward(self, gradient, retain_graph, create_graph, inputs)
        mode.backward_calls += 1
        leaves, seen, todo = [], set(), [self.grad_fn]
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if hasattr(node, "variable"):  # AccumulateGrad: a leaf that requires grad
                leaves.append(node.variable)
            todo.extend(next_node for next_node, _ in node.next_functions)
        with torch.no_grad():
            for p in leaves:
                grad = torch.full_like(p, mode.grad_value)  # the parameter's own layout, as autograd leaves it
                p.grad = grad if p.grad is None else p.grad.add_(grad)

    return backward


@contextlib.contextmanager
def simulated_cards(*names: str, current: int = 0, memory: MemoryStats | None = None,
                    sync: FakeCuda | None = None) -> Iterator[list[Card]]:
    """``torch.cuda`` answering for the cards ``names`` (keys of :data:`CARDS`), device ``current`` current.

    No tensor is faked here: for code that only asks about the machine. ``memory`` is what the memory
    counters answer (one set for all cards).
    """
    cards = [CARDS[n] for n in (names or ("H200",))]
    memory = memory or MemoryStats()
    state = {"current": current}

    def index(device=None) -> int:
        if device is None:
            return state["current"]
        if isinstance(device, int):
            return device
        device = torch.device(device) if isinstance(device, str) else device
        return state["current"] if device.index is None else device.index

    def card(device=None) -> Card:
        i = index(device)
        if not 0 <= i < len(cards):
            raise RuntimeError(f"Invalid device id {i} (the simulated machine has {len(cards)} GPUs)")
        return cards[i]

    def set_device(device) -> None:
        state["current"] = index(device)

    def bf16(including_emulation: bool = True) -> bool:
        # torch's rule: capability 8.0 or more, else (with emulation) whether a bf16 tensor can be made: yes
        return card().major >= 8 or including_emulation

    def synchronize(device=None) -> None:
        if sync is not None:
            sync.record_sync("torch.cuda.synchronize")

    rng = {i: torch.zeros(16, dtype=torch.uint8) + i for i in range(len(cards))}

    def get_rng_state(device="cuda"):
        card(device)
        return rng[index(device)].clone()

    def set_rng_state(new_state, device="cuda"):
        card(device)
        rng[index(device)] = new_state.clone()

    def set_rng_state_all(states):
        if len(states) > len(cards):
            # what torch does: it sets each state on device i, and a device that does not exist is an error
            card(len(cards))
        for i, s in enumerate(states):
            rng[i] = s.clone()

    def set_sync_debug_mode(debug_mode) -> None:
        if sync is not None:
            sync.sync_debug_mode = {"default": 0, "warn": 1, "error": 2}.get(debug_mode, debug_mode)

    patches = {
        "set_sync_debug_mode": set_sync_debug_mode,
        "get_sync_debug_mode": lambda: sync.sync_debug_mode if sync is not None else 0,
        "is_available": lambda: True,
        "device_count": lambda: len(cards),
        "current_device": lambda: state["current"],
        "set_device": set_device,
        "get_device_properties": card,
        "get_device_capability": lambda device=None: card(device).capability,
        "get_device_name": lambda device=None: card(device).name,
        "is_bf16_supported": bf16,
        "is_initialized": lambda: True,
        "synchronize": synchronize,
        "get_rng_state": get_rng_state,
        "set_rng_state": set_rng_state,
        "get_rng_state_all": lambda: [rng[i].clone() for i in range(len(cards))],
        "set_rng_state_all": set_rng_state_all,
        "manual_seed": lambda seed: None,
        "manual_seed_all": lambda seed: None,
        "memory_allocated": lambda device=None: memory.allocated,
        "max_memory_allocated": lambda device=None: memory.peak_allocated,
        "memory_reserved": lambda device=None: memory.reserved,
        "max_memory_reserved": lambda device=None: memory.peak_reserved,
        "reset_peak_memory_stats": lambda device=None: memory.reset_peak(),
        "empty_cache": lambda: None,
        "mem_get_info": lambda device=None: (
            card(device).total_memory - memory.reserved - memory.other_processes, card(device).total_memory),
    }
    with contextlib.ExitStack() as stack:
        for name, value in patches.items():
            stack.enter_context(mock.patch(f"torch.cuda.{name}", value))
        stack.enter_context(mock.patch("torch.cuda.amp.common.amp_definitely_not_available", lambda: False))
        yield cards


@contextlib.contextmanager
def fake_cuda(card: str = "H200", *cards: str, grad_value: float = 0.0) -> Iterator[FakeCuda]:
    """Fake CUDA tensors on simulated ``card`` (and further ``cards`` for a multi-GPU machine)."""
    mode = FakeCuda(grad_value)
    # CUDA device guards become no-ops (what FakeTensorMode does where CUDA is unavailable); it must be done
    # before torch.cuda.is_available is patched, and lasts for the process (no real CUDA tensor exists here).
    torch._C._ensureCUDADeviceGuardSet()
    swap = torch.__future__.get_swap_module_params_on_conversion()
    cache = torch.is_autocast_cache_enabled()
    lift = torch._C._only_lift_cpu_tensors()
    with contextlib.ExitStack() as stack:
        stack.enter_context(simulated_cards(card, *cards, memory=mode.memory, sync=mode))
        stack.enter_context(mock.patch("torch.Tensor.backward", _stand_in_backward(mode)))
        # Module.to(...) swaps a parameter for its CUDA wrapper (a plain `.data =` cannot change its type)
        torch.__future__.set_swap_module_params_on_conversion(True)
        torch.set_autocast_cache_enabled(False)
        # torch.tensor(data, device="cuda") builds on the CPU and then copies (through the mode), as
        # FakeTensorMode arranges where CUDA is unavailable
        torch._C._set_only_lift_cpu_tensors(True)
        try:
            with mode:
                yield mode
        finally:
            torch.__future__.set_swap_module_params_on_conversion(swap)
            torch.set_autocast_cache_enabled(cache)
            torch._C._set_only_lift_cpu_tensors(lift)


def to_host(value):
    """A fake CUDA tensor's values as a plain CPU tensor (for assertions; never counted as a sync)."""
    if isinstance(value, CudaTensor):
        return value.inner.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(v) for v in value)
    return value


__all__ = ["CARDS", "Card", "CudaTensor", "DeviceMismatchError", "FakeCuda", "MemoryStats", "Sync", "fake_cuda",
           "simulated_cards", "to_host"]
