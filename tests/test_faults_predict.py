"""Prediction under faults (yolo9kit/predict): a full disk, its own input as its output, an empty image or a
tensor as a source, a video detect stopped by SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import cv2
import numpy as np
import pytest
import torch
from conftest import REPO
from fault_checks import digest
from train_toys import one_thread

from yolo9kit.files import DiskFullError, OwnInputError

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def test_a_full_disk_in_detect_names_the_file(shapes64, tmp_path, monkeypatch):
    import yolo9kit.files as files
    from yolo9kit import predict
    from yolo9kit.config import SaveConfig

    monkeypatch.setattr(files, "free_bytes", lambda folder: 10)
    image = shapes64.parent / "images" / "val" / "000000.jpg"
    with pytest.raises(DiskFullError, match=r"disk full: writing .*000000\.jpg needs"):
        predict("yolov9-t", image, imgsz=64, save=SaveConfig(tmp_path / "out"))


def test_predict_refuses_its_own_input_as_output(shapes64, tmp_path):
    from yolo9kit import predict
    from yolo9kit.config import SaveConfig

    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes((shapes64.parent / "images" / "val" / "000000.jpg").read_bytes())
    before = digest(folder / "a.jpg")
    with pytest.raises(OwnInputError, match="a.jpg is this command's input"):
        predict("yolov9-t", folder, imgsz=64, save=SaveConfig(folder))
    assert digest(folder / "a.jpg") == before


def test_predict_on_an_empty_image_or_a_tensor_says_what_it_takes():
    from yolo9kit import predict

    results = predict("yolov9-t", [np.zeros((0, 0, 3), np.uint8)], imgsz=64)
    assert len(results) == 0 and results.skipped == [("array #0", "empty image (0 x 0 pixels)")]
    with pytest.raises(TypeError, match="a Tensor is not an image source: pass a BGR numpy image"):
        predict("yolov9-t", torch.zeros(3, 64, 64), imgsz=64)


@pytest.mark.slow
def test_a_video_detect_stopped_by_sigterm_leaves_a_playable_video(shapes64, tmp_path):
    from yolo9kit.data.sources import write_video

    frames = sorted((shapes64.parent / "images" / "train").glob("*.jpg"))[:4] * 150
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
