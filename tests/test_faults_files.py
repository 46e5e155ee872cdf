"""Nothing lost, round two: writes that cannot destroy, files that cannot exhaust the machine, converters that
cannot lie. Each case is a row of docs/faults.md."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import REPO, holding_the_lock
from torch import nn
from train_toys import one_thread

from yolo9kit.cli import main
from yolo9kit.data import check, coco_to_yolo, make_shapes
from yolo9kit.files import DiskFullError, FolderInUseError, OwnInputError
from yolo9kit.models import create_model
from yolo9kit.models.checkpoint import CheckpointError, save_checkpoint
from yolo9kit.models.weights import MAX_MODEL_BYTES, check_model

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)
DEAD_PID = 4_194_305  # above Linux's largest pid_max: no process has it


def _digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "yolov9-t.pt"
    save_checkpoint(path, create_model("yolov9-t", num_classes=2))
    return path


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return make_shapes(tmp_path_factory.mktemp("data") / "shapes", n_train=4, n_val=2, imgsz=64, num_classes=2)


# ---- data loss ----------------------------------------------------------------------------------------------

def test_export_refuses_to_write_over_its_weights(weights, capsys):
    before = _digest(weights)
    assert main(["export", str(weights), "--out", str(weights), "--imgsz", "64"]) == 2
    assert "is this command's input" in capsys.readouterr().err and _digest(weights) == before


def test_an_export_is_written_whole_or_not_at_all(weights, tmp_path, monkeypatch):
    """A write cut short (a kill, an interrupt) or a full disk leaves the old file as it was and no junk."""
    import yolo9kit.files as files
    from yolo9kit import export

    out = tmp_path / "model.onnx"
    out.write_bytes(b"the previous export")
    real_write = Path.write_bytes

    def cut_short(self, data):
        real_write(self, data[: len(data) // 3])
        raise KeyboardInterrupt  # what a kill in the middle of the write leaves: a third of the file

    monkeypatch.setattr(Path, "write_bytes", cut_short)
    with pytest.raises(KeyboardInterrupt):
        export(weights, out, imgsz=64)
    monkeypatch.undo()
    assert out.read_bytes() == b"the previous export" and os.listdir(tmp_path) == ["model.onnx"]
    monkeypatch.setattr(files, "free_bytes", lambda folder: 1000)
    with pytest.raises(DiskFullError, match=f"writing {out}"):
        export(weights, out, imgsz=64)
    assert out.read_bytes() == b"the previous export" and os.listdir(tmp_path) == ["model.onnx"]


def test_make_shapes_refuses_a_folder_with_other_files(tmp_path, capsys, caplog):
    mine = tmp_path / "mine"
    (mine / "images").mkdir(parents=True)
    (mine / "images" / "holiday.jpg").write_bytes(b"my photo")
    assert main(["data", "make-shapes", "--out", str(mine), "--n-train", "2", "--n-val", "1", "--imgsz", "64"]) == 2
    assert "already holds files" in capsys.readouterr().err
    assert (mine / "images" / "holiday.jpg").read_bytes() == b"my photo"
    make_shapes(mine, n_train=2, n_val=1, imgsz=64, overwrite=True)  # told to: replaced
    assert not (mine / "images" / "holiday.jpg").exists() and (mine / "data.yaml").is_file()
    make_shapes(mine, n_train=3, n_val=1, imgsz=64)  # another shapes set: remade from its settings, with a word
    assert len(list((mine / "images" / "train").glob("*.jpg"))) == 3 and "replacing the shapes data set" in caplog.text


def test_an_interrupted_make_shapes_keeps_the_data_set_it_replaces(tmp_path, monkeypatch):
    root = tmp_path / "shapes"
    make_shapes(root, n_train=3, n_val=1, imgsz=64)
    before = {p.name: _digest(p) for p in (root / "images" / "train").iterdir()}
    real = cv2.imwrite
    calls = {"n": 0}

    def dies_on_the_third(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(cv2, "imwrite", dies_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        make_shapes(root, n_train=5, n_val=1, imgsz=64, overwrite=True)
    assert {p.name: _digest(p) for p in (root / "images" / "train").iterdir()} == before
    assert sorted(os.listdir(tmp_path)) == ["shapes"]  # no half-written folder beside it


def _coco(images, annotations, path: Path) -> Path:
    path.write_text(json.dumps({"images": images, "categories": [{"id": 1, "name": "thing"}],
                                "annotations": annotations}))
    return path


def test_convert_coco_keeps_images_of_one_name_in_two_folders_apart(tmp_path, capsys):
    images = [{"id": 1, "file_name": "a/img1.jpg", "width": 100, "height": 100},
              {"id": 2, "file_name": "b/img1.jpg", "width": 100, "height": 100}]
    boxes = [{"image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20]},
             {"image_id": 2, "category_id": 1, "bbox": [50, 50, 20, 20]}]
    result = coco_to_yolo(_coco(images, boxes, tmp_path / "a.json"), tmp_path / "out")
    labels = tmp_path / "out" / "labels" / "train"
    assert (labels / "a" / "img1.txt").read_text() == "0 0.200000 0.200000 0.200000 0.200000\n"
    assert (labels / "b" / "img1.txt").read_text() == "0 0.600000 0.600000 0.200000 0.200000\n"
    assert result.n_boxes == 2 and result.n_images == 2
    same = [{**images[0], "id": 3}, images[0]]
    with pytest.raises(ValueError, match="both have the label file a/img1.txt"):
        coco_to_yolo(_coco(same, [], tmp_path / "b.json"), tmp_path / "other")
    # a converted folder is not converted over without --overwrite
    assert main(["data", "convert-coco", str(tmp_path / "a.json"), "--out", str(tmp_path / "out")]) == 2
    assert "data.yaml exists" in capsys.readouterr().err
    assert main(["data", "convert-coco", str(tmp_path / "a.json"), "--out", str(tmp_path / "out"),
                 "--overwrite"]) == 0


def _toy_run(tmp_path, **settings):
    from train_toys import ToyNet, make_batches, toy_loss

    from yolo9kit.config import TrainConfig
    from yolo9kit.train.fit import fit

    config = TrainConfig(**{**dict(epochs=1, batch_size=2, device="cpu", amp="off", project=str(tmp_path / "runs"),
                                   name="x", exist_ok=True, plots=False, progress_bar=False), **settings})
    return fit(ToyNet(), None, config, loss_fn=toy_loss, train_loader=make_batches(2, 2), validate_fn=lambda m: {})


def test_two_runs_into_one_folder_the_second_is_refused_naming_the_first(tmp_path):
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    other = holding_the_lock(run)
    try:
        with pytest.raises(FolderInUseError, match=f"in use by process {other.pid} on {socket.gethostname()} "
                                                   r"\(a training run\), which holds its lock .yolo9kit.lock"):
            _toy_run(tmp_path)
        assert not (run / "weights").exists()
    finally:
        other.kill()  # kill -9: the system drops its lock
        other.wait()
    result = _toy_run(tmp_path)
    assert result.last.is_file() and not (run / ".yolo9kit.lock").exists()  # taken over, released at the end


def test_a_lock_of_a_killed_process_of_another_host_is_taken_over(tmp_path, caplog):
    from yolo9kit import runs

    run = _toy_run(tmp_path).save_dir
    (run / "state.yaml").write_text("state: running\n")  # kill -9, then a restarted container of another name
    (run / ".yolo9kit.lock").write_text(f"{DEAD_PID} container-before-the-restart\n")
    assert runs(tmp_path / "runs").set_index("run").loc["x", "state"] == "killed"
    with caplog.at_level(logging.INFO, logger="yolo9kit.files"):
        resumed = _toy_run(tmp_path, epochs=2, resume=str(run))
    assert resumed.epochs_completed == 2 and not (run / ".yolo9kit.lock").exists()
    assert f"taking over the lock of process {DEAD_PID} on container-before-the-restart" in caplog.text


@pytest.mark.slow
def test_a_video_detect_stopped_by_sigterm_leaves_a_playable_video(shapes, tmp_path):
    from yolo9kit.data.sources import write_video

    frames = sorted((shapes.parent / "images" / "train").glob("*.jpg")) * 150
    video = write_video(frames, tmp_path / "clip.mp4", fps=10)
    project = tmp_path / "detect"
    proc = subprocess.Popen([sys.executable, "-m", "yolo9kit", "detect", "--weights", "yolov9-t", "--source",
                             str(video), "--imgsz", "64", "--project", str(project), "--device", "cpu"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not list(project.glob("exp/.clip.mp4.*.tmp.mp4")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(1.0)  # some frames written
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM" in err
    annotated = project / "exp" / "clip.mp4"
    reader = cv2.VideoCapture(str(annotated))
    count = 0
    while reader.read()[0]:
        count += 1
    assert 0 < count < len(frames) and not list(project.glob("exp/*.tmp*"))


# ---- tiny files, huge allocations ---------------------------------------------------------------------------

def _wide_table() -> dict:
    """yolov9-t with two 16000-wide convolutions: within every row bound, 8.6 GiB of parameters."""
    table = copy.deepcopy(create_model("yolov9-t").yaml)
    table["backbone"][1] = [-1, 1, "Conv", [16000, 3, 2]]
    table["backbone"][2] = [-1, 1, "Conv", [16000, 3, 2]]
    return table


def test_an_official_file_asking_for_a_huge_model_is_refused_before_it_is_built(tmp_path, monkeypatch):
    package, module = types.ModuleType("models"), types.ModuleType("models.yolo")

    class DetectionModel(nn.Module):  # what the official pickle names
        pass

    DetectionModel.__module__, DetectionModel.__qualname__ = "models.yolo", "DetectionModel"
    module.DetectionModel = DetectionModel
    monkeypatch.setitem(sys.modules, "models", package)
    monkeypatch.setitem(sys.modules, "models.yolo", module)
    pickled = DetectionModel()
    pickled.yaml, pickled.nc = _wide_table(), 80
    path = tmp_path / "tiny.pt"
    torch.save({"model": pickled, "epoch": -1}, path)
    monkeypatch.delitem(sys.modules, "models.yolo")
    monkeypatch.delitem(sys.modules, "models")
    assert path.stat().st_size < 16_000
    with pytest.raises(CheckpointError, match=r"8\.64 GiB of parameters .* limit of 4\.00 GiB"):
        create_model(path)


def test_a_kit_checkpoint_with_a_deep_block_is_refused_before_it_is_built(weights, tmp_path):
    """A RepNCSPELAN4 depth of thousands is within the width bound but takes minutes and gigabytes to build,
    even on the meta device: refused by the block's own repeat bound first."""
    ckpt = torch.load(weights, weights_only=True)
    table = copy.deepcopy(ckpt["model_config"]["yaml"])
    row = next(i for i, r in enumerate(table["backbone"]) if r[2] == "RepNCSPELAN4")
    table["backbone"][row] = [-1, 1, "RepNCSPELAN4", [*table["backbone"][row][3][:3], 16000]]
    ckpt["model_config"]["yaml"] = table
    path = tmp_path / "deep.pt"
    torch.save(ckpt, path)
    with pytest.raises(CheckpointError, match=r"c5 \(RepNCSP depth\)=16000: expected 1 to 64"):
        create_model(path)
    ckpt["model_config"]["yaml"] = _wide_table()
    torch.save(ckpt, path)
    with pytest.raises(CheckpointError, match="more than the limit of 4.00 GiB"):
        create_model(path)


