"""yolo9kit checkpoints: round trips through create_model, EMA preference, clear errors, atomic writes."""

from __future__ import annotations

import random

import pytest
import torch

from yolo9kit.models import create_model, to_deploy
from yolo9kit.models.checkpoint import CheckpointError, read_checkpoint, save_checkpoint


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("gelan-t", names=["cat", "dog"]).eval()


def _outputs(m, x):
    with torch.no_grad():
        return m.eval()(x).main


def test_round_trip_same_outputs(model, tmp_path):
    path = save_checkpoint(tmp_path / "run" / "last.pt", model, epoch=4, note="hello")
    loaded = create_model(path)
    assert loaded.names == ["cat", "dog"] and loaded.nc == 2 and loaded.training
    x = torch.rand(2, 3, 64, 64)
    assert torch.equal(_outputs(loaded, x), _outputs(model, x))
    ckpt = read_checkpoint(path)
    assert ckpt["format"] == "yolo9kit" and ckpt["version"] == 1 and ckpt["epoch"] == 4
    assert ckpt["model_config"]["yaml"] == model.yaml


def test_ema_weights_used_when_present(model, tmp_path):
    ema = {k: (v + 0.01 if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    path = save_checkpoint(tmp_path / "ema.pt", model, ema=ema)
    with_ema = create_model(path)
    assert with_ema.checkpoint_meta["entry"] == "ema"
    assert torch.equal(with_ema.model[0].conv.weight, ema["model.0.conv.weight"])
    without = create_model(path)  # the raw weights: the checkpoint's "model" entry
    without.load_state_dict(read_checkpoint(path)["model"])
    assert torch.equal(without.model[0].conv.weight, model.model[0].conv.weight)
    assert create_model(save_checkpoint(tmp_path / "raw.pt", model)).checkpoint_meta["entry"] == "model"


def test_dual_and_fused_models_round_trip(tmp_path):
    dual = create_model("yolov9-t").eval()
    x = torch.rand(1, 3, 64, 64)
    loaded = create_model(save_checkpoint(tmp_path / "dual.pt", dual))
    assert loaded.is_dual and torch.equal(_outputs(loaded, x), _outputs(dual, x))
    deployed = to_deploy(dual)
    loaded = create_model(save_checkpoint(tmp_path / "deploy.pt", deployed))
    assert torch.equal(_outputs(loaded, x), _outputs(deployed, x))


def test_plain_entries_only(model, tmp_path):
    import numpy as np

    path = save_checkpoint(tmp_path / "plain.pt", model, best=np.float64(0.5), where=tmp_path)
    ckpt = read_checkpoint(path)
    assert ckpt["best"] == 0.5 and ckpt["where"] == str(tmp_path)
    with pytest.raises(TypeError, match="optimizer.*state_dict"):
        save_checkpoint(tmp_path / "bad.pt", model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="reserved"):
        save_checkpoint(tmp_path / "bad.pt", model, version=2)


def test_truncated_file_clear_error(model, tmp_path):
    path = save_checkpoint(tmp_path / "full.pt", model)
    data = path.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match=r"cut\.pt: cannot be read \(truncated"):
        create_model(tmp_path / "cut.pt")
    for seed in range(5):
        (tmp_path / "noise.pt").write_bytes(random.Random(seed).randbytes(2048))
        with pytest.raises(CheckpointError, match="cannot be read"):
            create_model(tmp_path / "noise.pt")
    with pytest.raises(FileNotFoundError):
        read_checkpoint(tmp_path / "absent.pt")


def test_foreign_file_clear_error(tmp_path):
    torch.save({"state_dict": {"w": torch.zeros(1)}}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a yolo9kit checkpoint"):
        create_model(tmp_path / "other.pt")
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    with pytest.raises(CheckpointError, match="not a yolo9kit checkpoint"):
        read_checkpoint(tmp_path / "tensor.pt")


def test_official_file_gets_a_hint(official_fixture):
    with pytest.raises(CheckpointError, match="official YOLOv9 checkpoint.*create_model"):
        read_checkpoint(official_fixture("gelan-t-narrow.official-release.pt"))


def test_interrupted_write_keeps_previous_file(model, tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "last.pt", model, epoch=1)
    before = path.read_bytes()

    def dying_save(obj, f, *args, **kwargs):  # the process dies half-way through writing
        with open(f, "wb") as fh:
            fh.write(before[:100])
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, model, epoch=2)
    monkeypatch.undo()
    assert path.read_bytes() == before and read_checkpoint(path)["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def _data_offset(path, member):
    """Where the bytes of a zip member start (torch.save stores tensors uncompressed)."""
    import struct
    import zipfile

    info = zipfile.ZipFile(path).getinfo(member)
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        header = f.read(30)
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_length + extra_length, info.file_size


def test_a_flipped_byte_in_the_weights_is_reported_not_used(model, tmp_path):
    import zipfile

    path = save_checkpoint(tmp_path / "last.pt", model, ema=model.state_dict())
    assert read_checkpoint(path)["checksum"]["sha256"].keys() == {"model", "ema"}
    largest = max((i for i in zipfile.ZipFile(path).infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    start, size = _data_offset(path, largest.filename)
    data = bytearray(path.read_bytes())
    data[start + size // 2] ^= 0x10  # one bit of one float: still a readable file
    (tmp_path / "damaged.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"damaged\.pt: the '(model|ema)' weights do not match the checksum"):
        create_model(tmp_path / "damaged.pt")


def test_a_checkpoint_without_its_checksum_is_refused(model, tmp_path):
    ckpt = read_checkpoint(save_checkpoint(tmp_path / "new.pt", model))
    del ckpt["checksum"]  # not written by save_checkpoint
    torch.save(ckpt, tmp_path / "bare.pt")
    with pytest.raises(CheckpointError, match=r"bare\.pt: the 'model' weights do not match the checksum .*has none"):
        create_model(tmp_path / "bare.pt")


def _with_config(model, tmp_path, name, change):
    ckpt = read_checkpoint(save_checkpoint(tmp_path / "ok.pt", model))
    change(ckpt["model_config"])
    torch.save(ckpt, tmp_path / name)
    return tmp_path / name


@pytest.mark.parametrize("change, message", [
    (lambda c: c["yaml"]["backbone"].__setitem__(1, [-1, 100, "Conv", [32, 3, 2]]), "100 repeats"),
    (lambda c: c["yaml"]["backbone"].__setitem__(1, [-1, 1, "Conv", [10**9, 3, 2]]), "layer widths up to"),
    (lambda c: c["yaml"].__setitem__("width_multiple", 5.0), r"width_multiple=5\.0"),
    (lambda c: c.update(nc=200_000, names=["x"] * 3), "nc=200000"),
    (lambda c: c["yaml"].__setitem__("backbone", c["yaml"]["backbone"] * 50), "layer rows"),
    (lambda c: c["yaml"]["head"][0][3].__setitem__(0, 256), "weights do not match the model it describes"),
])
def test_a_model_config_past_the_bounds_is_refused_before_anything_is_allocated(model, tmp_path, monkeypatch,
                                                                                   change, message):
    """A damaged or hostile model_config (a huge model, or one that does not fit the weights) is refused
    with a clear error; no model is built off the meta device before that."""
    from yolo9kit.models.model import DetectionModel

    path = _with_config(model, tmp_path, "big.pt", change)
    built = []
    init = DetectionModel.__init__

    def recording_init(self, *args, **kwargs):
        built.append(str(torch.get_default_device()))
        init(self, *args, **kwargs)

    monkeypatch.setattr(DetectionModel, "__init__", recording_init)
    with pytest.raises(CheckpointError, match=f"big.pt: .*{message}"):
        create_model(path)
    assert all(device == "meta" for device in built), built


def test_a_save_checks_the_free_space_first(model, tmp_path, monkeypatch):
    import collections
    import shutil

    from yolo9kit.files import DiskFullError

    path = save_checkpoint(tmp_path / "w" / "last.pt", model, epoch=1)
    before = path.read_bytes()
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(DiskFullError, match=r"saving last\.pt needs about .* MiB in .*w, which has 4\.00 KiB free"):
        save_checkpoint(path, model, epoch=2)
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == ["last.pt"]
    with pytest.raises(DiskFullError):
        save_checkpoint(tmp_path / "new" / "weights" / "last.pt", model)
    assert not (tmp_path / "new").exists()  # nothing created either
