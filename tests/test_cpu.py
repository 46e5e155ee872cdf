"""The CPU: the cores the kit uses (the affinity capped by a cgroup quota, a container's --cpus; torch's threads
lowered to them, the loader's default workers counted from them, a warning when other processes keep them
busy), and bf16 where the processor computes it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from train_toys import ToyNet, make_batches, toy_loss

from yolo9kit import env
from yolo9kit.config import StepConfig, TrainConfig
from yolo9kit.config import step as step_module
from yolo9kit.data import loader
from yolo9kit.data.loader import WORKER_BYTES
from yolo9kit.train.step import build_trainer, train_step

AFFINITY = len(os.sched_getaffinity(0))


@pytest.mark.parametrize(("files", "expected"), [
    ({"cpu.max": "150000 100000\n"}, min(AFFINITY, 2)),  # cgroup v2: 1.5 cores of quota -> 2 threads
    ({"cpu.max": "100000 100000\n"}, 1),
    ({"cpu.max": "max 100000\n"}, AFFINITY),  # no quota
    ({"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),  # cgroup v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, AFFINITY),  # v1, no quota
    ({"cpu.max": "not a quota\n"}, AFFINITY),  # unreadable: the affinity alone
    ({}, AFFINITY),
])
def test_usable_cores_are_the_affinity_capped_by_the_cgroup_quota(tmp_path, files, expected):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert env.usable_cores(tmp_path) == expected


def test_torch_threads_are_lowered_to_the_usable_cores_and_never_raised(monkeypatch):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(env, "usable_cores", lambda cgroup=None: 1)
        assert env.set_cpu_threads() == 1 == torch.get_num_threads()
        monkeypatch.setattr(env, "usable_cores", lambda cgroup=None: 8)
        assert env.set_cpu_threads() == 1  # only lowers: one thread asked for (OMP_NUM_THREADS=1) stays one
    finally:
        torch.set_num_threads(before)


def test_the_default_workers_count_the_usable_cores(monkeypatch):
    monkeypatch.setattr(loader, "memory_limits", lambda: {})
    monkeypatch.setattr(loader, "SHM", Path("/nonexistent"))  # macOS, Windows: no /dev/shm, the official rule
    monkeypatch.setattr(loader, "usable_cores", lambda: 1)
    assert loader.default_workers(16)[0] == 1
    monkeypatch.setattr(loader, "usable_cores", lambda: 32)
    assert loader.default_workers(16)[0] == 8 and loader.default_workers(1)[0] == 0  # the official caps
    assert loader.default_workers(16)[1] == "8 workers: min(32 usable cores, batch 16, 8)"


def test_the_default_workers_fit_half_the_free_shared_memory_and_ram(monkeypatch, tmp_path):
    """Each worker prepares ``prefetch`` uint8 batches (4 of 16 x 3 x 640 x 640: 78.6 MB): a container's 64 MB
    /dev/shm holds none of them, 200 MB free holds one worker's; RAM counts WORKER_BYTES per worker beside them."""
    batches = 4 * 16 * 3 * 640 * 640
    monkeypatch.setattr(loader, "usable_cores", lambda: 8)
    monkeypatch.setattr(loader, "SHM", tmp_path)
    monkeypatch.setattr(loader, "memory_limits", lambda: {"RAM": 64 << 30, "cgroup": 32 << 30})
    free = {"shm": 64 << 20}
    monkeypatch.setattr(loader.shutil, "disk_usage", lambda path: SimpleNamespace(free=free["shm"]))
    count, why = loader.default_workers(16, 640, prefetch=4)
    assert count == 0 and why.startswith("0 workers: half the free /dev/shm (64.00 MiB)"), why
    free["shm"] = 2 * batches + 1
    assert loader.default_workers(16, 640, prefetch=4)[0] == 1
    assert loader.default_workers(16, 320, prefetch=4)[0] == 4  # a quarter of the bytes per batch
    monkeypatch.setattr(loader.torch.cuda, "device_count", lambda: 2)  # two DDP ranks share it: 2 each
    assert loader.default_workers(16, 320, prefetch=4)[0] == 2
    monkeypatch.setattr(loader.torch.cuda, "device_count", lambda: 0)
    free["shm"] = 64 << 30
    monkeypatch.setattr(loader, "memory_limits", lambda: {"RAM": 64 << 30, "cgroup": 3 * (batches + WORKER_BYTES)})
    count, why = loader.default_workers(16, 640, prefetch=4)
    assert count == 1 and "half the free RAM" in why, why  # the least of the limits: the cgroup's


