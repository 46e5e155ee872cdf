"""``environment_report()`` (what ``yolo9kit.checks()`` shows first): what a workshop needs to know about the
machine before the first cell runs; the devices the kit resolves."""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from yolo9kit.cpu import COMPETING_CORES, competing_cores, native_cpu_bf16, set_cpu_threads, usable_cores

# The data files a wheel must carry: (folder inside the package, pattern, what needs them). A missing
# folder means an install that dropped its package data (for example a wheel built without it).
PACKAGE_DATA = (
    ("models/cfg", "*.yaml", "the model layer tables (create_model)"),
    ("memory_calibration", "*.json", "the memory calibration (memory.estimate)"),
    ("models", "*.pt", "the shipped shapes model (create_model)"),
)


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
    # What slows this machine without stopping it (another process busy on these cores, ...): shown, not failed.
    warnings: list[str] = field(default_factory=list)
    cpu_threads: int = 1  # torch's intra-op threads (set_cpu_threads: at most the usable cores)
    cpu_isa: str = "unknown"  # the vector instructions torch's CPU kernels use (AVX512, AVX2, ...)
    cpu_bf16: bool = False  # bf16 in hardware (native_cpu_bf16): where amp="bf16" may run on the CPU
    gpu_check: Any = None  # yolo9kit.gpu_check.GPUCheck when asked for (checks(gpu=True)), else None

    @property
    def ok(self) -> bool:
        return not self.problems and (self.gpu_check is None or self.gpu_check.ok)

    def to_dict(self) -> dict:
        out = asdict(dataclasses.replace(self, gpu_check=None))
        out["gpu_check"] = None if self.gpu_check is None else self.gpu_check.to_dict()
        return out

    def __str__(self) -> str:
        gib = 1024**3
        lines = [
            f"yolo9kit {self.yolo9kit}  Python {self.python}  {self.platform}",
            f"torch {self.torch}  torchvision {self.torchvision}  CUDA {self.cuda_version or '-'}",
        ]
        if self.gpus:
            for i, gpu in enumerate(self.gpus):
                lines.append(f"GPU {i}: {gpu['name']}  {gpu['total_bytes'] / gib:.1f} GiB  sm_{gpu['capability']}")
        else:
            lines.append("GPU: none (CPU only: memory figures are estimated, training runs on the CPU)")
        ram = f"{self.ram_total_bytes / gib:.1f} GiB" if self.ram_total_bytes else "unknown"
        free = f"{self.ram_available_bytes / gib:.1f} GiB" if self.ram_available_bytes else "unknown"
        lines.append(f"CPU cores: {self.cpu_cores} (torch threads {self.cpu_threads}), {self.cpu_isa}, bf16 in "
                     f"hardware: {'yes' if self.cpu_bf16 else 'no'}  RAM: {ram} total, {free} available")
        lines.append("packages: " + ", ".join(f"{k} {v or 'missing'}" for k, v in self.packages.items()))
        lines.append(f"JupyterLab widget extension: {self.widgets_extension}")
        lines.append(f"package data ({self.location}): "
                     + ", ".join(f"{k} {v} file(s)" for k, v in self.package_data.items()))
        lines.extend(f"PROBLEM: {p}" for p in self.problems)
        lines.extend(f"WARNING: {w}" for w in self.warnings)
        if self.gpu_check is not None:
            lines.append(str(self.gpu_check))
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:  # notebooks show the same table
        return "```\n" + str(self) + "\n```"


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _package_data(problems: list[str]) -> dict[str, int]:
    """Count the installed data files of each ``PACKAGE_DATA`` folder; a missing kind is a problem."""
    root = Path(__file__).resolve().parent
    found: dict[str, int] = {}
    for folder, pattern, used_by in PACKAGE_DATA:
        found[folder] = len(list((root / folder).glob(pattern)))
        if not found[folder]:
            problems.append(f"no {pattern} files in {root / folder}: {used_by} will fail; "
                            "reinstall yolo9kit from a wheel or checkout that includes its package data")
    return found


