"""A training run under faults (yolo9kit/train): kills, full disks and signals at any point of an epoch, resumes
that change what cannot change, non-finite weights, best.pt, and failed or refused runs that leave nothing behind."""

from __future__ import annotations

import collections
import csv
import errno
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO
from fault_checks import DEAD_PID, digest
from train_toys import ToyNet, assert_same_state, make_batches, one_thread, toy_loss

from yolo9kit.config import TrainConfig
from yolo9kit.files import DiskFullError
from yolo9kit.models.checkpoint import read_checkpoint
from yolo9kit.train import records, state
from yolo9kit.train.fit import fit
from yolo9kit.train.guards import NonFiniteWeightsError
from yolo9kit.train.records import read_state

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


_Usage = collections.namedtuple("_Usage", "total used free")


class _Killed(BaseException):
    """A hard kill (SIGKILL, a power cut): a ``BaseException`` that none of the kit's handlers catch, raised from
    inside the save sequence; ``_kill_at`` leaves the temporary file of a killed write beside it."""


def _initial_state():
    torch.manual_seed(3)
    return {k: v.clone() for k, v in ToyNet(batchnorm=True).state_dict().items()}

INIT = _initial_state()


def _validate(model):
    """Deterministic stand-in for evaluate(): fitness grows as the EMA moves away from the initial weights
    (it does every epoch here), so every epoch writes best.pt."""
    d = sum(float((v.float() - INIT[k].float()).norm()) for k, v in model.state_dict().items() if v.is_floating_point())
    f = 1 - 1 / (1 + d)
    return {"precision": 0.5, "recall": 0.5, "map50": f, "map50_95": f, "fitness": f}


def _config(tmp_path, **kw):
    base = dict(epochs=2, batch_size=2, accumulate_steps=2, amp="off", device="cpu", warmup_epochs=0.0,
                warmup_min_batches=3, project=str(tmp_path / "runs"), name="exp", lr0=0.05, progress_bar=False)
    base["plots"] = False  # the pictures have their tests (test_train_pictures.py); here they would cost most of a run
    return TrainConfig(**{**base, **kw})


def _fit(config, data=None, loss_fn=toy_loss, model_name=None):
    torch.manual_seed(3)
    model = ToyNet(batchnorm=True)
    if model_name:
        model.name = model_name  # what checkpoints and settings.yaml call the model
    return fit(model, data, config, loss_fn=loss_fn, train_loader=make_batches(5, 2), validate_fn=_validate)


def _epochs_in_csv(run):
    return [row["epoch"] for row in csv.DictReader(open(run / "results.csv"))]