def test_busy_time_is_read_for_this_process_cpus_only():
    stat = ("cpu  100 0 50 900 10 5 5 0 0 0\n"
            "cpu0 60 0 30 400 5 3 2 0 0 0\n"
            "cpu1 40 0 20 500 5 2 3 0 0 0\n"
            "intr 12345\n")
    assert env._busy_jiffies(stat, None) == 160
    assert env._busy_jiffies(stat, [0]) == 95 and env._busy_jiffies(stat, [1]) == 65
    assert env._busy_jiffies(stat, [0, 1]) == 160


def test_a_busy_process_on_the_same_cores_is_seen_and_warned_about(monkeypatch):
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert env.competing_cores(1.0) >= env.COMPETING_CORES  # the busy loop keeps about one core
    finally:
        busy.kill()
        busy.wait()
    monkeypatch.setattr(env, "competing_cores", lambda sample_s=0.5: 1.5)
    report = env.environment_report(verbose=False, widgets=False)
    assert report.warnings and "1.5 of this process's" in report.warnings[0]
    assert "WARNING: other processes keep" in str(report)
    assert report.ok == (not report.problems)  # a warning, not a failure: checks still exits 0
    monkeypatch.setattr(env, "competing_cores", lambda sample_s=0.5: 0.1)
    assert not env.environment_report(verbose=False, widgets=False).warnings


def test_cpu_amp_rules_follow_the_processors_bf16():
    for bf16 in (True, False):  # auto: bf16 where the CPU computes it (its seed spread: docs/benchmarks.md)
        assert StepConfig("yolov9-t", 2).resolve("cpu", bf16=bf16).amp == ("bf16" if bf16 else "off")
        assert StepConfig("yolov9-t", 2, amp="fp16").resolve("cpu", bf16=bf16).amp == "off"
    assert StepConfig("yolov9-t", 2, amp="bf16").resolve("cpu", bf16=True).amp == "bf16"
    with pytest.raises(ValueError, match=r"amp='bf16': this CPU has no bf16 in hardware .* use amp='off'"):
        StepConfig("yolov9-t", 2, amp="bf16").resolve("cpu", bf16=False)


@pytest.mark.parametrize("native", [True, False])
def test_an_explicit_bf16_step_autocasts_on_a_cpu_that_has_it_and_is_refused_on_one_without(monkeypatch, native):
    monkeypatch.setattr(step_module, "native_cpu_bf16", lambda: native)  # the processor, simulated
    model = ToyNet()
    config = TrainConfig(amp="bf16", device="cpu", batch_size=4, warmup_min_batches=0, warmup_epochs=0.0)
    if not native:
        with pytest.raises(ValueError, match="this CPU has no bf16 in hardware"):
            build_trainer(model, config, loss_fn=toy_loss)
        return
    trainer = build_trainer(model, config, loss_fn=toy_loss)
    assert trainer.step.amp == "bf16" and trainer.amp_dtype == torch.bfloat16
    assert trainer.scaler.get_scale() == 1.0 and trainer.scaler.get_growth_interval() == 2**30  # no loss scaling
    dtypes = []
    conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    conv.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    before = [p.detach().clone() for p in model.parameters()]
    images, targets = make_batches(1, 4)[0][:2]
    items = train_step(trainer, images, targets, ni=0, accumulate_steps=1)
    assert dtypes == [torch.bfloat16] and torch.isfinite(items).all()  # the convolutions ran in bf16
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the weights stay fp32
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
