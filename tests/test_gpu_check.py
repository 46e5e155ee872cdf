"""``checks --gpu``: its CPU paths. Without CUDA it says so in one line; on fake CUDA (tests/fake_cuda.py, whose
memory counters follow the fake tensors' bytes) the whole check runs, and its verdicts can come out either way."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from fake_cuda import fake_cuda
from train_toys import one_thread

import yolo9kit
import yolo9kit.extras
from yolo9kit.extras import gpu_check
from yolo9kit.extras.gpu_check import GPUCheckConfig, check_gpu
from yolo9kit.memory import StepConfig, estimate
from yolo9kit.memory.gpus import calibration_for, resolve_gpu

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

SMALL = GPUCheckConfig(model="yolov9-t", imgsz=64, batch_size=2, steps=2, warmup_batches=1, memory_batches=(2, 4))


def test_without_cuda_the_gpu_check_says_so_in_one_line_and_exits_0(tmp_path):
    run = subprocess.run([sys.executable, "-m", "yolo9kit", "checks", "--gpu", "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().count("\n") == 0 and "no CUDA device" in run.stdout
    assert not (tmp_path / "gpu_check.json").exists()
    report = yolo9kit.extras.checks(verbose=False, widgets=False, gpu=True)
    assert report.gpu_check is not None and not report.gpu_check.ran and "no CUDA device" in str(report)


@pytest.mark.slow
def test_the_gpu_check_runs_the_steps_memory_and_writes_its_record(tmp_path):
    with fake_cuda("H200"):
        result = check_gpu(SMALL, out=tmp_path, command="test", calibration_dir=tmp_path / "calibration")
    assert result.ran and result.ok and result.losses_agree, result
    assert len(result.losses["fast"]) == len(result.losses["plain"]) == 3
    assert result.images_per_s["fast"] > 0 and result.images_per_s["plain"] > 0
    assert result.syncs_in_fast_step == 0  # the fake card reports the fast step's syncs: none
    assert [r["batch_size"] for r in result.memory] == [2, 4]
    for row in result.memory:
        assert row["amp"] == "bf16" and row["measured_peak_allocated"] > 0 and row["estimated_peak_allocated"] > 0
        assert row["error_allocated"] == pytest.approx(row["estimated_peak_allocated"] /
                                                       row["measured_peak_allocated"] - 1)
    assert result.memory[1]["measured_peak_allocated"] > result.memory[0]["measured_peak_allocated"]
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    assert record["device"]["name"] == "NVIDIA H200" and record["device"]["capability"] == "90"
    assert record["versions"]["torch"] == torch.__version__ and record["command"] == "test"
    assert record["config"]["model"] == "yolov9-t" and record["ok"] is True
    assert result.calibration.startswith(("recorded in", "not recorded"))
    text = str(result)
    assert "losses agree" in text and "img/s" in text and "batch 4: peak reserved" in text


@pytest.mark.slow
def test_a_fast_step_that_computes_another_loss_is_reported(tmp_path, monkeypatch):
    """The verdict is not fixed: a fast step whose loss is 5 % off makes the check disagree (and fail)."""
    real = gpu_check.build_trainer

    def skewed(model, config, **kwargs):
        trainer = real(model, config, **kwargs)
        if trainer.step.fused_optimizer:  # the fast step
            loss_fn = trainer.loss_fn
            trainer.loss_fn = lambda outputs, targets: tuple(v * 1.05 for v in loss_fn(outputs, targets))
        return trainer

    monkeypatch.setattr(gpu_check, "build_trainer", skewed)
    with fake_cuda("RTX 4090"):
        result = check_gpu(GPUCheckConfig(**{**SMALL.__dict__, "memory_batches": ()}), out=tmp_path)
    assert not result.losses_agree and not result.ok
    assert abs(result.loss_max_rel_diff - 0.05) < 0.005  # the skew, and the steps' own rounding difference
    assert "DISAGREE" in str(result)


def _rows(error: float, spec) -> list[dict]:
    """Two measured points where the estimate (reserved) is ``error`` off the measurement."""
    rows = []
    for b in (8, 16):
        est = estimate(StepConfig("yolov9-t", b, imgsz=64), gpu=spec)
        traced = int(gpu_check.estimator_for(StepConfig("yolov9-t", b, imgsz=64), spec).memory.peak(b)[0])
        measured = est.peak_reserved / (1 + error)
        rows.append({"batch_size": b, "amp": est.step.amp, "estimated_traced_bytes": traced,
                     "estimated_peak_reserved": est.peak_reserved, "measured_peak_reserved": measured,
                     "measured_peak_allocated": measured * 0.9, "error_reserved": error})
    return rows


def test_a_measurement_is_recorded_only_where_it_improves_the_estimate(_own_calibrations):
    """20 % off: the fit on the two points replaces it, and the next estimate for the card is within 1 %.
    1 % off (under the 2 % threshold): nothing is recorded."""
    spec = resolve_gpu("L4")
    step = StepConfig("yolov9-t", 8, imgsz=64)
    assert calibration_for(spec.name, "bf16") is None
    close = gpu_check._record_calibration(_rows(0.01, spec), spec, SMALL, _own_calibrations)
    assert close.startswith("not recorded: the estimate is already within 1.0%")
    off = _rows(0.2, spec)
    said = gpu_check._record_calibration(off, spec, SMALL, _own_calibrations)
    assert said.startswith(f"recorded in {_own_calibrations}") and "later estimates for L4 at bf16 use it" in said
    assert calibration_for(spec.name, "bf16") is not None
    again = estimate(step, gpu=spec)
    assert again.peak_reserved == pytest.approx(off[0]["measured_peak_reserved"], rel=0.01)
    assert "measured calibration" in " ".join(again.notes)
