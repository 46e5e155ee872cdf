"""The recipe of a run (``yolo9kit.config.recipe``): train_dual.py's for long runs or when asked, the kit's
short recipe for runs of at most 10,000 optimizer steps, applied over the defaults only, kept on resume,
said in the first line of output and in settings.yaml."""

from __future__ import annotations

import argparse
import dataclasses
import logging

import pytest
import yaml
from train_toys import one_thread

from yolo9kit.cli import train as train_cli
from yolo9kit.config import DEFAULT_AUGMENT_HYP, OptimConfig, TrainConfig
from yolo9kit.config.recipe import SHORT_RUN_UPDATES, apply_short_recipe, choose_recipe

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def _parse(argv):
    parser = argparse.ArgumentParser()
    train_cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["train", *argv])


def test_auto_takes_the_short_recipe_up_to_ten_thousand_steps_of_64_images():
    # 64 * 100 images are 100 optimizer steps of 64 per epoch: 100 epochs are 10,000 steps, 101 are more
    at_limit, why = choose_recipe(TrainConfig(epochs=100), 64 * 100)
    assert at_limit.recipe == "short" and "10,000 optimizer steps of 64 images, at most 10,000" in why
    over, why = choose_recipe(TrainConfig(epochs=101), 64 * 100)
    assert over.recipe == "official" and "more than 10,000" in why and SHORT_RUN_UPDATES == 10_000
    assert over == TrainConfig(epochs=101, recipe="official")  # the official settings, untouched
    assert choose_recipe(TrainConfig(epochs=1), 65)[1].startswith("recipe short (1 epochs of 65 images are 2 ")
    unknown, why = choose_recipe(TrainConfig(epochs=3), None)
    assert unknown.recipe == "official" and "unknown" in why


def test_the_short_recipe_is_the_demos_and_sets_only_what_is_at_its_default():
    short = apply_short_recipe(TrainConfig(epochs=30))
    assert (short.step.optimizer, short.optim.lr0, short.optim.nominal_batch_size, short.optim.warmup_epochs,
            short.optim.warmup_min_batches, short.pipeline.close_mosaic) == ("AdamW", 0.0015, 16, 1.0, 0, 5)
    assert short.pipeline.augment_hyp == {**DEFAULT_AUGMENT_HYP, "mosaic": 0.5, "mixup": 0.0, "copy_paste": 0.0,
                                          "scale": 0.5}
    assert apply_short_recipe(TrainConfig(epochs=3)).pipeline.close_mosaic == 3  # at most the run's epochs
    mine = apply_short_recipe(TrainConfig(epochs=30, lr0=0.003, optimizer="SGD", close_mosaic=2,
                                          hyp={"mosaic": 1.0, "degrees": 5.0}))
    assert (mine.optim.lr0, mine.step.optimizer, mine.pipeline.close_mosaic) == (0.003, "SGD", 2)
    assert mine.pipeline.augment_hyp["mosaic"] == 1.0 and mine.pipeline.augment_hyp["degrees"] == 5.0
    assert mine.pipeline.augment_hyp["mixup"] == 0.0  # the keys not given still take the recipe's
    # a setting given by name is kept even at its official value, through replace too; so is a part's own value
    for given in (TrainConfig(epochs=30, nominal_batch_size=64, optimizer="SGD"),
                  TrainConfig(nominal_batch_size=64, optimizer="SGD").replace(epochs=30),
                  dataclasses.replace(TrainConfig(nominal_batch_size=64, optimizer="SGD"), epochs=30)):
        kept = apply_short_recipe(given)
        assert (kept.optim.nominal_batch_size, kept.step.optimizer, kept.optim.lr0) == (64, "SGD", 0.0015)
    assert apply_short_recipe(TrainConfig(optim=OptimConfig(lr0=0.02))).optim.lr0 == 0.02
    assert apply_short_recipe(TrainConfig(optim=OptimConfig(lr0=0.01))).optim.lr0 == 0.0015  # a part names none
    assert apply_short_recipe(short) == short  # idempotent: a resumed run's settings come back unchanged
    asked, why = choose_recipe(TrainConfig(epochs=500, recipe="short"), 100_000)
    assert asked == short.replace(epochs=500) and "as asked" in why


def test_a_resumed_run_keeps_its_recipe():
    saved = apply_short_recipe(TrainConfig(epochs=2)).to_dict()
    resumed, why = choose_recipe(TrainConfig.from_dict(saved, epochs=400), 10 ** 6, saved=saved)
    assert resumed.recipe == "short" and "resumed run's" in why
    assert resumed.to_dict() == {**saved, "epochs": 400}


def test_the_command_line_takes_recipe_and_an_official_hyp_file_means_the_official_recipe(tmp_path):
    assert train_cli.config_from_args(_parse(["--data", "d.yaml"])).recipe == "auto"
    assert train_cli.config_from_args(_parse(["--data", "d.yaml", "--recipe", "short"])).recipe == "short"
    hyp = tmp_path / "hyp.yaml"
    hyp.write_text("lr0: 0.01\nmosaic: 1.0\n")
    assert train_cli.config_from_args(_parse(["--data", "d.yaml", "--hyp", str(hyp)])).recipe == "official"
    assert train_cli.config_from_args(_parse(["--hyp", str(hyp), "--recipe", "short"])).recipe == "short"
    with pytest.raises(SystemExit):
        _parse(["--recipe", "fast"])


def test_a_short_run_says_its_recipe_first_and_records_it(tmp_path, caplog):
    from yolo9kit.data import make_shapes
    from yolo9kit.models.checkpoint import read_checkpoint

    data = make_shapes(tmp_path / "d", n_train=4, n_val=2, imgsz=64, num_classes=2)
    args = _parse(["--data", str(data), "--model", "yolov9-t", "--batch", "4", "--epochs", "1", "--img", "64",
                   "--noval", "--no-plots", "--project", str(tmp_path / "runs"), "--name", "r", "--workers", "0",
                   "--device", "cpu"])
    with caplog.at_level(logging.INFO, logger="yolo9kit"):
        assert train_cli.run(args) == 0
    fit_lines = [r.getMessage() for r in caplog.records if r.name.startswith("yolo9kit.train")]
    assert fit_lines[0].startswith("recipe short (1 epochs of 4 images are 1 optimizer steps of 64 images")
    run = tmp_path / "runs" / "r"
    settings = yaml.safe_load((run / "settings.yaml").read_text())
    assert settings["train_config"]["recipe"] == "short" and settings["train_config"]["optimizer"] == "AdamW"
    assert settings["derived"]["recipe"] == fit_lines[0]
    assert read_checkpoint(run / "weights" / "last.pt")["optimizer"]["param_groups"][0]["lr"] > 0
