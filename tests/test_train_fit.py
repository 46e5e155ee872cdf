"""fit end to end on toy models: run folder, exact resume (epoch boundary and mid-epoch), interrupts, NaN stop
(checkpoint writes cut short: tests/test_faults_train.py)."""

from __future__ import annotations

import csv
import re
import time

import pytest
import torch
import yaml
from train_toys import ToyNet, assert_same_state, make_batches, one_thread, params_of, toy_loss

from yolo9kit.config import TrainConfig
from yolo9kit.models.checkpoint import read_checkpoint
from yolo9kit.train.fit import fit
from yolo9kit.train.guards import NonFiniteLossError
from yolo9kit.train.records import RESULTS_COLUMNS, BatchRecord, EpochRecord

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def _config(tmp_path, **kw):
    base = dict(epochs=2, batch_size=2, accumulate_steps=2, amp="off", device="cpu", warmup_epochs=0.0,
                warmup_min_batches=3, project=str(tmp_path / "runs"), name="exp", lr0=0.05)
    base["plots"] = False  # the pictures have their tests (test_train_pictures.py); here they would cost most of a run
    return TrainConfig(**{**base, **kw})


def _validate(model):
    """A deterministic stand-in for evaluate(): fitness grows as the weights shrink."""
    w = float(sum(p.abs().sum() for p in model.parameters()))
    return {"precision": 0.5, "recall": 0.5, "map50": 1 / (1 + w), "map50_95": 0.5 / (1 + w), "fitness": 0.55 / (1 + w)}


def _fit(config, batchnorm=True, batches=None, loss_fn=toy_loss):
    torch.manual_seed(3)
    model = ToyNet(batchnorm=batchnorm)
    batches = batches if batches is not None else make_batches(5, 2)
    return fit(model, None, config, loss_fn=loss_fn, train_loader=batches, validate_fn=_validate)


class _StopAt:
    """Callback raising KeyboardInterrupt (the notebook stop button) at the n-th call."""

    def __init__(self, n):
        self.n, self.calls = n, 0

    def __call__(self, record):
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt


def test_fit_writes_run_folder(tmp_path):
    result = _fit(_config(tmp_path))
    run = tmp_path / "runs" / "exp"
    assert result.save_dir == run and not result.interrupted and result.epochs_completed == 2
    assert (run / "weights" / "last.pt").is_file() and (run / "weights" / "best.pt").is_file()
    rows = list(csv.DictReader(open(run / "results.csv")))
    assert list(rows[0]) == RESULTS_COLUMNS and [r["epoch"] for r in rows] == ["0", "1"]
    assert rows[1]["peak_allocated"] == "" and float(rows[1]["images_per_s"]) > 0  # VRAM: CUDA only
    ckpt = read_checkpoint(run / "weights" / "last.pt")
    for key in ("model", "ema", "optimizer", "scaler", "scheduler", "rng", "progress", "train_config"):
        assert key in ckpt, key
    assert ckpt["progress"]["epoch"] == 2 and ckpt["train_config"]["batch_size"] == 2
    assert set(ckpt["rng"]) >= {"python", "numpy", "torch"}
    # 5 batches, accumulate 2 (ramped from 1 over 3 warmup batches): steps at ni 0, 1, 3, 5, 7, 9
    assert result.optimizer_steps == 6
    assert _fit(_config(tmp_path)).save_dir == tmp_path / "runs" / "exp2"  # incremented, not overwritten


class _SlowLoader(list):
    """Batches that keep the loop waiting ``wait`` seconds each: a loader slower than the (toy) model."""

    def __init__(self, batches, wait: float):
        super().__init__(batches)
        self.wait = wait

    def __iter__(self):
        for batch in super().__iter__():
            time.sleep(self.wait)
            yield batch


