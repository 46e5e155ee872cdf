"""Parity with the official YOLOv9 implementation, measured on its reference fixtures (CPU, float32):
raw and decoded outputs, fresh initialisation, official checkpoint loading, deploy conversion."""

from __future__ import annotations

import datetime
import random
import sys

import pytest
import torch

from yolo9kit.models import create_model, load_official_checkpoint, to_deploy
from yolo9kit.models.official import OfficialCheckpointError

TOL = 1e-4  # max abs diff / max abs value


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def _fp32(state_dict: dict) -> dict:
    return {k: v.float() if v.is_floating_point() else v for k, v in state_dict.items()}


def _first_differing_layer(model, x, stats) -> str:
    """Index of the first layer whose output sum differs from the official per-layer statistics."""
    outputs = {}
    hooks = [m.register_forward_hook(lambda mod, _i, o: outputs.__setitem__(mod.i, o)) for m in model.model]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    for i, ref in sorted(stats.items()):
        o = outputs.get(i)
        if isinstance(o, torch.Tensor) and abs(o.double().abs().sum().item() - ref["abs_sum"]) > 1e-3 * (
                abs(ref["abs_sum"]) + 1e-6):
            return f"first differing layer {i}: abs_sum {o.double().abs().sum().item()} vs {ref['abs_sum']}"
    return "no layer statistic differs"


@pytest.fixture(scope="module")
def golden(load_fixture):
    return load_fixture("yolov9-t-golden.pt")


@pytest.fixture(scope="module")
def golden_model(golden):
    model = create_model("yolov9-t")
    model.load_state_dict(_fp32(golden["state_dict_fp16"]), strict=True)
    return model


def test_golden_eval_outputs(golden, golden_model):
    model = golden_model.eval()
    with torch.no_grad():
        out = model(golden["input"])
        raw = model(golden["input"], raw=True)
    assert _rel(out.aux, golden["eval_aux"]) < TOL and _rel(out.main, golden["eval_main"]) < TOL
    for got, ref in zip(raw.aux + raw.main, golden["eval_raw_aux"] + golden["eval_raw_main"]):
        assert got.shape == ref.shape and _rel(got, ref) < TOL


def test_golden_train_outputs(golden, golden_model):
    model = golden_model.train()
    with torch.no_grad():
        out = model(golden["input"])
    for got, ref in zip(out.aux + out.main, golden["train_raw_aux"] + golden["train_raw_main"]):
        assert got.shape == ref.shape and _rel(got, ref) < TOL


def test_golden_deploy_keeps_main_output(golden, golden_model):
    model = golden_model.eval()
    with torch.no_grad():
        ref = model(golden["input"]).main
        got = to_deploy(model)(golden["input"]).main
    assert _rel(got, ref) < 1e-5


@pytest.mark.parametrize("name", ["yolov9-t", "gelan-t"])
def test_parity_fixture(load_fixture, name):
    fx = load_fixture(f"{name}.parity.pt")
    model = create_model(name)
    assert sum(p.numel() for p in model.parameters()) == fx["params"]
    assert torch.equal(model.stride, fx["stride"].float())
    state = _fp32(fx["state_dict"])
    model.load_state_dict(state, strict=True)
    model.eval()
    with torch.no_grad():
        out = model(fx["input"])
    ref_eval = fx["eval_out"]  # official order: aux, main
    got_eval = [out.aux, out.main] if model.is_dual else [out.main]
    for got, ref in zip(got_eval, ref_eval, strict=True):
        assert _rel(got, ref) < TOL, _first_differing_layer(model, fx["input"], fx["eval_layer_stats"])

    model.load_state_dict(state, strict=True)  # fresh BN statistics for the training-mode pass
    model.train()
    with torch.no_grad():
        out = model(fx["input"])
    ref_train = fx["train_out"] if model.is_dual else [fx["train_out"]]
    got_train = [out.aux, out.main] if model.is_dual else [out.main]
    for got_maps, ref_maps in zip(got_train, ref_train, strict=True):
        for got, ref in zip(got_maps, ref_maps, strict=True):
            assert _rel(got, ref) < TOL, _first_differing_layer(model.eval(), fx["input"], fx["eval_layer_stats"])


