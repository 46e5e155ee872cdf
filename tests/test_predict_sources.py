"""predict and detect read videos (frame by frame, every k-th frame, annotated video written), globs and .txt
lists of images; bad inputs are skipped or refused with the file and the reason.

The video is generated here: a few shapes images written with cv2.VideoWriter (mp4v, lossy), so the
frames predicted "as images" are the ones decoded back from that file.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from yolo9kit.cli import main
from yolo9kit.config import SaveConfig
from yolo9kit.data import make_shapes
from yolo9kit.data.sources import VideoReader, expand_sources, write_video
from yolo9kit.models import create_model
from yolo9kit.models.checkpoint import SHAPES_IMGSZ, SHAPES_MODEL, SHAPES_WEIGHTS
from yolo9kit.prediction import predict

FRAMES = 6
WIDTH, HEIGHT = 96, 64  # not square: the written video keeps the source's width and height


@pytest.fixture(scope="module")
def model():
    return create_model(SHAPES_MODEL).eval()


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    """A 6-frame 96x64 mp4 of shapes images (10 fps)."""
    root = tmp_path_factory.mktemp("clip")
    make_shapes(root / "shapes", n_train=FRAMES, n_val=1, imgsz=(WIDTH, HEIGHT), num_classes=3, seed=3)
    images = sorted((root / "shapes" / "images" / "train").iterdir())
    return write_video(images, root / "clip.mp4", fps=10.0)


def _decoded_frames(path: Path) -> list[np.ndarray]:
    capture = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, image = capture.read()
        if not ok:
            break
        frames.append(image)
    capture.release()
    return frames


@pytest.mark.slow
@pytest.mark.parametrize("vid_stride", [1, 2])
def test_video_round_trip(model, clip, tmp_path, vid_stride):
    """Frames k-1, 2k-1, ... are predicted; the annotated video has their count and the source's size; each
    frame's detections equal those of the same decoded frame predicted as an image."""
    results = predict(model, clip, imgsz=SHAPES_IMGSZ, device="cpu", vid_stride=vid_stride,
                      save=SaveConfig(tmp_path, txt=True))
    kept = list(range(vid_stride - 1, FRAMES, vid_stride))
    assert [r.frame for r in results] == kept and all(r.path == str(clip) for r in results)
    assert list(results.speed["frame"]) == kept and (results.speed["inference_ms"] > 0).all()
    written = _decoded_frames(tmp_path / "clip.mp4")
    assert len(written) == FRAMES // vid_stride
    assert all(f.shape == (HEIGHT, WIDTH, 3) for f in written)
    assert sorted(p.name for p in (tmp_path / "labels").iterdir()) == sorted(f"clip_{k}.txt" for k in kept)

    source = _decoded_frames(clip)
    as_images = predict(model, [source[k] for k in kept], imgsz=SHAPES_IMGSZ, device="cpu")
    assert sum(len(r) for r in results) > 0
    for video_frame, image in zip(results, as_images):
        np.testing.assert_array_equal(video_frame.classes, image.classes)
        np.testing.assert_allclose(video_frame.scores, image.scores, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(video_frame.boxes, image.boxes, atol=0.0)
    assert results[0].image is None  # frames are not kept in memory ...
    np.testing.assert_array_equal(results[0].annotated(), as_images[0].annotated())  # ... but decoded to draw


def test_the_reader_keeps_every_kth_frame_and_reads_one_at_a_time(clip):
    reader = VideoReader(str(clip), vid_stride=4)
    assert (reader.fps, reader.frame_count, reader.size) == (10.0, FRAMES, (WIDTH, HEIGHT))
    frames = iter(reader)
    index, image, seconds = next(frames)
    assert index == 3 and image.shape == (HEIGHT, WIDTH, 3) and seconds >= 0
    assert [i for i, *_ in frames] == []  # frame 7 does not exist: 6 // 4 = 1 frame
    with pytest.raises(ValueError, match="vid_stride"):
        VideoReader(str(clip), vid_stride=0)


def test_globs_and_list_files(tmp_path):
    """A .txt list: one path a line, relative to the list's folder (./ too), blank lines ignored, order kept; a
    missing file is recorded with the list file and line; an empty list is refused naming the file."""
    for name in ("a.jpg", "b.png", "c.mp4", "notes.md"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.jpg").write_bytes(b"x")
    listing = tmp_path / "list.txt"
    listing.write_text(f"sub/d.jpg\n\n./a.jpg\n{tmp_path / 'c.mp4'}\nmissing.jpg\n")
    items, skipped = expand_sources(listing)
    assert items == [str(tmp_path / "sub" / "d.jpg"), str(tmp_path / "a.jpg"), str(tmp_path / "c.mp4")]
    assert skipped == [(f"{listing}:5", f"the listed file {tmp_path / 'missing.jpg'} does not exist")]

    items, _ = expand_sources(str(tmp_path / "**" / "*.jpg"))
    assert items == sorted([str(tmp_path / "a.jpg"), str(tmp_path / "sub" / "d.jpg")])
    items, _ = expand_sources(tmp_path)  # a folder: its images and videos, not its sub-folders or other files
    assert [Path(i).name for i in items] == ["a.jpg", "b.png", "c.mp4"]

    listing.write_bytes("a.jpg\n".encode("utf-8-sig"))  # a byte-order mark (Windows Notepad) is not a name
    assert expand_sources(listing) == ([str(tmp_path / "a.jpg")], [])

    (tmp_path / "empty.txt").write_text("\n  \n")
    with pytest.raises(ValueError, match=r"empty\.txt names no image or video"):
        expand_sources(tmp_path / "empty.txt")
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        expand_sources(tmp_path / "nothing-here.mp4")


@pytest.mark.slow
def test_bad_inputs_are_skipped_with_the_reason_and_the_rest_kept(model, clip, tmp_path):
    """A corrupt video, an empty one and a missing listed file are skipped with their names and reasons; the
    images and the good video before and after them are predicted and written."""
    frames = _decoded_frames(clip)
    cv2.imwrite(str(tmp_path / "first.png"), frames[0])
    (tmp_path / "broken.mp4").write_bytes(b"\x00not a video" * 10)
    empty = tmp_path / "empty.avi"
    writer = cv2.VideoWriter(str(empty), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (WIDTH, HEIGHT))
    writer.release()
    listing = tmp_path / "inputs.txt"
    listing.write_text(f"first.png\nbroken.mp4\n{empty.name}\ngone.png\n{clip}\n")
    out = tmp_path / "out"
    results = predict(model, listing, imgsz=SHAPES_IMGSZ, device="cpu", vid_stride=3, save=SaveConfig(out))
    assert [(Path(r.path).name, r.frame) for r in results] == [("first.png", None), ("clip.mp4", 2), ("clip.mp4", 5)]
    reasons = dict(results.skipped)
    assert set(reasons) == {str(tmp_path / "broken.mp4"), str(empty), f"{listing}:4"}
    assert "video" in reasons[str(tmp_path / "broken.mp4")] and "gone.png" in reasons[f"{listing}:4"]
    assert list(results.speed["frame"]) == [None, 2, 5]
    assert (out / "first.png").is_file() and len(_decoded_frames(out / "clip.mp4")) == 2
    assert results.to_frame()["frame"].dropna().astype(int).isin([2, 5]).all()


@pytest.mark.slow
def test_detect_cli_on_a_video(clip, tmp_path, capsys):
    code = main(["detect", "--weights", str(SHAPES_WEIGHTS), "--source", str(clip), "--imgsz", str(SHAPES_IMGSZ),
                 "--vid-stride", "2", "--device", "cpu", "--project", str(tmp_path), "--name", "exp"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert [line.split(" ")[:3] for line in out.splitlines() if line.startswith("video")] == [
        ["video", "frame", "1"], ["video", "frame", "3"], ["video", "frame", "5"]]
    speed = json.loads((tmp_path / "exp" / "speed.json").read_text())
    assert speed["video_frames"] == 3 and speed["images"] == 0
    assert [row["frame"] for row in speed["per_image"]] == [1, 3, 5]
    assert len(_decoded_frames(tmp_path / "exp" / "clip.mp4")) == 3


@pytest.mark.slow
def test_a_run_stopped_mid_video_leaves_a_playable_video_of_the_frames_done(model, clip, tmp_path, monkeypatch):
    import yolo9kit.prediction as prediction

    calls = []
    run_batch = prediction._Run.batch

    def stop_at_the_third_frame(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return run_batch(*args, **kwargs)

    monkeypatch.setattr(prediction._Run, "batch", stop_at_the_third_frame)
    with pytest.raises(KeyboardInterrupt):
        predict(model, clip, imgsz=SHAPES_IMGSZ, device="cpu", save=SaveConfig(tmp_path))
    written = _decoded_frames(tmp_path / "clip.mp4")
    assert len(written) == 2 and written[0].shape == (HEIGHT, WIDTH, 3)


def test_write_video_names_the_image_it_cannot_use(tmp_path):
    make_shapes(tmp_path / "a", n_train=2, n_val=1, imgsz=(WIDTH, HEIGHT), num_classes=3, seed=3)
    make_shapes(tmp_path / "b", n_train=1, n_val=1, imgsz=64, num_classes=3, seed=3)
    good = sorted((tmp_path / "a" / "images" / "train").iterdir())
    other = next((tmp_path / "b" / "images" / "train").iterdir())
    with pytest.raises(ValueError, match=f"{other.name}: 64x64, the video is {WIDTH}x{HEIGHT}"):
        write_video([*good, other], tmp_path / "mixed.mp4")
    with pytest.raises(ValueError, match="no images given"):
        write_video([], tmp_path / "none.mp4")
    clip = write_video(good, tmp_path / "ok.mp4")
    assert VideoReader(str(clip), 1).frame_count == len(good)


def test_detect_prints_each_line_as_its_image_is_done(tmp_path, capsys, monkeypatch):
    """detect printed nothing until the end of the run (10,000 images: nothing for minutes); each line now comes
    when its image is done: the first image's line is out before the second image is written."""
    from yolo9kit import prediction

    sources = [str(tmp_path / f"{name}.jpg") for name in ("a", "b")]
    for source in sources:
        cv2.imwrite(source, np.full((64, 64, 3), 90, np.uint8))
    printed_before_write = []
    write = prediction._write_outputs

    def write_after_reading_stdout(result, *args):
        printed_before_write.append(capsys.readouterr().out)
        write(result, *args)

    monkeypatch.setattr(prediction, "_write_outputs", write_after_reading_stdout)
    assert main(["detect", "--weights", "gelan-t", "--source", *sources, "--imgsz", "64", "--device", "cpu",
                 "--project", str(tmp_path / "runs")]) == 0
    assert "image 1/2 " not in printed_before_write[0]
    assert f"image 1/2 {sources[0]}: 64x64 " in printed_before_write[1]
    assert f"image 2/2 {sources[1]}: " in capsys.readouterr().out