def test_an_epoch_s_time_is_split_into_waiting_for_data_and_computing(tmp_path, caplog, capsys, monkeypatch):
    """results.csv's data_s is the part of epoch_s spent waiting for batches, val_s the validation; a run that waits
    more than half the time says so once, with what to change, and the progress bar shows the share."""
    from yolo9kit.train import loop

    config = _config(tmp_path, progress_bar=True)
    with caplog.at_level("WARNING", logger="yolo9kit.train.loop"):  # epochs of half a second: too short to say
        fit(ToyNet(), None, config, loss_fn=toy_loss, train_loader=_SlowLoader(make_batches(5, 2), 0.1))
    assert not [r for r in caplog.records if "waited for data" in r.getMessage()]
    monkeypatch.setattr(loop, "DATA_WAIT_MIN_S", 0.0)  # 10 s by default
    with caplog.at_level("WARNING", logger="yolo9kit.train.loop"):
        result = fit(ToyNet(), None, config, loss_fn=toy_loss, train_loader=_SlowLoader(make_batches(5, 2), 0.1),
                     validate_fn=_validate)
    rows = list(csv.DictReader(open(result.save_dir / "results.csv")))
    for row in rows:  # 5 sleeps of 0.1 s against a toy step of milliseconds
        assert 0.5 * float(row["epoch_s"]) < float(row["data_s"]) <= float(row["epoch_s"]) and float(row["val_s"]) > 0
    warnings = [r.getMessage() for r in caplog.records if "waited for data" in r.getMessage()]
    assert len(warnings) == 1 and "epoch 1 waited for data" in warnings[0] and "more workers" in warnings[0]
    assert re.search(r"img/s data \d+% acc", capsys.readouterr().err)


def test_a_new_run_says_its_pace_once_after_its_first_read_back(tmp_path, caplog):
    """After the first 10 batches (one read-back) of a new run: the time an epoch and the run will take at that pace,
    once (not again in later epochs); 25 batches of at least 0.1 s each make an epoch of at least 2.5 s."""
    config = _config(tmp_path)
    with caplog.at_level("INFO", logger="yolo9kit.train.loop"):
        fit(ToyNet(), None, config, loss_fn=toy_loss, train_loader=_SlowLoader(make_batches(25, 2), 0.1))
    said = [r.getMessage() for r in caplog.records if "at the pace of" in r.getMessage()]
    assert len(said) == 1 and f"the {config.epochs} epochs in about" in said[0], said
    epoch_s = float(re.search(r"first 10 batches an epoch trains in about (\d+) s", said[0]).group(1))
    assert epoch_s >= 2, said[0]


def test_a_time_budget_sets_the_epochs_from_the_pace_of_the_first():
    """``time`` (hours): after the first epoch, the epochs that fit what is left at its pace; later only fewer."""
    from types import SimpleNamespace

    from yolo9kit.train.fit import _fit_the_time
    from yolo9kit.train.state import DistInfo

    def after(epoch, first, seconds_per_epoch, setup_s=60.0, earlier_s=0.0, epochs=100):
        now = time.monotonic()
        started = now - seconds_per_epoch * (epoch + 1 - first)  # the epochs of this process took that long
        run = SimpleNamespace(config=TrainConfig(time=1.0, epochs=epochs), dist=DistInfo(),
                              folder=SimpleNamespace(earlier_s=earlier_s, started=started - setup_s))
        _fit_the_time(run, epoch, first, started)
        return run.config.epochs

    assert after(0, 0, 600.0) == 5  # 1 h - 1 min set-up - 10 min: 4.9 more epochs of 10 min fit, 4 do
    assert after(0, 0, 600.0, epochs=3) == 5  # the first epoch sets it either way: --epochs is replaced
    assert after(1, 0, 750.0, epochs=5) == 4  # slower than the first: 2 + int((3600 - 60 - 1500) / 750) = 2 + 2
    assert after(1, 0, 500.0, epochs=5) == 5  # faster: never more than the first epoch set
    assert after(3, 3, 600.0, earlier_s=1800.0, epochs=10) == 5  # resumed: 3600 - 1800 - 660 = 1140 s left, 4 + 1
    assert after(0, 0, 4000.0) == 1  # the first epoch already spent the budget: the run ends after it


def test_a_time_budget_spent_in_the_first_epoch_ends_a_finished_run(tmp_path):
    result = _fit(_config(tmp_path, epochs=50, time=1e-9))
    assert result.epochs_completed == 1 and result.results[-1]["fitness"] is not None  # validated as the last
    assert yaml.safe_load((result.save_dir / "state.yaml").read_text())["state"] == "finished"
    assert read_checkpoint(result.last)["train_config"]["epochs"] == 1  # a resume continues the fitted schedule


