"""A training run under faults: kills at every point of the end of an epoch, leftovers of killed writes, full
disks, SIGINT and SIGTERM (a real signal, in this process and to ``python -m yolo9kit train``), resumes that
change what cannot change, data recorded from another folder, and failed runs that leave nothing behind.

A hard kill (SIGKILL, a power cut) is simulated by raising ``_Killed``, a ``BaseException`` that none of the
kit's handlers catch, from inside the save sequence; it leaves a temporary file as a killed write would.
"""

from __future__ import annotations

import collections
import csv
import errno
import hashlib
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
from train_toys import ToyNet, make_batches, one_thread, params_of, toy_loss

from yolo9kit.config import TrainConfig
from yolo9kit.files import DiskFullError
from yolo9kit.models.checkpoint import read_checkpoint
from yolo9kit.train import records, state
from yolo9kit.train.fit import fit
from yolo9kit.train.records import read_state

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

DEAD_PID = 4_194_305  # above Linux's largest pid_max: no process has it
_Usage = collections.namedtuple("_Usage", "total used free")


class _Killed(BaseException):
    """A hard kill: nothing of the kit runs after it."""


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


def _same_weights(a, b):
    for k, v in params_of(a.model).items():
        assert torch.equal(params_of(b.model)[k], v), k
    for k, v in a.ema.state_dict().items():
        assert torch.equal(b.ema.state_dict()[k], v), k


def _epochs_in_csv(run):
    return [row["epoch"] for row in csv.DictReader(open(run / "results.csv"))]


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(folder):
    """Every file under ``folder`` with its digest: what a refused command leaves as it found it."""
    return {str(p.relative_to(folder)): _digest(p) for p in sorted(folder.rglob("*")) if p.is_file()}


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
    _same_weights(straight, resumed)


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


@pytest.mark.parametrize("failure", ["torch", "oserror"])
def test_a_disk_that_fills_during_a_save_keeps_every_file_written_before(tmp_path, monkeypatch, failure):
    """The disk fills while best.pt of epoch 1 is written: a DiskFullError naming the folder, and last.pt,
    best.pt and results.csv exactly as epoch 0 left them (no temporary file either)."""
    first = _fit(_config(tmp_path, epochs=1))
    files = [first.last, first.best, first.save_dir / "results.csv"]
    before = [_digest(p) for p in files]
    full = {"now": False}
    _report_free(monkeypatch, lambda: 50_000 if full["now"] else 10**11)
    save = torch.save

    def filling_save(obj, f, *args, **kwargs):
        with open(f, "wb") as out:
            out.write(b"the start of a checkpoint")
        full["now"] = True
        if failure == "torch":  # what torch's zip writer says on a full disk
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 474")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", filling_save)
    with pytest.raises(DiskFullError, match=f"saving best.pt needs about .* in {first.save_dir / 'weights'}"):
        _fit(_config(tmp_path, epochs=2, resume=str(first.save_dir)))
    monkeypatch.setattr(torch, "save", save)
    assert [_digest(p) for p in files] == before
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
    _same_weights(straight, resumed)


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


def test_a_planned_stop_from_a_callback_is_a_normal_return(tmp_path):
    def stop(record):
        raise KeyboardInterrupt("dashboard: stop requested")

    result = _fit(_config(tmp_path, callbacks={"on_epoch_end": stop}))
    assert result.interrupted and result.interrupted_by == "KeyboardInterrupt" and result.epochs_completed == 1
    assert read_checkpoint(result.last)["progress"]["epoch"] == 1


def test_cli_exit_status_says_how_the_run_ended(tmp_path, monkeypatch, capsys):
    import argparse

    from yolo9kit.cli import train as train_cli
    from yolo9kit.train.fit import FitResult

    parser = argparse.ArgumentParser()
    train_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["train", "--data", "d.yaml", "--project", str(tmp_path)])
    monkeypatch.setattr(train_cli, "create_model", lambda *a, **k: ToyNet())
    monkeypatch.setattr(train_cli, "class_names", lambda *a, **k: ["thing"])  # no data.yaml read
    for by, code in ((None, 0), ("SIGINT", 130), ("SIGTERM", 143), ("KeyboardInterrupt", 130)):
        result = FitResult(ToyNet(), None, tmp_path, 1, 0.0, -1, interrupted=by is not None, interrupted_by=by)
        monkeypatch.setattr(train_cli, "fit", lambda *a, result=result, **k: result)
        assert train_cli.run(args) == code, by
        if by:
            assert f"interrupted by {by}" in capsys.readouterr().out


def test_resume_refuses_settings_that_cannot_change(tmp_path):
    first = _fit(_config(tmp_path, epochs=2))
    with pytest.raises(ValueError, match=r"batch_size 2 -> 4, imgsz 640 -> 320: these cannot change"):
        _fit(_config(tmp_path, epochs=3, batch_size=4, imgsz=320, resume=str(first.save_dir)))
    with pytest.raises(ValueError, match="epochs=1, but the run has trained 2 epochs already"):
        _fit(_config(tmp_path, epochs=1, resume=str(first.save_dir)))
    assert _epochs_in_csv(first.save_dir) == ["0", "1"]  # refused before anything was touched


def test_cli_resume_refuses_fixed_flags_and_takes_epochs(tmp_path):
    import argparse

    from yolo9kit.cli import train as train_cli
    from yolo9kit.models import create_model
    from yolo9kit.models.checkpoint import save_checkpoint
    from yolo9kit.train.state import Progress

    saved = TrainConfig(epochs=2, batch_size=4, imgsz=64, device="cpu", seed=5).to_dict()
    last = save_checkpoint(tmp_path / "run" / "weights" / "last.pt", create_model("gelan-t", num_classes=2),
                           train_config=saved, progress=Progress(epoch=2).to_dict(), data=str(tmp_path / "d.yaml"))
    parser = argparse.ArgumentParser()
    train_cli.add_parser(parser.add_subparsers())

    def setup(*flags):
        return train_cli._resume_setup(parser.parse_args(["train", "--resume", str(last), *flags]))

    with pytest.raises(ValueError, match=r"--batch-size 2 \(the run's: 4\), --imgsz 128 \(the run's: 64\), --cos-lr.*"
                                         "cannot change in the middle of a run"):
        setup("--epochs", "9", "--batch", "2", "--imgsz", "128", "--cos-lr")
    with pytest.raises(ValueError, match=r"--seed 0 \(the run's: 5\)"):  # 0, the default, given: still seen
        setup("--seed", "0")
    _, data, config = setup("--epochs", "9", "--batch", "4", "--workers", "0")  # the run's batch: accepted
    assert (config.epochs, config.batch_size, config.step.imgsz, config.pipeline.workers) == (9, 4, 64, 0)
    assert data == str(tmp_path / "d.yaml") and config.run.resume == str(last)


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


def test_a_run_that_fails_before_its_first_save_leaves_no_folder(tmp_path):
    def broken_loss(outputs, targets):
        raise ValueError("the loss could not be computed")

    with pytest.raises(ValueError, match="could not be computed"):
        _fit(_config(tmp_path), loss_fn=broken_loss)
    assert not (tmp_path / "runs" / "exp" / "weights").exists() and not (tmp_path / "runs" / "exp").exists()


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


def test_every_test_named_in_docs_faults_exists():
    """docs/faults.md names the test of each case: each must be a test function of that file."""
    import re

    text = (REPO / "docs" / "faults.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", text)
    assert len(named) >= 20
    missing = [f"{path}::{name}" for path, name in named
               if not re.search(rf"^def {name}\(", (REPO / path).read_text(), re.MULTILINE)]
    assert not missing, missing
