"""Nothing lost, round two: what a resume, a save and the settings refuse, and what a run says instead of
training on nothing. Each case is a row of docs/faults.md."""

from __future__ import annotations

import csv
import logging
import resource
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from train_toys import ToyNet, make_batches, one_thread, toy_loss

from yolo9kit.cli import main
from yolo9kit.config import TrainConfig
from yolo9kit.env import memory_limits
from yolo9kit.models.checkpoint import read_checkpoint
from yolo9kit.train.fit import fit
from yolo9kit.train.guards import NonFiniteWeightsError

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def _config(tmp_path, **kw):
    base = dict(epochs=2, batch_size=2, accumulate_steps=1, amp="off", device="cpu", warmup_epochs=0.0,
                warmup_min_batches=0, project=str(tmp_path / "runs"), name="exp", lr0=0.01, progress_bar=False,
                plots=False)
    return TrainConfig(**{**base, **kw})


def _fit(config, validate, model=None, **kw):
    torch.manual_seed(3)
    return fit(model or ToyNet(), None, config, loss_fn=toy_loss, train_loader=make_batches(3, 2),
               validate_fn=validate, **kw)


def _fitness(*values):
    """A validation whose fitness is ``values[i]`` at its i-th call."""
    calls = []

    def validate(model):
        f = values[min(len(calls), len(values) - 1)]
        calls.append(f)
        return {"precision": f, "recall": f, "map50": f, "map50_95": f, "fitness": f}

    validate.calls = calls
    return validate


def _poison(path, where: str) -> None:
    """Write NaN into the training state of a checkpoint (the weights' checksum stays valid)."""
    ckpt = torch.load(path, weights_only=True)
    if where == "optimizer":
        state = next(iter(ckpt["optimizer"]["state"].values()))
        state["momentum_buffer"].fill_(float("nan"))
    else:
        ckpt["scaler"] = {"scale": float("nan"), "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
                          "_growth_tracker": 0}
    torch.save(ckpt, path)


@pytest.mark.parametrize("where", ["optimizer", "scaler"])
def test_resume_refuses_a_training_state_that_is_not_finite(tmp_path, where):
    first = _fit(_config(tmp_path, epochs=1), _fitness(0.5))
    best = first.best.read_bytes()
    _poison(first.last, where)
    with pytest.raises(ValueError, match=r"its training state is not finite \(1 entries hold NaN or Inf, e\.g\. "
                                         rf"{where}\."):
        _fit(_config(tmp_path, epochs=2, resume=str(first.last)), _fitness(0.0))
    assert first.best.read_bytes() == best


def test_resume_refuses_a_model_of_other_classes_or_names(tmp_path):
    first = _fit(_config(tmp_path, epochs=1), _fitness(0.5))
    other = ToyNet()
    other.names = ["something else"]
    with pytest.raises(ValueError, match=r"class names \['something else'\] are not the run's \['thing'\]"):
        _fit(_config(tmp_path, epochs=2, resume=str(first.last)), _fitness(0.5), model=other)
    other.nc, other.names = 2, ["a", "b"]
    with pytest.raises(ValueError, match="the model predicts 2 classes, the run 1"):
        _fit(_config(tmp_path, epochs=2, resume=str(first.last)), _fitness(0.5), model=other)


def test_non_finite_weights_are_never_saved(tmp_path):
    """Weights that turned NaN in epoch 1 (the second; messages count from 1): nothing is written, and
    best.pt and last.pt of epoch 0 are the files a user is left with."""
    def nan_after_epoch_0(record):
        if record.epoch == 1:
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))

    model = ToyNet()
    config = _config(tmp_path, epochs=3, callbacks={"on_batch": nan_after_epoch_0})
    with pytest.raises(NonFiniteWeightsError, match=r"epoch 2, best\.pt: the weights hold NaN or Inf") as info:
        _fit(config, _fitness(0.2, 0.5), model=model)
    assert f"last good checkpoint is {tmp_path / 'runs' / 'exp' / 'weights' / 'last.pt'}" in str(info.value)
    weights = tmp_path / "runs" / "exp" / "weights"
    for name in ("best.pt", "last.pt"):
        saved = read_checkpoint(weights / name)
        assert saved["progress"]["epoch"] == 1 and all(torch.isfinite(v).all() for v in saved["model"].values())


