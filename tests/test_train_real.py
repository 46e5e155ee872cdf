"""fit with the real yolov9-t, DetectionLoss, the shapes data loaders and evaluate()."""

from __future__ import annotations

import pytest
import torch
from train_toys import assert_equal_states, assert_same_state, one_thread

from yolo9kit.config import TrainConfig
from yolo9kit.models import create_model
from yolo9kit.models.checkpoint import read_checkpoint
from yolo9kit.train.fit import fit

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def shapes64(tmp_path_factory):
    from yolo9kit.data import make_shapes

    return make_shapes(tmp_path_factory.mktemp("shapes64"), n_train=8, n_val=4, imgsz=64, num_classes=2)


def _config(tmp_path, **kw):
    base = dict(epochs=2, batch_size=4, imgsz=64, workers=0, device="cpu", val=False, warmup_epochs=0.0,
                warmup_min_batches=2, project=str(tmp_path / "runs"), seed=1)
    return TrainConfig(**{**base, **kw})


def _model(num_classes=2):
    torch.manual_seed(0)
    return create_model("yolov9-t", num_classes=num_classes)


def test_resume_is_exact_with_yolov9_t(shapes64, tmp_path):
    """2 epochs straight == 1 epoch, interrupt, resume, 1 epoch: bitwise equal weights, EMA and optimizer state
    (same data order and augmentation, since the loaders draw from (seed, epoch, index))."""
    straight = fit(_model(), shapes64, _config(tmp_path, name="straight"))

    def stop(record):
        raise KeyboardInterrupt

    stopped = fit(_model(), shapes64, _config(tmp_path, name="stopped", callbacks={"on_epoch_end": stop}))
    assert stopped.interrupted and stopped.epochs_completed == 1
    resumed = fit(_model(), shapes64, _config(tmp_path, name="stopped", resume=True))
    assert resumed.save_dir == stopped.save_dir and resumed.epochs_completed == 2
    assert_same_state(straight, resumed)
    a, b = read_checkpoint(straight.last)["optimizer"], read_checkpoint(resumed.last)["optimizer"]
    assert a["state"]  # the optimizer's per-parameter state (the default recipe's AdamW moments here)
    for i, state in a["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["state"][i][key])), (i, key)
    # the final epoch was validated with evaluate(); the kit checkpoint loads back as the EMA model
    assert resumed.results[-1]["metrics/mAP50"] is not None
    assert_equal_states(resumed.ema, create_model(resumed.best))


def test_class_count_mismatch_is_a_clear_error(shapes64, tmp_path):
    with pytest.raises(ValueError, match="predicts 5 classes but .* has 2"):
        fit(_model(5), shapes64, _config(tmp_path))


@pytest.mark.slow
def test_loss_falls_and_map_rises_on_shapes(tmp_path):
    """A short CPU run on the shapes data (see benchmarks/train_cpu.py for the full one); mAP50 rose by 0.13-0.15
    over training seeds 0-2 with these settings."""
    from yolo9kit.data import make_shapes

    data = make_shapes(tmp_path / "shapes", n_train=192, n_val=32, imgsz=128, num_classes=3, max_objects=3)
    config = TrainConfig(epochs=10, batch_size=16, nominal_batch_size=16, imgsz=128, workers=0, device="cpu",
                         optimizer="AdamW", lr0=0.0015, warmup_epochs=1.0, warmup_min_batches=0,
                         hyp={"mosaic": 0.0, "mixup": 0.0, "copy_paste": 0.0, "scale": 0.5},
                         project=str(tmp_path / "runs"), progress_bar=False)
    result = fit(_model(3), data, config)
    rows = result.results
    assert rows[-1]["train/box_loss"] < rows[0]["train/box_loss"]
    assert rows[-1]["train/cls_loss"] < rows[0]["train/cls_loss"]
    assert rows[-1]["metrics/mAP50"] > rows[0]["metrics/mAP50"] + 0.05
