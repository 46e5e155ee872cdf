"""The cards a step is sized for: the GPU table, measured calibrations, a model of PyTorch's CUDA caching
allocator and a throughput model (their figures and assumptions: docs/memory.md)."""

from __future__ import annotations

import bisect
import json
import logging
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import torch

from yolo9kit.env import memory_limits, native_bf16, native_cpu_bf16

LOGGER = logging.getLogger(__name__)
MIB = 1 << 20
DEFAULT_GPU = "RTX 4090"  # the card of a figure when none is named and this machine has no CUDA device
FORMAT = "yolo9kit-memory-calibration"


@dataclass(frozen=True)
class GPUSpec:
    name: str
    total_bytes: int  # what CUDA reports (nvidia-smi's MiB x 2**20), not the marketing GB
    bf16: bool
    tflops_fp16: float  # dense fp16 tensor rate, fp32 accumulation (data sheet)
    bandwidth_gbs: float
    context_bytes: int = 512 * MIB  # CUDA context and library handles, outside PyTorch's counters (assumed)
    device_type: str = "cuda"  # "cpu" for the host memory a CPU run is sized against (``host_memory``)


# name, nvidia-smi MiB, bf16, fp16 TFLOPs, GB/s
GPUS: dict[str, GPUSpec] = {name: GPUSpec(name, mib * MIB, bf16, tflops, gbs) for name, mib, bf16, tflops, gbs in [
    ("T4", 15_360, False, 65.0, 320.0),
    ("GTX 1660 Ti", 6_144, False, 10.9, 288.0),  # no tensor cores; fp16 gives NaN losses: trains in fp32
    ("V100-16GB", 16_160, False, 125.0, 900.0),
    ("V100-32GB", 32_510, False, 125.0, 900.0),
    ("RTX 3060", 12_288, True, 25.0, 360.0),
    ("RTX 3090", 24_576, True, 71.0, 936.0),
    ("RTX 4070", 12_282, True, 58.0, 504.0),
    ("RTX 4080", 16_376, True, 97.0, 717.0),
    ("RTX 4090", 24_564, True, 165.0, 1008.0),
    ("RTX 5090", 32_607, True, 210.0, 1792.0),
    ("RTX A6000", 49_140, True, 155.0, 768.0),
    ("A10", 23_028, True, 125.0, 600.0),
    ("L4", 23_034, True, 121.0, 300.0),
    ("L40S", 46_068, True, 362.0, 864.0),
    ("A100-40GB", 40_960, True, 312.0, 1555.0),
    ("A100-80GB", 81_920, True, 312.0, 2039.0),
    ("H100", 81_559, True, 989.0, 3350.0),
    ("H200", 143_771, True, 989.0, 4800.0),
]}
_ALIASES = {"4090": "RTX 4090", "3090": "RTX 3090", "A100": "A100-80GB", "A100-40G": "A100-40GB",
            "A100-80G": "A100-80GB", "H100-80GB": "H100", "H100 SXM": "H100", "V100": "V100-16GB",
            "NVIDIA H100 80GB HBM3": "H100"}


def _known(name: str) -> GPUSpec | None:
    def norm(text: str) -> str:  # case, spaces and vendor words ignored
        return text.upper().replace(" ", "").replace("NVIDIA", "").replace("GEFORCE", "").replace("TESLA", "")

    return next((GPUS[_ALIASES.get(n, n)] for n in [*GPUS, *_ALIASES] if norm(n) == norm(name.strip())), None)


def resolve_gpu(gpu: str | int | GPUSpec | None) -> GPUSpec | None:
    """A GPU name (e.g. "rtx4090"), a capacity in bytes (bf16, A100-like speed), a GPUSpec, or None, as a GPUSpec
    (or None); a ValueError for an unknown name or a capacity <= 0."""
    if gpu is None or isinstance(gpu, GPUSpec):
        return gpu
    if isinstance(gpu, int) and gpu <= 0:
        raise ValueError(f"gpu={gpu}: a capacity must be a positive number of bytes")
    if isinstance(gpu, int):
        return GPUSpec(f"{gpu / (1 << 30):.1f} GiB GPU", gpu, True, 312.0, 1555.0)
    if (spec := _known(str(gpu))) is None:
        raise ValueError(f"unknown GPU {gpu!r}: use one of {', '.join(GPUS)} or a capacity in bytes "
                         "(e.g. gpu=24 * 2**30)")
    return spec


