"""Bad data is refused or repaired before training, and every command-line error is one line and an exit code.

Each case is a row of docs/faults.md. The data sets are the 64-pixel shapes set (4 training
images, 2 validation images, 2 classes).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from conftest import REPO

from yolo9kit.cli import main, one_line
from yolo9kit.config import TrainConfig
from yolo9kit.data import DataError, YOLODataset, check, create_dataloader, make_shapes


@pytest.fixture()
def shapes(tmp_path) -> Path:
    return make_shapes(tmp_path / "shapes", n_train=4, n_val=2, imgsz=64, num_classes=2)


def _names(data_yaml: Path, names: list[str]) -> None:
    config = yaml.safe_load(data_yaml.read_text())
    data_yaml.write_text(yaml.safe_dump({**config, "names": names}))


def _train_labels(data_yaml: Path) -> list[Path]:
    return sorted((data_yaml.parent / "labels" / "train").glob("*.txt"))


def _one_unnamed_class(data_yaml: Path) -> None:
    """One training image labelled with class 1, the others (and the val images) with class 0; then ``names``
    loses class 1."""
    for i, label in enumerate(_train_labels(data_yaml)):
        label.write_text(f"{int(i == 0)} 0.5 0.5 0.2 0.2\n")
    for label in (data_yaml.parent / "labels" / "val").glob("*.txt"):
        label.write_text("0 0.5 0.5 0.2 0.2\n")
    _names(data_yaml, ["rectangle"])


def _run(argv: list[str], capsys) -> tuple[int, str]:
    """Exit code and everything printed (stdout and stderr) of ``python -m yolo9kit ARGV`` run in-process."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse errors
        code = e.code
    captured = capsys.readouterr()
    return code, captured.err + captured.out


def _one_error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


# ---- training refuses labels it would silently lose ---------------------------------------------------------

def _fit(data: Path, tmp_path: Path, **changes):
    """fit a toy network (one class, like the shortened names) on ``data``: the real training loader."""
    from train_toys import ToyNet, toy_loss

    from yolo9kit.train.fit import fit

    config = TrainConfig(epochs=1, batch_size=2, imgsz=64, workers=0, device="cpu", val=False, progress_bar=False,
                         project=str(tmp_path / "runs"), warmup_min_batches=0, **changes)
    return fit(ToyNet(), data, config, loss_fn=toy_loss, validate_fn=lambda model: {"fitness": 0.0})


def test_labels_with_unnamed_classes_stop_training_before_the_first_step(shapes, tmp_path):
    _one_unnamed_class(shapes)
    steps = []
    with pytest.raises(DataError) as error:
        _fit(shapes, tmp_path, callbacks={"on_batch": steps.append})
    message = str(error.value)
    assert str(shapes) in message and "(train split)" in message and "class id 1" in message
    assert "names has 1" in message and "1 of 4 images would be left out" in message
    assert "allow_bad_labels=True" in message
    assert steps == []
    assert not list((tmp_path / "runs").rglob("*.pt"))


def test_allow_bad_labels_trains_on_what_is_left(shapes, tmp_path):
    _one_unnamed_class(shapes)
    steps = []
    result = _fit(shapes, tmp_path, allow_bad_labels=True, callbacks={"on_batch": steps.append})
    assert len(steps) == 2 and result.epochs_completed == 1  # the 3 images left: batches of 2 and 1


def test_a_training_split_without_labels_is_refused(shapes):
    for label in _train_labels(shapes):
        label.unlink()
    with pytest.raises(DataError, match=r"none of the 4 usable images has a box \(4 without a label file"):
        create_dataloader(shapes, "train", imgsz=64, batch_size=2, workers=0)
    loader = create_dataloader(shapes, "train", imgsz=64, batch_size=2, workers=0, allow_bad_labels=True)
    assert len(loader.dataset) == 4
    assert len(create_dataloader(shapes, "val", imgsz=64, batch_size=2, workers=0).dataset) == 2  # val never refused


def test_more_than_a_tenth_of_the_labelled_images_dropped_is_refused(tmp_path, caplog):
    shapes = make_shapes(tmp_path / "ten", n_train=10, n_val=1, imgsz=64, num_classes=2)
    labels = _train_labels(shapes)
    labels[0].write_text("0 0.5 0.5 0.2\n")  # 1 of 10 dropped: at the limit, kept
    with caplog.at_level(logging.WARNING):
        assert len(YOLODataset(shapes, "train", imgsz=64).im_files) == 9
    assert f"`python -m yolo9kit data check {shapes} --split train` lists them" in caplog.text  # a shell command
    labels[1].write_text("0 0.5 1.5 0.2 0.2\n")  # 2 of 10: refused
    with pytest.raises(DataError) as error:
        YOLODataset(shapes, "train", imgsz=64)
    assert "2 of 10 images with labels would be left out" in str(error.value)
    assert f"python -m yolo9kit data check {shapes} --split train" in str(error.value)
    assert len(YOLODataset(shapes, "train", imgsz=64, allow_bad_labels=True).im_files) == 8


