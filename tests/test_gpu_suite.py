"""benchmarks/gpu_suite.py is prepared for a GPU run: its quick mode runs every part on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.slow
def test_gpu_suite_quick_mode_runs_every_part_on_the_cpu(tmp_path):
    out = tmp_path / "suite"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_suite.py"), "--quick", "--device", "cpu",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    suite = json.loads((out / "suite.json").read_text())
    assert suite["meta"]["imgsz"] == 128 and "gpu_suite.py --quick" in suite["meta"]["command"]
    (step,) = suite["train_step"]
    assert step["code"] == "yolo9kit" and step["model"] == "yolov9-t" and step["img_per_s"] > 0
    assert step["estimated_alloc_GiB"] > 0  # the CPU estimate of the same step, next to the measurement
    assert [r["variant"] for r in suite["ablation"]][:2] == ["default", "amp fp16"]
    assert all(r["img_per_s"] > 0 for r in suite["ablation"])
    (epoch,) = suite["epoch"]
    assert epoch["images"] == 8 and epoch["loader_img_per_s"] > 0 and epoch["train_img_per_s"] > 0
    assert [(r["model"], r["batch"]) for r in suite["inference"]] == [("gelan-t", 1), ("gelan-t", 2)]
    markdown = (out / "suite.md").read_text()
    assert "### train_step" in markdown and "### inference" in markdown and "| yolov9-t | 2 | yolo9kit |" in markdown
