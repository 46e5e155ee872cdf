"""The machine: ``environment_report`` (what ``checks()`` shows first), the cores a CPU run may use (affinity and
cgroup quota), the memory a process may still take (RAM, rlimits, cgroup) and the torch device a setting names."""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.util
import logging
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

try:
    import resource
except ImportError:  # Windows
    resource = None

# The data files a wheel must carry: (folder inside the package, pattern, what needs them).
PACKAGE_DATA = (("models/cfg", "*.yaml", "the model layer tables (create_model)"),
                ("memory_calibration", "*.json", "the memory calibration (memory.estimate)"),
                ("models", "*.pt", "the shipped shapes model (create_model)"))
COMPETING_CORES = 0.5  # busy cores of other processes (on this process's cores) from which the report warns
PROC, CGROUP = Path("/proc"), Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class EnvReport:
    """Versions and hardware. ``str(report)`` is a short table; ``ok`` says whether training can start."""

    python: str
    platform: str
    yolo9kit: str
    torch: str | None
    torchvision: str | None
    cuda_available: bool
    cuda_version: str | None
    gpus: list[dict] = field(default_factory=list)  # name, total_bytes, capability
    cpu_cores: int = 1
    ram_total_bytes: int | None = None
    ram_available_bytes: int | None = None
    packages: dict[str, str | None] = field(default_factory=dict)
    widgets_extension: str = "unknown"  # "enabled", "disabled", "not installed", "unknown"
    package_data: dict[str, int] = field(default_factory=dict)  # folder -> number of data files found
    location: str = ""  # where the package was imported from (an editable checkout or site-packages)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what slows this machine without stopping it
    cpu_threads: int = 1  # torch's intra-op threads (set_cpu_threads)
    cpu_isa: str = "unknown"  # the vector instructions torch's CPU kernels use (AVX512, AVX2, ...)
    cpu_bf16: bool = False  # native_cpu_bf16: where amp="bf16" may run on the CPU
    gpu_check: Any = None  # a gpu_check.GPUCheck with checks(gpu=True)

    @property
    def ok(self) -> bool:
        return not self.problems and (self.gpu_check is None or self.gpu_check.ok)

    def __str__(self) -> str:
        gib = 1024**3
        lines = [f"yolo9kit {self.yolo9kit}  Python {self.python}  {self.platform}",
                 f"torch {self.torch}  torchvision {self.torchvision}  CUDA {self.cuda_version or '-'}"]
        lines += [f"GPU {i}: {gpu['name']}  {gpu['total_bytes'] / gib:.1f} GiB  sm_{gpu['capability']}"
                  for i, gpu in enumerate(self.gpus)] or [
            "GPU: none (CPU only: memory figures are estimated, training runs on the CPU)"]
        ram, free = (f"{n / gib:.1f} GiB" if n else "unknown" for n in (self.ram_total_bytes, self.ram_available_bytes))
        lines += [f"CPU cores: {self.cpu_cores} (torch threads {self.cpu_threads}), {self.cpu_isa}, bf16 in "
                  f"hardware: {'yes' if self.cpu_bf16 else 'no'}  RAM: {ram} total, {free} available",
                  "packages: " + ", ".join(f"{k} {v or 'missing'}" for k, v in self.packages.items()),
                  f"JupyterLab widget extension: {self.widgets_extension}",
                  f"package data ({self.location}): "
                  + ", ".join(f"{k} {v} file(s)" for k, v in self.package_data.items()),
                  *(f"PROBLEM: {p}" for p in self.problems), *(f"WARNING: {w}" for w in self.warnings)]
        if self.gpu_check is not None:
            lines.append(str(self.gpu_check))
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:  # notebooks show the same table
        return "```\n" + str(self) + "\n```"


