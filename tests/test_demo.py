"""``python -m yolo9kit demo``: the whole kit end to end, as `make demo` runs it, in its smoke run (``--quick``)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_quick_demo_runs_end_to_end(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "yolo9kit", "demo", "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "outputs identical" in proc.stdout
    table = proc.stdout.split("== 2.")[0]
    assert "deploy_gflops" in table and "yolov9-t" in table and "gelan-t" in table  # one model of each family
    assert (out / "train_batch.png").stat().st_size > 0
    assert (out / "train" / "weights" / "last.pt").is_file()
    assert "mAP50-95" in proc.stdout and "Speed:" in proc.stdout
    assert any((out / "predict").iterdir())
    from yolo9kit.models import create_model

    trained = create_model(out / "train" / "weights" / "last.pt")
    assert list(trained.names) == ["rectangle", "ellipse", "triangle"]  # the data's class names travel with it
