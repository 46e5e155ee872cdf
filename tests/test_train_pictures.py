"""The run folder of ``fit``: settings.yaml, the pictures (labels, first batches, curves every epoch, the final
validation plots), the ``plots`` switch, and a picture that fails to draw costing nothing but itself."""

from __future__ import annotations

import argparse
import hashlib
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from train_toys import ToyNet, assert_equal_states, make_batches, one_thread, toy_loss

from yolo9kit.config import StepConfig, TrainConfig
from yolo9kit.config.recipe import apply_short_recipe
from yolo9kit.train.fit import fit

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

VALIDATION_PICTURES = ("confusion_matrix.png", "PR_curve.png", "F1_curve.png", "P_curve.png", "R_curve.png")
PICTURES = ("labels.jpg", "train_batch0.jpg", "train_batch1.jpg", "train_batch2.jpg", "results.png",
            *VALIDATION_PICTURES)


@pytest.fixture(scope="module")
def shapes3(tmp_path_factory):
    from yolo9kit.data import make_shapes

    # 6 training images in batches of 2: three batches, so three batch pictures
    return make_shapes(tmp_path_factory.mktemp("shapes3"), n_train=6, n_val=4, imgsz=64, num_classes=3)


def _config(tmp_path, **kw):
    # A tiny learning rate keeps the shipped shapes model's detections, so the final validation has true
    # positives and draws the F1, P and R curves too (a model trained from scratch for an epoch has none).
    base = dict(epochs=1, batch_size=2, imgsz=64, workers=0, device="cpu", lr0=1e-5, warmup_epochs=0.0,
                warmup_min_batches=0, project=str(tmp_path / "runs"), progress_bar=False)
    return TrainConfig(**{**base, **kw})


def _shapes_fit(data, config):
    from yolo9kit.models import create_model

    return fit(create_model("yolov9-t-shapes").eval(), data, config)


def _assert_picture(path):
    assert path.is_file() and path.stat().st_size > 0, path
    with Image.open(path) as image:
        assert image.format == ("JPEG" if path.suffix == ".jpg" else "PNG"), (path, image.format)
        image.verify()  # a truncated or corrupt file raises
    with Image.open(path) as image:
        assert min(image.size) >= 200, (path, image.size)


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_short_run_writes_its_settings_and_every_picture(shapes3, tmp_path):
    """Two epochs: settings.yaml as the run trained, labels.jpg, three batch pictures, results.png redrawn after
    each epoch, and the confusion matrix and the PR, F1, P, R curves of the final validation."""
    curves = []

    def after_epoch(record):
        curves.append(_digest(tmp_path / "runs" / "exp" / "results.png"))

    config = _config(tmp_path, epochs=2, callbacks={"on_epoch_end": after_epoch})
    result = _shapes_fit(shapes3, config)
    assert result.save_dir == tmp_path / "runs" / "exp"
    for name in PICTURES:
        _assert_picture(result.save_dir / name)
    assert not (result.save_dir / "train_batch3.jpg").exists()
    assert len(curves) == 2 and curves[0] != curves[1]  # the curves picture follows the epochs

    settings = yaml.safe_load((result.save_dir / "settings.yaml").read_text())
    # the settings the run trained with: its recipe decided (a 2-epoch run takes the short one), and why
    trained = apply_short_recipe(config).to_dict()
    assert settings["train_config"] == yaml.safe_load(yaml.safe_dump(trained)) and trained["optimizer"] == "AdamW"
    assert settings["derived"]["recipe"].startswith("recipe short (2 epochs of ")
    cpu_step = StepConfig().resolve("cpu")  # the step this processor decides: recorded as it ran
    assert settings["step"]["device_type"] == "cpu" and settings["step"]["amp"] == cpu_step.amp
    assert settings["step"]["channels_last"] == cpu_step.channels_last
    assert settings["derived"]["cpu_threads"] == torch.get_num_threads()
    assert settings["derived"]["batches_per_epoch"] == 3
    assert settings["derived"]["accumulate_steps"] == 8  # official rule, short recipe's nominal 16: round(16 / 2)
    assert settings["hyp"] == apply_short_recipe(config).pipeline.augment_hyp and settings["loss"]["box_gain"] == 7.5
    assert settings["data"] == str(shapes3.resolve())


