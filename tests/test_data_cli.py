"""``python -m yolo9kit data ...`` verbs, run through their own parser."""

from __future__ import annotations

import json

from yolo9kit.cli import build_parser, main


def _run(argv):
    args = build_parser().parse_args(argv)
    return args.func(args)


def test_make_shapes_check_and_convert(tmp_path, capsys):
    out = tmp_path / "shapes"
    assert _run(["data", "make-shapes", "--out", str(out), "--n-train", "4", "--n-val", "2",
                 "--imgsz", "64", "--num-classes", "2", "--seed", "1"]) == 0
    assert (out / "data.yaml").is_file() and len(list((out / "images" / "val").glob("*.jpg"))) == 2
    assert _run(["data", "check", str(out / "data.yaml"), "--split", "val"]) == 0
    assert "val: 2 images, 2 usable" in capsys.readouterr().out
    (out / "labels" / "train" / "000001.txt").write_text("0 0.5 0.5 0.2\n")
    assert _run(["data", "check", str(out / "data.yaml")]) == 1
    text = capsys.readouterr().out
    assert "000001.txt" in text and "wrong column count" in text and "error" in text
    # a data set that cannot be read: one line on stderr, exit code 2 (through the command line's main)
    assert main(["data", "check", str(out / "data.yaml"), "--split", "test"]) == 2
    assert main(["data", "check", str(out / "missing.yaml")]) == 2
    captured = capsys.readouterr()
    assert "split 'test' is not defined" in captured.err and "missing.yaml not found" in captured.err
    assert "not defined" not in captured.out
    ann = {"images": [{"id": 1, "file_name": "000000.jpg", "width": 64, "height": 64}],
           "categories": [{"id": 5, "name": "thing"}],
           "annotations": [{"image_id": 1, "category_id": 5, "bbox": [0, 0, 32, 16]}]}
    (tmp_path / "a.json").write_text(json.dumps(ann))
    assert _run(["data", "convert-coco", str(tmp_path / "a.json"), "--out", str(tmp_path / "coco")]) == 0
    label = (tmp_path / "coco" / "labels" / "train" / "000000.txt").read_text()
    assert label == "0 0.250000 0.125000 0.500000 0.250000\n"
    (tmp_path / "b.json").write_text("{")
    assert main(["data", "convert-coco", str(tmp_path / "b.json"), "--out", str(tmp_path / "c")]) == 2
    assert "not valid JSON" in capsys.readouterr().err