def test_a_fitness_of_zero_never_replaces_a_better_best(tmp_path):
    run = _fit(_config(tmp_path, epochs=3), _fitness(0.4, 0.0, 0.0))
    assert run.best_epoch == 0 and read_checkpoint(run.best)["progress"]["best_epoch"] == 0
    zero = _fit(_config(tmp_path, name="zero", epochs=2), _fitness(0.0, 0.0))
    assert zero.best.is_file() and read_checkpoint(zero.best)["progress"]["epoch"] == 1  # the first 0 makes best.pt
    tie = _fit(_config(tmp_path, name="tie", epochs=2), _fitness(0.3, 0.3))
    assert tie.best_epoch == 1  # a positive tie replaces it, as the official code does


def test_a_run_stopped_during_its_last_validation_is_validated_by_its_resume(tmp_path):
    calls = []

    def ctrl_c_in_the_last_validation(model):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {"precision": 0.1, "recall": 0.1, "map50": 0.1, "map50_95": 0.1, "fitness": 0.1}

    stopped = _fit(_config(tmp_path, epochs=2), ctrl_c_in_the_last_validation)
    assert stopped.interrupted_by == "KeyboardInterrupt" and stopped.epochs_completed == 2
    rows = list(csv.DictReader(open(stopped.save_dir / "results.csv")))
    assert rows[-1]["fitness"] == ""  # the epoch is kept without its metrics
    resumed = _fit(_config(tmp_path, epochs=2, resume=str(stopped.last)), _fitness(0.6))
    rows = list(csv.DictReader(open(resumed.save_dir / "results.csv")))
    assert len(rows) == 2 and float(rows[-1]["fitness"]) == pytest.approx(0.6)
    assert resumed.best_epoch == 1 and read_checkpoint(resumed.best)["progress"]["best_fitness"] == pytest.approx(0.6)


def test_batches_whose_boxes_no_anchor_holds_are_named(caplog):
    """At 32 pixels a box of a tenth of the image holds no anchor point of any level: the batch trains on
    background only, and the epoch says so once."""
    from yolo9kit.models import create_model
    from yolo9kit.train.loop import train_one_epoch
    from yolo9kit.train.state import Progress
    from yolo9kit.train.step import build_trainer

    torch.manual_seed(0)
    model = create_model("yolov9-t", num_classes=1)
    config = TrainConfig(epochs=1, batch_size=2, imgsz=32, amp="off", device="cpu", warmup_epochs=0.0,
                         warmup_min_batches=0)
    trainer = build_trainer(model, config)
    tiny = torch.tensor([[0, 0, 0.31, 0.31, 0.02, 0.02], [1, 0, 0.62, 0.62, 0.02, 0.02]])
    batches = [(torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8), tiny)] * 2
    with caplog.at_level(logging.WARNING):
        train_one_epoch(trainer, batches, config, Progress(), batches_per_epoch=2, warmup=0, progress_bar=False)
    assert "2 of 2 batches had boxes but none of them held an anchor (at 32x32 px)" in caplog.text


def test_batch_auto_on_the_cpu_is_bounded_by_the_process_limit():
    """Under ``prlimit --as`` (here: setrlimit in the child) the CPU batch is sized against what the process may
    still map, not the machine's RAM."""
    code = ("import torch; from yolo9kit.memory.gpus import host_memory; m = host_memory(); "
            "print(m.name); print(m.total_bytes)")

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                         preexec_fn=limit)
    name, total = run.stdout.split("\n")[:2]
    assert run.returncode == 0, run.stderr
    assert name == "CPU RAM (RLIMIT_AS limit)" and 0 < int(total) < 6 << 30