def environment_report(verbose: bool = True, widgets: bool = True) -> EnvReport:
    """An ``EnvReport`` (a table in a notebook) of versions, CUDA and GPUs, CPU cores, RAM, package data and the
    JupyterLab widget extension; its ``problems`` list what would stop a walkthrough.

    Args:
        verbose: log the report at INFO level as well as returning it.
        widgets: ask JupyterLab about its widget extension (a subprocess, about a second).
    """
    problems: list[str] = []
    state = _widgets_extension_state() if widgets else "unknown"
    if state in ("disabled", "not installed"):
        problems.append(f"JupyterLab widget extension is {state}: sliders will show as text. Install "
                        "`jupyterlab_widgets` (it is in the `notebooks` extra) and restart JupyterLab")
    root = Path(__file__).resolve().parent
    package_data = {folder: len(list((root / folder).glob(pattern))) for folder, pattern, _ in PACKAGE_DATA}
    problems += [f"no {pattern} files in {root / folder}: {used_by} will fail; reinstall yolo9kit from a wheel or "
                 "checkout that includes its package data" for folder, pattern, used_by in PACKAGE_DATA
                 if not package_data[folder]]
    cuda = torch.cuda.is_available()
    gpus = [{"name": p.name, "total_bytes": int(p.total_memory), "capability": f"{p.major}{p.minor}"}
            for p in map(torch.cuda.get_device_properties, range(torch.cuda.device_count() if cuda else 0))]
    ram = _meminfo(PROC / "meminfo")
    with contextlib.suppress(ValueError, OSError, AttributeError):  # no sysconf on Windows
        ram.setdefault("MemTotal", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    others = competing_cores()
    warnings = [] if others is None or others < COMPETING_CORES else [
        f"other processes keep about {others:.1f} of this process's {usable_cores()} cores busy: training and "
        "timings here run slower while they do (two notebooks training at once share the cores; stop the other "
        "kernel, or wait for it)"]
    report = EnvReport(
        python=platform.python_version(), platform=f"{platform.system()} {platform.machine()}",
        yolo9kit=_version("yolo9kit") or "(not installed)", torch=_version("torch"),
        torchvision=_version("torchvision"), cuda_available=cuda, cuda_version=torch.version.cuda, gpus=gpus,
        cpu_cores=usable_cores(), cpu_threads=set_cpu_threads(), cpu_isa=torch.backends.cpu.get_cpu_capability(),
        cpu_bf16=native_cpu_bf16(), ram_total_bytes=ram.get("MemTotal"),
        ram_available_bytes=ram.get("MemAvailable"),
        packages={name: _version(name) for name in
                  ("numpy", "opencv-python-headless", "pandas", "matplotlib", "jupyterlab", "ipywidgets")},
        widgets_extension=state, package_data=package_data, location=str(root),
        problems=problems, warnings=warnings)
    if verbose:
        logging.getLogger(__name__).info("\n%s", report)
    return report


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def load_extra(group: str, name: str, extra: str = "", package: str | None = None) -> Any:
    """The object that the entry point ``name`` of ``group`` names (pyproject.toml): how the core reaches the extras.

    Raises:
        ValueError: no such entry point, or ``package`` (a third-party package it needs) is not installed; naming
            the pip ``extra`` that installs it.
    """
    found = [point for point in metadata.entry_points(group=group) if point.name == name]
    if not found or (package is not None and importlib.util.find_spec(package) is None):
        need = f"the {package} package" if package else f"the {extra} extra" if extra else "yolo9kit's entry points"
        raise ValueError(f"{name} needs {need}: " + (f"pip install 'yolo9kit[{extra}]'" if extra else
                                                     "pip install -e . in the kit's checkout"))
    return found[0].load()


def _widgets_extension_state() -> str:
    """Ask JupyterLab whether @jupyter-widgets/jupyterlab-manager is installed and enabled."""
    jupyter = shutil.which("jupyter", path=os.path.dirname(sys.executable)) or shutil.which("jupyter")
    if jupyter is None or _version("jupyterlab") is None:  # no JupyterLab: Colab's or another front end draws them
        return "unknown"
    if _version("jupyterlab_widgets") is None:
        return "not installed"
    try:
        out = subprocess.run([jupyter, "labextension", "list"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    for line in (out.stdout + out.stderr).splitlines():
        if "@jupyter-widgets/jupyterlab-manager" in line:
            return "enabled" if "enabled" in line and "disabled" not in line else "disabled"
    return "not installed"


def usable_cores(cgroup: Path | None = None) -> int:
    """The cores this process may use: its CPU affinity capped by the CPU quota (``--cpus``) of ``cgroup`` (a
    folder; default: this process's cgroup), at least 1. ``os.cpu_count()`` and torch ignore the quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    # default: this process's cgroup v2 folder (the ``0::/path`` line), else the cgroup root
    cgroup = cgroup or next((CGROUP / line[2].lstrip("/") for line in _cgroups(PROC) if line[:2] == ["0", ""]), CGROUP)
    quota = None  # in cores: cgroup v2 cpu.max ("200000 100000" -> 2.0), else v1
    try:
        limit, period = (cgroup / "cpu.max").read_text().split()[:2]
        quota = None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        with contextlib.suppress(OSError, ValueError):
            limit, period = (int((cgroup / "cpu" / f"cpu.cfs_{name}_us").read_text()) for name in ("quota", "period"))
            quota = limit / period if limit > 0 and period > 0 else None
    return max(1, min(cores, math.ceil(quota)) if quota else cores)


def _cgroups(proc: Path) -> list[list[str]]:
    """``[hierarchy, controllers, path]`` of each line of ``<proc>/self/cgroup``; [] when unreadable."""
    try:
        return [line.split(":", 2) for line in (proc / "self" / "cgroup").read_text().splitlines()]
    except OSError:
        return []


def set_cpu_threads() -> int:
    """Lower torch's intra-op threads to ``usable_cores()`` (never raise: ``OMP_NUM_THREADS`` stays); the count."""
    cores = usable_cores()
    if torch.get_num_threads() > cores:
        torch.set_num_threads(cores)
    return torch.get_num_threads()


def competing_cores(sample_s: float = 0.5) -> float | None:
    """How many of this process's cores other processes keep busy over ``sample_s`` seconds; None off Linux."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    try:
        busy0, own0, t0 = _busy_jiffies((PROC / "stat").read_text(), cpus), time.process_time(), time.monotonic()
        time.sleep(sample_s)
        busy1, own1, t1 = _busy_jiffies((PROC / "stat").read_text(), cpus), time.process_time(), time.monotonic()
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, ((busy1 - busy0) / os.sysconf("SC_CLK_TCK") - (own1 - own0)) / (t1 - t0))


def _busy_jiffies(stat: str, cpus: list[int] | None) -> int:
    """Busy clock ticks of the /proc/stat lines of ``cpus`` (None: the aggregate ``cpu`` line)."""
    total = 0
    for line in stat.splitlines():
        name, *fields = line.split()
        if name == "cpu" if cpus is None else name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
            total += user + nice + system + irq + softirq + steal
    return total


@functools.lru_cache(maxsize=1)  # StepConfig.resolve asks at every step it resolves
def native_cpu_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware for oneDNN (AVX512-BF16 or AMX-BF16, Arm FEAT_BF16)."""
    if not torch.backends.mkldnn.is_available():
        return False
    with contextlib.suppress(OSError):
        flags = (PROC / "cpuinfo").read_text()
        return " avx512_bf16" in flags or " amx_bf16" in flags
    try:  # macOS
        out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True,
                             timeout=5, check=False)
        return out.stdout.strip() == "1"
    except (OSError, subprocess.TimeoutExpired):
        return False


def memory_limits(proc: Path = PROC, root: Path = CGROUP) -> dict[str, int]:
    """The bytes this process may still allocate under each limit that is set and readable (from the ``proc`` and
    cgroup ``root`` folders): ``"RAM"`` (MemAvailable), ``"RLIMIT_AS"`` / ``"RLIMIT_DATA"`` (the limit less what
    the process maps), ``"cgroup"`` (memory.max, v2, or memory.limit_in_bytes, v1, less its use)."""
    out = {"RAM": _meminfo(proc / "meminfo").get("MemAvailable")}
    status = _meminfo(proc / "self" / "status")
    with contextlib.suppress(AttributeError, OSError, ValueError):  # resource is None on Windows
        for name, used in (("RLIMIT_AS", status.get("VmSize")), ("RLIMIT_DATA", status.get("VmData"))):
            soft, _ = resource.getrlimit(getattr(resource, name))
            if soft not in (resource.RLIM_INFINITY, -1) and soft > 0:
                out[name] = max(0, soft - (used or 0))
    out["cgroup"] = _cgroup_room(proc, root)
    return {name: room for name, room in out.items() if room is not None}


def _meminfo(path: Path) -> dict[str, int]:
    """``Key: value kB`` lines (/proc/meminfo, /proc/self/status) in bytes; {} when unreadable."""
    out = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def _cgroup_room(proc: Path, root: Path) -> int | None:
    """The memory left under the lowest cgroup limit of this process (v2 memory.max at every level, or v1)."""
    candidates = []
    for _, controllers, path in _cgroups(proc):
        rel = path.lstrip("/")
        if controllers == "":  # v2: the limits of every level up to the root count
            levels = (root / rel, *(p for p in (root / rel).parents if p == root or root in p.parents))
            candidates += [(level / "memory.max", level / "memory.current") for level in levels]
        elif "memory" in controllers.split(","):
            candidates += [(base / "memory.limit_in_bytes", base / "memory.usage_in_bytes")
                           for base in (root / "memory" / rel, root / "memory")]
    rooms = []
    for limit_file, usage_file in candidates:
        with contextlib.suppress(OSError, ValueError):
            limit = limit_file.read_text().strip()
            if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:  # v1 "no limit" is a huge number
                continue
            usage = int(usage_file.read_text().strip()) if usage_file.is_file() else 0
            rooms.append(max(0, int(limit) - usage))
    return min(rooms) if rooms else None


def process_memory_bytes() -> int | None:
    """This process's resident set size in bytes (Linux), else its peak (``getrusage``), None without either."""
    rss = _meminfo(PROC / "self" / "status").get("VmRSS")
    if rss is not None or resource is None:
        return rss
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)  # KiB


def parse_device(device: Any) -> torch.device:
    """The device a setting names, unchecked: None/"" the first CUDA device if any, else the CPU; ``0``/``"1"``
    that CUDA device; else ``torch.device(device)`` (whose ``RuntimeError`` names a device torch does not know)."""
    if device is None or device == "":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, int) or (isinstance(device, str) and device.strip().isdigit()):
        return torch.device(f"cuda:{int(device)}")
    return torch.device(device.strip() if isinstance(device, str) else device)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``parse_device`` checked against this machine; a CUDA device always with its index (``"cuda"``: the current
    device, so that later questions about its name, memory and bf16 are about the card in use).

    Raises:
        ValueError: a CUDA device is asked for on a machine without CUDA.
    """
    device = parse_device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device} requested but CUDA is not available; use device='cpu'")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def free_cuda_memory(device: Any = None) -> None:
    """Collect garbage and hand the cached CUDA blocks back to the driver; nothing to do for a CPU ``device``."""
    gc.collect()
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize()  # blocks of kernels still running are freed once they finish
        torch.cuda.empty_cache()


def native_bf16(index: int) -> bool:
    """Whether CUDA device ``index`` computes bf16 in hardware, not emulated (capability 8.0+: docs/gpu.md)."""
    return tuple(torch.cuda.get_device_capability(index)) >= (8, 0)


def to_device_async(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Copy a small host tensor to ``device`` without the host waiting for the GPU (staged in pinned memory)."""
    if device.type == "cuda" and tensor.device.type == "cpu" and not tensor.is_pinned():
        tensor = tensor.pin_memory()  # a pageable copy may make the driver wait for the stream
    return tensor.to(device, non_blocking=True)
