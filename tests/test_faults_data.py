"""Bad data (yolo9kit/data): labels training would lose, broken images, orphan label files, ``data check``, the disk
cache on read-only data, make_shapes over other files, convert_coco's boxes and file names."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from fault_checks import digest, one_error_line, one_unnamed_class, run_cli, train_labels

from yolo9kit.cli import main
from yolo9kit.config import TrainConfig
from yolo9kit.data import DataError, YOLODataset, check, coco_to_yolo, create_dataloader, make_shapes

# ---- training refuses labels it would silently lose ----------------------------------------------------------------

def _fit(data: Path, tmp_path: Path, **changes):
    """fit a toy network (one class, like the shortened names) on ``data``: the real training loader."""
    from train_toys import ToyNet, toy_loss

    from yolo9kit.train.fit import fit

    config = TrainConfig(epochs=1, batch_size=2, imgsz=64, workers=0, device="cpu", val=False, progress_bar=False,
                         project=str(tmp_path / "runs"), warmup_min_batches=0, **changes)
    return fit(ToyNet(), data, config, loss_fn=toy_loss, validate_fn=lambda model: {"fitness": 0.0})


def test_labels_with_unnamed_classes_stop_training_before_the_first_step(shapes4, tmp_path):
    one_unnamed_class(shapes4)
    steps = []
    with pytest.raises(DataError) as error:
        _fit(shapes4, tmp_path, callbacks={"on_batch": steps.append})
    message = str(error.value)
    assert str(shapes4) in message and "(train split)" in message and "class id 1" in message
    assert "names has 1" in message and "1 of 4 images would be left out" in message
    assert "allow_bad_labels=True" in message
    assert steps == []
    assert not list((tmp_path / "runs").rglob("*.pt"))


def test_allow_bad_labels_trains_on_what_is_left(shapes4, tmp_path):
    one_unnamed_class(shapes4)
    steps = []
    result = _fit(shapes4, tmp_path, allow_bad_labels=True, callbacks={"on_batch": steps.append})
    assert len(steps) == 2 and result.epochs_completed == 1  # the 3 images left: batches of 2 and 1


def test_a_training_split_without_labels_is_refused(shapes4):
    for label in train_labels(shapes4):
        label.unlink()
    with pytest.raises(DataError, match=r"none of the 4 usable images has a box \(4 without a label file"):
        create_dataloader(shapes4, "train", imgsz=64, batch_size=2, workers=0)
    loader = create_dataloader(shapes4, "train", imgsz=64, batch_size=2, workers=0, allow_bad_labels=True)
    assert len(loader.dataset) == 4
    assert len(create_dataloader(shapes4, "val", imgsz=64, batch_size=2, workers=0).dataset) == 2  # val never refused


def test_more_than_a_tenth_of_the_labelled_images_dropped_is_refused(tmp_path, caplog):
    shapes = make_shapes(tmp_path / "ten", n_train=10, n_val=1, imgsz=64, num_classes=2)
    labels = train_labels(shapes)
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


# ---- images and label files ----------------------------------------------------------------------------------------

def test_jpeg_with_trailing_bytes_is_kept_with_a_warning_and_left_unchanged(shapes4):
    image = sorted((shapes4.parent / "images" / "train").glob("*.jpg"))[0]
    clean = cv2.imread(str(image))
    trailing = b"\x00trailing bytes after the end marker" * 4
    data = image.read_bytes() + trailing
    image.write_bytes(data)
    report = check(shapes4, use_cache=False)
    assert report.ok and report.n_usable == 4
    (row,) = [p for p in report.problems if p.file == str(image)]
    assert row.severity == "warning" and f"{len(trailing)} bytes after the JPEG end-of-image marker" in row.reason
    dataset = YOLODataset(shapes4, "train", imgsz=64, cache="ram")
    index = dataset.im_files.index(str(image))
    np.testing.assert_array_equal(dataset.load_image(index), clean)  # the pixels of the image, not of a re-save
    assert image.read_bytes() == data  # the user's file is never rewritten


def test_truncated_jpeg_is_still_an_error(shapes4):
    """A JPEG cut short is dropped, also when an end-of-image marker sits earlier in it (a comment here; an EXIF
    thumbnail in camera files) and garbage follows the cut."""
    image = sorted((shapes4.parent / "images" / "train").glob("*.jpg"))[0]
    cv2.imwrite(str(image), np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8))
    from PIL import Image

    with Image.open(image) as im:
        im.load()
        im.save(image, comment=b"a thumbnail ends with \xff\xd9 too")
    data = image.read_bytes()
    image.write_bytes(data[: len(data) * 2 // 3] + b"garbage")
    report = check(shapes4, use_cache=False)
    (row,) = [p for p in report.problems if p.file == str(image)]
    assert row.severity == "error" and "truncated JPEG" in row.reason


def test_label_files_without_an_image_are_reported(shapes4, tmp_path):
    labels = shapes4.parent / "labels" / "train"
    (labels / "ghost.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (labels / "classes.txt").write_text("rectangle\nellipse\n")  # labelImg's names file is not a label
    report = check(shapes4)
    assert report.n_orphan_labels == 1 and "1 label files without an image" in report.summary()
    (row,) = [p for p in report.problems if "ghost" in p.file]
    assert row.file == str(labels / "ghost.txt") and row.severity == "warning" and "no image" in row.reason
    assert report.ok  # reported, nothing left out
    assert YOLODataset(shapes4, "train", imgsz=64).report.n_orphan_labels == 1
    listed = tmp_path / "list.yaml"  # a list file may share its label folder with other splits: not searched
    images = sorted(str(p) for p in (shapes4.parent / "images" / "train").glob("*.jpg"))
    (tmp_path / "train.txt").write_text("\n".join(images[:2]) + "\n")
    listed.write_text(yaml.safe_dump({"path": str(tmp_path), "train": "train.txt", "val": "train.txt",
                                      "names": ["rectangle", "ellipse"]}))
    assert check(listed).n_orphan_labels == 0


def test_data_check_reports_a_box_that_training_would_clip(shapes4):
    label = shapes4.parent / "labels" / "train" / "000000.txt"
    label.write_text("0 0.0 0.2 1.0 0.2\n0 0.5 0.5 0.2 0.2\n")  # what the old converter wrote
    report = check(shapes4, "train", use_cache=False)
    reasons = [p.reason for p in report.problems if p.file == str(label)]
    assert any("past the image edge, training clips it" in r and "(line 1)" in r for r in reasons), reasons


def test_data_check_on_an_empty_split_exits_non_zero_with_one_line(shapes4, capsys):
    for image in (shapes4.parent / "images" / "val").glob("*.jpg"):
        image.unlink()
    code, text = run_cli(["data", "check", str(shapes4), "--split", "val"], capsys)
    assert code == 2
    line = one_error_line(text)
    assert "the val split has no images" in line and str(shapes4) in line
    with pytest.raises(DataError, match="has no images"):
        check(shapes4, split="val")


def test_disk_cache_on_read_only_data_falls_back_to_ram(shapes4, caplog, monkeypatch):
    folder = shapes4.parent / "labels"  # the disk image cache is written beside the label cache
    check(shapes4)  # the label cache exists; only the image cache is new
    if os.geteuid() == 0:
        # root writes into a read-only folder anyway: the failure chmod would cause is simulated
        import yolo9kit.data.images as disk_cache

        def refuse(*args, **kwargs):
            raise PermissionError(13, "Permission denied", str(folder))

        monkeypatch.setattr(disk_cache, "write_file", refuse)
    else:
        folder.chmod(0o555)
    try:
        with caplog.at_level(logging.WARNING):
            dataset = YOLODataset(shapes4, "train", imgsz=64, cache="disk")
    finally:
        folder.chmod(0o755)
    assert dataset.images is not None and not hasattr(dataset.images, "path")  # RAM, not a memory map
    assert f"cannot write the image cache in {folder}" in caplog.text and "in RAM instead" in caplog.text
    np.testing.assert_array_equal(dataset.images[0], YOLODataset(shapes4, "train", imgsz=64).load_image(0))
    assert not list(folder.glob("*.yolo9kit-images"))


# ---- make_shapes and convert_coco ----------------------------------------------------------------------------------

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
    before = {p.name: digest(p) for p in (root / "images" / "train").iterdir()}
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
    assert {p.name: digest(p) for p in (root / "images" / "train").iterdir()} == before
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
