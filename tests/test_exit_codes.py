"""The exit codes docs/faults.md documents, verb by verb: 0 done, 1 failed while running (or files had to be
skipped), 2 the input is wrong, 130 Ctrl-C, 143 SIGTERM (the signal cases are in tests/test_faults_train.py and
tests/test_faults_predict.py). Every error is one line on stderr."""

from __future__ import annotations

import pytest

from yolo9kit.cli import build_parser, main


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    from yolo9kit.data import make_shapes

    return make_shapes(tmp_path_factory.mktemp("data") / "shapes", n_train=2, n_val=1, imgsz=64)


def _cases(shapes, tmp):
    missing = str(tmp / "missing")
    bad_labels = tmp / "bad"
    return [
        ("checks", ["checks", "--gpu"], 0),  # no CUDA here: says so, exits 0
        ("models", ["models", "gelan-t"], 0),
        ("models", ["models", "yolov9-x"], 2),
        ("data", ["data", "check", str(shapes), "--split", "val"], 0),
        ("data", ["data", "check", missing + ".yaml"], 2),
        ("data", ["data", "check", str(bad_labels / "data.yaml")], 1),  # a file had to be skipped
        ("data", ["data", "convert-coco", missing + ".json", "--out", str(tmp / "coco")], 2),
        ("train", ["train", "--model", "yolov9-t"], 2),  # no --data
        ("train", ["train", "--data", missing + ".yaml"], 2),
        ("train", ["train", "--resume", missing], 2),
        ("train", ["train", "--data", str(shapes), "--freeze", "backbone", "1"], 2),
        ("train", ["train", "--seeds", "2", "--resume"], 2),
        ("tune", ["tune", "--model", "yolov9-t"], 2),  # no --data
        ("tune", ["tune", "--data", str(shapes), "--trials", "0"], 2),
        ("tune", ["tune", "--data", str(shapes), "--resume"], 2),  # the same command continues a study
        ("runs", ["runs", str(tmp)], 0),  # no run folders there: says so
        ("runs", ["runs", missing], 2),
        ("val", ["val", "--weights", missing + ".pt", "--data", str(shapes)], 2),
        ("detect", ["detect", "--weights", "yolov9-t", "--source", missing + ".jpg"], 2),
        ("detect", ["detect", "--weights", "yolov9-t", "--source", str(tmp / "broken.jpg"), "--imgsz", "64",
                    "--project", str(tmp / "det")], 1),  # nothing could be read
        ("export", ["export", missing + ".pt"], 2),
        ("profile", ["profile", "--model", "yolov9-t", "--gpu", "GTX 9999"], 2),
        ("demo", ["demo", "--no-such-flag"], 2),
    ]


def test_each_verb_exits_with_the_documented_code(shapes, tmp_path, capsys):
    import shutil

    bad_labels = tmp_path / "bad"
    shutil.copytree(shapes.parent, bad_labels)
    (bad_labels / "labels" / "train" / "000000.txt").write_text("0 0.5 0.5\n")
    (tmp_path / "broken.jpg").write_bytes(b"not an image")
    cases = _cases(shapes, tmp_path)
    verbs = next(a for a in build_parser()._actions if a.dest == "verb").choices
    assert {verb for verb, _, _ in cases} == set(verbs)  # every verb has a case
    for _verb, argv, code in cases:
        try:
            got = main(argv)
        except SystemExit as e:  # argparse's own errors
            got = e.code
        err = capsys.readouterr().err
        assert got == code, (argv, got, err)
        if code == 2:
            assert err.strip().count("\n") == 0 and "error" in err, (argv, err)
