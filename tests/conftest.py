"""Shared fixtures. Reference outputs of the official code are read from ``$YOLO9KIT_FIXTURES`` or
``../shared/fixtures/official`` beside the checkout; tests that need them skip, with the reason,
when they are absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def fixtures_dir() -> Path | None:
    """The folder of official reference fixtures, or None when it is not there."""
    candidates = [os.environ.get("YOLO9KIT_FIXTURES"), REPO.parent / "shared" / "fixtures" / "official"]
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    return None


@pytest.fixture(scope="session")
def official_fixture():
    """``official_fixture("yolov9-t.parity.pt")`` -> path; skips when the file is absent."""

    def _get(name: str) -> Path:
        root = fixtures_dir()
        if root is None:
            pytest.skip("official fixtures not found: set YOLO9KIT_FIXTURES to the folder of official outputs")
        path = root / name
        if not path.is_file():
            pytest.skip(f"official fixture {name} not found in {root}")
        return path

    return _get


@pytest.fixture(scope="session")
def load_fixture(official_fixture):
    """``load_fixture("ops.parity.pt")`` -> the dict stored in it (weights_only load)."""
    import torch

    cache: dict[str, object] = {}

    def _load(name: str):
        if name not in cache:
            cache[name] = torch.load(official_fixture(name), map_location="cpu", weights_only=True)
        return cache[name]

    return _load