def test_a_new_run_in_an_existing_folder_writes_its_own_results_and_keeps_the_earlier_ones(tmp_path):
    first = _fit(_config(tmp_path, exist_ok=True))
    earlier = (first.save_dir / "results.csv").read_text()
    second = _fit(_config(tmp_path, exist_ok=True, epochs=1))
    assert second.save_dir == first.save_dir
    rows = list(csv.DictReader(open(second.save_dir / "results.csv")))
    assert [r["epoch"] for r in rows] == ["0"]  # not the earlier run's two epochs continued by this one
    assert (second.save_dir / "results.previous.csv").read_text() == earlier


def test_callbacks_get_step_and_epoch_records_and_the_epoch_record_is_the_results_row(tmp_path):
    steps, epochs, ends = [], [], []
    result = _fit(_config(tmp_path, callbacks={"on_batch": steps.append, "on_epoch_end": epochs.append,
                                               "on_run_end": ends.append}))
    assert ends == ["finished"]  # state.yaml's word, once, after the last epoch
    assert all(type(r) is BatchRecord for r in steps) and all(type(r) is EpochRecord for r in epochs)
    assert [(r.epoch, r.batch_index, r.ni) for r in steps] == [(e, i, 5 * e + i) for e in (0, 1) for i in range(5)]
    assert [r.optimizer_steps for r in steps] == [1, 2, 2, 3, 3, 4, 4, 5, 5, 6]  # steps at ni 0, 1, 3, 5, 7, 9
    assert [r.accumulate_steps for r in steps] == [1, 1, 2, 2, 2, 2, 2, 2, 2, 2]  # ramped over 3 warmup batches
    for r in steps:
        assert r.box_loss > 0 and r.cls_loss == r.dfl_loss == 0  # toy_loss reports [mean, 0, 0]
        assert r.lr_norm_weight == r.lr_weight  # both warm up from 0 (official)
        assert r.micro_batch_size == 2 and r.images_per_s > 0 and r.peak_allocated is None  # CPU: not measured
    # warmup over 3 batches: biases from warmup_bias_lr (0.1) down to lr0 (0.05), weights from 0 up to lr0
    assert [r.lr_bias for r in steps[:4]] == pytest.approx([0.1, 0.1 - 0.05 / 3, 0.1 - 0.1 / 3, 0.05])
    assert [r.lr_weight for r in steps[:4]] == pytest.approx([0.0, 0.05 / 3, 0.1 / 3, 0.05])
    assert steps[0].momentum == pytest.approx(0.8) and steps[3].momentum == pytest.approx(0.937)
    last = steps[4]  # the running means and learning rates of an epoch's last batch are the epoch's
    assert (last.box_loss, last.lr_bias, last.lr_weight, last.lr_norm_weight) == pytest.approx(
        (epochs[0].box_loss, epochs[0].lr_bias, epochs[0].lr_weight, epochs[0].lr_norm_weight))
    assert [r.epoch for r in epochs] == [0, 1] and epochs[1].map50 == pytest.approx(_validate(result.ema)["map50"])
    assert epochs[0].peak_allocated is None and epochs[0].epoch_s > 0
    assert [r.row() for r in epochs] == result.results
    lines = list(csv.DictReader(open(result.save_dir / "results.csv")))
    for record, line in zip(epochs, lines, strict=True):
        row = record.row()
        assert list(row) == RESULTS_COLUMNS
        for column, value in row.items():
            if value is None:
                assert line[column] == "", column
            else:
                assert float(line[column]) == pytest.approx(value, rel=1e-5), column


def test_resume_at_epoch_boundary_is_exact(tmp_path):
    straight = _fit(_config(tmp_path, name="straight"))
    stopped = _fit(_config(tmp_path, name="stopped", callbacks={"on_epoch_end": _StopAt(1)}))
    assert stopped.interrupted and stopped.interrupted_by == "KeyboardInterrupt" and stopped.epochs_completed == 1
    assert read_checkpoint(stopped.last)["progress"]["epoch"] == 1  # a normal return: last.pt holds the epoch
    resumed = _fit(_config(tmp_path, name="stopped", resume=str(stopped.last)))
    assert resumed.save_dir == stopped.save_dir and resumed.epochs_completed == 2
    assert_same_state(straight, resumed)
    assert resumed.optimizer_steps == straight.optimizer_steps
    assert len(list(csv.DictReader(open(resumed.save_dir / "results.csv")))) == 2


