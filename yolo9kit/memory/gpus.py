"""GPU specifications the estimator and the planner need: memory, bf16 support, rough speed.

``total_bytes`` is the memory CUDA reports (``torch.cuda.get_device_properties(i).total_memory``,
the nvidia-smi total in MiB x 2**20), not the marketing GB. ``tflops_fp16`` is the dense fp16 tensor
rate with fp32 accumulation from the vendor data sheets (rough: YOLO training reaches a few percent of
it, see the throughput model in ``plan``); ``bandwidth_gbs`` the memory bandwidth in GB/s.
``context_bytes``: the CUDA context, cuDNN and cuBLAS handles, which nvidia-smi counts but PyTorch's
counters do not; about 0.5 GiB with CUDA 12 lazy module loading (an assumption; a measured
calibration replaces it).
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
# The card a memory estimate or a plan is for when none is named and this machine has no CUDA device: the
# common 24 GB single card of the people this kit is for.
DEFAULT_GPU = "RTX 4090"


@dataclass(frozen=True)
class GPUSpec:
    name: str
    total_bytes: int
    bf16: bool
    tflops_fp16: float
    bandwidth_gbs: float
    context_bytes: int = 512 * MIB
    device_type: str = "cuda"  # "cpu" for the host memory a CPU run is sized against (``host_memory``)


def _gpu(name: str, mib: int, bf16: bool, tflops: float, bw: float) -> GPUSpec:
    return GPUSpec(name, mib * MIB, bf16, tflops, bw)


GPUS: dict[str, GPUSpec] = {g.name: g for g in [
    _gpu("T4", 15_360, False, 65.0, 320.0),
    _gpu("V100-16GB", 16_160, False, 125.0, 900.0),
    _gpu("V100-32GB", 32_510, False, 125.0, 900.0),
    _gpu("RTX 3060", 12_288, True, 25.0, 360.0),
    _gpu("RTX 3090", 24_576, True, 71.0, 936.0),
    _gpu("RTX 4070", 12_282, True, 58.0, 504.0),
    _gpu("RTX 4080", 16_376, True, 97.0, 717.0),
    _gpu("RTX 4090", 24_564, True, 165.0, 1008.0),
    _gpu("RTX 5090", 32_607, True, 210.0, 1792.0),
    _gpu("RTX A6000", 49_140, True, 155.0, 768.0),
    _gpu("A10", 23_028, True, 125.0, 600.0),
    _gpu("L4", 23_034, True, 121.0, 300.0),
    _gpu("L40S", 46_068, True, 362.0, 864.0),
    _gpu("A100-40GB", 40_960, True, 312.0, 1555.0),
    _gpu("A100-80GB", 81_920, True, 312.0, 2039.0),
    _gpu("H100", 81_559, True, 989.0, 3350.0),
    _gpu("H200", 143_771, True, 989.0, 4800.0),
]}

_ALIASES = {"4090": "RTX 4090", "3090": "RTX 3090", "A100": "A100-80GB", "A100-40G": "A100-40GB",
            "A100-80G": "A100-80GB", "H100-80GB": "H100", "H100 SXM": "H100", "V100": "V100-16GB",
            "TESLA T4": "T4", "NVIDIA H200": "H200", "NVIDIA H100 80GB HBM3": "H100"}


def resolve_gpu(gpu: str | int | GPUSpec | None) -> GPUSpec | None:
    """A GPU name (case and spaces ignored, e.g. "rtx4090"), a capacity in bytes, a GPUSpec, or None.

    A capacity in bytes gives an unnamed GPU with that memory, bf16 assumed, A100-like speed.
    """
    if gpu is None or isinstance(gpu, GPUSpec):
        return gpu
    if isinstance(gpu, int):
        if gpu <= 0:
            raise ValueError(f"gpu={gpu}: a capacity must be a positive number of bytes")
        return GPUSpec(f"{gpu / (1 << 30):.1f} GiB GPU", gpu, True, 312.0, 1555.0)
    key = str(gpu).strip()
    norm = key.upper().replace(" ", "").replace("NVIDIA", "").replace("GEFORCE", "").replace("TESLA", "")
    for name in [*GPUS, *_ALIASES]:
        cand = name.upper().replace(" ", "").replace("NVIDIA", "").replace("GEFORCE", "").replace("TESLA", "")
        if cand == norm:
            return GPUS[_ALIASES.get(name, name)]
    raise ValueError(f"unknown GPU {gpu!r}: use one of {', '.join(GPUS)} or a capacity in bytes "
                     "(e.g. gpu=24 * 2**30)")


def gpu_from_device(index: int | None = None) -> GPUSpec:
    """The spec of local CUDA device ``index`` (None: the current one): table values when the name is known,
    its real capacity and its bf16 (``yolo9kit.env.native_bf16``, what ``StepConfig.resolve`` asks) always."""
    import torch

    from yolo9kit.env import native_bf16

    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    try:
        known = resolve_gpu(props.name)
    except ValueError:
        known = None
    bf16 = native_bf16(index)
    if known is None:
        return GPUSpec(props.name, props.total_memory, bf16, 312.0, 1555.0)
    return GPUSpec(known.name, props.total_memory, bf16, known.tflops_fp16, known.bandwidth_gbs,
                   known.context_bytes)


def target_gpu(gpu: str | int | GPUSpec | None) -> GPUSpec:
    """The card a memory figure is for: ``gpu`` resolved, or when None this machine's CUDA device, else
    ``DEFAULT_GPU``. The one meaning of ``gpu=None`` across the memory tools and the widgets."""
    if gpu is not None:
        return resolve_gpu(gpu)
    import torch

    return gpu_from_device() if torch.cuda.is_available() else resolve_gpu(DEFAULT_GPU)


def host_memory() -> GPUSpec:
    """The memory this process may use now, as the capacity a CPU training step must fit in: the smallest of
    the RAM available, its rlimits (``ulimit -v``, ``prlimit``) and its cgroup's limit (a container), each less
    what is already used (``yolo9kit.env.memory_limits``). The spec's name says which one bounds it."""
    from yolo9kit.env import memory_limits

    limits = memory_limits()
    if not limits:
        raise RuntimeError("cannot tell how much memory this process may use (no /proc/meminfo, no limits): "
                           "give TrainConfig(batch_size=...) explicitly")
    source = min(limits, key=limits.get)
    name = "CPU RAM" if source == "RAM" else f"CPU RAM ({source} limit)"
    from yolo9kit.cpu import native_cpu_bf16

    return GPUSpec(name, limits[source], native_cpu_bf16(), 1.0, 50.0, context_bytes=0, device_type="cpu")
