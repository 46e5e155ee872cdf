"""Parity with the official YOLOv9 implementation on the committed references (tests/fixtures/official,
docs/parity.md): for all ten models the state_dict layout, the seed-0 initial weights, the decoded outputs
in eval mode and the raw maps in training mode (CPU, float32); official checkpoint files of both formats
load without the official code and reproduce what the official ``attempt_load`` computes.

Extra cases read the bigger references kept outside the repository when they are there.
"""

from __future__ import annotations

import datetime
import math
import random
import sys

import pytest
import torch
from official_parity import SMALL, first_differing_layer, init_fingerprint, rel, run_kit, seed0_state

from yolo9kit.models import create_model, list_models, to_deploy
from yolo9kit.models.weights import CheckpointError

TOL = 1e-4  # max abs diff / max abs value; measured agreement is about 1e-6 (docs/parity.md)
MODELS = [name if name in SMALL else pytest.param(name, marks=pytest.mark.slow) for name in list_models()]


def test_every_model_has_a_committed_reference(official_fixture):
    for name in list_models():
        official_fixture(f"{name}.parity.pt")  # fails, naming the file and the command, when one is missing


def test_committed_references_stay_small():
    """The references are committed: they stay under 8 MB in all."""
    from conftest import FIXTURES

    total = sum(p.stat().st_size for p in FIXTURES.iterdir() if p.is_file())
    assert 0 < total < 8e6, f"tests/fixtures/official holds {total / 1e6:.1f} MB"


# BatchNorm running statistics of the stride probe: tolerance per entry, relative to its abs sum and per
# element. In yolov9-e and gelan-e a few of them (downstream of CBLinear's biases) are ill-conditioned: on a
# 2-core AMD EPYC the kit's own build misses (1e-5, 1e-6) by up to 1.7 times, whether oneDNN is on or off:
# float32 rounding, not the construction. (1e-4, 1e-5) covers that with a margin of about six; a construction
# error moves them by far more (test_a_wrong_probe_fails_the_initialisation_check). In m/c such entries miss
# (1e-4, 1e-5) by 55 times on two threads and by 60 to 90 times after bf16 work was left switched on, so the
# build compared runs in a new process on one thread (official_parity.seed0_state), whatever ran before.
RUNNING_STATS_TOL = (1e-4, 1e-5)


def _init_differs(key: str, shape: tuple, ours: torch.Tensor, ref: torch.Tensor) -> bool:
    """Weights and biases come from the seeded RNG: equal (1e-9). BatchNorm running statistics are float32
    means and variances the stride probe measures over 256x256 maps: within ``RUNNING_STATS_TOL`` (relative
    to the entry's abs sum, plus a term per element for the rounding around exact zeros). Both builds run on
    one thread, ours in a new process (official_parity.seed0_state)."""
    if not key.endswith(("running_mean", "running_var")):
        return not torch.allclose(ours, ref, rtol=1e-9, atol=1e-9)
    relative, per_element = RUNNING_STATS_TOL
    tol = relative * float(ref[1]) + per_element * math.prod(shape)
    return bool((ours - ref).abs().max() > tol)


def _differing_entries(fx: dict, init: torch.Tensor) -> list[str]:
    """The state_dict keys whose fingerprint in ``init`` differs from the reference's (``_init_differs``)."""
    floats = [(k, tuple(s)) for k, s in fx["layout"] if "num_batches_tracked" not in k]
    assert len(floats) == len(fx["init"]) == len(init)
    return [k for (k, shape), a, b in zip(floats, init, fx["init"]) if _init_differs(k, shape, a, b)]


def test_a_wrong_probe_fails_the_initialisation_check(load_fixture, monkeypatch):
    """The running-statistics tolerance still catches a construction error: a build whose stride probe runs
    twice (its BatchNorm statistics updated twice, the official build updates them once) fails it."""
    from yolo9kit.models import create_model
    from yolo9kit.models.model import DetectionModel

    fx = load_fixture("yolov9-t.parity.pt")
    probe = DetectionModel._probe_strides

    def twice(self):
        probe(self)
        probe(self)

    monkeypatch.setattr(DetectionModel, "_probe_strides", twice)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        state = create_model("yolov9-t").state_dict()
    finally:
        torch.set_num_threads(threads)
    differ = _differing_entries(fx, init_fingerprint(state))
    assert differ and all(k.endswith(("running_mean", "running_var")) for k in differ)