def target_gpu(gpu: str | int | GPUSpec | None, device: torch.device | None = None) -> GPUSpec:
    """The card a figure is for: ``gpu`` resolved; when None, ``device``'s card (its capacity and bf16, the table's
    speeds) or the RAM a CPU may use, or without a device this machine's CUDA card, else ``DEFAULT_GPU``."""
    if gpu is not None:
        return resolve_gpu(gpu)
    if device is not None and device.type != "cuda":
        return host_memory()
    if device is None and not torch.cuda.is_available():
        return resolve_gpu(DEFAULT_GPU)
    index = torch.cuda.current_device() if device is None or device.index is None else device.index
    props = torch.cuda.get_device_properties(index)
    known = _known(props.name) or GPUSpec(props.name, 0, True, 312.0, 1555.0)
    return replace(known, total_bytes=props.total_memory, bf16=native_bf16(index))


def host_memory() -> GPUSpec:
    """The memory this process may use now (the least of ``env.memory_limits``), as a CPU step's capacity; a
    RuntimeError when no limit can be read."""
    limits = memory_limits()
    if not limits:
        raise RuntimeError("cannot tell how much memory this process may use (no /proc/meminfo, no limits): "
                           "give TrainConfig(batch_size=...) explicitly")
    source = min(limits, key=limits.get)
    name = "CPU RAM" if source == "RAM" else f"CPU RAM ({source} limit)"
    return GPUSpec(name, limits[source], native_cpu_bf16(), 1.0, 50.0, context_bytes=0, device_type="cpu")


def read_calibration(path) -> dict:
    """One calibration JSON file (a path or a packaged resource), checked: a ValueError naming it otherwise."""
    path = Path(path) if isinstance(path, str) else path
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a memory calibration file (expected \"format\": \"{FORMAT}\")")
    if data.get("kind") not in ("measured", "reference") or not isinstance(data.get("gpu"), str):
        raise ValueError(f"{path}: needs \"kind\" (\"measured\" or \"reference\") and \"gpu\" (a GPU name)")
    return data


def _read_folder(folder) -> tuple[dict, ...]:
    found, entries = [], [e for e in folder.iterdir() if e.name.endswith(".json")] if folder.is_dir() else []
    for entry in sorted(entries, key=lambda e: e.name):
        try:
            found.append(read_calibration(entry))
        except (OSError, ValueError) as e:
            LOGGER.warning("skipping calibration file %s: %s", entry.name, e)
    return tuple(found)


def packaged_calibrations() -> tuple[dict, ...]:
    """The calibration files shipped in ``yolo9kit/memory_calibration/`` (a bad one is skipped, with a warning)."""
    return _read_folder(resources.files("yolo9kit") / "memory_calibration")


def user_calibration_dir() -> Path:
    """Where this machine's own measurements are kept (``checks(gpu=True)`` writes them)."""
    return Path.home() / ".cache" / "yolo9kit" / "memory_calibration"


def calibration_for(gpu_name: str, amp: str, calibrations: tuple[dict, ...] | None = None) -> dict | None:
    """The measured calibration of ``gpu_name`` for ``amp``, or None: by default this machine's own (read on each
    call: a check may just have written one), then the shipped ones."""
    if calibrations is None:
        calibrations = (*_read_folder(user_calibration_dir()), *packaged_calibrations())
    for cal in calibrations:
        if cal["kind"] == "measured" and not cal.get("smoke") and cal["gpu"] == gpu_name and amp in cal.get("fits", {}):
            return {**cal["fits"][amp], "context_bytes": cal.get("context_bytes"), "throughput": cal.get("throughput")}
    return None


# the CUDA caching allocator: c10's constants, default settings
MIN_BLOCK = 512  # every request rounded up to a multiple of this (kMinBlockSize)
SMALL_SIZE = 1 << 20  # up to this: the small pool (kSmallSize) ...
SMALL_BUFFER = 2 << 20  # ... carved out of 2 MiB segments (kSmallBuffer)
LARGE_BUFFER = 20 << 20  # a large request under kMinLargeAlloc gets a 20 MiB segment (kLargeBuffer) ...
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20  # ... a larger one its size rounded up to 2 MiB (kRoundLarge)


