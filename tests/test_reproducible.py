"""Same settings, same numbers: a model made from a name starts from the same weights in every process, and
``create_model`` + ``fit`` run twice in separate processes give the same losses (docs/training.md, "What is
reproducible")."""

from __future__ import annotations

import csv
import importlib
import os
import signal
import subprocess
import sys
import textwrap

import pytest
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
    from yolo9kit.train.fit import fit
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    from yolo9kit.extras import fit_seeds

    data = make_shapes(tmp_path / "data", n_train=8, n_val=2, imgsz=64, num_classes=3, seed=5)
    config = TrainConfig(epochs=1, batch_size=4, imgsz=64, device="cpu", workers=0, project=str(tmp_path),
                         name="grid", plots=False, seed=4)
    spread = fit_seeds("yolov9-t", data, config, seeds=2)
    assert spread.table["seed"].tolist() == [4, 5]
    assert [r.save_dir.name for r in spread.results] == ["grid-seed-4", "grid-seed-5"]
    first, second = (r.results[0]["train/box_loss"] for r in spread.results)
    assert first != second  # other initial weights and data order
    summary = spread.summary()
    assert list(summary.index) == ["mAP50", "mAP50-95", "best mAP50", "best mAP50-95"]
    assert (summary["seeds"] == 2).all() and spread.table["state"].tolist() == ["finished", "finished"]
    assert summary.loc["mAP50", "range"] == abs(spread.table["mAP50"].diff().iloc[1])
    assert spread.within(summary.loc["mAP50", "range"]) and not spread.within(summary.loc["mAP50", "range"] + 0.01)
    assert "over 2 finished seeds" in str(spread)
    again = fit_seeds("yolov9-t", data, config, seeds=2)  # the same call again: both seeds finished, none retrained
    assert again.results == () and again.table.equals(spread.table)


def test_fit_seeds_refuses_a_module_and_repeated_seeds():
    import pytest

    from yolo9kit import create_model
    from yolo9kit.config import TrainConfig
    from yolo9kit.extras import fit_seeds

    with pytest.raises(TypeError, match="model name or file"):
        fit_seeds(create_model("yolov9-t", 3), None, TrainConfig())
    with pytest.raises(ValueError, match="each once"):
        fit_seeds("yolov9-t", None, TrainConfig(), seeds=[1, 1])


def test_train_seeds_refuses_what_it_cannot_repeat_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "yolo9kit", "train", "--seeds", "2", "--resume"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--seeds N takes N >= 1 new runs" in proc.stderr, proc.stderr


def _toy_fit(stop_at=None):
    """``fit`` as ``fit_seeds`` calls it, on the toy model and batches: a real run folder in a second, not a
    minute; ``stop_at``: SIGTERM to this process at that on_batch call."""
    from train_toys import ToyNet, make_batches, toy_loss

    from yolo9kit.train.fit import fit

    calls = []

    def signal_at(record):
        calls.append(1)
        if len(calls) == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)

    def toy(model, data, config):
        torch.manual_seed(config.run.seed)
        net = ToyNet()
        return fit(net, None, config.replace(callbacks={"on_batch": signal_at}), loss_fn=toy_loss,
                   train_loader=make_batches(2, 2), validate_fn=lambda ema: _toy_scores(ema, config.run.seed))

    return toy


def _toy_scores(model, seed):
    score = 0.1 + 0.01 * seed
    return {"precision": 0.5, "recall": 0.5, "map50": score, "map50_95": score, "fitness": score}


def test_a_stop_ends_the_seeds_command_and_the_same_command_continues_it(tmp_path, monkeypatch, capsys):
    """SIGTERM in seed 5 of 4, 5, 6: the command exits 143 after it (seed 6 not begun); the spread counts only
    the finished seed. The same command again skips seed 4, resumes seed 5 from its last.pt and trains seed 6,
    in folders that read as their seeds."""
    from yolo9kit.cli import main

    seeds_module = importlib.import_module("yolo9kit.extras.experiments")
    command = ["train", "--data", "unused.yaml", "--seeds", "3", "--seed", "4", "--epochs", "2", "--batch-size",
               "2", "--device", "cpu", "--no-plots", "--project", str(tmp_path), "--name", "c"]
    monkeypatch.setattr(seeds_module, "fit", _toy_fit(stop_at=4 + 3))  # seed 4: calls 1-4; seed 5: its 2nd epoch
    assert main(command) == 143
    out = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c-seed-4", "c-seed-5"]
    assert "over 1 finished seeds" in out and "1 of the 2 runs did not finish" in out
    assert (tmp_path / "c-seed-5" / "weights" / "last.pt").is_file()
    first = (tmp_path / "c-seed-4" / "results.csv").read_bytes()

    monkeypatch.setattr(seeds_module, "fit", _toy_fit())
    assert main(command) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c-seed-4", "c-seed-5", "c-seed-6"]
    assert (tmp_path / "c-seed-4" / "results.csv").read_bytes() == first  # skipped, not trained again
    with open(tmp_path / "c-seed-5" / "results.csv") as f:
        assert [row["epoch"] for row in csv.DictReader(f)] == ["0", "1"]  # resumed: each epoch once
    assert "over 3 finished seeds" in out and "did not finish" not in out
    assert "range 0.1400-0.1600" in out  # the scores of seeds 4, 5 and 6
    longer = [*command[:command.index("--epochs") + 1], "3", *command[command.index("--epochs") + 2:]]
    assert main(longer) == 2  # the name of finished seeds with other settings: refused, not mixed in
    assert "c-seed-4 holds a finished run with other settings: epochs 2 (now 3)" in capsys.readouterr().err


def test_the_number_of_seeds_is_bounded_before_anything_is_made(tmp_path, capsys):
    from yolo9kit.cli import main

    assert main(["train", "--data", str(tmp_path / "none.yaml"), "--seeds", "30000000",
                 "--project", str(tmp_path / "runs")]) == 2
    assert "1 to 100 seeds" in capsys.readouterr().err and not (tmp_path / "runs").exists()
