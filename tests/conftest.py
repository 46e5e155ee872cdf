"""Shared fixtures.

Reference outputs of the official YOLOv9 code are committed under ``tests/fixtures/official/`` (written by
``tools/official_reference.py``, see docs/parity.md). A parity test whose reference file is missing FAILS
with the file's name and the command that regenerates it: a clone of the repository runs every parity test.

Bigger references kept outside the repository (``$YOLO9KIT_FIXTURES``, or ``../shared/fixtures/official``
beside the checkout) serve extra cases only; those tests skip, with the reason, when the folder is absent.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "official"
REGENERATE = "python tools/official_reference.py --official PATH/TO/yolov9 --out tests/fixtures/official"


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


def holding_the_lock(folder: Path) -> subprocess.Popen:
    """Another process that takes ``folder``'s lock (``FolderLock``) and keeps it until killed."""
    other = subprocess.Popen([sys.executable, "-c", "import sys, time; from yolo9kit.files import FolderLock; "
                              "FolderLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)",
                              str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert other.stdout.readline() == "held\n"
    return other