def test_the_size_limit_is_stated_and_can_be_raised():
    table = _wide_table()
    with pytest.raises(CheckpointError, match="raise it"):
        check_model(table, 80, "wide.yaml")
    check_model(table, 80, "wide.yaml", max_model_bytes=12 << 30)  # a model that really is that large
    assert MAX_MODEL_BYTES == 4 << 30
    for name in ("yolov9-e", "gelan-e"):  # every official model is far below it
        check_model(create_model(name).yaml, 80, name)


def test_a_compressed_entry_is_refused_by_its_declared_size_before_it_is_read(weights, tmp_path, monkeypatch):
    import zipfile

    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(weights) as source, zipfile.ZipFile(path, "w") as bomb:
        for entry in source.infolist():
            bomb.writestr(entry, source.read(entry.filename))
        prefix = source.namelist()[0].split("/")[0]
        bomb.writestr(f"{prefix}/data/extra", b"\0" * (200 << 20), compress_type=zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 2 * weights.stat().st_size
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("the archive was read"))
    with pytest.raises(CheckpointError, match=r"would unpack to 200\.0 MiB"):
        create_model(path)


# ---- converters and checks agree ---------------------------------------------------------------------------

def test_convert_coco_clips_drops_and_refuses_boxes_as_training_would(tmp_path):
    image = [{"id": 1, "file_name": "img.jpg", "width": 100, "height": 50}]
    boxes = [{"image_id": 1, "category_id": 1, "bbox": [-50, 0, 100, 10]},  # half outside: clipped
             {"image_id": 1, "category_id": 1, "bbox": [-200, 0, 50, 10]},  # wholly outside: dropped
             {"image_id": 1, "category_id": 1, "bbox": [10, 10, 0, 5]}]  # zero width: dropped
    result = coco_to_yolo(_coco(image, boxes, tmp_path / "a.json"), tmp_path / "out")
    assert (tmp_path / "out" / "labels" / "train" / "img.txt").read_text() == "0 0.250000 0.100000 0.500000 0.200000\n"
    assert result.n_boxes == 1 and result.n_invalid_skipped == 2
    assert "wholly outside" in result.skipped[0] and "zero or negative" in result.skipped[1]
    nan = [{"image_id": 1, "category_id": 1, "bbox": [float("nan"), 0, 10, 10]}]
    with pytest.raises(ValueError, match="annotation 0 has a non-finite bbox"):
        coco_to_yolo(_coco(image, nan, tmp_path / "b.json"), tmp_path / "nan")
    flat = [{**image[0], "width": 0}]
    with pytest.raises(ValueError, match="image 1 .* non-positive or non-finite size 0.0 x 50.0"):
        coco_to_yolo(_coco(flat, [], tmp_path / "c.json"), tmp_path / "flat")