def _memory() -> tuple[int | None, int | None]:
    """Total and available RAM from /proc/meminfo (Linux) or sysconf; (None, None) when unknown."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info.get("MemTotal"), info.get("MemAvailable")
    except (OSError, ValueError, IndexError):
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            return total, None
        except (ValueError, OSError, AttributeError):
            return None, None


def _widgets_extension_state() -> str:
    """Ask JupyterLab whether @jupyter-widgets/jupyterlab-manager is installed and enabled."""
    jupyter = shutil.which("jupyter", path=os.path.dirname(sys.executable)) or shutil.which("jupyter")
    if _version("jupyterlab_widgets") is None:
        return "not installed"
    if jupyter is None:
        return "unknown"
    try:
        out = subprocess.run(
            [jupyter, "labextension", "list"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = out.stdout + out.stderr
    for line in text.splitlines():
        if "@jupyter-widgets/jupyterlab-manager" in line:
            return "enabled" if "enabled" in line and "disabled" not in line else "disabled"
    return "not installed"


def environment_report(verbose: bool = True, widgets: bool = True) -> EnvReport:
    """Report versions, CUDA and GPUs, CPU cores, RAM and the JupyterLab widget extension.

    Args:
        verbose: log the report at INFO level as well as returning it.
        widgets: ask JupyterLab about its widget extension (a subprocess, about a second).

    Returns:
        An ``EnvReport``; in a notebook it displays as a table. ``report.problems`` lists what would
        stop a walkthrough (missing torch, a disabled widget extension).
    """
    import logging

    problems: list[str] = []
    torch_version = _version("torch")
    cuda_available, cuda_version, gpus = False, None, []
    if torch_version is None:
        problems.append("PyTorch is not installed: run `make demo` or `pip install -e .[notebooks]`")
    else:
        import torch

        cuda_available = torch.cuda.is_available()
        cuda_version = torch.version.cuda
        for i in range(torch.cuda.device_count() if cuda_available else 0):
            props = torch.cuda.get_device_properties(i)
            gpus.append({"name": props.name, "total_bytes": int(props.total_memory),
                         "capability": f"{props.major}{props.minor}"})
    state = _widgets_extension_state() if widgets else "unknown"
    if state in ("disabled", "not installed"):
        problems.append(
            f"JupyterLab widget extension is {state}: sliders will show as text. "
            "Install `jupyterlab_widgets` (it is in the `notebooks` extra) and restart JupyterLab"
        )
    package_data = _package_data(problems)
    total, available = _memory()
    warnings = []
    others = competing_cores()
    if others is not None and others >= COMPETING_CORES:
        warnings.append(f"other processes keep about {others:.1f} of this process's {usable_cores()} cores busy: "
                        "training and timings here run slower while they do (two notebooks training at once "
                        "share the cores; stop the other kernel, or wait for it)")
    report = EnvReport(
        python=platform.python_version(),
        platform=f"{platform.system()} {platform.machine()}",
        yolo9kit=_version("yolo9kit") or "(not installed)",
        torch=torch_version,
        torchvision=_version("torchvision"),
        cuda_available=cuda_available,
        cuda_version=cuda_version,
        gpus=gpus,
        cpu_cores=usable_cores(),
        cpu_threads=set_cpu_threads() if torch_version is not None else 1,
        cpu_isa=torch.backends.cpu.get_cpu_capability() if torch_version is not None else "unknown",
        cpu_bf16=native_cpu_bf16() if torch_version is not None else False,
        ram_total_bytes=total,
        ram_available_bytes=available,
        packages={name: _version(name) for name in
                  ("numpy", "opencv-python-headless", "pandas", "matplotlib", "jupyterlab", "ipywidgets")},
        widgets_extension=state,
        package_data=package_data,
        location=str(Path(__file__).resolve().parent),
        problems=problems,
        warnings=warnings,
    )
    if verbose:
        logging.getLogger(__name__).info("\n%s", report)
    return report


def parse_device(device: Any) -> torch.device:  # noqa: F821 (torch imported lazily)
    """The device a setting names, not checked against this machine: None or "" the first CUDA device when
    there is CUDA, else the CPU; a GPU index (``0``, ``"1"``) that CUDA device; else ``torch.device(device)``.

    Raises:
        RuntimeError: not a device torch knows (``torch.device``'s own error).
    """
    import torch

    if device is None or device == "":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, int) or (isinstance(device, str) and device.strip().isdigit()):
        return torch.device(f"cuda:{int(device)}")
    return torch.device(str(device).strip() if isinstance(device, str) else device)


def resolve_device(device: str | torch.device | None) -> torch.device:  # noqa: F821 (torch imported lazily)
    """None/"" -> the first CUDA device when available, else CPU; "0" -> cuda:0; else ``torch.device(device)``.

    A CUDA device always comes back with its index: ``"cuda"`` is the current CUDA device
    (``torch.cuda.current_device()``), so every later question about "the card" (its name, memory, bf16,
    random state) is about the one the tensors are on, also on a machine with several GPUs.

    Raises:
        ValueError: a CUDA device is asked for on a machine without CUDA.
    """
    import torch

    device = parse_device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device} requested but CUDA is not available; use device='cpu'")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def free_cuda_memory(device: Any = None) -> None:
    """Collect unreachable tensors and hand the cached CUDA blocks back to the driver (after the caller dropped
    its own): before a measurement and after an out-of-memory error. Nothing to do for a CPU ``device``."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize()  # blocks of kernels still running are freed once they finish
        torch.cuda.empty_cache()


def native_bf16(index: int) -> bool:
    """Whether CUDA device ``index`` computes bf16 in hardware: compute capability 8.0 or more (Ampere and
    newer). ``torch.cuda.is_bf16_supported()`` is not this question: by default it also counts emulation and
    says True on a T4 or V100 (7.x), where bf16 has no tensor cores and no cuDNN engines."""
    import torch

    return tuple(torch.cuda.get_device_capability(index)) >= (8, 0)


def to_device_async(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:  # noqa: F821
    """Copy a (small) host tensor to ``device`` without making the host wait for the GPU.

    A copy from ordinary (pageable) host memory may make the CUDA driver wait for the stream; staging it
    in pinned memory first lets ``non_blocking`` really overlap. No-op for tensors already on ``device``.
    """
    if tensor.device == device:
        return tensor
    if device.type == "cuda" and tensor.device.type == "cpu" and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def ram_available_bytes() -> int | None:
    """Memory the OS can give this process now (MemAvailable on Linux), or None when unknown."""
    return _memory()[1]


def memory_limits(proc: str | Path = "/proc", cgroup_root: str | Path = "/sys/fs/cgroup") -> dict[str, int]:
    """What this process may still allocate, by each limit that applies (bytes): ``"RAM"`` (MemAvailable),
    ``"RLIMIT_AS"`` and ``"RLIMIT_DATA"`` (``ulimit -v``, ``prlimit``: the limit less what the process already
    maps), ``"cgroup"`` (a container's or a systemd slice's memory.max, v2, or memory.limit_in_bytes, v1, less
    its current use). Limits that are not set, or cannot be read, are left out."""
    proc, root = Path(proc), Path(cgroup_root)
    out: dict[str, int] = {}
    available = _memory()[1] if proc == Path("/proc") else _meminfo(proc / "meminfo").get("MemAvailable")
    if available is not None:
        out["RAM"] = available
    status = _meminfo(proc / "self" / "status")
    try:
        import resource

        for name, used in (("RLIMIT_AS", status.get("VmSize")), ("RLIMIT_DATA", status.get("VmData"))):
            soft, _ = resource.getrlimit(getattr(resource, name))
            if soft not in (resource.RLIM_INFINITY, -1) and soft > 0:
                out[name] = max(0, soft - (used or 0))
    except (ImportError, AttributeError, OSError, ValueError):
        pass
    cgroup = _cgroup_room(proc, root)
    if cgroup is not None:
        out["cgroup"] = cgroup
    return out


def _meminfo(path: Path) -> dict[str, int]:
    """``Key: value kB`` lines (/proc/meminfo, /proc/self/status) in bytes; {} when unreadable."""
    out = {}
    try:
        for line in path.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    except OSError:
        pass
    return out


def _cgroup_room(proc: Path, root: Path) -> int | None:
    """The memory left under this process's cgroup limit (v2 memory.max, or v1 memory.limit_in_bytes)."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # v2: limits at every level up to the root count
            folder = root / rel
            while True:
                candidates.append((folder / "memory.max", folder / "memory.current"))
                if folder == root or root not in folder.parents:
                    break
                folder = folder.parent
        elif "memory" in controllers.split(","):
            for base in (root / "memory" / rel, root / "memory"):
                candidates.append((base / "memory.limit_in_bytes", base / "memory.usage_in_bytes"))
    rooms = []
    for limit_file, usage_file in candidates:
        try:
            limit = limit_file.read_text().strip()
            if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:  # v1 "no limit" is a huge number
                continue
            usage = int(usage_file.read_text().strip()) if usage_file.is_file() else 0
            rooms.append(max(0, int(limit) - usage))
        except (OSError, ValueError):
            continue
    return min(rooms) if rooms else None
