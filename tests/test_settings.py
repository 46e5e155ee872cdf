"""Each training setting is declared once (config.step.declare): the train command's flags, their checks and the
resume rules are read from the declarations, so they cannot drift from TrainConfig."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from yolo9kit.cli import train as train_cli
from yolo9kit.config import LossConfig, OptimConfig, PipelineConfig, RunConfig, StepConfig, TrainConfig
from yolo9kit.config.step import CHANGE, KEEP, RUN, Declared, settings
from yolo9kit.train.rundir import FIXED_ON_RESUME

DECLARED = {name: (f, declared) for name, (_, f, declared) in settings(TrainConfig).items()}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    train_cli.add_parser(parser.add_subparsers())
    return parser


def _train_actions() -> dict[str, argparse.Action]:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
    return {a.dest: a for a in sub._actions}


# StepConfig fields that are not training settings: fit's model fills the first two in, the memory tools'
# synthetic batch and custom loss use the next two, and resolve() the last
NOT_SETTINGS = {"model", "num_classes", "num_targets", "loss_fn", "device_type"}


def test_every_field_of_every_part_is_declared_with_a_flag_or_a_reason():
    for f in dataclasses.fields(TrainConfig):
        part = f.metadata.get("part")
        assert part is not None or "declared" in f.metadata, f.name
        for inner in dataclasses.fields(part) if part else ():
            assert "declared" in inner.metadata or (part is StepConfig and inner.name in NOT_SETTINGS), inner.name
    assert len(DECLARED) == sum(len(dataclasses.fields(f.metadata["part"])) for f in dataclasses.fields(TrainConfig)
                                if "part" in f.metadata) - len(NOT_SETTINGS) + 6  # epochs, time, batch_size, recipe,
    # gpu, margin
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


def test_a_resume_refuses_each_kept_flag_and_takes_each_changeable_one(tmp_path):
    """Each declared flag against the declarations, then ``train --resume LAST`` against a run's checkpoint: the
    refusal names each flag with the run's value, a flag given with its default value is seen, and the run's own
    batch and the changeable flags are taken."""
    saved = TrainConfig().to_dict()
    for name, (_, declared) in DECLARED.items():
        if declared.flag is None or name in ("resume", "project"):
            continue
        value = {"--batch-size": "8", "--gpu": "H100", "--freeze": "3", "--amp": "off", "--optimizer": "AdamW",
                 "--device": "cpu", "--cache": "disk", "--compile": "max-autotune", "--name": "other",
                 "--activation-checkpointing": "all", "--imgsz": "320", "--margin": "0.3",
                 "--recipe": "short", "--loggers": "mlflow"}.get(declared.flag, "5")
        is_switch = _train_actions()[name].nargs == 0
        argv = ["train", "--resume", "x", declared.flag] + ([] if is_switch else [value])
        args = _parser().parse_args(argv)
        refused = train_cli._refused_on_resume(args, saved, {"name": "yolov9-t"})
        assert bool(refused) == (declared.resume != CHANGE), (name, refused)
        if refused:
            assert refused[0].startswith(declared.flag), refused

    from yolo9kit.models import create_model
    from yolo9kit.models.checkpoint import save_checkpoint
    from yolo9kit.train.state import Progress

    run_config = TrainConfig(epochs=2, batch_size=4, imgsz=64, device="cpu", seed=5).to_dict()
    last = save_checkpoint(tmp_path / "run" / "weights" / "last.pt", create_model("gelan-t", num_classes=2),
                           train_config=run_config, progress=dataclasses.asdict(Progress(epoch=2)),
                           data=str(tmp_path / "d.yaml"))

    def setup(*flags):
        return train_cli._resume_setup(_parser().parse_args(["train", "--resume", str(last), *flags]))

    with pytest.raises(ValueError, match=r"--batch-size 2 \(the run's: 4\), --imgsz 128 \(the run's: 64\), --cos-lr.*"
                                         "cannot change in the middle of a run"):
        setup("--epochs", "9", "--batch", "2", "--imgsz", "128", "--cos-lr")
    with pytest.raises(ValueError, match=r"--seed 0 \(the run's: 5\)"):  # 0, the default, given: still seen
        setup("--seed", "0")
    _, data, config = setup("--epochs", "9", "--batch", "4", "--workers", "0")  # the run's batch: accepted
    assert (config.epochs, config.batch_size, config.step.imgsz, config.pipeline.workers) == (9, 4, 64, 0)
    assert data == str(tmp_path / "d.yaml") and config.run.resume == str(last)


def test_a_setting_is_given_by_its_name_and_read_through_its_part():
    config = TrainConfig(epochs=50, batch_size=16, lr0=0.02, micro_batch_size=8, imgsz=320, cache=None, seed=3)
    assert (config.epochs, config.batch_size, config.optim.lr0, config.step.batch_size, config.step.imgsz,
            config.pipeline.cache, config.run.seed) == (50, 16, 0.02, 8, 320, None, 3)
    changed = config.replace(lr0=0.05, epochs=10)
    assert (changed.optim.lr0, changed.epochs, changed.step.batch_size) == (0.05, 10, 8)
    assert dataclasses.replace(config, lr0=0.05, epochs=10) == changed  # the same way, through dataclasses
    assert config.optim.lr0 == 0.02  # frozen: the original is unchanged
    with pytest.raises(TypeError, match="unexpected settings \\['lr'\\]"):
        TrainConfig(lr=0.02)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.epochs = 3  # type: ignore[misc]


def test_a_whole_part_may_be_given_and_the_names_beside_it_apply_on_top():
    step = StepConfig("yolov9-s", 32, imgsz=320, amp="fp16", num_classes=3)
    config = TrainConfig(step=step, batch_size=64, amp="off", optim=OptimConfig(lr0=0.05), momentum=0.9)
    assert config.step == step.replace(model=None, num_classes=None, amp="off")  # the model is fit's
    assert (config.optim.lr0, config.optim.momentum) == (0.05, 0.9)
    assert TrainConfig(pipeline=PipelineConfig(rect=True), run=RunConfig(val=False)).pipeline.rect
    with pytest.raises(TypeError, match="expected a StepConfig"):
        TrainConfig(step=OptimConfig())
    with pytest.raises(ValueError, match="micro_batch_size=32: expected at most batch_size=16"):
        TrainConfig(step=step)  # the default batch of 16 cannot hold micro-batches of 32


def test_a_checkpoint_holds_every_setting_by_name_and_unknown_ones_are_ignored():
    config = TrainConfig(epochs=7, freeze=[0, 1], activation_checkpointing=[2, 3], hyp={"mosaic": 0.5},
                         loss=LossConfig(box_gain=5.0))
    saved = config.to_dict()
    assert set(saved) == set(DECLARED) - {"callbacks"}
    assert saved["freeze"] == [0, 1] and saved["micro_batch_size"] is None and saved["loss"]["box_gain"] == 5.0
    assert TrainConfig.from_dict(saved) == config
    assert TrainConfig.from_dict({**TrainConfig().to_dict(), "retired_setting": 1}) == TrainConfig()


def test_the_memory_tools_take_the_training_configs_step():
    from yolo9kit import memory

    config = TrainConfig(imgsz=128, amp="fp16", micro_batch_size=2, batch_size=4, multi_scale=True)
    with pytest.raises(ValueError, match="the step has no model"):
        memory.estimate(config.step, gpu="T4")
    report = memory.estimate(config.step.replace(model="yolov9-t"), gpu="T4")
    assert report.batch_size == 2 and report.as_row()["imgsz"] == 192  # multi-scale: the largest side
    assert report.step.multi_scale and report.step.amp == "fp16"
