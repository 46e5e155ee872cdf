"""Shared fixtures: the official references, and what many tests need made once per test run (``shapes64``,
``tiny_model``, ``toy_fit``) or fresh for each test (``shapes4``).

Reference outputs of the official YOLOv9 code are committed under ``tests/fixtures/official/`` (written by
``tools/official_reference.py``, see docs/parity.md). A parity test whose reference file is missing FAILS
with the file's name and the command that regenerates it: a clone of the repository runs every parity test.

Bigger references kept outside the repository (``$YOLO9KIT_FIXTURES``, or ``../shared/fixtures/official``
beside the checkout) serve extra cases only; those tests skip, with the reason, when the folder is absent.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from notebook_checks import browser_missing
from train_toys import ToyNet, make_batches, toy_loss

from yolo9kit.config import TrainConfig
from yolo9kit.data import make_shapes
from yolo9kit.models import create_model
from yolo9kit.models.checkpoint import SHAPES_CLASSES
from yolo9kit.train.fit import fit

REPO = Path(__file__).resolve().parents[1]
if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs two workers: one thread each, their subprocesses too
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
FIXTURES = REPO / "tests" / "fixtures" / "official"
REGENERATE = "python tools/official_reference.py --official PATH/TO/yolov9 --out tests/fixtures/official"


def build_wheel(out: Path) -> Path:
    """A wheel of the checkout, built in ``out`` from a copy (so that the checkout gets no build/ or egg-info)."""
    src = out / "src"
    shutil.copytree(REPO / "yolo9kit", src / "yolo9kit", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(out / "dist"), str(src)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    return next((out / "dist").glob("yolo9kit-*.whl"))


def extra_fixtures_dir() -> Path | None:
    """The folder of extra (uncommitted) official references, or None when it is not there."""
    candidates = [os.environ.get("YOLO9KIT_FIXTURES"), REPO.parent / "shared" / "fixtures" / "official"]
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    return None


def committed_fixture(name: str) -> Path:
    """Path of a committed official reference; fails the test (never skips) when it is missing."""
    path = FIXTURES / name
    if not path.is_file():
        pytest.fail(f"official reference tests/fixtures/official/{name} is missing; regenerate the references "
                    f"from a checkout of WongKinYiu/yolov9 with `{REGENERATE}` (docs/parity.md)", pytrace=False)
    return path


def _torch_load(path: Path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.fixture(scope="session")
def official_fixture():
    """``official_fixture("ops.parity.pt")`` -> path of a committed reference; fails when it is missing."""
    return committed_fixture


@pytest.fixture(scope="session")
def load_fixture():
    """``load_fixture("ops.parity.pt")`` -> the dict stored in a committed reference (weights_only load)."""
    cache: dict[str, object] = {}

    def _load(name: str):
        if name not in cache:
            cache[name] = _torch_load(committed_fixture(name))
        return cache[name]

    return _load


@pytest.fixture(scope="session")
def extra_fixture():
    """``extra_fixture("yolov9-t-golden.pt")`` -> path of an extra reference; skips when it is absent."""

    def _get(name: str) -> Path:
        root = extra_fixtures_dir()
        if root is None:
            pytest.skip("extra official references not found: set YOLO9KIT_FIXTURES to their folder "
                        "(the committed ones in tests/fixtures/official cover every parity test)")
        path = root / name
        if not path.is_file():
            pytest.skip(f"extra official reference {name} not found in {root}")
        return path

    return _get


@pytest.fixture(scope="session")
def load_extra_fixture(extra_fixture):
    """``load_extra_fixture("yolov9-t-golden.pt")`` -> its dict; skips when it is absent."""
    cache: dict[str, object] = {}

    def _load(name: str):
        if name not in cache:
            cache[name] = _torch_load(extra_fixture(name))
        return cache[name]

    return _load


@pytest.fixture(autouse=True)
def _own_calibrations(tmp_path_factory, monkeypatch):
    """Measured calibrations recorded on this machine (``checks --gpu``) live in the user's home; tests read
    and write an empty folder of their own instead, so a developer's measurements change no test."""
    import yolo9kit.memory.gpus as gpus

    folder = tmp_path_factory.mktemp("memory_calibration")
    monkeypatch.setattr(gpus, "user_calibration_dir", lambda: folder)
    return folder