@pytest.mark.parametrize("stop_at_batch", [3, 4])  # inside an accumulation window / right after a step
def test_resume_inside_an_epoch_is_exact(tmp_path, stop_at_batch):
    """Interrupted mid-epoch: resume redoes the unfinished accumulation window with the same data. BatchNorm-free
    because the interrupted window's forward passes have already moved BatchNorm running statistics."""
    straight = _fit(_config(tmp_path, name="straight"), batchnorm=False)
    stopped = _fit(_config(tmp_path, name="stopped", callbacks={"on_batch": _StopAt(5 + stop_at_batch)}),
                   batchnorm=False)
    assert stopped.interrupted and stopped.epochs_completed == 1
    resumed = _fit(_config(tmp_path, name="stopped", resume=str(stopped.save_dir)), batchnorm=False)
    assert_same_state(straight, resumed)


def test_keyboard_interrupt_saves_last(tmp_path):
    result = _fit(_config(tmp_path, callbacks={"on_batch": _StopAt(2)}))
    assert result.interrupted and result.last.is_file()
    ckpt = read_checkpoint(result.last)
    assert ckpt["progress"]["epoch"] == 0
    for k, v in params_of(result.model).items():
        assert torch.equal(ckpt["model"][k], v)


def test_nonfinite_losses_stop_with_clear_error_and_keep_last_good_checkpoint(tmp_path, monkeypatch):
    calls = {"n": 0}

    def nan_after_first_epoch(outputs, targets):
        calls["n"] += 1
        loss, items = toy_loss(outputs, targets)
        return (loss * float("nan"), items) if calls["n"] > 5 else (loss, items)

    monkeypatch.setattr("yolo9kit.train.loop.MAX_NONFINITE_BATCHES", 3)
    config = _config(tmp_path, epochs=3)
    with pytest.raises(NonFiniteLossError, match="3 non-finite losses in a row") as info:
        _fit(config, loss_fn=nan_after_first_epoch)
    run = tmp_path / "runs" / "exp"
    assert info.value.run_dir == run and str(run / "weights" / "last.pt") in str(info.value)
    ckpt = read_checkpoint(run / "weights" / "last.pt")
    assert ckpt["progress"]["epoch"] == 1  # written after the good first epoch, not touched since
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point())


def test_a_run_whose_every_step_was_skipped_did_not_finish(tmp_path):
    """Fewer non-finite losses than MAX_NONFINITE_BATCHES (dfl: 1e300 makes every one inf): an epoch that trained
    nothing fails the run, naming the cause, instead of a "finished" run with an untrained best.pt."""
    calls = {"n": 0}

    def inf_from(first):
        def loss_fn(outputs, targets):
            calls["n"] += 1
            loss, items = toy_loss(outputs, targets)
            return (loss * float("inf"), items) if calls["n"] >= first else (loss, items)
        return loss_fn

    run = tmp_path / "runs" / "exp"
    with pytest.raises(NonFiniteLossError, match="every batch of epoch 1 had a non-finite loss") as info:
        _fit(_config(tmp_path, epochs=2), loss_fn=inf_from(1))  # 5 batches an epoch, 10 in a row stop a run
    assert "loss gains" in str(info.value) and "lr0" not in str(info.value)  # not trained yet: not the lr
    assert "last.pt" not in str(info.value) and not run.exists()  # no checkpoint to name, no folder left
    calls["n"] = 0
    with pytest.raises(NonFiniteLossError, match="every batch of epoch 2 had a non-finite loss") as info:
        _fit(_config(tmp_path, epochs=3), loss_fn=inf_from(6))
    assert f"last good checkpoint is {run / 'weights' / 'last.pt'}" in str(info.value) and "lr0" in str(info.value)
    assert read_checkpoint(run / "weights" / "last.pt")["progress"]["epoch"] == 1
    assert yaml.safe_load((run / "state.yaml").read_text())["state"] == "failed"


def test_single_nonfinite_loss_is_skipped(tmp_path):
    calls = {"n": 0}

    def one_nan(outputs, targets):
        calls["n"] += 1
        loss, items = toy_loss(outputs, targets)
        return (loss * float("nan"), items) if calls["n"] == 2 else (loss, items)

    result = _fit(_config(tmp_path, epochs=1), loss_fn=one_nan)
    assert result.nonfinite_batches == 1 and not result.interrupted
    assert all(torch.isfinite(p).all() for p in result.model.parameters())
