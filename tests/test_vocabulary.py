"""One word per idea: every name of the public API and the command line is one docs/glossary.md defines.

The public API read here: the names the package exports (``yolo9kit``, ``yolo9kit.memory``, ``.data``,
``.train``, ``.plots``, ``.widgets``, ``.config``, ``.extras``), the entry points of ``validate``, ``prediction``,
``models`` and ``models.checkpoint``, and the fields of every ``...Config`` settings class. Result types (a
dataclass that is not a settings class) and the layer-building classes (official names, for checkpoints)
are not parameters a user passes, so they are left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import re

import pytest
from conftest import REPO

GLOSSARY = REPO / "docs" / "glossary.md"
# module -> the names read (None: its __all__)
SURFACES: dict[str, list[str] | None] = {
    "yolo9kit": None, "yolo9kit.memory": None, "yolo9kit.data": None,
    "yolo9kit.plots": None, "yolo9kit.widgets": None, "yolo9kit.config": None,
    "yolo9kit.train.fit": ["fit", "FitResult"], "yolo9kit.extras": None,
    "yolo9kit.train.loop": ["train_one_epoch", "EpochStats"],
    "yolo9kit.train.step": ["Trainer", "build_trainer", "describe_step", "train_step", "ModelEMA"],
    "yolo9kit.train.optim": ["base_accumulate", "build_optimizer", "lr_factor", "param_groups",
                             "scaled_weight_decay", "step_settings", "warmup_batches"],
    "yolo9kit.train.records": ["read_results", "BatchRecord", "EpochRecord"],
    "yolo9kit.train.guards": ["NonFiniteLossError", "OutOfMemoryAtMinimumError"],
    "yolo9kit.train.rundir": ["class_names"], "yolo9kit.files": ["DiskFullError"],
    "yolo9kit.validate": ["evaluate", "compare_heads"], "yolo9kit.prediction": ["predict"],
    "yolo9kit.models.checkpoint": ["read_checkpoint", "save_checkpoint"],
    "yolo9kit.models": ["create_model", "load_model", "list_models", "model_table", "to_deploy", "fuse", "count_flops"],
}


def _glossary() -> tuple[set[str], set[str]]:
    """(names in the first column of the glossary's tables, words of its "not" column)."""
    names, banned = set(), set()
    for line in GLOSSARY.read_text().splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        names |= set(re.findall(r"`-{0,2}([A-Za-z_][A-Za-z0-9_-]*)`", cells[0]))
        if len(cells) >= 4:
            banned |= set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", cells[3]))
    return {n.replace("-", "_") for n in names}, banned


def _parameters(obj) -> list[str]:
    if inspect.isclass(obj):
        if dataclasses.is_dataclass(obj):
            return [f.name for f in dataclasses.fields(obj)] if obj.__name__.endswith("Config") else []
        if issubclass(obj, (BaseException, tuple)):
            return []
        return [p for p in inspect.signature(obj.__init__).parameters if p != "self"]
    return list(inspect.signature(obj).parameters) if callable(obj) else []


def public_parameters() -> dict[str, set[str]]:
    """parameter name -> the public callables that take it."""
    found: dict[str, set[str]] = {}
    for module_name, names in SURFACES.items():
        module = importlib.import_module(module_name)
        for name in names or module.__all__:
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                continue
            for parameter in _parameters(obj):
                found.setdefault(parameter, set()).add(f"{module_name}.{name}")
    return found


def cli_flags() -> dict[str, set[str]]:
    """flag (its first spelling, without dashes, ``_`` for ``-``) -> the verbs that take it (hidden aliases
    of renamed flags are left out: they only warn and say the new spelling)."""
    from yolo9kit.cli import build_parser

    found: dict[str, set[str]] = {}

    def walk(parser: argparse.ArgumentParser, verb: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{verb} {name}".strip())
            elif action.help != argparse.SUPPRESS and action.dest != "help":
                flag = action.option_strings[0] if action.option_strings else action.dest
                found.setdefault(flag.lstrip("-").replace("-", "_"), set()).add(verb)

    walk(build_parser(), "")
    return found


def test_glossary_has_names_and_banned_words():
    names, banned = _glossary()
    assert {"imgsz", "amp", "activation_checkpointing", "device", "gpu", "method", "step"} <= names
    assert {"precision", "image_size", "checkpoint", "lean", "nc"} <= banned
    assert not names & banned, names & banned


@pytest.mark.parametrize("read", [public_parameters, cli_flags], ids=["api", "cli"])
def test_every_public_name_is_in_the_glossary(read):
    names, banned = _glossary()
    used = read()
    outside = {n: sorted(where) for n, where in used.items() if n not in names and n not in ("self", "h")}
    assert not outside, f"names outside docs/glossary.md (add them there, or use the glossary's word): {outside}"
    wrong = {n: sorted(where) for n, where in used.items() if n in banned}
    assert not wrong, f"words the glossary rules out: {wrong}"


def test_the_check_fails_on_a_name_outside_the_glossary(monkeypatch):
    """The check is not vacuous: a public function with an unlisted or a banned name is caught."""
    import yolo9kit.memory

    def probe(model, precision="fp16", zebra=1):
        return model

    monkeypatch.setattr(yolo9kit.memory, "probe", probe, raising=False)
    monkeypatch.setattr(yolo9kit.memory, "__all__", [*yolo9kit.memory.__all__, "probe"])
    names, banned = _glossary()
    used = public_parameters()
    assert "zebra" in used and "zebra" not in names
    assert "precision" in used and "precision" in banned