def _files(folder):
    """Every file under ``folder`` with its digest: what a refused command leaves as it found it."""
    return {str(p.relative_to(folder)): digest(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def _kill_at(monkeypatch, target, epoch):
    """Die like a killed process when epoch ``epoch`` writes ``target`` (a checkpoint name or results.csv),
    leaving the temporary file of a write that was cut short."""
    save, append = state.save_training_checkpoint, records.append_results

    def dying_save(path, trainer, progress, *args, **kwargs):
        if path.name == target and progress.epoch == epoch + 1:
            path.parent.mkdir(parents=True, exist_ok=True)
            (path.parent / f".{path.name}.{DEAD_PID}.tmp").write_bytes(b"half a checkpoint")
            raise _Killed
        return save(path, trainer, progress, *args, **kwargs)

    def dying_append(path, record):
        if target == "results.csv" and record.epoch == epoch:
            raise _Killed
        return append(path, record)

    monkeypatch.setattr(state, "save_training_checkpoint", dying_save)
    monkeypatch.setattr(records, "append_results", dying_append)


# ---- kills and full disks at the end of an epoch --------------------------------------------------------------------

@pytest.mark.parametrize("target", ["best.pt", "last.pt", "results.csv"])
def test_a_kill_at_any_write_of_an_epoch_end_loses_nothing(tmp_path, monkeypatch, target):
    """Killed while epoch 1 writes ``target``; the resumed run has best.pt of the best epoch, one row per
    epoch, no temporary file, and the weights of a run never killed."""
    straight = _fit(_config(tmp_path, name="straight"))
    _kill_at(monkeypatch, target, epoch=1)
    with pytest.raises(_Killed):
        _fit(_config(tmp_path))
    monkeypatch.undo()
    resumed = _fit(_config(tmp_path, resume=str(tmp_path / "runs" / "exp")))
    run = resumed.save_dir
    assert _epochs_in_csv(run) == ["0", "1"]
    last, best = read_checkpoint(resumed.last), read_checkpoint(resumed.best)
    assert last["progress"]["best_epoch"] == 1 and best["progress"]["epoch"] == 2  # best.pt is epoch 1's
    assert best["progress"]["best_fitness"] == last["progress"]["best_fitness"]
    assert [r["epoch"] for r in last["results"]] == [0, 1]
    assert not [p.name for p in (run / "weights").iterdir() if p.name.endswith(".tmp")]
    assert_same_state(straight, resumed)


def test_temporary_files_of_killed_writes_are_removed_on_the_next_start(tmp_path):
    result = _fit(_config(tmp_path, epochs=1))
    weights = result.save_dir / "weights"
    stale = [weights / f".best.pt.{DEAD_PID}.tmp", weights / f".last.pt.{DEAD_PID}.tmp",
             result.save_dir / f".results.csv.{DEAD_PID}.tmp"]
    live = weights / f".last.pt.{os.getppid()}.tmp"  # a write in progress in another process
    for path in [*stale, live]:
        path.write_bytes(b"x" * 1000)
    _fit(_config(tmp_path, epochs=2, resume=str(result.save_dir)))
    assert not any(p.exists() for p in stale) and live.exists()


def _report_free(monkeypatch, free):
    """The free-space query reports ``free()`` bytes (a callable, so a test can fill the disk part-way)."""
    monkeypatch.setattr(shutil, "disk_usage", lambda path: _Usage(10**12, 10**12 - free(), free()))


def test_a_full_disk_stops_before_the_epoch_with_a_clear_error(tmp_path, monkeypatch):
    steps = []
    _report_free(monkeypatch, lambda: 10_000)
    with pytest.raises(DiskFullError, match=r"disk full: .* needs about .* [KM]iB in .*weights, which has 9\.77 KiB "
                                            r"free"):
        _fit(_config(tmp_path, callbacks={"on_batch": steps.append}))
    assert steps == []  # not a batch trained for nothing
    assert not (tmp_path / "runs" / "exp").exists()  # and no empty run or weights folder left


@pytest.mark.parametrize("failure", ["torch", "oserror", "interrupt"])
def test_a_save_cut_short_keeps_every_file_written_before(tmp_path, monkeypatch, failure):
    """The disk fills (torch's zip writer or the OS says so), or the process is interrupted, while best.pt of
    epoch 1 is written: last.pt, best.pt and results.csv exactly as epoch 0 left them, and no temporary file.
    A full disk is a DiskFullError naming the folder."""
    first = _fit(_config(tmp_path, epochs=1))
    files = [first.last, first.best, first.save_dir / "results.csv"]
    before = [digest(p) for p in files]
    full = {"now": False}
    _report_free(monkeypatch, lambda: 50_000 if full["now"] else 10**11)
    save = torch.save

    def filling_save(obj, f, *args, **kwargs):
        with open(f, "wb") as out:
            out.write(b"the start of a checkpoint")
        if failure == "interrupt":  # the process stops in the middle of the write
            raise KeyboardInterrupt
        full["now"] = True
        if failure == "torch":  # what torch's zip writer says on a full disk
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 474")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", filling_save)
    if failure == "interrupt":
        with pytest.raises(KeyboardInterrupt):
            _fit(_config(tmp_path, epochs=2, resume=str(first.last)))
    else:
        with pytest.raises(DiskFullError, match=f"saving best.pt needs about .* in {first.save_dir / 'weights'}"):
            _fit(_config(tmp_path, epochs=2, resume=str(first.save_dir)))
    monkeypatch.setattr(torch, "save", save)
    assert [digest(p) for p in files] == before
    assert read_checkpoint(first.last)["progress"]["epoch"] == 1
    assert sorted(p.name for p in first.last.parent.iterdir()) == ["best.pt", "last.pt"]


def test_a_failed_results_append_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    result = _fit(_config(tmp_path, epochs=1))
    path = result.save_dir / "results.csv"
    before = path.read_bytes()
    record = records.EpochRecord(**{**_record_fields(), "epoch": 1})
    real_write = Path.write_bytes

    def half_write(self, data):
        """The write takes half of the bytes, then the disk is full."""
        real_write(self, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", half_write)
    with pytest.raises(OSError, match="disk full|No space"):
        records.append_results(path, record)
    assert path.read_bytes() == before
    fresh = tmp_path / "new" / "results.csv"
    fresh.parent.mkdir()
    with pytest.raises(OSError):
        records.append_results(fresh, record)
    assert not fresh.exists()  # never an empty or header-only file


def _record_fields():
    return dict(epoch=0, box_loss=1.0, cls_loss=1.0, dfl_loss=1.0, lr_bias=0.01, lr_weight=0.01,
                lr_norm_weight=0.01, precision=None, recall=None, map50=None, map50_95=None, fitness=None,
                peak_allocated=None, images_per_s=1.0, epoch_s=1.0)


# ---- signals -------------------------------------------------------------------------------------------------------

@pytest.fixture
def default_sigint():
    """These tests send SIGINT: start from Python's own handler whatever the runner inherited (a runner started
    in the background of a non-interactive shell ignores SIGINT, and ``fit`` rightly leaves an ignored signal
    ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


class _SignalAt:
    """on_batch callback that sends this process a real signal at its n-th call."""

    def __init__(self, n, signum):
        self.n, self.signum, self.calls = n, signum, 0

    def __call__(self, record):
        self.calls += 1
        if self.calls == self.n:
            os.kill(os.getpid(), self.signum)


@pytest.mark.usefixtures("default_sigint", "callbacks_every_batch")
def test_sigint_inside_an_accumulation_window_saves_last_and_resumes_exactly_with_batchnorm(tmp_path):
    """Ctrl-C after batch 2 of epoch 0 (inside a window: steps at ni 0, 1, 3): the run stops before the next
    batch and says why; the resumed run equals a straight one, BatchNorm running statistics included."""
    straight = _fit(_config(tmp_path, name="straight"))
    stopped = _fit(_config(tmp_path, callbacks={"on_batch": _SignalAt(3, signal.SIGINT)}))
    assert stopped.interrupted and stopped.interrupted_by == "SIGINT"
    assert read_checkpoint(stopped.last)["progress"]["ni"] == 2  # the window restarts at batch 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored
    resumed = _fit(_config(tmp_path, resume=str(stopped.save_dir)))
    assert resumed.interrupted_by is None and not resumed.interrupted
    assert_same_state(straight, resumed)


@pytest.mark.usefixtures("default_sigint")
def test_a_signal_during_validation_saves_the_epoch_without_metrics(tmp_path):
    """Validation has no batch to stop at: the signal stops it at once, and the trained epoch is kept."""
    calls = []

    def validate_then_ctrl_c(model):
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return _validate(model)

    torch.manual_seed(3)
    result = fit(ToyNet(batchnorm=True), None, _config(tmp_path), loss_fn=toy_loss, train_loader=make_batches(5, 2),
                 validate_fn=validate_then_ctrl_c)
    assert result.interrupted_by == "SIGINT" and result.epochs_completed == 1
    rows = list(csv.DictReader(open(result.save_dir / "results.csv")))
    assert [r["epoch"] for r in rows] == ["0"] and rows[0]["fitness"] == "" and float(rows[0]["train/box_loss"]) > 0
    assert read_checkpoint(result.last)["progress"]["epoch"] == 1 and not result.best.exists()


@pytest.mark.usefixtures("default_sigint")
def test_a_signal_while_checkpoints_are_written_waits_for_them(tmp_path, monkeypatch):
    """Ctrl-C while best.pt of epoch 0 is written: best.pt, last.pt and the row are all written, then the run
    stops."""
    save = state.save_training_checkpoint

    def save_and_ctrl_c(path, *args, **kwargs):
        if path.name == "best.pt":
            os.kill(os.getpid(), signal.SIGINT)
        return save(path, *args, **kwargs)

    monkeypatch.setattr(state, "save_training_checkpoint", save_and_ctrl_c)
    result = _fit(_config(tmp_path, epochs=3))
    assert result.interrupted_by == "SIGINT" and result.epochs_completed == 1
    assert _epochs_in_csv(result.save_dir) == ["0"]
    assert read_checkpoint(result.best)["progress"]["epoch"] == read_checkpoint(result.last)["progress"]["epoch"] == 1


def _read_until(stream, needle: bytes, timeout: float) -> bytes:
    """Read ``stream`` (a pipe) until ``needle`` appears; what was read."""
    seen, end = b"", time.monotonic() + timeout
    while needle not in seen:
        left = end - time.monotonic()
        assert left > 0, f"{needle!r} not seen in {timeout} s: {seen[-2000:]!r}"
        if select.select([stream], [], [], left)[0]:
            chunk = os.read(stream.fileno(), 65536)
            assert chunk, f"the process ended before {needle!r}: {seen[-2000:]!r}"
            seen += chunk
    return seen


@pytest.mark.slow
def test_sigterm_to_the_cli_saves_last_exits_143_and_resumes_exactly(tmp_path):
    """``python -m yolo9kit train`` sent SIGTERM while it trains: it saves last.pt, says so and exits 143;
    ``--resume`` then ends with the weights of a run never stopped (gelan-t, 64 px, 2 batches per epoch)."""
    from yolo9kit.data import make_shapes

    data = make_shapes(tmp_path / "d", n_train=4, n_val=2, imgsz=64, num_classes=2)
    project = tmp_path / "runs"
    flags = ["--data", str(data), "--model", "gelan-t", "--batch-size", "2", "--epochs", "2", "--imgsz", "64",
             "--workers", "0", "--device", "cpu", "--noval", "--project", str(project)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "yolo9kit", "train"]
    straight = subprocess.run([*command, *flags, "--name", "straight"], env=env, capture_output=True, timeout=900)
    assert straight.returncode == 0, straight.stderr[-3000:]

    process = subprocess.Popen([*command, *flags, "--name", "stopped"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        _read_until(process.stderr, b"epoch 1/2", timeout=600)  # in the epoch loop: SIGTERM is handled there
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=600)
    finally:
        process.kill()
    assert process.returncode == 143, err[-3000:]
    assert b"interrupted by SIGTERM" in out and b"SIGTERM" in out + err
    stopped = read_checkpoint(project / "stopped" / "weights" / "last.pt")
    assert stopped["progress"]["ni"] < 4  # saved before the end of the run

    resumed = subprocess.run([*command, "--resume", str(project / "stopped"), "--project", str(project)], env=env,
                             capture_output=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = read_checkpoint(project / "straight" / "weights" / "last.pt")
    b = read_checkpoint(project / "stopped" / "weights" / "last.pt")
    for entry in ("model", "ema"):
        for k, v in a[entry].items():
            assert torch.equal(b[entry][k], v), (entry, k)


# ---- resumes -------------------------------------------------------------------------------------------------------

def test_resume_refuses_settings_that_cannot_change(tmp_path):
    first = _fit(_config(tmp_path, epochs=2))
    with pytest.raises(ValueError, match=r"batch_size 2 -> 4, imgsz 640 -> 320: these cannot change"):
        _fit(_config(tmp_path, epochs=3, batch_size=4, imgsz=320, resume=str(first.save_dir)))
    with pytest.raises(ValueError, match="epochs=1, but the run has trained 2 epochs already"):
        _fit(_config(tmp_path, epochs=1, resume=str(first.save_dir)))
    assert _epochs_in_csv(first.save_dir) == ["0", "1"]  # refused before anything was touched


def test_resume_extends_a_finished_run(tmp_path):
    first = _fit(_config(tmp_path, epochs=1))
    more = _fit(_config(tmp_path, epochs=3, resume=str(first.last)))
    assert more.epochs_completed == 3 and _epochs_in_csv(more.save_dir) == ["0", "1", "2"]
    assert read_checkpoint(more.last)["train_config"]["epochs"] == 3


def test_the_data_path_is_recorded_absolute_and_resume_works_from_another_folder(tmp_path, monkeypatch):
    from yolo9kit.data import make_shapes

    make_shapes(tmp_path / "d", n_train=2, n_val=1, imgsz=64, num_classes=1)
    monkeypatch.chdir(tmp_path)
    first = _fit(_config(tmp_path, epochs=1), data="d/data.yaml")
    recorded = read_checkpoint(first.last)["data"]
    assert recorded == str((tmp_path / "d" / "data.yaml").resolve())
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    more = _fit(_config(tmp_path, epochs=2, resume=str(first.save_dir)))  # data=None: the recorded one
    assert more.epochs_completed == 2 and read_checkpoint(more.last)["data"] == recorded


def test_resume_with_another_model_is_a_short_error(tmp_path):
    first = _fit(_config(tmp_path, epochs=1))
    torch.manual_seed(3)
    with pytest.raises(ValueError, match=r"another model than the one to train \(0 tensors missing, 0 unexpected, "
                                         r"\d+ of another shape, e\.g\. \S+\)") as info:
        fit(ToyNet(batchnorm=True, channels=16), None, _config(tmp_path, epochs=2, resume=str(first.last)),
            loss_fn=toy_loss, train_loader=make_batches(5, 2), validate_fn=_validate)
    assert len(str(info.value)) < 400


def test_refused_runs_leave_the_run_folder_as_they_found_it(tmp_path):
    from yolo9kit.data import DataError, make_shapes

    data = make_shapes(tmp_path / "d", n_train=2, n_val=1, imgsz=64, num_classes=1)
    first = _fit(_config(tmp_path, epochs=1), data=str(data))
    found = _files(first.save_dir)
    other = data.with_name("other.yaml")
    other.write_text(data.read_text())
    with pytest.raises(ValueError, match="the data cannot change in the middle of a run"):
        _fit(_config(tmp_path, epochs=2, resume=str(first.save_dir)), data=str(other))
    assert _files(first.save_dir) == found  # state.yaml still "finished", with its wall time
    for label in (data.parent / "labels" / "train").glob("*.txt"):
        label.write_text("3 0.5 0.5 0.2 0.2\n")  # a class that data.yaml does not name
    with pytest.raises(DataError):  # a new run into the folder (exist_ok), refused by its training labels
        fit(ToyNet(batchnorm=True), data, _config(tmp_path, exist_ok=True, imgsz=64, workers=0), loss_fn=toy_loss,
            validate_fn=_validate)
    assert _files(first.save_dir) == found  # results.csv not set aside, no "failed"


@pytest.mark.parametrize("text", ["state: interrupted\nwall_s: abc\n", "a: &x [1]\nb: *x\n", "state: [unclosed\n"])
def test_a_bad_state_yaml_never_blocks_a_resume(tmp_path, text):
    first = _fit(_config(tmp_path, epochs=1))
    (first.save_dir / "state.yaml").write_text(text)
    more = _fit(_config(tmp_path, epochs=2, resume=str(first.save_dir)))
    assert more.epochs_completed == 2 and not (more.save_dir / ".yolo9kit.lock").exists()
    state = read_state(more.save_dir)
    assert state["state"] == "finished" and isinstance(state["wall_s"], float)


def test_a_last_pt_of_another_model_copied_into_a_run_is_refused_naming_both(tmp_path):
    ours = _fit(_config(tmp_path, epochs=1, name="ours"), model_name="toy-a")
    theirs = _fit(_config(tmp_path, epochs=1, name="theirs"), model_name="toy-b")
    shutil.copyfile(theirs.last, ours.last)
    found = _files(ours.save_dir)
    with pytest.raises(ValueError, match=r"holds a toy-b model, but the run in \S+ours trains toy-a"):
        _fit(_config(tmp_path, epochs=2, resume=str(ours.save_dir)), model_name="toy-b")
    assert _files(ours.save_dir) == found


def _plain_config(tmp_path, **kw):
    """``_config`` without accumulation or warmup, lr0 0.01: the runs of ``_fit_plain``."""
    return _config(tmp_path, **{**dict(accumulate_steps=1, warmup_min_batches=0, lr0=0.01), **kw})


def _fit_plain(config, validate, model=None, **kw):
    """A ToyNet without BatchNorm on 3 batches, validated by ``validate``."""
    torch.manual_seed(3)
    return fit(model or ToyNet(), None, config, loss_fn=toy_loss, train_loader=make_batches(3, 2),
               validate_fn=validate, **kw)


def _fitness(*values):
    """A validation whose fitness is ``values[i]`` at its i-th call."""
    calls = []

    def validate(model):
        f = values[min(len(calls), len(values) - 1)]
        calls.append(f)
        return {"precision": f, "recall": f, "map50": f, "map50_95": f, "fitness": f}

    validate.calls = calls
    return validate


def _poison(path, where: str) -> None:
    """Write NaN into the training state of a checkpoint (the weights' checksum stays valid)."""
    ckpt = torch.load(path, weights_only=True)
    if where == "optimizer":
        state = next(iter(ckpt["optimizer"]["state"].values()))
        state["momentum_buffer"].fill_(float("nan"))
    else:
        ckpt["scaler"] = {"scale": float("nan"), "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
                          "_growth_tracker": 0}
    torch.save(ckpt, path)


@pytest.mark.parametrize("where", ["optimizer", "scaler"])
def test_resume_refuses_a_training_state_that_is_not_finite(tmp_path, where):
    first = _fit_plain(_plain_config(tmp_path, epochs=1), _fitness(0.5))
    best = first.best.read_bytes()
    _poison(first.last, where)
    with pytest.raises(ValueError, match=r"its training state is not finite \(1 entries hold NaN or Inf, e\.g\. "
                                         rf"{where}\."):
        _fit_plain(_plain_config(tmp_path, epochs=2, resume=str(first.last)), _fitness(0.0))
    assert first.best.read_bytes() == best


def test_resume_refuses_a_model_of_other_classes_or_names(tmp_path):
    first = _fit_plain(_plain_config(tmp_path, epochs=1), _fitness(0.5))
    other = ToyNet()
    other.names = ["something else"]
    with pytest.raises(ValueError, match=r"class names \['something else'\] are not the run's \['thing'\]"):
        _fit_plain(_plain_config(tmp_path, epochs=2, resume=str(first.last)), _fitness(0.5), model=other)
    other.nc, other.names = 2, ["a", "b"]
    with pytest.raises(ValueError, match="the model predicts 2 classes, the run 1"):
        _fit_plain(_plain_config(tmp_path, epochs=2, resume=str(first.last)), _fitness(0.5), model=other)


def test_a_run_stopped_during_its_last_validation_is_validated_by_its_resume(tmp_path):
    calls = []

    def ctrl_c_in_the_last_validation(model):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {"precision": 0.1, "recall": 0.1, "map50": 0.1, "map50_95": 0.1, "fitness": 0.1}

    stopped = _fit_plain(_plain_config(tmp_path, epochs=2), ctrl_c_in_the_last_validation)
    assert stopped.interrupted_by == "KeyboardInterrupt" and stopped.epochs_completed == 2
    rows = list(csv.DictReader(open(stopped.save_dir / "results.csv")))
    assert rows[-1]["fitness"] == ""  # the epoch is kept without its metrics
    resumed = _fit_plain(_plain_config(tmp_path, epochs=2, resume=str(stopped.last)), _fitness(0.6))
    rows = list(csv.DictReader(open(resumed.save_dir / "results.csv")))
    assert len(rows) == 2 and float(rows[-1]["fitness"]) == pytest.approx(0.6)
    assert resumed.best_epoch == 1 and read_checkpoint(resumed.best)["progress"]["best_fitness"] == pytest.approx(0.6)


# ---- what a run keeps, and what it leaves when it fails ------------------------------------------------------------

def test_non_finite_weights_are_never_saved(tmp_path):
    """Weights that turned NaN in epoch 1 (the second; messages count from 1): nothing is written, and
    best.pt and last.pt of epoch 0 are the files a user is left with."""
    def nan_after_epoch_0(record):
        if record.epoch == 1:
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))

    model = ToyNet()
    config = _plain_config(tmp_path, epochs=3, callbacks={"on_batch": nan_after_epoch_0})
    with pytest.raises(NonFiniteWeightsError, match=r"epoch 2, best\.pt: the weights hold NaN or Inf") as info:
        _fit_plain(config, _fitness(0.2, 0.5), model=model)
    assert f"last good checkpoint is {tmp_path / 'runs' / 'exp' / 'weights' / 'last.pt'}" in str(info.value)
    weights = tmp_path / "runs" / "exp" / "weights"
    for name in ("best.pt", "last.pt"):
        saved = read_checkpoint(weights / name)
        assert saved["progress"]["epoch"] == 1 and all(torch.isfinite(v).all() for v in saved["model"].values())


def test_a_fitness_of_zero_never_replaces_a_better_best(tmp_path):
    run = _fit_plain(_plain_config(tmp_path, epochs=3), _fitness(0.4, 0.0, 0.0))
    assert run.best_epoch == 0 and read_checkpoint(run.best)["progress"]["best_epoch"] == 0
    zero = _fit_plain(_plain_config(tmp_path, name="zero", epochs=2), _fitness(0.0, 0.0))
    assert zero.best.is_file() and read_checkpoint(zero.best)["progress"]["epoch"] == 1  # the first 0 makes best.pt
    tie = _fit_plain(_plain_config(tmp_path, name="tie", epochs=2), _fitness(0.3, 0.3))
    assert tie.best_epoch == 1  # a positive tie replaces it, as the official code does


def test_batches_whose_boxes_no_anchor_holds_are_named(caplog):
    """At 32 pixels a box of a tenth of the image holds no anchor point of any level: the batch trains on
    background only, and the epoch says so once."""
    from yolo9kit.models import create_model
    from yolo9kit.train.loop import train_one_epoch
    from yolo9kit.train.state import Progress
    from yolo9kit.train.step import build_trainer

    torch.manual_seed(0)
    model = create_model("yolov9-t", num_classes=1)
    config = TrainConfig(epochs=1, batch_size=2, imgsz=32, amp="off", device="cpu", warmup_epochs=0.0,
                         warmup_min_batches=0)
    trainer = build_trainer(model, config)
    tiny = torch.tensor([[0, 0, 0.31, 0.31, 0.02, 0.02], [1, 0, 0.62, 0.62, 0.02, 0.02]])
    batches = [(torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8), tiny)] * 2
    with caplog.at_level(logging.WARNING):
        train_one_epoch(trainer, batches, config, Progress(), batches_per_epoch=2, warmup=0, progress_bar=False)
    assert "2 of 2 batches had boxes but none of them held an anchor (at 32x32 px)" in caplog.text