def round_size(nbytes: int) -> int:
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(nbytes: int) -> int:
    """Size of the segment the allocator asks the driver for when no cached block fits."""
    return SMALL_BUFFER if nbytes <= SMALL_SIZE else LARGE_BUFFER if nbytes < MIN_LARGE_ALLOC \
        else -(-nbytes // ROUND_LARGE) * ROUND_LARGE


class CachingAllocatorModel:
    """Replay allocations and frees (best fit in the request's pool, split, merge with free neighbours, no
    segment ever released); ``reserved`` and ``peak_reserved`` in bytes. One stream, no expandable segments."""

    def __init__(self) -> None:
        self.pools: dict[bool, list] = {True: [], False: []}  # small pool? -> sorted [(size, segment, offset)]
        self.blocks: dict[tuple[int, int], list] = {}  # (segment, offset) -> [size, is_free]
        self.offsets: list[list[int]] = []  # per segment: sorted block offsets
        self.live: dict[int, tuple[int, int, bool]] = {}  # allocation key -> (segment, offset, small pool?)
        self.reserved = self.peak_reserved = self.allocated = self.peak_allocated = 0

    def malloc(self, key: int, nbytes: int) -> None:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i < len(pool):
            bsize, seg, off = pool.pop(i)
        else:
            bsize, seg, off = segment_size(size), len(self.offsets), 0
            self.offsets.append([0])
            self.reserved += bsize
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rest = bsize - size
        if (small and rest >= MIN_BLOCK) or (not small and rest > SMALL_SIZE):  # split
            self.blocks[seg, off + size] = [rest, True]
            bisect.insort(self.offsets[seg], off + size)
            bisect.insort(pool, (rest, seg, off + size))
        else:
            size = bsize
        self.blocks[seg, off] = [size, False]
        self.live[key] = (seg, off, small)
        self.allocated += size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: int) -> None:
        seg, off, small = self.live.pop(key)
        offsets, pool = self.offsets[seg], self.pools[small]
        size = self.blocks[seg, off][0]
        self.allocated -= size
        j = bisect.bisect_left(offsets, off)
        if j + 1 < len(offsets) and self.blocks[seg, offsets[j + 1]][1]:  # merge with the next block
            nxt = offsets.pop(j + 1)
            pool.remove((self.blocks[seg, nxt][0], seg, nxt))
            size += self.blocks.pop((seg, nxt))[0]
        if j > 0 and self.blocks[seg, offsets[j - 1]][1]:  # merge with the previous block
            prv = offsets[j - 1]
            pool.remove((self.blocks[seg, prv][0], seg, prv))
            size += self.blocks[seg, prv][0]
            del self.blocks[seg, off]
            offsets.pop(j)
            off = prv
        self.blocks[seg, off] = [size, True]
        bisect.insort(pool, (size, seg, off))


_REF_BANDWIDTH_GBS, _REF_TFLOPS = 4800.0, 989.0  # the H200 the constants were fitted on (docs/memory.md)


@dataclass(frozen=True)
class ThroughputModel:
    """``step_s = accumulate * (micro_overhead_s + batch_size * per_image) + optimizer_overhead_s``."""

    base_s: float = 1.58e-3  # per image, memory-bound part, scaled by bandwidth
    s_per_gflop: float = 9.5e-6  # per training GFLOP, scaled by fp16 TFLOPs
    micro_overhead_s: float = 0.20
    optimizer_overhead_s: float = 0.056
    fp32_factor: float = 2.0

    def step_s(self, gpu: GPUSpec, batch_size: int, accumulate: int, train_gflops_per_image: float, amp: str) -> float:
        per_image = self.base_s * _REF_BANDWIDTH_GBS / gpu.bandwidth_gbs \
            + self.s_per_gflop * train_gflops_per_image * _REF_TFLOPS / gpu.tflops_fp16
        per_image *= self.fp32_factor if amp == "off" else 1.0
        return accumulate * (self.micro_overhead_s + batch_size * per_image) + self.optimizer_overhead_s