@pytest.mark.slow
def test_the_seeded_build_does_not_depend_on_what_the_process_ran_before(load_fixture):
    """An autocast region left open (or a precision setting, other kernels) changes yolov9-m's ill-conditioned
    probe statistics in this process by far more than the tolerance; the build compared is not made here."""
    fx = load_fixture("yolov9-m.parity.pt")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        state = seed0_state("yolov9-m")
    assert not _differing_entries(fx, init_fingerprint(state))


@pytest.mark.parametrize("name", MODELS)
def test_layout_and_seeded_initialisation_equal_official(load_fixture, name):
    """Same keys and shapes, parameter count and strides as the official model; with seed 0 the fresh
    weights are the official fresh weights (same construction order, default conv init, head bias priors,
    BN statistics of the stride probe), compared through each entry's sum and abs sum."""
    fx, ours = load_fixture(f"{name}.parity.pt"), run_kit(name)
    assert ours["layout"] == [(k, tuple(s)) for k, s in fx["layout"]]
    assert ours["params"] == fx["params"] and torch.equal(ours["stride"], fx["stride"].float())
    differ = _differing_entries(fx, ours["init"])
    assert not differ, f"initial weights differ from the official seed-0 build: {differ[:5]}"


@pytest.mark.parametrize("name", MODELS)
def test_eval_outputs_equal_official(load_fixture, name):
    """Decoded (B, 4 + nc, anchors) outputs of every head in eval mode (official order: aux, then main)."""
    fx, ours = load_fixture(f"{name}.parity.pt"), run_kit(name)
    assert len(ours["eval_out"]) == len(fx["eval_out"])
    for got, ref in zip(ours["eval_out"], fx["eval_out"]):
        assert got.shape == ref.shape
        assert rel(got, ref) < TOL, first_differing_layer(ours["eval_layer_stats"], fx["eval_layer_stats"])


@pytest.mark.parametrize("name", MODELS)
def test_train_outputs_equal_official(load_fixture, name):
    """Raw (B, 4 * 16 + nc, H / s, W / s) maps of every head in training mode (batch statistics)."""
    fx, ours = load_fixture(f"{name}.parity.pt"), run_kit(name)
    dual = name.startswith("yolov9")
    got_heads = ours["train_out"] if dual else [ours["train_out"]]
    ref_heads = fx["train_out"] if dual else [fx["train_out"]]
    assert len(got_heads) == len(ref_heads)
    for got_maps, ref_maps in zip(got_heads, ref_heads):
        assert [m.shape for m in got_maps] == [m.shape for m in ref_maps]
        for got, ref in zip(got_maps, ref_maps):
            assert rel(got, ref) < TOL, first_differing_layer(ours["eval_layer_stats"], fx["eval_layer_stats"])


# ------------------------------------------------------------------------------------- checkpoints

CHECKPOINTS = [("yolov9-t-narrow.official-release.pt", "model"), ("gelan-t-narrow.official-release.pt", "model"),
               ("gelan-t-narrow.official-train.pt", "ema")]


@pytest.mark.parametrize("file_name, entry", CHECKPOINTS)
def test_official_checkpoint_loads_and_reproduces_outputs(official_fixture, load_fixture, file_name, entry):
    """Release files (official strip_optimizer) and a training file (as train_dual.py saves it) load without
    the official code; the outputs equal the official attempt_load's (fp32, fused) on the same input."""
    ref = load_fixture("checkpoints.parity.pt")[file_name]
    model = create_model(official_fixture(file_name))
    assert model.training and next(model.parameters()).dtype == torch.float32
    assert model.checkpoint_meta["entry"] == ref["entry"] == entry
    assert model.nc == ref["nc"] == 3 and model.names == ref["names"] == ["circle", "square", "triangle"]
    assert model.name == file_name.split(".")[0] and torch.equal(model.stride, ref["stride"].float())
    assert not any(m == "models" or m.startswith(("models.", "utils.")) for m in sys.modules)
    x = load_fixture("checkpoints.parity.pt")["image"].float() / 255
    with torch.no_grad():
        out = model.eval()(x)
    got = [out.aux, out.main] if model.is_dual else [out.main]
    assert len(got) == len(ref["eval_out"])
    for g, r in zip(got, ref["eval_out"]):
        assert torch.isfinite(r).all() and g.shape == r.shape and rel(g, r) < TOL