@pytest.fixture
def callbacks_every_batch(monkeypatch):
    """on_batch after every batch (the loop reads the losses back every LOG_INTERVAL batches): for tests that stop
    a run from a callback at one exact batch."""
    monkeypatch.setattr("yolo9kit.train.loop.LOG_INTERVAL", 1)


def holding_the_lock(folder: Path) -> subprocess.Popen:
    """Another process that takes ``folder``'s lock (``FolderLock``) and keeps it until killed."""
    other = subprocess.Popen([sys.executable, "-c", "import sys, time; from yolo9kit.files import FolderLock; "
                              "FolderLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)",
                              str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert other.stdout.readline() == "held\n"
    return other


@pytest.fixture(scope="session")
def shapes64(tmp_path_factory) -> Path:
    """data.yaml of a small shapes set made once per test run: 8 train and 4 val images, 64 px, the 3 classes of
    the shipped model, seed 0. Shared: read it, never change its files (make your own set for that)."""
    return make_shapes(tmp_path_factory.mktemp("shapes64"), n_train=8, n_val=4, imgsz=64, num_classes=3, seed=0)


@pytest.fixture
def shapes4(tmp_path) -> Path:
    """data.yaml of a shapes set of the test's own: 4 train and 2 val images, 64 px, 2 classes. A test may change
    its files."""
    return make_shapes(tmp_path / "shapes", n_train=4, n_val=2, imgsz=64, num_classes=2)


@pytest.fixture(scope="session")
def _tiny_model_built():
    return create_model("yolov9-t", names=list(SHAPES_CLASSES), seed=0)


@pytest.fixture
def tiny_model(_tiny_model_built):
    """A yolov9-t with random weights (seed 0) and the shapes' 3 classes, in training mode: a copy of one built
    once per test run, so a test may change it."""
    return copy.deepcopy(_tiny_model_built)


@pytest.fixture(scope="session")
def toy_fit(tmp_path_factory):
    """The ``FitResult`` of one finished run, made once per test run: ``ToyNet`` (tests/train_toys.py), 3 epochs of
    2 random batches of 2 images, fitness rising every epoch (so each epoch writes best.pt). Shared: read its
    run folder, never change it."""
    config = TrainConfig(epochs=3, batch_size=2, accumulate_steps=1, amp="off", device="cpu", warmup_epochs=0.0,
                         warmup_min_batches=0, progress_bar=False, plots=False,
                         project=str(tmp_path_factory.mktemp("toy_fit")), name="toy")
    epoch = iter(range(1, 100))

    def validate(model):
        n = next(epoch)
        return {"precision": 0.5, "recall": 0.5, "map50": 0.1 * n, "map50_95": 0.05 * n, "fitness": 0.055 * n}

    torch.manual_seed(0)
    return fit(ToyNet(), None, config, loss_fn=toy_loss, train_loader=make_batches(2, 2), validate_fn=validate)


def _param(item, name: str):
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(name) if callspec else None


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs
def pytest_collection_modifyitems(config, items):
    """Each notebook runs once per session: a widget notebook that the browser test runs is not also run
    headless (where the browser cannot run, the headless test runs it). The files that hold slow tests come
    first (a stable sort: each file's tests stay together), so that `make test`'s two workers end together."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") or item.get_closest_marker("browser")}
    items.sort(key=lambda item: item.path not in slow_files)
    if browser_missing():
        return
    in_browser = {_param(item, "name") for item in items if item.get_closest_marker("browser")}
    twice = [item for item in items if item.originalname == "test_notebook_runs_in_smoke_mode"
             and _param(item, "path").name in in_browser]
    if twice:
        items[:] = [item for item in items if item not in twice]
        config.hook.pytest_deselected(items=twice)