@pytest.mark.parametrize("name", ["yolov9-t", "gelan-t"])
def test_seeded_initialisation_equals_official(load_fixture, name):
    """With seed 0 the fresh model has the official fresh weights: same construction order, default conv
    init, head bias priors and probe-pass BN statistics (stored rounded to fp16)."""
    fx = load_fixture(f"{name}.parity.pt")
    torch.manual_seed(0)
    ours = create_model(name).state_dict()
    # num_batches_tracked is skipped: the fixture stores 2 where a fresh official build measures 1 (spec 3.1);
    # with a fixed momentum the counter never enters a computation
    differ = [k for k, v in fx["state_dict"].items()
              if "num_batches_tracked" not in k and not torch.equal(ours[k].half(), v.half())]
    assert not differ, differ[:5]


@pytest.mark.parametrize("ckpt_name, parity_name, entry", [
    ("yolov9-t.official-release.pt", "yolov9-t.parity.pt", "model"),
    ("gelan-t.official-release.pt", "gelan-t.parity.pt", "model"),
    ("yolov9-t.official-train.pt", "yolov9-t.parity.pt", "ema"),
])
def test_official_checkpoint_loads_and_reproduces_outputs(official_fixture, load_fixture, ckpt_name, parity_name,
                                                          entry):
    model = load_official_checkpoint(official_fixture(ckpt_name))
    assert not model.training and next(model.parameters()).dtype == torch.float32
    assert model.nc == 80 and model.names[:2] == ["0", "1"] and model.checkpoint_meta["entry"] == entry
    assert not any(m == "models" or m.startswith(("models.", "utils.")) for m in sys.modules)
    fx = load_fixture(parity_name)
    reference = create_model(parity_name.split(".")[0])
    reference.load_state_dict(_fp32(fx["state_dict"]), strict=True)
    reference.eval()
    with torch.no_grad():
        got, ref = model(fx["input"]), reference(fx["input"])
    assert _rel(got.main, ref.main) == 0.0 and _rel(got.main, fx["eval_out"][-1]) < TOL
    if model.is_dual:
        assert _rel(got.aux, fx["eval_out"][0]) < TOL


def test_official_train_checkpoint_metadata(official_fixture):
    model = load_official_checkpoint(official_fixture("yolov9-t.official-train.pt"))
    assert model.checkpoint_meta["epoch"] == 3 and model.checkpoint_meta["best_fitness"] == pytest.approx(0.1)


def test_official_checkpoint_rejects_bad_files(official_fixture, tmp_path):
    release = official_fixture("yolov9-t.official-release.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(release[: len(release) // 2])
    (tmp_path / "random.pt").write_bytes(random.Random(1).randbytes(4096))
    torch.save({"model": {"weight": torch.zeros(2)}}, tmp_path / "state_dict.pt")
    torch.save({"model": datetime.datetime(2024, 1, 1)}, tmp_path / "foreign_global.pt")
    cases = {"truncated.pt": "truncated or corrupted", "random.pt": "truncated or corrupted",
             "state_dict.pt": "expected the pickled official DetectionModel",
             "foreign_global.pt": r"datetime\.datetime.*refusing to unpickle"}
    for name, match in cases.items():
        with pytest.raises(OfficialCheckpointError, match=match):
            load_official_checkpoint(tmp_path / name)
    with pytest.raises(FileNotFoundError):
        load_official_checkpoint(tmp_path / "missing.pt")


def test_official_checkpoint_hint_for_kit_checkpoint(tmp_path):
    from yolo9kit.checkpoint import save_checkpoint

    path = save_checkpoint(tmp_path / "kit.pt", create_model("gelan-t"))
    with pytest.raises(OfficialCheckpointError, match="yolo9kit checkpoint.*load_checkpoint"):
        load_official_checkpoint(path)
