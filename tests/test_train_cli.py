"""``python -m yolo9kit train``: flags -> TrainConfig, hyp yaml split, model from data; plots of a run."""

from __future__ import annotations

import argparse

import pytest
from train_toys import one_thread

from yolo9kit.cli import train as train_cli

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def _parse(argv):
    parser = argparse.ArgumentParser()
    train_cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["train", *argv])


def test_flags_to_config(tmp_path):
    hyp = tmp_path / "hyp.yaml"
    hyp.write_text("lr0: 0.02\nmomentum: 0.9\nmosaic: 0.5\nbox: 5.0\nobj: 0.7\n")
    args = _parse(["--data", "d.yaml", "--batch-size", "24", "--img", "320", "--cos-lr", "--hyp", str(hyp),
                   "--close-mosaic", "3", "--cache", "--amp", "bf16", "--optimizer", "AdamW",
                   "--accumulate-steps", "2"])
    config = train_cli.config_from_args(args)
    assert (config.batch_size, config.step.imgsz, config.optim.schedule, config.pipeline.close_mosaic) == \
        (24, 320, "cosine", 3)
    assert (config.pipeline.cache, config.step.amp, config.step.optimizer, config.optim.accumulate_steps) == \
        ("ram", "bf16", "AdamW", 2)
    assert config.optim.lr0 == 0.02 and config.optim.momentum == 0.9 and config.pipeline.augment_hyp["mosaic"] == 0.5
    assert config.optim.loss.box_gain == 5.0 and config.optim.loss.cls_gain == 0.5
    assert _parse(["--resume"]).resume is True and _parse(["--resume", "x/last.pt"]).resume == "x/last.pt"
    assert config.step.compile is False and config.step.channels_last is None and config.step.lean_activations is None
    fast = train_cli.config_from_args(_parse(["--data", "d.yaml", "--compile", "reduce-overhead"]))
    plain = train_cli.config_from_args(_parse(["--data", "d.yaml", "--compile", "--plain-step"]))
    assert fast.step.compile == "reduce-overhead" and plain.step.compile is True
    assert (plain.step.channels_last, plain.step.lean_activations, plain.step.fused_optimizer,
            plain.pipeline.colour_on_device) == (False,) * 4
    with pytest.raises(SystemExit):
        _parse(["--cos-lr", "--flat-cos-lr"])


def test_config_round_trip():
    from yolo9kit.config import TrainConfig
    from yolo9kit.loss import LossConfig

    config = TrainConfig(batch_size=8, hyp={"mosaic": 0.0}, loss=LossConfig(box_gain=5.0),
                         callbacks={"on_batch": print})
    values = config.to_dict()
    assert "callbacks" not in values
    again = TrainConfig.from_dict(values)
    assert again == config and again.optim.loss.box_gain == 5.0
    with pytest.raises(ValueError, match="TrainConfig.amp='fp8': expected one of"):
        TrainConfig(amp="fp8")


def test_create_model_for_the_data_transfers_weights(tmp_path, caplog):
    from yolo9kit import create_model
    from yolo9kit.data import make_shapes
    from yolo9kit.models.checkpoint import save_checkpoint
    from yolo9kit.train.rundir import class_names

    data = make_shapes(tmp_path / "d", n_train=2, n_val=1, imgsz=64, num_classes=3)
    source = create_model("gelan-t", num_classes=5)
    ckpt = save_checkpoint(tmp_path / "src.pt", source)
    with caplog.at_level("INFO"):
        model = create_model("gelan-t", names=class_names(data), weights=ckpt)
    assert model.nc == 3 and model.training
    assert "Transferred" in caplog.text
    own, src = model.state_dict(), source.state_dict()
    same = [k for k in own if own[k].shape == src[k].shape]
    assert all((own[k] == src[k]).all() for k in same) and len(same) < len(own)  # class outputs differ in shape
    from_checkpoint = create_model(ckpt, names=class_names(data))  # the checkpoint as the model: rebuilt, 3 classes
    assert from_checkpoint.nc == 3 and from_checkpoint.name == "gelan-t"  # its name kept (the memory tools use it)


def test_plots(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from yolo9kit.config import TrainConfig
    from yolo9kit.plots import plot_results, plot_schedule

    rows = [{"epoch": e, "train/box_loss": 2 - e, "train/cls_loss": 3 - e, "train/dfl_loss": 1.5, "lr/pg0": 0.01,
             "lr/pg1": 0.01, "lr/pg2": 0.01, "metrics/mAP50": 0.1 * e, "metrics/mAP50-95": 0.05 * e,
             "metrics/precision": None, "metrics/recall": None, "images_per_s": 10.0} for e in range(3)]
    import matplotlib.pyplot as plt
    import torch

    from yolo9kit.figure import InlineFigure
    from yolo9kit.plots import show_batch

    before = plt.get_fignums()
    fig = plot_results(rows)
    assert len(fig.axes) == 4
    fig = plot_schedule(TrainConfig(epochs=3, batch_size=16), batches_per_epoch=50)
    assert fig.axes[0].get_xlabel() == "batch (ni)"
    grid = show_batch((torch.zeros(2, 3, 32, 32, dtype=torch.uint8), torch.zeros(0, 6)))
    # one convention: every plot's own figure is an InlineFigure outside pyplot (shown as a cell's value)
    assert all(isinstance(f, InlineFigure) for f in (plot_results(rows), fig, grid))
    assert plt.get_fignums() == before


def test_cli_trains_and_resumes(tmp_path, capsys):
    from yolo9kit.data import make_shapes
    from yolo9kit.models.checkpoint import read_checkpoint

    data = make_shapes(tmp_path / "d", n_train=4, n_val=2, imgsz=64, num_classes=2)
    common = ["--project", str(tmp_path / "runs"), "--name", "cli", "--workers", "0", "--device", "cpu"]
    args = _parse(["--data", str(data), "--model", "yolov9-t", "--batch", "4", "--epochs", "1", "--img", "64",
                   "--noval", *common])
    assert train_cli.run(args) == 0
    last = tmp_path / "runs" / "cli" / "weights" / "last.pt"
    ckpt = read_checkpoint(last)
    assert ckpt["progress"]["epoch"] == 1 and ckpt["data"] == str(data.resolve())  # absolute: resume from anywhere
    assert "done: 1 epochs" in capsys.readouterr().out
    # resuming a finished run rebuilds model, data and config from the checkpoint and trains nothing more
    assert train_cli.run(_parse(["--resume", str(last), *common])) == 0
    assert read_checkpoint(last)["progress"]["epoch"] == 1
