"""Every kind of bad input is reported with its file and reason; the good files still load."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from yolo9kit.data import DataError, YOLODataset, check, create_dataloader

GOOD_LABEL = "0 0.5 0.5 0.4 0.4\n"


def _image(path: Path, size=(64, 48), value=90) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = np.full((size[1], size[0], 3), value, np.uint8)
    image[10:30, 10:40] = (20, 200, 60)
    cv2.imwrite(str(path), image)


def _dataset(root: Path, items: dict[str, str | None], nc: int = 2) -> Path:
    """Images named by ``items`` with the given label text (None: no label file)."""
    for name, label in items.items():
        _image(root / "images" / "train" / f"{name}.jpg")
        if label is not None:
            lb = root / "labels" / "train" / f"{name}.txt"
            lb.parent.mkdir(parents=True, exist_ok=True)
            lb.write_text(label)
    config = {"path": str(root), "train": "images/train", "val": "images/train", "names": [f"c{i}" for i in range(nc)]}
    (root / "data.yaml").write_text(yaml.safe_dump(config))
    return root / "data.yaml"


LABEL_CASES = {
    "wrong_columns": ("0 0.5 0.5 0.4\n", "error", "wrong column count"),
    "non_numeric": ("0 0.5 abc 0.4 0.4\n", "error", "non-numeric value 'abc'"),
    "outside": ("0 0.5 1.2 0.4 0.4\n", "error", "outside [0, 1]"),
    "negative": ("1 -0.1 0.5 0.4 0.4\n", "error", "outside [0, 1]"),
    "class_too_big": ("5 0.5 0.5 0.4 0.4\n", "error", "class id 5 outside 0..1"),
    "class_not_int": ("0.5 0.5 0.5 0.4 0.4\n", "error", "class id 0.5"),
    "zero_size": ("0 0.5 0.5 0.0 0.4\n1 0.3 0.3 0.2 0.2\n", "warning", "zero-size box removed (line 1)"),
    "duplicates": (GOOD_LABEL * 3 + "1 0.2 0.2 0.1 0.1\n", "warning", "2 duplicate rows removed"),
    "empty": ("", "warning", "empty label file"),
    "polygon": ("1 0.1 0.1 0.5 0.1 0.5 0.6 0.1 0.6\n", "info", "polygons read as their bounding boxes"),
}


@pytest.fixture()
def bad_data(tmp_path):
    items = {"good_a": GOOD_LABEL, "good_b": "1 0.3 0.3 0.2 0.2\n", "missing_label": None}
    items.update({name: text for name, (text, _, _) in LABEL_CASES.items()})
    yaml_path = _dataset(tmp_path, items)
    images = tmp_path / "images" / "train"
    (images / "corrupt.jpg").write_bytes(os.urandom(2000))
    data = (images / "good_a.jpg").read_bytes()
    (images / "truncated.jpg").write_bytes(data[: len(data) // 2])
    cv2.imwrite(str(images / "tiny.png"), np.zeros((8, 8, 3), np.uint8))
    (images / "not_an_image.png").write_text("hello")
    return yaml_path


def _row(frame, name):
    rows = frame[frame.file.str.contains(f"/{name}\\.")]
    assert len(rows) == 1, (name, frame)
    return rows.iloc[0]


def test_every_label_problem_is_named_with_its_reason(bad_data):
    frame = check(bad_data).to_frame()
    for name, (_, severity, reason) in LABEL_CASES.items():
        row = _row(frame, name)
        assert row.file.endswith(f"labels/train/{name}.txt")
        assert row.severity == severity, name
        assert reason in row.reason, (name, row.reason)
    row = _row(frame, "missing_label")
    assert row.severity == "warning" and "no label file" in row.reason


def test_every_image_problem_is_named_with_its_reason(bad_data):
    report = check(bad_data)
    frame = report.to_frame()
    assert "unreadable image" in _row(frame, "corrupt").reason
    assert "truncated JPEG" in _row(frame, "truncated").reason
    assert "image too small (8x8 px" in _row(frame, "tiny").reason
    assert "unreadable image" in _row(frame, "not_an_image").reason
    assert not report.ok
    assert report.n_images == 17
    assert report.n_skipped == 10  # 4 image errors + 6 label errors
    assert report.n_duplicates_removed == 2
    assert "truncated.jpg" in str(report) and "truncated.jpg" in report._repr_html_()


def test_good_files_still_load_and_bad_ones_are_left_out(bad_data):
    with pytest.raises(DataError, match="class id 5"):  # a train split this damaged refuses by default
        YOLODataset(bad_data, "train", imgsz=64)
    ds = YOLODataset(bad_data, "train", imgsz=64, allow_bad_labels=True)
    names = sorted(Path(f).stem for f in ds.im_files)
    assert names == sorted(["good_a", "good_b", "missing_label", "zero_size", "duplicates", "empty", "polygon"])
    labels = dict(zip((Path(f).stem for f in ds.im_files), ds.labels))
    assert labels["missing_label"].shape == (0, 5) and labels["empty"].shape == (0, 5)
    np.testing.assert_allclose(labels["zero_size"], [[1, 0.3, 0.3, 0.2, 0.2]])
    np.testing.assert_allclose(labels["duplicates"], [[0, 0.5, 0.5, 0.4, 0.4], [1, 0.2, 0.2, 0.1, 0.1]])
    np.testing.assert_allclose(labels["polygon"], [[1, 0.3, 0.35, 0.4, 0.5]], atol=1e-6)
    loader = create_dataloader(bad_data, "train", imgsz=64, batch_size=4, workers=0, allow_bad_labels=True)
    assert sum(len(b[0]) for b in loader) == 7


def test_no_usable_image_is_a_clear_error(tmp_path):
    yaml_path = _dataset(tmp_path, {"a": "0 0.5 0.5 2 2\n", "b": "x\n"})
    with pytest.raises(ValueError, match="no usable image in the train split"):
        YOLODataset(yaml_path, "train", imgsz=64)


def test_cache_is_reused_and_rebuilt_when_a_label_changes(tmp_path):
    yaml_path = _dataset(tmp_path, {"a": GOOD_LABEL, "b": GOOD_LABEL})
    assert check(yaml_path).n_instances == 2
    cache_files = list(tmp_path.glob("labels/*.cache"))
    assert len(cache_files) == 1
    label = tmp_path / "labels" / "train" / "b.txt"
    label.write_text(GOOD_LABEL + "1 0.2 0.2 0.1 0.1\n")
    st = label.stat()
    os.utime(label, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a later mtime, whatever the clock resolution
    report = check(yaml_path)
    assert report.n_instances == 3
    ds = YOLODataset(yaml_path, "train", imgsz=64)
    assert sum(len(x) for x in ds.labels) == 3


def test_cache_file_holds_no_pickle(tmp_path):
    yaml_path = _dataset(tmp_path, {"a": GOOD_LABEL, "b": "1 0.1 0.1 0.5 0.1 0.5 0.6\n"})
    check(yaml_path)
    (cache_file,) = tmp_path.glob("labels/*.cache")
    with np.load(cache_file, allow_pickle=False) as z:  # raises if anything needed pickle
        assert {"meta", "labels", "seg_points"} <= set(z.files)


def test_cache_in_unwritable_folder_only_warns(tmp_path, caplog, monkeypatch):
    yaml_path = _dataset(tmp_path, {"a": GOOD_LABEL})
    import yolo9kit.data.cache as cache

    def refuse(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(cache, "write_file", refuse)
    report = check(yaml_path)
    assert report.n_usable == 1
    assert "could not write the label cache" in caplog.text


def test_data_yaml_forms(tmp_path):
    yaml_path = _dataset(tmp_path, {"a": GOOD_LABEL, "b": GOOD_LABEL, "c": GOOD_LABEL})
    (tmp_path / "list.txt").write_text("./images/train/a.jpg\n./images/train/b.jpg\n")
    from yolo9kit.data import label_path, load_data_config

    config = load_data_config({"path": str(tmp_path), "train": "list.txt", "val": ["images/train/c.jpg"],
                               "test": "images/*/b.jpg", "names": {0: "x", 1: "y"}, "nc": 99})
    assert config.names == ["x", "y"] and config.nc == 2
    assert [p.name for p in config.train] == ["a.jpg", "b.jpg"]
    assert [p.name for p in config.val] == ["c.jpg"] and [p.name for p in config.test] == ["b.jpg"]
    assert label_path("/d/images/x/images/y/z.png") == Path("/d/images/x/labels/y/z.txt")
    with pytest.raises(ValueError, match="missing required key"):
        load_data_config({"train": "a"})
    assert yaml_path.is_file()


def test_label_and_list_files_with_a_byte_order_mark_are_read(tmp_path):
    """What Windows Notepad saves: was "line 1: non-numeric value '\\ufeff0'" and the image left out."""
    from yolo9kit.data import load_data_config

    yaml_path = _dataset(tmp_path, {"a": GOOD_LABEL, "b": GOOD_LABEL})
    (tmp_path / "labels" / "train" / "a.txt").write_bytes(GOOD_LABEL.encode("utf-8-sig"))
    (tmp_path / "list.txt").write_bytes("./images/train/a.jpg\n".encode("utf-8-sig"))
    report = check(yaml_path, split="train", use_cache=False)
    assert report.n_usable == 2 and not any(p.severity == "error" for p in report.problems)
    assert [p.name for p in load_data_config({"path": str(tmp_path), "train": "list.txt", "val": "list.txt",
                                              "names": ["x"]}).train] == ["a.jpg"]


def test_a_symlink_loop_in_an_images_folder_is_visited_once(tmp_path):
    """images/train/loop -> images/train was followed 40 levels deep: 16 images became 656, 640 of them unlabelled."""
    from yolo9kit.data import load_data_config, make_shapes

    data = make_shapes(tmp_path / "shapes", n_train=16, n_val=1, imgsz=32)
    for split in ("images", "labels"):
        (data.parent / split / "train" / "loop").symlink_to(data.parent / split / "train")
    assert len(load_data_config(data).train) == 16
    report = check(data, split="train")
    assert report.n_usable == 16 and report.n_orphan_labels == 0


def test_check_for_training_stops_where_fit_would_and_shows_one_line_in_a_notebook(tmp_path):
    import shutil

    from yolo9kit.data import check, make_shapes
    from yolo9kit.data.labels import DataError

    data = make_shapes(tmp_path / "s", n_train=4, n_val=1, imgsz=64)
    shutil.rmtree(tmp_path / "s" / "labels" / "train")
    assert check(data).n_instances == 0  # a report: the images have no labels
    with pytest.raises(DataError, match="none of the 4 usable images has a box") as info:
        check(data, for_training=True)
    lines = info.value._render_traceback_()  # what IPython prints instead of the traceback
    assert len(lines) == 1 and "DataError" in lines[0] and "labels/train/000000.txt" in lines[0]