def test_memory_limits_read_cgroup_v1_and_v2(tmp_path):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 16000000 kB\nMemAvailable: 8000000 kB\n")
    (proc / "self" / "status").write_text("VmSize: 1000 kB\n")
    root = tmp_path / "cgroup"
    (root / "job").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("0::/job\n")
    (root / "job" / "memory.max").write_text(f"{4 << 30}\n")
    (root / "job" / "memory.current").write_text(f"{1 << 30}\n")
    assert memory_limits(proc, root)["cgroup"] == 3 << 30 and memory_limits(proc, root)["RAM"] == 8_192_000_000
    (root / "job" / "memory.max").write_text("max\n")
    assert "cgroup" not in memory_limits(proc, root)
    (proc / "self" / "cgroup").write_text("4:memory:/box\n")
    (root / "memory" / "box").mkdir(parents=True)
    (root / "memory" / "box" / "memory.limit_in_bytes").write_text(f"{2 << 30}\n")
    (root / "memory" / "box" / "memory.usage_in_bytes").write_text(f"{1 << 29}\n")
    assert memory_limits(proc, root)["cgroup"] == (2 << 30) - (1 << 29)


def test_hyp_files_that_are_not_plain_yaml_are_one_line_naming_the_file(tmp_path, capsys):
    (tmp_path / "broken.yaml").write_text("lr0: [1\n")
    (tmp_path / "tag.yaml").write_text("lr0: !!python/object/apply:os.system ['echo hi']\n")
    for name, problem in (("broken.yaml", "line 2"), ("tag.yaml", "could not determine a constructor")):
        assert main(["train", "--data", "x.yaml", "--hyp", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--hyp {tmp_path / name}" in err and problem in err


def test_freezing_every_layer_is_one_line(tmp_path, capsys):
    from yolo9kit.data import make_shapes

    data = make_shapes(tmp_path / "shapes", n_train=2, n_val=1, imgsz=64)
    assert main(["train", "--data", str(data), "--model", "yolov9-t", "--freeze", "30", "--imgsz", "64",
                 "--batch-size", "2", "--workers", "0", "--project", str(tmp_path / "runs")]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "freeze=30 freezes every layer of yolov9-t (30 layers" in captured.err
    assert captured.out.count("freezing layers") <= 1 and not (tmp_path / "runs").exists()


def test_settings_refuse_fractional_counts():
    for name in ("epochs", "patience", "close_mosaic", "seed"):
        with pytest.raises(ValueError, match=rf"TrainConfig\.{name}=2\.5: expected a whole number"):
            TrainConfig(**{name: 2.5})
    with pytest.raises(ValueError, match="micro_batch_size=1.5: expected a whole number or None"):
        TrainConfig(micro_batch_size=1.5)


def test_a_run_with_batch_auto_that_fails_at_once_leaves_no_folder(tmp_path):
    """The automatic batch's record (auto_batch.json) goes with the folder of a run that fails before its
    first checkpoint: nothing is left behind."""
    from yolo9kit.data import make_shapes
    from yolo9kit.models import create_model

    data = make_shapes(tmp_path / "shapes", n_train=2, n_val=1, imgsz=64)

    class BrokenLoader:  # fails at the first batch, after the batch was chosen and recorded
        def __len__(self):
            return 1

        def __iter__(self):
            raise ValueError("the first batch could not be read")

    config = _config(tmp_path, epochs=1, batch_size="auto", accumulate_steps=None, imgsz=64, workers=0)
    with pytest.raises(ValueError, match="could not be read"):
        fit(create_model("yolov9-t", num_classes=4), data, config, train_loader=BrokenLoader(),
            validate_fn=lambda model: {})
    assert not (tmp_path / "runs").exists()