def test_official_checkpoint_metadata(load_fixture, official_fixture):
    train = create_model(official_fixture("gelan-t-narrow.official-train.pt"))
    assert train.checkpoint_meta["epoch"] == 3 and train.checkpoint_meta["best_fitness"] == pytest.approx(0.1)
    release = create_model(official_fixture("yolov9-t-narrow.official-release.pt"))
    assert release.checkpoint_meta["epoch"] == -1 and release.checkpoint_meta["best_fitness"] is None


def test_official_checkpoint_rejects_bad_files(official_fixture, tmp_path):
    release = official_fixture("yolov9-t-narrow.official-release.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(release[: len(release) // 2])
    (tmp_path / "random.pt").write_bytes(random.Random(1).randbytes(4096))
    torch.save({"model": {"weight": torch.zeros(2)}}, tmp_path / "state_dict.pt")
    torch.save({"model": datetime.datetime(2024, 1, 1)}, tmp_path / "foreign_global.pt")
    cases = {"truncated.pt": "truncated, corrupted", "random.pt": "truncated, corrupted",
             "state_dict.pt": "not a yolo9kit checkpoint.*bare state_dict",
             "foreign_global.pt": r"datetime\.datetime.*refusing to unpickle"}
    for name, match in cases.items():
        with pytest.raises(CheckpointError, match=match):
            create_model(tmp_path / name)
    with pytest.raises(FileNotFoundError):
        create_model(tmp_path / "missing.pt")


# ------------------------------------------------------------- extra: references outside the repository

def _fp32(state_dict: dict) -> dict:
    return {k: v.float() if v.is_floating_point() else v for k, v in state_dict.items()}


@pytest.fixture(scope="module")
def golden(load_extra_fixture):
    """yolov9-t at 160 px with randomised weights (kept outside the repository: 12 MB)."""
    return load_extra_fixture("yolov9-t-golden.pt")


@pytest.fixture(scope="module")
def golden_model(golden):
    model = create_model("yolov9-t")
    model.load_state_dict(_fp32(golden["state_dict_fp16"]), strict=True)
    return model


def test_extra_golden_eval_and_train_outputs(golden, golden_model):
    model = golden_model.eval()
    with torch.no_grad():
        out = model(golden["input"])
        raw = model(golden["input"], raw=True)
    assert rel(out.aux, golden["eval_aux"]) < TOL and rel(out.main, golden["eval_main"]) < TOL
    for got, ref in zip(raw.aux + raw.main, golden["eval_raw_aux"] + golden["eval_raw_main"]):
        assert got.shape == ref.shape and rel(got, ref) < TOL
    with torch.no_grad():
        out = golden_model.train()(golden["input"])
    for got, ref in zip(out.aux + out.main, golden["train_raw_aux"] + golden["train_raw_main"]):
        assert got.shape == ref.shape and rel(got, ref) < TOL


def test_extra_golden_deploy_keeps_main_output(golden, golden_model):
    model = golden_model.eval()
    with torch.no_grad():
        ref = model(golden["input"]).main
        got = to_deploy(model)(golden["input"]).main
    assert rel(got, ref) < 1e-5


@pytest.mark.parametrize("file_name", ["yolov9-t.official-release.pt", "gelan-t.official-release.pt",
                                       "yolov9-t.official-train.pt"])
def test_extra_full_size_official_checkpoints_load(extra_fixture, file_name):
    """Full-width (80-class) official files: they load strictly and run."""
    model = create_model(extra_fixture(file_name)).eval()
    assert model.nc == 80 and model.names[:2] == ["0", "1"]
    with torch.no_grad():
        out = model(torch.zeros(1, 3, 64, 64))
    assert out.main.shape == (1, 84, 84)