def test_data_check_reports_a_box_that_training_would_clip(shapes):
    label = shapes.parent / "labels" / "train" / "000000.txt"
    original = label.read_text()
    try:
        label.write_text("0 0.0 0.2 1.0 0.2\n0 0.5 0.5 0.2 0.2\n")  # what the old converter wrote
        report = check(shapes, "train", use_cache=False)
        reasons = [p.reason for p in report.problems if p.file == str(label)]
        assert any("past the image edge, training clips it" in r and "(line 1)" in r for r in reasons), reasons
    finally:
        label.write_text(original)


# ---- unclear cases: one line, the documented exit code -----------------------------------------------------

def test_a_full_disk_in_detect_names_the_file(shapes, tmp_path, monkeypatch):
    import yolo9kit.files as files
    from yolo9kit import predict
    from yolo9kit.config import SaveConfig

    monkeypatch.setattr(files, "free_bytes", lambda folder: 10)
    image = shapes.parent / "images" / "val" / "000000.jpg"
    with pytest.raises(DiskFullError, match=r"disk full: writing .*000000\.jpg needs"):
        predict("yolov9-t", image, imgsz=64, save=SaveConfig(tmp_path / "out"))


def test_predict_refuses_its_own_input_as_output(shapes, tmp_path):
    from yolo9kit import predict
    from yolo9kit.config import SaveConfig

    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes((shapes.parent / "images" / "val" / "000000.jpg").read_bytes())
    before = _digest(folder / "a.jpg")
    with pytest.raises(OwnInputError, match="a.jpg is this command's input"):
        predict("yolov9-t", folder, imgsz=64, save=SaveConfig(folder))
    assert _digest(folder / "a.jpg") == before


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


