"""Checkpoints and exports under faults (yolo9kit/models, export): files asking for a huge model or unpacking to
gigabytes are refused before they are built or read; an export never writes over its weights or half a file."""

from __future__ import annotations

import copy
import os
import sys
import types
from pathlib import Path

import pytest
import torch
from fault_checks import digest
from torch import nn
from train_toys import one_thread

from yolo9kit.cli import main
from yolo9kit.files import DiskFullError
from yolo9kit.models import create_model
from yolo9kit.models.checkpoint import MAX_MODEL_BYTES, CheckpointError, check_model, save_checkpoint

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "yolov9-t.pt"
    save_checkpoint(path, create_model("yolov9-t", num_classes=2))
    return path


def test_export_refuses_to_write_over_its_weights(weights, capsys):
    before = digest(weights)
    assert main(["export", str(weights), "--out", str(weights), "--imgsz", "64"]) == 2
    assert "is this command's input" in capsys.readouterr().err and digest(weights) == before


def test_an_export_is_written_whole_or_not_at_all(weights, tmp_path, monkeypatch):
    """A write cut short (a kill, an interrupt) or a full disk leaves the old file as it was and no junk."""
    import yolo9kit.files as files
    from yolo9kit.extras import export

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
