"""The processor a CPU run has: the cores this process may use (its affinity and a container's quota), the
threads torch runs on them, whether other processes keep them busy, and whether it computes bf16 in hardware.
``environment_report`` shows all of it; ``fit``, the commands and ``StepConfig.resolve`` use it."""

from __future__ import annotations

import functools
import math
import os
import subprocess
from pathlib import Path

# Busy cores of other processes (on this process's cores) from which environment_report warns.
COMPETING_CORES = 0.5


def usable_cores(cgroup: Path | None = None) -> int:
    """The cores this process may use: its CPU affinity, capped by the CPU quota of its cgroup (a container's
    ``--cpus``: cgroup v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), at least 1.

    ``os.cpu_count()`` is the machine's count, and torch's default thread count follows the affinity only: in
    a container limited to 2 of 64 cores both say 64, and 64 threads taking turns on 2 cores run slower
    than 2. ``cgroup``: the cgroup folder to read (default: this process's, under /sys/fs/cgroup).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_quota(cgroup or _own_cgroup())
    return max(1, min(cores, math.ceil(quota)) if quota else cores)


def _own_cgroup() -> Path:
    """This process's cgroup v2 folder (``0::/path`` in /proc/self/cgroup), else the cgroup root."""
    root = Path("/sys/fs/cgroup")
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return root / line[3:].lstrip("/")
    except OSError:
        pass
    return root


def _cgroup_quota(folder: Path) -> float | None:
    """The CPU quota in cores (``200000 100000`` -> 2.0), None when there is none or it cannot be read."""
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota = int((folder / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def set_cpu_threads() -> int:
    """Lower torch's intra-op threads to the usable cores (``usable_cores``) and return the count in force.

    Only lowers: torch may already use fewer (one per physical core, or the ``OMP_NUM_THREADS`` a user or
    torchrun set), and more threads than cores never run faster. ``fit`` and the command line call it first.
    """
    import torch

    cores = usable_cores()
    if torch.get_num_threads() > cores:
        torch.set_num_threads(cores)
    return torch.get_num_threads()


def competing_cores(sample_s: float = 0.5) -> float | None:
    """How many of this process's cores other processes keep busy, sampled over ``sample_s`` seconds from
    /proc/stat (the CPUs of this process's affinity) minus this process's own time; None off Linux."""
    import time

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    try:
        busy0, own0, t0 = _busy_jiffies(Path("/proc/stat").read_text(), cpus), _own_jiffies(), time.monotonic()
        time.sleep(sample_s)
        busy1, own1, t1 = _busy_jiffies(Path("/proc/stat").read_text(), cpus), _own_jiffies(), time.monotonic()
    except (OSError, ValueError, IndexError):
        return None
    hertz = os.sysconf("SC_CLK_TCK")
    return max(0.0, (busy1 - busy0 - (own1 - own0)) / hertz / (t1 - t0))


def _busy_jiffies(stat: str, cpus: list[int] | None) -> int:
    """Busy time (user, nice, system, irq, softirq, steal) of the ``cpuN`` lines of /proc/stat for ``cpus``
    (None: the aggregate ``cpu`` line), in clock ticks."""
    total = 0
    for line in stat.splitlines():
        name, *fields = line.split()
        if (cpus is None and name == "cpu") or (cpus is not None and name[3:].isdigit() and name.startswith("cpu")
                                                and int(name[3:]) in cpus):
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
            total += user + nice + system + irq + softirq + steal
    return total


def _own_jiffies() -> int:
    """This process's user + system time (its threads included) in clock ticks, from /proc/self/stat."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of the line)


@functools.lru_cache(maxsize=1)  # the processor does not change: StepConfig.resolve asks at every step it resolves
def native_cpu_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware for oneDNN: the AVX512-BF16 or AMX-BF16 instructions (x86,
    /proc/cpuinfo), or FEAT_BF16 (Arm, macOS). Without them bf16 is emulated, slower than fp32."""
    import torch

    if not torch.backends.mkldnn.is_available():
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
        return " avx512_bf16" in flags or " amx_bf16" in flags
    except OSError:
        pass
    try:
        out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True,
                             timeout=5, check=False)
        return out.stdout.strip() == "1"
    except (OSError, subprocess.TimeoutExpired):
        return False
