"""Each training setting is declared once (config.declare): the train command's flags, their checks and the
resume rules are read from the declarations, so they cannot drift from TrainConfig."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from yolo9kit.cli import train as train_cli
from yolo9kit.config import TrainConfig
from yolo9kit.config.declare import CHANGE, KEEP, RUN, Declared, declarations
from yolo9kit.train.rundir import FIXED_ON_RESUME

DECLARED = declarations(TrainConfig)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    train_cli.add_parser(parser.add_subparsers())
    return parser


def _train_actions() -> dict[str, argparse.Action]:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
    return {a.dest: a for a in sub._actions}


def test_every_field_is_declared_with_a_flag_or_a_reason():
    assert set(DECLARED) == {f.name for f in dataclasses.fields(TrainConfig)}
    for name, (_, declared) in DECLARED.items():
        assert (declared.flag is None) != (declared.no_flag is None), name
        assert declared.help and declared.resume in (KEEP, CHANGE, RUN), name


def test_a_declaration_without_flag_or_reason_is_refused():
    with pytest.raises(ValueError, match="has a flag or says why it has none"):
        Declared("a setting nobody can set")
    with pytest.raises(ValueError, match="not both"):
        Declared("both", flag="--x", no_flag="API only")


def test_the_parser_has_each_declared_flag_and_nothing_given_means_not_given():
    actions = _train_actions()
    for name, (_, declared) in DECLARED.items():
        if declared.flag is None:  # set through another flag (--hyp, --plain-step, --cos-lr) or the API only
            continue
        action = actions[name]
        assert declared.flag in action.option_strings and set(declared.aliases) <= set(action.option_strings), name
        assert action.default is None, name  # a resume sees a flag given with its default value
        assert action.help.startswith(declared.help), name
    args = _parser().parse_args(["train", "--data", "d.yaml"])
    assert train_cli.given_settings(args) == {}
    assert train_cli.config_from_args(args) == TrainConfig()  # every default is the declaration's


@pytest.mark.parametrize("name", [n for n, (_, d) in DECLARED.items()
                                  if d.flag and (d.low is not None or d.high is not None) and n != "batch_size"])
def test_a_value_out_of_range_is_refused_in_the_same_words_by_the_flag_and_the_config(name, capsys):
    f, declared = DECLARED[name]
    bad = declared.low - 1 if declared.low is not None else declared.high + 1
    bad = int(bad) if declared.integer else bad
    with pytest.raises(ValueError, match=rf"TrainConfig\.{name}=.*expected {re.escape(declared.expected)}"):
        TrainConfig(**{name: bad})
    with pytest.raises(SystemExit):
        _parser().parse_args(["train", declared.flag, str(bad)])
    error = capsys.readouterr().err.splitlines()[-1]
    assert f"argument {declared.flag}" in error and f"expected {declared.expected}" in error, error


def test_a_flag_gives_the_config_the_value_the_api_takes():
    args = _parser().parse_args(["train", "--data", "d.yaml", "--epochs", "7", "--margin", "0.2", "--imgsz", "320",
                                 "--noval", "--no-plots", "--rect", "--seed", "3", "--amp", "off", "--cos-lr"])
    assert train_cli.config_from_args(args) == TrainConfig(epochs=7, margin=0.2, imgsz=320, val=False, plots=False,
                                                           rect=True, seed=3, amp="off", schedule="cosine")


def test_the_resume_rules_are_the_declared_ones():
    assert set(FIXED_ON_RESUME) == {n for n, (_, d) in DECLARED.items() if d.resume == KEEP}
    assert {"epochs", "patience", "device", "workers", "cache", "val", "plots"} <= \
        {n for n, (_, d) in DECLARED.items() if d.resume == CHANGE}
    assert {"batch_size", "imgsz", "lr0", "seed", "schedule", "freeze"} <= set(FIXED_ON_RESUME)


def test_a_resume_refuses_each_kept_flag_and_takes_each_changeable_one():
    saved = TrainConfig().to_dict()
    for name, (_, declared) in DECLARED.items():
        if declared.flag is None or name in ("resume", "project"):
            continue
        value = {"--batch-size": "8", "--gpu": "H100", "--freeze": "3", "--amp": "off", "--optimizer": "AdamW",
                 "--device": "cpu", "--cache": "disk", "--compile": "max-autotune", "--name": "other",
                 "--activation-checkpointing": "all", "--imgsz": "320", "--margin": "0.3",
                 "--label-smoothing": "0.1"}.get(declared.flag, "5")
        is_switch = _train_actions()[name].nargs == 0
        argv = ["train", "--resume", "x", declared.flag] + ([] if is_switch else [value])
        args = _parser().parse_args(argv)
        refused = train_cli._refused_on_resume(args, saved, {"name": "yolov9-t"})
        assert bool(refused) == (declared.resume != CHANGE), (name, refused)
        if refused:
            assert refused[0].startswith(declared.flag), refused
