"""Same settings, same numbers: a model made from a name starts from the same weights in every process, and
``create_model`` + ``fit`` run twice in separate processes give the same losses (docs/training.md, "What is
reproducible")."""

from __future__ import annotations

import csv
import subprocess
import sys
import textwrap

import torch

WEIGHTS_DIGEST = textwrap.dedent("""
    import hashlib, sys
    import torch
    torch.manual_seed(int(sys.argv[1]))  # whatever the caller's random state, the model's seed decides
    from yolo9kit import create_model
    model = create_model("yolov9-t", 3, **({"seed": int(sys.argv[2])} if len(sys.argv) > 2 else {}))
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode() + tensor.numpy().tobytes())
    print(digest.hexdigest())
""")

FIT = textwrap.dedent("""
    import sys
    from yolo9kit import create_model
    from yolo9kit.config import TrainConfig
    from yolo9kit.data import make_shapes
    from yolo9kit.train import fit
    out = sys.argv[1]
    data = make_shapes(out + "/data", n_train=8, n_val=2, imgsz=64, num_classes=3, seed=5)
    config = TrainConfig(epochs=2, batch_size=4, imgsz=64, device="cpu", workers=0, val=False, project=out,
                         name="run", plots=False)
    fit(create_model("yolov9-t", 3), data, config)
""")


def _run(script: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


def test_a_model_from_a_name_has_the_same_weights_in_every_process_for_its_seed():
    first, second = _run(WEIGHTS_DIGEST, "1"), _run(WEIGHTS_DIGEST, "2")
    assert first == second, "two processes built different initial weights for the same (default) seed"
    assert _run(WEIGHTS_DIGEST, "1", "0") == first  # the default seed is 0
    assert _run(WEIGHTS_DIGEST, "1", "7") != first  # another seed, other weights


def test_building_a_model_leaves_the_callers_random_state_alone():
    from yolo9kit import create_model

    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    create_model("yolov9-t", 3)
    assert torch.equal(torch.rand(4), expected)


def test_create_model_and_fit_twice_in_two_processes_give_the_same_losses(tmp_path):
    rows = []
    for name in ("a", "b"):
        _run(FIT, str(tmp_path / name))
        with open(tmp_path / name / "run" / "results.csv") as f:
            rows.append([{k: v for k, v in row.items() if k.startswith("train/")} for row in csv.DictReader(f)])
    assert len(rows[0]) == 2 and rows[0] == rows[1], rows


def test_fit_seeds_repeats_a_run_with_other_seeds_and_gives_their_spread(tmp_path):
    from yolo9kit.config import TrainConfig
    from yolo9kit.data import make_shapes
    from yolo9kit.train import fit_seeds

    data = make_shapes(tmp_path / "data", n_train=8, n_val=2, imgsz=64, num_classes=3, seed=5)
    config = TrainConfig(epochs=1, batch_size=4, imgsz=64, device="cpu", workers=0, project=str(tmp_path),
                         name="grid", plots=False, seed=4)
    spread = fit_seeds("yolov9-t", data, config, seeds=2)
    assert spread.table["seed"].tolist() == [4, 5]
    assert [r.save_dir.name for r in spread.results] == ["grid-seed4", "grid-seed5"]
    first, second = (r.results[0]["train/box_loss"] for r in spread.results)
    assert first != second  # other initial weights and data order
    summary = spread.summary()
    assert list(summary.index) == ["mAP50", "mAP50-95", "best mAP50", "best mAP50-95"]
    assert (summary["seeds"] == 2).all()
    assert summary.loc["mAP50", "range"] == abs(spread.table["mAP50"].diff().iloc[1])
    assert spread.within(summary.loc["mAP50", "range"]) and not spread.within(summary.loc["mAP50", "range"] + 0.01)
    assert "over 2 seeds" in str(spread)


def test_fit_seeds_refuses_a_module_and_repeated_seeds():
    import pytest

    from yolo9kit import create_model
    from yolo9kit.config import TrainConfig
    from yolo9kit.train import fit_seeds

    with pytest.raises(TypeError, match="model name or file"):
        fit_seeds(create_model("yolov9-t", 3), None, TrainConfig())
    with pytest.raises(ValueError, match="each once"):
        fit_seeds("yolov9-t", None, TrainConfig(), seeds=[1, 1])


def test_train_seeds_refuses_what_it_cannot_repeat_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "yolo9kit", "train", "--seeds", "2", "--resume"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--seeds N takes N >= 1 new runs" in proc.stderr, proc.stderr
