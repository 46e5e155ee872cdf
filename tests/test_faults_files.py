"""yolo9kit/files.py under faults: one run per folder (its lock, taken over from a killed process) and the YAML
the kit reads back, bounded."""

from __future__ import annotations

import logging
import socket

import pytest
from conftest import holding_the_lock
from fault_checks import DEAD_PID
from train_toys import one_thread

from yolo9kit.files import FolderInUseError

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def _toy_run(tmp_path, **settings):
    from train_toys import ToyNet, make_batches, toy_loss

    from yolo9kit.config import TrainConfig
    from yolo9kit.train.fit import fit

    config = TrainConfig(**{**dict(epochs=1, batch_size=2, device="cpu", amp="off", project=str(tmp_path / "runs"),
                                   name="x", exist_ok=True, plots=False, progress_bar=False), **settings})
    return fit(ToyNet(), None, config, loss_fn=toy_loss, train_loader=make_batches(2, 2), validate_fn=lambda m: {})


def test_two_runs_into_one_folder_the_second_is_refused_naming_the_first(tmp_path):
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    other = holding_the_lock(run)
    try:
        with pytest.raises(FolderInUseError, match=f"in use by process {other.pid} on {socket.gethostname()} "
                                                   r"\(a training run\), which holds its lock .yolo9kit.lock"):
            _toy_run(tmp_path)
        assert not (run / "weights").exists()
    finally:
        other.kill()  # kill -9: the system drops its lock
        other.wait()
    result = _toy_run(tmp_path)
    assert result.last.is_file() and not (run / ".yolo9kit.lock").exists()  # taken over, released at the end


def test_resume_finds_a_killed_run_of_another_host_and_takes_over_its_lock(tmp_path, caplog):
    from yolo9kit.extras import runs

    run = _toy_run(tmp_path).save_dir
    (run / "state.yaml").write_text("state: running\n")  # kill -9, then a restarted container of another name
    (run / ".yolo9kit.lock").write_text(f"{DEAD_PID} container-before-the-restart\n")
    assert runs(tmp_path / "runs").set_index("run").loc["x", "state"] == "killed"
    assert _toy_run(tmp_path, name="y").last.stat().st_mtime >= (run / "weights" / "last.pt").stat().st_mtime
    with caplog.at_level(logging.INFO, logger="yolo9kit.files"):  # resume=True: the newest run that did not end
        resumed = _toy_run(tmp_path, epochs=2, resume=True)
    assert resumed.epochs_completed == 2 and not (run / ".yolo9kit.lock").exists()
    assert f"taking over the lock of process {DEAD_PID} on container-before-the-restart" in caplog.text


def test_the_yaml_a_run_reads_back_is_bounded_and_a_refusal_names_the_file(tmp_path):
    """Aliases (a few hundred bytes that expand to gigabytes) and files over 1 MiB are refused unread by every
    reader of the kit's YAML: --hyp, data.yaml, state.yaml (runs(): a damaged row, tests/test_experiments.py)."""
    from yolo9kit.config.recipe import read_hyp
    from yolo9kit.data import load_data_config
    from yolo9kit.files import RecordError
    from yolo9kit.train.records import read_state, write_state

    hyp = tmp_path / "hyp.yaml"
    hyp.write_text("lr0: &x 0.01\nlrf: *x\n")
    with pytest.raises(ValueError, match=f"--hyp {hyp}: line 2: .*aliases"):
        read_hyp(hyp)
    data = tmp_path / "data.yaml"
    data.write_text("train: &t images\nval: *t\nnames: [a]\n")
    with pytest.raises(RecordError, match=f"{data}: line 2: .*aliases"):
        load_data_config(data)
    data.write_text("train: images\nval: images\nnames: [a]\n# " + "x" * (1 << 20) + "\n")
    with pytest.raises(RecordError, match="more than the 1.00 MiB"):
        load_data_config(data)
    write_state(tmp_path, "finished", None, 2, 2, 1.0)  # what the kit writes it reads back
    assert read_state(tmp_path)["state"] == "finished"