def test_a_run_that_fails_before_its_first_save_leaves_no_folder(tmp_path):
    def broken_loss(outputs, targets):
        raise ValueError("the loss could not be computed")

    with pytest.raises(ValueError, match="could not be computed"):
        _fit(_config(tmp_path), loss_fn=broken_loss)
    assert not (tmp_path / "runs" / "exp" / "weights").exists() and not (tmp_path / "runs" / "exp").exists()


def test_a_run_with_batch_auto_that_fails_at_once_leaves_no_folder(tmp_path):
    """The automatic batch's record (auto_batch.json) goes with the folder of a run that fails before its
    first checkpoint: nothing is left behind."""
    from yolo9kit.data import make_shapes
    from yolo9kit.models import create_model

    data = make_shapes(tmp_path / "shapes", n_train=2, n_val=1, imgsz=64)

    class BrokenLoader:  # fails at the first batch, after the batch was chosen and recorded
        def __len__(self):
            return 1

        def __iter__(self):
            raise ValueError("the first batch could not be read")

    config = _plain_config(tmp_path, epochs=1, batch_size="auto", accumulate_steps=None, imgsz=64, workers=0)
    with pytest.raises(ValueError, match="could not be read"):
        fit(create_model("yolov9-t", num_classes=4), data, config, train_loader=BrokenLoader(),
            validate_fn=lambda model: {})
    assert not (tmp_path / "runs").exists()


# ---- docs/faults.md ------------------------------------------------------------------------------------------------

def test_every_test_named_in_docs_faults_exists():
    """docs/faults.md names the test of each case: each must be a test function of that file."""
    import re

    text = (REPO / "docs" / "faults.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", text)
    assert len(named) >= 20
    missing = [f"{path}::{name}" for path, name in named
               if not re.search(rf"^def {name}\(", (REPO / path).read_text(), re.MULTILINE)]
    assert not missing, missing