@pytest.mark.slow  # builds yolov9-t
def test_train_cli_prints_the_data_error_as_one_line(shapes, tmp_path, capsys):
    _one_unnamed_class(shapes)
    code, text = _run(["train", "--data", str(shapes), "--model", "yolov9-t", "--epochs", "1", "--imgsz", "64",
                       "--batch-size", "2", "--workers", "0", "--device", "cpu", "--project", str(tmp_path / "r")],
                      capsys)
    assert code == 2
    errors = [line for line in text.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in text
    assert str(shapes) in errors[0] and "class id 1" in errors[0]


# ---- images and label files ----------------------------------------------------------------------------------

def test_jpeg_with_trailing_bytes_is_kept_with_a_warning_and_left_unchanged(shapes):
    image = sorted((shapes.parent / "images" / "train").glob("*.jpg"))[0]
    clean = cv2.imread(str(image))
    trailing = b"\x00trailing bytes after the end marker" * 4
    data = image.read_bytes() + trailing
    image.write_bytes(data)
    report = check(shapes, use_cache=False)
    assert report.ok and report.n_usable == 4
    (row,) = [p for p in report.problems if p.file == str(image)]
    assert row.severity == "warning" and f"{len(trailing)} bytes after the JPEG end-of-image marker" in row.reason
    dataset = YOLODataset(shapes, "train", imgsz=64, cache="ram")
    index = dataset.im_files.index(str(image))
    np.testing.assert_array_equal(dataset.load_image(index), clean)  # the pixels of the image, not of a re-save
    assert image.read_bytes() == data  # the user's file is never rewritten


def test_truncated_jpeg_is_still_an_error(shapes):
    """A JPEG cut short is dropped, also when an end-of-image marker sits earlier in it (a comment here; an EXIF
    thumbnail in camera files) and garbage follows the cut."""
    image = sorted((shapes.parent / "images" / "train").glob("*.jpg"))[0]
    cv2.imwrite(str(image), np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8))
    from PIL import Image

    with Image.open(image) as im:
        im.load()
        im.save(image, comment=b"a thumbnail ends with \xff\xd9 too")
    data = image.read_bytes()
    image.write_bytes(data[: len(data) * 2 // 3] + b"garbage")
    report = check(shapes, use_cache=False)
    (row,) = [p for p in report.problems if p.file == str(image)]
    assert row.severity == "error" and "truncated JPEG" in row.reason


def test_label_files_without_an_image_are_reported(shapes, tmp_path):
    labels = shapes.parent / "labels" / "train"
    (labels / "ghost.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (labels / "classes.txt").write_text("rectangle\nellipse\n")  # labelImg's names file is not a label
    report = check(shapes)
    assert report.n_orphan_labels == 1 and "1 label files without an image" in report.summary()
    (row,) = [p for p in report.problems if "ghost" in p.file]
    assert row.file == str(labels / "ghost.txt") and row.severity == "warning" and "no image" in row.reason
    assert report.ok  # reported, nothing left out
    assert YOLODataset(shapes, "train", imgsz=64).report.n_orphan_labels == 1
    listed = tmp_path / "list.yaml"  # a list file may share its label folder with other splits: not searched
    images = sorted(str(p) for p in (shapes.parent / "images" / "train").glob("*.jpg"))
    (tmp_path / "train.txt").write_text("\n".join(images[:2]) + "\n")
    listed.write_text(yaml.safe_dump({"path": str(tmp_path), "train": "train.txt", "val": "train.txt",
                                      "names": ["rectangle", "ellipse"]}))
    assert check(listed).n_orphan_labels == 0


def test_data_check_on_an_empty_split_exits_non_zero_with_one_line(shapes, capsys):
    for image in (shapes.parent / "images" / "val").glob("*.jpg"):
        image.unlink()
    code, text = _run(["data", "check", str(shapes), "--split", "val"], capsys)
    assert code == 2
    line = _one_error_line(text)
    assert "the val split has no images" in line and str(shapes) in line
    with pytest.raises(DataError, match="has no images"):
        check(shapes, split="val")


# ---- --cache disk on read-only data ---------------------------------------------------------------------------

def test_disk_cache_on_read_only_data_falls_back_to_ram(shapes, caplog, monkeypatch):
    folder = shapes.parent / "labels"  # the disk image cache is written beside the label cache
    check(shapes)  # the label cache exists; only the image cache is new
    if os.geteuid() == 0:
        # root writes into a read-only folder anyway: the failure chmod would cause is simulated
        import yolo9kit.data.cache as disk_cache

        def refuse(*args, **kwargs):
            raise PermissionError(13, "Permission denied", str(folder))

        monkeypatch.setattr(disk_cache, "write_file", refuse)
    else:
        folder.chmod(0o555)
    try:
        with caplog.at_level(logging.WARNING):
            dataset = YOLODataset(shapes, "train", imgsz=64, cache="disk")
    finally:
        folder.chmod(0o755)
    assert dataset.images is not None and not hasattr(dataset.images, "path")  # RAM, not a memory map
    assert f"cannot write the image cache in {folder}" in caplog.text and "in RAM instead" in caplog.text
    np.testing.assert_array_equal(dataset.images[0], YOLODataset(shapes, "train", imgsz=64).load_image(0))
    assert not list(folder.glob("*.yolo9kit-images"))


# ---- command-line errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, flag", [
    (["train", "--batch-size", "0", "--data", "X"], "--batch-size"),
    (["val", "--batch-size", "0", "--data", "X", "--weights", "yolov9-t"], "--batch-size"),
    (["detect", "--imgsz", "0", "--weights", "yolov9-t", "--source", "X"], "--imgsz"),
    (["train", "--device", "banana", "--data", "X"], "--device"),
], ids=["train-batch-0", "val-batch-0", "detect-imgsz-0", "train-device-banana"])
def test_the_four_errors_of_the_issue_are_one_line(argv, flag, capsys):
    code, text = _run(argv, capsys)
    assert code == 2
    line = _one_error_line(text)
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
    code, text = _run(argv, capsys)
    assert code == 2
    assert expected in _one_error_line(text)


def test_conflicting_and_out_of_range_train_settings_are_one_line(tmp_path, capsys):
    missing = str(tmp_path / "missing.yaml")  # never read: the settings are refused first
    code, text = _run(["train", "--data", missing, "--batch-size", "2", "--micro-batch-size", "4"], capsys)
    assert code == 2 and "micro_batch_size=4: expected at most batch_size=2" in _one_error_line(text)
    hyp = tmp_path / "hyp.yaml"
    hyp.write_text("lr0: -0.01\n")
    code, text = _run(["train", "--data", missing, "--hyp", str(hyp)], capsys)
    assert code == 2 and "lr0=-0.01: expected a finite number > 0" in _one_error_line(text)
    hyp.write_text("mosaic: 1.5\n")
    code, text = _run(["train", "--data", missing, "--hyp", str(hyp)], capsys)
    assert code == 2 and "['mosaic']=1.5: expected a probability in [0, 1]" in _one_error_line(text)
    with pytest.raises(ValueError, match="micro_batch_size"):
        TrainConfig(batch_size=2, micro_batch_size=4)


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
    code, text = _run(["train", "--data", str(tmp_path / "missing.yaml"), "--hyp", str(hyp)], capsys)
    assert code == 2 and f"--hyp {hyp}: {line.split(':')[0]}: " in _one_error_line(text)
    assert expected in _one_error_line(text)


def test_errors_while_running_are_one_line_and_verbose_shows_the_traceback(tmp_path, capsys):
    missing = str(tmp_path / "missing.pt")
    argv = ["val", "--data", "X", "--weights", missing, "--project", str(tmp_path / "runs")]
    code, text = _run(argv, capsys)
    assert code == 2
    assert f"python -m yolo9kit val: error: weights {missing} not found" in _one_error_line(text)
    assert not (tmp_path / "runs").exists()  # no empty run folder left behind
    with pytest.raises(FileNotFoundError):
        main(["-v", *argv])
    with pytest.raises(FileNotFoundError):  # -v after the verb works too (val's own --verbose included)
        main([*argv, "--verbose"])
    with pytest.raises(FileNotFoundError):
        main(["train", "--data", str(tmp_path / "missing.yaml"), "--weights", missing, "-v",
              "--project", str(tmp_path / "runs")])


def test_failures_and_interrupts_have_their_own_exit_codes(monkeypatch, capsys):
    import yolo9kit.cli

    def fails(args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be ...")

    monkeypatch.setattr(yolo9kit.cli, "run_models", fails)
    code, text = _run(["models"], capsys)
    line = _one_error_line(text)
    assert code == 1 and "models: failed (RuntimeError): CUDA error: an illegal memory access" in line
    assert "--verbose" in line

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(yolo9kit.cli, "run_models", interrupted)
    code, text = _run(["models"], capsys)
    assert code == 130 and _one_error_line(text) == "python -m yolo9kit models: interrupted"


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


def test_the_shell_sees_one_line_and_exit_code_2():
    """The whole process, as a shell runs it: no traceback, one line on stderr, exit code 2."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "yolo9kit", "train", "--device", "banana", "--data", "X"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert _one_error_line(done.stderr).startswith("python -m yolo9kit train: error: argument --device: 'banana'")


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
