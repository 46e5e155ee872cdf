"""The official training options of train_dual.py in TrainConfig, fit and the train CLI, each against the
official rule restated here: --rect batch shapes, --multi-scale sizes, --single-cls, --min-items,
--label-smoothing (a no-op in the official dual loss: accepted and ignored), --save-period names."""

from __future__ import annotations

import argparse
import logging
import math
import random

import cv2
import numpy as np
import pytest
import torch
import yaml
from train_toys import ToyNet, make_batches, one_thread, toy_loss

from yolo9kit.cli import train as train_cli
from yolo9kit.config import TrainConfig
from yolo9kit.train.fit import fit, make_loader
from yolo9kit.train.loop import train_one_epoch
from yolo9kit.train.optim import multi_scale_rng, multi_scale_shape
from yolo9kit.train.rundir import check_classes
from yolo9kit.train.state import Progress, current
from yolo9kit.train.step import build_trainer

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

# (width, height, labels per image) of a small set with mixed aspect ratios and label counts
_IMAGES = [(64, 32, 1), (32, 64, 2), (48, 64, 0), (64, 48, 3), (64, 64, 1), (40, 64, 2), (64, 20, 1)]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A data.yaml whose training images have different sizes and 0 to 3 boxes of classes 0-2."""
    root = tmp_path_factory.mktemp("mixed")
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i, (w, h, n) in enumerate(_IMAGES):
            cv2.imwrite(str(root / "images" / split / f"{i}.png"), rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
            rows = [f"{(i + k) % 3} {0.3 + 0.1 * k} 0.5 0.2 0.3" for k in range(n)]
            (root / "labels" / split / f"{i}.txt").write_text("\n".join(rows) + ("\n" if rows else ""))
    path = root / "data.yaml"
    path.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                    "names": {0: "a", 1: "b", 2: "c"}}))
    return str(path)


def _official_rect_shapes(sizes_wh, batch_size: int, img_size: int, stride: int, pad: float) -> np.ndarray:
    """utils/dataloaders.py LoadImagesAndLabels, rect: sort by h/w, per batch [maxi, 1] when all are wider than
    tall, [1, 1/mini] when all are taller, else [1, 1]; ceil(shape * img_size / stride + pad) * stride."""
    s = np.array(sizes_wh, dtype=np.float64)
    ar = s[:, 1] / s[:, 0]
    ar = ar[ar.argsort()]
    bi = np.floor(np.arange(len(s)) / batch_size).astype(int)
    shapes = [[1, 1]] * (bi[-1] + 1)
    for i in range(bi[-1] + 1):
        ari = ar[bi == i]
        if ari.max() < 1:
            shapes[i] = [ari.max(), 1]
        elif ari.min() > 1:
            shapes[i] = [1, 1 / ari.min()]
    return np.ceil(np.array(shapes) * img_size / stride + pad).astype(int) * stride


def test_rect_batches_have_the_official_shapes(mixed):
    config = TrainConfig(rect=True, batch_size=2, imgsz=64, workers=0, seed=3)
    loader = make_loader(mixed, "train", config, current())
    expected = _official_rect_shapes([(w, h) for w, h, _ in _IMAGES], 2, 64, 32, 0.0)
    assert not loader.dataset.mosaic and loader.dataset.rect
    for epoch in (0, 1):  # no shuffling: the same aspect-ratio order every epoch
        loader.set_epoch(epoch)
        shapes = [tuple(images.shape[2:]) for images, *_ in loader]
        assert shapes == [tuple(s) for s in expected]
    assert [tuple(s) for s in expected] == [(32, 64), (64, 64), (64, 64), (64, 32)]  # the set is mixed enough
    square = make_loader(mixed, "train", TrainConfig(batch_size=2, imgsz=64, workers=0), current())
    assert square.dataset.mosaic and all(tuple(im.shape[2:]) == (64, 64) for im, *_ in square)


@pytest.mark.parametrize("imgsz", [64, 320, 640])
def test_multi_scale_sizes_follow_the_official_rule(imgsz):
    """sz = randrange(0.5 * imgsz, 1.5 * imgsz + gs) // gs * gs; new shape ceil(x * sz / max(h, w) / gs) * gs."""
    gs, seen = 32, set()
    for ni in range(300):
        shape = multi_scale_shape((imgsz, imgsz // 2), imgsz, gs, multi_scale_rng(5, ni))
        official = random.Random(f"multi-scale 5 {ni}").randrange(int(imgsz * 0.5), int(imgsz * 1.5) + gs) // gs * gs
        factor = official / imgsz
        want = None if factor == 1 else (math.ceil(imgsz * factor / gs) * gs, math.ceil(imgsz // 2 * factor / gs) * gs)
        assert shape == want
        size = imgsz if shape is None else shape[0]
        assert size % gs == 0 and imgsz * 0.5 - gs < size <= imgsz * 1.5
        seen.add(size)
    assert min(seen) == max(imgsz // 2 // gs * gs, gs) and max(seen) == imgsz * 3 // 2 // gs * gs
    assert multi_scale_shape((64, 64), 64, gs, multi_scale_rng(5, 7)) == \
        multi_scale_shape((64, 64), 64, gs, multi_scale_rng(5, 7))  # a function of (seed, ni): resumable
    assert TrainConfig(imgsz=imgsz, multi_scale=True).step.peak_imgsz == \
        imgsz * 3 // 2 // gs * gs  # the memory tools describe the largest batch


def test_multi_scale_training_feeds_the_drawn_sizes():
    config = TrainConfig(epochs=1, batch_size=2, accumulate_steps=1, amp="off", device="cpu", multi_scale=True,
                         warmup_epochs=0.0, warmup_min_batches=0, seed=4, imgsz=64)
    torch.manual_seed(0)
    model = ToyNet()
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(tuple(args[0].shape[2:])))
    trainer = build_trainer(model, config, loss_fn=toy_loss)
    batches = make_batches(6, 2, size=64)
    train_one_epoch(trainer, batches, config, Progress(), batches_per_epoch=6, warmup=0, progress_bar=False)
    expected = [multi_scale_shape((64, 64), 64, 32, multi_scale_rng(4, ni)) or (64, 64) for ni in range(6)]
    assert seen == expected and len(set(seen)) > 1


def test_single_cls_makes_one_class(mixed):
    from yolo9kit import create_model
    from yolo9kit.train.rundir import class_names

    still = {"scale": 0.0, "translate": 0.0, "fliplr": 0.0, "mixup": 0.0, "copy_paste": 0.0}  # every box kept
    config = TrainConfig(single_cls=True, batch_size=7, imgsz=64, workers=0, rect=True, hyp=still)
    images, targets, *_ = next(iter(make_loader(mixed, "train", config, current())))
    assert len(targets) == sum(n for *_, n in _IMAGES) and set(targets[:, 1].tolist()) == {0.0}
    model = create_model("gelan-t", names=class_names(mixed, single_cls=True))
    assert model.nc == 1 and model.names == ["item"]  # official: names = {0: 'item'} unless one name already
    check_classes(model, mixed, single_cls=True)
    with pytest.raises(ValueError, match="single_cls"):
        check_classes(create_model("gelan-t", names=class_names(mixed)), mixed, single_cls=True)


def test_min_items_drops_images_with_fewer_labels(mixed):
    for min_items in (0, 1, 2, 3):
        loader = make_loader(mixed, "train", TrainConfig(min_items=min_items, batch_size=2, imgsz=64, workers=0),
                             current())
        assert len(loader.dataset) == sum(n >= min_items for *_, n in _IMAGES)  # official: len(labels) >= min_items
    with pytest.raises(ValueError, match="min_items"):
        TrainConfig(min_items=-1)


def _toy_fit(tmp_path, **kw):
    config = TrainConfig(epochs=5, batch_size=2, accumulate_steps=1, amp="off", device="cpu", warmup_epochs=0.0,
                         warmup_min_batches=0, project=str(tmp_path / "runs"), progress_bar=False, **kw)
    torch.manual_seed(0)
    return fit(ToyNet(), None, config, loss_fn=toy_loss, train_loader=make_batches(2, 2),
               validate_fn=lambda m: {"precision": 0.0, "recall": 0.0, "map50": 0.0, "map50_95": 0.0, "fitness": 0.0})


def test_save_period_writes_the_official_epoch_files(tmp_path):
    """train_dual.py: ``if opt.save_period > 0 and epoch % opt.save_period == 0: save w / f'epoch{epoch}.pt'``."""
    result = _toy_fit(tmp_path, save_period=2)
    names = sorted(p.name for p in (result.save_dir / "weights").glob("epoch*.pt"))
    assert names == [f"epoch{e}.pt" for e in range(5) if e % 2 == 0]


def test_deterministic_switches_the_kernels_for_the_run_and_back_after_it(tmp_path):
    seen = []
    before = torch.are_deterministic_algorithms_enabled()
    result = _toy_fit(tmp_path, deterministic=True, name="det",
                      callbacks={"on_batch": lambda record: seen.append(torch.are_deterministic_algorithms_enabled())})
    assert seen and all(seen) and torch.are_deterministic_algorithms_enabled() == before
    plain = _toy_fit(tmp_path, name="plain")  # on the CPU the numbers are the same either way
    assert [r["train/box_loss"] for r in result.results] == [r["train/box_loss"] for r in plain.results]


def test_label_smoothing_is_accepted_and_ignored(caplog):
    """The official dual loss (utils/loss_tal_dual.py ComputeLoss) sets ``self.cp, self.cn = smooth_BCE(eps)`` and
    never reads them: the official flag is accepted, says so, and the run is the one without it."""
    with caplog.at_level(logging.WARNING, logger="yolo9kit.cli"):
        smoothed = train_cli.config_from_args(_parse(["--label-smoothing", "0.1"]))
    assert "--label-smoothing 0.1 is ignored" in caplog.text
    assert smoothed == train_cli.config_from_args(_parse([]))
    for bad in ("-0.1", "1.0"):
        with pytest.raises(SystemExit):
            _parse(["--label-smoothing", bad])


def _parse(argv):
    parser = argparse.ArgumentParser()
    train_cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["train", "--data", "d.yaml", *argv])


def test_train_flags_to_config():
    config = train_cli.config_from_args(_parse(["--freeze", "10", "--rect", "--multi-scale", "--single-cls",
                                                "--min-items", "2", "--label-smoothing", "0.1",
                                                "--save-period", "5"]))
    assert (config.step.freeze, config.pipeline.rect, config.step.multi_scale, config.pipeline.single_cls) == \
        (10, True, True, True)
    assert (config.pipeline.min_items, config.run.save_period) == (2, 5)
    assert train_cli.config_from_args(_parse(["--freeze", "0", "1", "2"])).step.freeze == (0, 1, 2)
    assert train_cli.config_from_args(_parse(["--freeze", "backbone"])).step.freeze == "backbone"
    assert train_cli.config_from_args(_parse(["--freeze", "0"])).step.freeze is None  # the official default
    default = train_cli.config_from_args(_parse([]))
    assert (default.step.freeze, default.pipeline.rect, default.step.multi_scale, default.pipeline.single_cls,
            default.pipeline.min_items, default.run.save_period) == (None, False, False, False, 0, -1)
    for bad in (["--freeze", "x"], ["--label-smoothing", "1.5"], ["--min-items", "-1"]):
        with pytest.raises(SystemExit):
            _parse(bad)
