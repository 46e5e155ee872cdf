"""The command line and the settings under faults (yolo9kit/cli, yolo9kit/config): every error is one line and
its exit code, flags, --hyp files and settings are checked before any work, and a refused command leaves no folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO
from fault_checks import one_error_line, one_unnamed_class, run_cli
from train_toys import ToyNet, one_thread

from yolo9kit.cli import main, one_line
from yolo9kit.config import TrainConfig

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.mark.parametrize("argv, flag", [
    (["train", "--batch-size", "0", "--data", "X"], "--batch-size"),
    (["val", "--batch-size", "0", "--data", "X", "--weights", "yolov9-t"], "--batch-size"),
    (["detect", "--imgsz", "0", "--weights", "yolov9-t", "--source", "X"], "--imgsz"),
    (["train", "--device", "banana", "--data", "X"], "--device"),
], ids=["train-batch-0", "val-batch-0", "detect-imgsz-0", "train-device-banana"])
def test_the_four_errors_of_the_issue_are_one_line(argv, flag, capsys):
    code, text = run_cli(argv, capsys)
    assert code == 2
    line = one_error_line(text)
    assert f"python -m yolo9kit {argv[0]}: error: argument {flag}" in line and "--help" in line


@pytest.mark.parametrize("argv, expected", [
    (["train", "--data", "X", "--imgsz", "100"], "multiple of 32"),
    (["train", "--data", "X", "--workers", "-1"], "integer >= 0"),
    (["train", "--data", "X", "--epochs", "0"], "integer >= 1"),
    (["train", "--data", "X", "--cache", "banana"], "choose from 'ram', 'disk'"),
    (["train", "--data", "X", "--margin", "1.5"], "[0, 1)"),
    (["train", "--data", "X", "--device", "0"], "CUDA"),
    (["train", "--data", "X", "--device", "0,1"], "torchrun"),
    (["val", "--data", "X", "--weights", "W", "--conf-thres", "2"], "[0, 1]"),
    (["val", "--data", "X", "--weights", "W", "--workers", "-2"], "integer >= 0"),
    (["detect", "--weights", "W", "--source", "S", "--iou-thres", "nan"], "[0, 1]"),
    (["detect", "--weights", "W", "--source", "S", "--max-det", "0"], "integer >= 1"),
    (["profile", "--batch-size", "8", "0"], "integer >= 1"),
    (["data", "make-shapes", "--out", "O", "--num-classes", "0"], "integer >= 1"),
])
def test_arguments_are_checked_before_any_work(argv, expected, capsys):
    if argv[-1] == "0" and argv[-2] == "--device":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA: --device 0 is valid here")
    code, text = run_cli(argv, capsys)
    assert code == 2
    assert expected in one_error_line(text)


def test_device_flag_is_checked_against_the_machine(monkeypatch):
    """The CUDA branches, on any machine: one card is pretended."""
    import argparse

    import torch

    from yolo9kit.cli.train import device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert [device(d) for d in ("0", "cuda", "cuda:0", "cpu", "")] == ["0", "cuda", "cuda:0", "cpu", ""]
    for text, expected in (("1", "has 1 CUDA device(s), 0..0"), ("cuda:3", "has 1 CUDA device(s)"),
                           ("gpu", "expected cpu, cuda"), ("meta", "expected cpu, cuda")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(expected)):
            device(text)


def test_the_shell_sees_one_line_and_exit_code_2():
    """The whole process, as a shell runs it: no traceback, one line on stderr, exit code 2."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "yolo9kit", "train", "--device", "banana", "--data", "X"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert one_error_line(done.stderr).startswith("python -m yolo9kit train: error: argument --device: 'banana'")


def test_conflicting_and_out_of_range_train_settings_are_one_line(tmp_path, capsys):
    missing = str(tmp_path / "missing.yaml")  # never read: the settings are refused first
    code, text = run_cli(["train", "--data", missing, "--batch-size", "2", "--micro-batch-size", "4"], capsys)
    assert code == 2 and "micro_batch_size=4: expected at most batch_size=2" in one_error_line(text)
    hyp = tmp_path / "hyp.yaml"
    hyp.write_text("lr0: -0.01\n")
    code, text = run_cli(["train", "--data", missing, "--hyp", str(hyp)], capsys)
    assert code == 2 and "lr0=-0.01: expected a finite number > 0" in one_error_line(text)
    hyp.write_text("mosaic: 1.5\n")
    code, text = run_cli(["train", "--data", missing, "--hyp", str(hyp)], capsys)
    assert code == 2 and "['mosaic']=1.5: expected a probability in [0, 1]" in one_error_line(text)
    with pytest.raises(ValueError, match="micro_batch_size"):
        TrainConfig(batch_size=2, micro_batch_size=4)


def test_settings_refuse_fractional_counts():
    for name in ("epochs", "patience", "close_mosaic", "seed"):
        with pytest.raises(ValueError, match=rf"TrainConfig\.{name}=2\.5: expected a whole number"):
            TrainConfig(**{name: 2.5})
    with pytest.raises(ValueError, match="micro_batch_size=1.5: expected a whole number or None"):
        TrainConfig(micro_batch_size=1.5)