@pytest.mark.slow
def test_plots_off_writes_no_picture_and_the_pictures_change_no_weight(shapes3, tmp_path):
    result = _shapes_fit(shapes3, _config(tmp_path, plots=False, name="off"))
    files = sorted(p.name for p in result.save_dir.iterdir())
    assert files == ["results.csv", "settings.yaml", "state.yaml", "weights"]
    drawn = _shapes_fit(shapes3, _config(tmp_path, plots=True, name="on"))
    assert (drawn.save_dir / "train_batch0.jpg").is_file()
    assert_equal_states(result.model, drawn.model)  # the same batches in the same order, so the same step


def _toy_fit(tmp_path, **kw):
    torch.manual_seed(0)
    return fit(ToyNet(), None, _config(tmp_path, amp="off", **kw), loss_fn=toy_loss,
               train_loader=make_batches(4, 2, size=64))


def test_a_failing_picture_is_a_warning_naming_it_and_training_goes_on(tmp_path, monkeypatch, caplog):
    """The batch pictures fail to draw, results.png fails half-way through its save in the second epoch: four
    warnings naming the files, both epochs trained and saved, and results.png of the first epoch kept whole."""
    import yolo9kit.train.records as records

    def broken(*args, **kwargs):
        raise RuntimeError("no ink")

    class HalfWritten:  # a figure whose save fills the disk half-way
        def savefig(self, path, **kwargs):
            Path(path).write_bytes(b"\x89PNG half")
            raise OSError(28, "No space left on device")

    curves = []
    draw_results = records.draw_results

    def second_fails(*args, **kwargs):
        curves.append(len(curves))
        return draw_results(*args, **kwargs) if len(curves) == 1 else HalfWritten()

    monkeypatch.setattr(records, "show_batch", broken)
    monkeypatch.setattr(records, "draw_results", second_fails)
    with caplog.at_level(logging.WARNING, logger="yolo9kit.train.records"):
        result = _toy_fit(tmp_path, epochs=2)
    assert result.epochs_completed == 2 and not result.interrupted
    assert (result.save_dir / "weights" / "last.pt").is_file() and len(result.results) == 2
    warned = [r.getMessage() for r in caplog.records if r.name == "yolo9kit.train.records"]
    assert len(warned) == 4, warned
    for i, message in enumerate(warned[:3]):
        assert f"train_batch{i}.jpg: picture not drawn (RuntimeError: no ink)" in message
    assert "results.png: picture not drawn (DiskFullError: disk full: saving the picture" in warned[3]
    assert not any(result.save_dir.glob("train_batch*")) and not any(result.save_dir.glob(".*.tmp"))
    _assert_picture(result.save_dir / "results.png")  # the first epoch's, whole


def test_a_run_failing_before_its_first_checkpoint_leaves_no_pictures_behind(tmp_path):
    def broken_loss(outputs, targets):
        raise ValueError("the loss could not be computed")

    with pytest.raises(ValueError, match="could not be computed"):
        fit(ToyNet(), None, _config(tmp_path, amp="off"), loss_fn=broken_loss, train_loader=make_batches(4, 2, 64))
    assert not (tmp_path / "runs" / "exp").exists()


def test_plot_labels_counts_every_class():
    from yolo9kit.plots import plot_labels

    rng = np.random.default_rng(0)
    labels = [np.c_[rng.integers(0, 3, n), rng.random((n, 4))] for n in (5, 0, 7)]
    figure = plot_labels(labels, ["a", "b", "c"])
    bars = figure.axes[0].patches
    assert [int(b.get_height()) for b in bars] == np.bincount(np.concatenate(labels)[:, 0].astype(int),
                                                               minlength=3).tolist()
    assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == ["a", "b", "c"]
    assert len(plot_labels(np.zeros((0, 5))).axes) == 4  # no labels: the empty panels, no error


def test_no_plots_flag(tmp_path):
    from yolo9kit.cli import train as train_cli

    parser = argparse.ArgumentParser()
    train_cli.add_parser(parser.add_subparsers())
    assert train_cli.config_from_args(parser.parse_args(["train", "--data", "d.yaml"])).run.plots is True
    assert train_cli.config_from_args(parser.parse_args(["train", "--data", "d.yaml", "--no-plots"])).run.plots is False


def test_drawing_the_pictures_leaves_the_training_unchanged(tmp_path):
    """The pictures read the batches on their way to the model and draw between epochs: same weights to the bit."""
    quiet, drawn = _toy_fit(tmp_path, epochs=2, plots=False, name="quiet"), _toy_fit(tmp_path, epochs=2, name="drawn")
    assert (drawn.save_dir / "train_batch0.jpg").is_file() and not (quiet.save_dir / "train_batch0.jpg").exists()
    assert_equal_states(quiet.model, drawn.model)