def test_predict_on_an_empty_image_or_a_tensor_says_what_it_takes():
    from yolo9kit import predict

    results = predict("yolov9-t", [np.zeros((0, 0, 3), np.uint8)], imgsz=64)
    assert len(results) == 0 and results.skipped == [("array #0", "empty image (0 x 0 pixels)")]
    with pytest.raises(TypeError, match="a Tensor is not an image source: pass a BGR numpy image"):
        predict("yolov9-t", torch.zeros(3, 64, 64), imgsz=64)


def test_the_yaml_a_run_reads_back_is_bounded_and_a_refusal_names_the_file(tmp_path):
    """Aliases (a few hundred bytes that expand to gigabytes) and files over 1 MiB are refused unread by every
    reader of the kit's YAML: --hyp, data.yaml, state.yaml (runs(): a damaged row, tests/test_experiments.py)."""
    from yolo9kit.config.recipe import read_hyp
    from yolo9kit.data import load_data_config
    from yolo9kit.files import RecordError
    from yolo9kit.train.records import read_state, write_state

    hyp = tmp_path / "hyp.yaml"
    hyp.write_text("lr0: &x 0.01\nlrf: *x\n")
    with pytest.raises(ValueError, match=f"--hyp {hyp}: line 2: .*aliases"):
        read_hyp(hyp)
    data = tmp_path / "data.yaml"
    data.write_text("train: &t images\nval: *t\nnames: [a]\n")
    with pytest.raises(RecordError, match=f"{data}: line 2: .*aliases"):
        load_data_config(data)
    data.write_text("train: images\nval: images\nnames: [a]\n# " + "x" * (1 << 20) + "\n")
    with pytest.raises(RecordError, match="more than the 1.00 MiB"):
        load_data_config(data)
    write_state(tmp_path, "finished", None, 2, 2, 1.0)  # what the kit writes it reads back
    assert read_state(tmp_path)["state"] == "finished"
