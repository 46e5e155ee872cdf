"""yolo9kit.memory: plots, GPU table, calibration files, snapshots on CPU, CLI, benchmark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from yolo9kit.config import StepConfig
from yolo9kit.extras.gpu_check import fit_line
from yolo9kit.memory import CATEGORIES, GPUS, MemoryReport, export_snapshot, resolve_gpu
from yolo9kit.memory.gpus import calibration_for, packaged_calibrations, read_calibration

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def report(b: int, method: str = "estimated") -> MemoryReport:
    parts = dict.fromkeys(CATEGORIES, 10 << 20)
    parts["activations"] = b * (100 << 20)
    total = sum(parts.values())
    step = StepConfig("toy", b, amp="fp16", channels_last=False, lean_activations=False)
    return MemoryReport(step, method, "T4", total, int(total * 1.05), parts,
                        step_time_s=0.1, images_per_s=b / 0.1, context_bytes=256 << 20,
                        gpu_total_bytes=GPUS["T4"].total_bytes)


def test_gpu_table_and_names():
    assert resolve_gpu("rtx4090") is GPUS["RTX 4090"]
    assert resolve_gpu("NVIDIA GeForce RTX 4090") is GPUS["RTX 4090"]
    assert resolve_gpu("a100-40gb").total_bytes == 40_960 << 20
    assert resolve_gpu(24 * GIB).total_bytes == 24 * GIB
    assert not GPUS["T4"].bf16 and GPUS["H100"].bf16
    with pytest.raises(ValueError, match="unknown GPU 'GTX 9999'.*T4"):
        resolve_gpu("GTX 9999")


def test_memory_vs_batch_and_breakdown_plots_return_figures():
    from matplotlib.figure import Figure

    from yolo9kit.plots import memory_breakdown, memory_vs_batch

    rows = [{**report(b).as_row(), "oom": False} for b in (1, 8, 32)]
    rows += [{**report(b, "measured").as_row(), "oom": False} for b in (8, 32)]
    rows.append({"batch_size": 64, "method": "measured", "setting": "fp16 640px", "oom": True})
    df = pd.DataFrame(rows)
    fig = memory_vs_batch(df, gpu="T4", margin=0.1)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "fp16 640px (estimated)" in labels and "fp16 640px (measured)" in labels
    assert any("out of memory" in s for s in labels)
    assert isinstance(memory_breakdown([report(8), report(16)]), Figure)
    assert isinstance(memory_breakdown(report(8)), Figure)


def test_settings_with_the_same_memory_stay_visible_and_fp32_is_named_so():
    """fp16 and bf16 steps need the same memory: each curve has its own style and marker, so neither hides the
    other, and "off" is drawn as fp32, the word the tables use."""
    from yolo9kit.plots import memory_vs_batch

    rows = [{**report(b).as_row(), "oom": False, "setting": setting} for setting in ("off", "fp16", "bf16")
            for b in (1, 8, 32)]
    ax = memory_vs_batch(pd.DataFrame(rows), gpu="T4").axes[0]
    curves = [line for line in ax.get_lines() if line.get_label().endswith("(estimated)")]
    assert [c.get_label() for c in curves] == ["fp32 (estimated)", "fp16 (estimated)", "bf16 (estimated)"]
    assert len({(c.get_linestyle(), c.get_marker()) for c in curves}) == 3
    assert ax.get_title()


def test_export_snapshot_needs_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        export_snapshot(tmp_path / "s.pickle", lambda: None)


def test_packaged_reference_is_not_applied_and_is_sane():
    cals = packaged_calibrations()
    ref = [c for c in cals if c["kind"] == "reference" and c["gpu"] == "H200"]
    assert ref, "the official H200 reference should ship with the package"
    a, b = ref[0]["fits"]["fp16"]["reserved_vs_allocated"]
    assert 1.0 < a < 1.1 and 0 <= b < 1 * GIB  # reserved is a few percent above allocated
    assert calibration_for("H200", "fp16") is None  # a reference is never used as our calibration


def test_calibration_file_checks(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="bad.json: not a memory calibration"):
        read_calibration(bad)
    broken = tmp_path / "broken.json"
    broken.write_text("{\n  oops")
    with pytest.raises(ValueError, match="broken.json: line 2"):
        read_calibration(broken)
    measured = {"format": "yolo9kit-memory-calibration", "version": 1, "kind": "measured", "gpu": "T4",
                "fits": {"fp16": {"allocated": [1.0, 0.0], "reserved": [1.05, 1e8]}}}
    assert calibration_for("T4", "fp16", (measured,))["reserved"] == [1.05, 1e8]
    assert calibration_for("T4", "bf16", (measured,)) is None
    assert fit_line([1, 2, 3], [3, 5, 7]) == pytest.approx((2.0, 1.0))


def test_profile_cli_parses_and_rejects_unknown_gpu(capsys):
    from yolo9kit.cli import build_parser, main

    parser = build_parser()
    args = parser.parse_args(["profile", "--model", "yolov9-t", "--batch-size", "8", "16", "--amp", "fp16", "bf16",
                              "--gpu", "GTX 9999", "--activation-checkpointing", "1,2,3", "--nominal-batch-size", "64"])
    assert args.batch_size == [8, 16] and args.amp == ["fp16", "bf16"] and args.nominal_batch_size == 64
    assert args.activation_checkpointing == [1, 2, 3] and args.channels_last is None
    assert main(["profile", "--model", "yolov9-t", "--gpu", "GTX 9999"]) == 2
    assert "unknown GPU" in capsys.readouterr().err
    other = parser.parse_args(["profile", "--activation-checkpointing", "all", "--nominal-batch-size", "32",
                               "--no-lean-activations"])
    assert other.activation_checkpointing == "all" and other.nominal_batch_size == 32
    assert other.lean_activations is False


@pytest.mark.slow
def test_profile_cli_prints_sweep_and_plan(capsys):
    from yolo9kit.cli import build_parser

    args = build_parser().parse_args(["profile", "--model", "gelan-t", "--imgsz", "64", "--batch-size", "1", "2",
                                      "--gpu", "T4", "--nominal-batch-size", "4", "--method", "estimated",
                                      "--images", "6000"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "peak_reserved_gib" in out and "recommended: batch 4 x accumulate 1" in out
    rows = [line.split() for line in out.splitlines() if "estimated" in line.split()[5:6]]  # ... img/s epoch_min
    assert len(rows) == 2 and all(float(r[-1]) == pytest.approx(6000 / float(r[-2]) / 60, rel=0.02) for r in rows)


@pytest.mark.slow
def test_benchmark_smoke_mode_writes_outputs(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "memory_gpu.py"), "--smoke", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "memory_gpu.json").read_text())
    assert data["meta"]["smoke"] and data["summary"]["points"] == 4
    assert {r["activation_checkpointing"] for r in data["rows"]} == {None, "all"}
    assert "| yolov9-t | 1 | fp16 |" in (tmp_path / "memory_gpu.md").read_text()
    cal = read_calibration(tmp_path / "calibration-RTX_4090-smoke.json")
    assert cal["smoke"] and cal["kind"] == "measured" and cal["fits"] == {}


def test_estimate_of_the_lean_step_keeps_less_activation_memory():
    """The kit's CUDA default step (channels_last, lean BatchNorm+SiLU) against the plain step."""
    from yolo9kit import memory

    plain = memory.estimate("yolov9-t", 8, imgsz=320, amp="fp16", gpu="H200", channels_last=False,
                            lean_activations=False)
    lean = memory.estimate("yolov9-t", 8, imgsz=320, amp="fp16", gpu="H200")  # fit's default step on CUDA
    assert lean.step.lean_activations and lean.step.channels_last and not plain.step.lean_activations
    assert "lean" in str(lean)
    ratio = lean.breakdown["activations"] / plain.breakdown["activations"]
    assert 0.6 < ratio < 0.85, ratio  # measured 0.78 at 640 and batch 64
    assert lean.peak_allocated < plain.peak_allocated