@pytest.mark.parametrize(("line", "expected"), [
    ("box: -7.5", "box_gain=-7.5: expected a finite number >= 0"),  # would maximise the box loss
    ("box: .nan", "box_gain=nan: expected a finite number >= 0"),
    ("cls_pw: -1", "cls_pos_weight=-1.0: expected a finite number > 0"),
    ("warmup_epochs: .inf", "warmup_epochs=inf: expected a finite number >= 0"),  # was an OverflowError, exit 1
    ("lr0: .inf", "lr0=inf: expected a finite number > 0"),
    ("hsv_h: .inf", "['hsv_h']=inf: expected a finite number >= 0"),
])
def test_every_hyp_key_has_a_range_named_with_the_file_and_key(tmp_path, capsys, line, expected):
    hyp = tmp_path / "hyp.yaml"
    hyp.write_text(line + "\n")
    code, text = run_cli(["train", "--data", str(tmp_path / "missing.yaml"), "--hyp", str(hyp)], capsys)
    assert code == 2 and f"--hyp {hyp}: {line.split(':')[0]}: " in one_error_line(text)
    assert expected in one_error_line(text)


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


@pytest.mark.slow  # builds yolov9-t
def test_train_cli_prints_the_data_error_as_one_line(shapes4, tmp_path, capsys):
    one_unnamed_class(shapes4)
    code, text = run_cli(["train", "--data", str(shapes4), "--model", "yolov9-t", "--epochs", "1", "--imgsz", "64",
                       "--batch-size", "2", "--workers", "0", "--device", "cpu", "--project", str(tmp_path / "r")],
                      capsys)
    assert code == 2
    errors = [line for line in text.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in text
    assert str(shapes4) in errors[0] and "class id 1" in errors[0]


def test_errors_while_running_are_one_line_and_verbose_shows_the_traceback(tmp_path, capsys):
    missing = str(tmp_path / "missing.pt")
    argv = ["val", "--data", "X", "--weights", missing, "--project", str(tmp_path / "runs")]
    code, text = run_cli(argv, capsys)
    assert code == 2
    assert f"python -m yolo9kit val: error: weights {missing} not found" in one_error_line(text)
    assert not (tmp_path / "runs").exists()  # no empty run folder left behind
    with pytest.raises(FileNotFoundError):
        main(["-v", *argv])
    with pytest.raises(FileNotFoundError):  # -v after the verb works too (val's own --verbose included)
        main([*argv, "--verbose"])
    with pytest.raises(FileNotFoundError):
        main(["train", "--data", str(tmp_path / "missing.yaml"), "--weights", missing, "-v",
              "--project", str(tmp_path / "runs")])


def test_refused_detect_val_and_train_leave_no_folders(tmp_path, capsys):
    project = tmp_path / "runs"
    assert main(["detect", "--weights", str(tmp_path / "missing.pt"), "--source", str(tmp_path),
                 "--project", str(project / "detect")]) == 2
    assert main(["val", "--weights", "yolov9-t", "--data", str(tmp_path / "missing.yaml"),
                 "--project", str(project / "val")]) == 2
    assert main(["train", "--data", str(tmp_path / "missing.yaml"), "--model", "yolov9-t",
                 "--project", str(project / "train")]) == 2
    assert not project.exists(), list(project.rglob("*"))
    assert capsys.readouterr().err.count("error:") == 3


def test_failures_and_interrupts_have_their_own_exit_codes(monkeypatch, capsys):
    import yolo9kit.cli

    def fails(args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be ...")

    monkeypatch.setattr(yolo9kit.cli, "run_models", fails)
    code, text = run_cli(["models"], capsys)
    line = one_error_line(text)
    assert code == 1 and "models: failed (RuntimeError): CUDA error: an illegal memory access" in line
    assert "--verbose" in line

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(yolo9kit.cli, "run_models", interrupted)
    code, text = run_cli(["models"], capsys)
    assert code == 130 and one_error_line(text) == "python -m yolo9kit models: interrupted"


def test_cli_exit_status_says_how_the_run_ended(tmp_path, monkeypatch, capsys):
    import argparse

    from yolo9kit.cli import train as train_cli
    from yolo9kit.train.fit import FitResult

    parser = argparse.ArgumentParser()
    train_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["train", "--data", "d.yaml", "--project", str(tmp_path)])
    monkeypatch.setattr(train_cli, "create_model", lambda *a, **k: ToyNet())
    monkeypatch.setattr(train_cli, "class_names", lambda *a, **k: ["thing"])  # no data.yaml read
    for by, code in ((None, 0), ("SIGINT", 130), ("SIGTERM", 143), ("KeyboardInterrupt", 130)):
        result = FitResult(ToyNet(), None, tmp_path, 1, 0.0, -1, interrupted=by is not None, interrupted_by=by)
        monkeypatch.setattr(train_cli, "fit", lambda *a, result=result, **k: result)
        assert train_cli.run(args) == code, by
        if by:
            assert f"interrupted by {by}" in capsys.readouterr().out


def test_a_state_dict_of_another_architecture_is_summarised_in_one_line():
    from torch import nn

    def layers(widths: list[int]) -> nn.Module:  # stands in for two architectures: hundreds of tensors
        return nn.ModuleDict({f"layer{i}": nn.Conv2d(w, w, 1) for i, w in enumerate(widths)})

    with pytest.raises(RuntimeError) as error:
        layers([4] * 200).load_state_dict(layers([8] * 150 + [4] * 20 + [2] * 100).state_dict())
    assert len(str(error.value)) > 20_000  # torch lists every key
    line = one_line(error.value)
    assert len(line) < 400 and "\n" not in line
    assert "(360 tensors of another shape, 0 missing, 140 unexpected)" in line and "--weights" in line
