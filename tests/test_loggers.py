"""The experiment loggers: a real run read back from its TensorBoard events with tensorboard's own reader and from a
real ``mlflow server`` with MLflow's client (a resume continuing the same MLflow run); a server that goes away and a
full disk are warnings, never the end of the run."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
from train_toys import ToyNet, make_batches, one_thread, toy_loss

from yolo9kit.config import TrainConfig
from yolo9kit.models.checkpoint import SHAPES_WEIGHTS
from yolo9kit.train.fit import fit

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def _start_server(folder: Path) -> tuple[subprocess.Popen, str]:
    """``mlflow server`` on a free localhost port, its own SQLite store and artifact folder; waits for /health."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mlflow = Path(sys.executable).with_name("mlflow")
    server = subprocess.Popen([str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                               "--backend-store-uri", f"sqlite:///{folder / 'server.db'}",
                               "--artifacts-destination", str(folder / "artifacts")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)  # its workers in its process group: stopped together
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(uri + "/health", timeout=2):
                return server, uri
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.5)
    _stop(server)
    pytest.fail(f"mlflow server did not start on {uri} (exit code {server.poll()})")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process, uri = _start_server(tmp_path_factory.mktemp("mlflow-server"))
    yield uri
    _stop(process)


def _stop(server: subprocess.Popen) -> None:
    """The server and its worker processes, at once (what a crash or a pulled cable does)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait(timeout=30)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    from yolo9kit.data import make_shapes

    return make_shapes(tmp_path_factory.mktemp("shapes"), n_train=8, n_val=4, imgsz=64, num_classes=3)


def _toy_fit(project, name, **settings):
    config = TrainConfig(project=str(project), name=name, epochs=3, batch_size=2, accumulate_steps=1, amp="off",
                         device="cpu", warmup_epochs=0.0, warmup_min_batches=0, progress_bar=False, plots=False,
                         **settings)
    scores = iter(range(1, 100))

    def validate(model):
        n = next(scores)
        return {"precision": 0.5, "recall": 0.5, "map50": 0.1 * n, "map50_95": 0.05 * n, "fitness": 0.055 * n}

    return fit(ToyNet(), None, config, loss_fn=toy_loss, train_loader=make_batches(2, 2), validate_fn=validate)


@pytest.mark.slow
def test_a_resumed_run_reads_back_from_tensorboard_and_the_mlflow_server(shapes, server, tmp_path):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def stop_after_the_first_epoch(record):
        raise KeyboardInterrupt

    config = TrainConfig(project=str(tmp_path / "runs"), name="logged", epochs=2, batch_size=4, imgsz=64, workers=0,
                         device="cpu", progress_bar=False, loggers=("tensorboard", "mlflow"), mlflow_uri=server)
    stopped = fit(str(SHAPES_WEIGHTS), shapes, config.replace(callbacks={"on_epoch_end": stop_after_the_first_epoch}))
    assert stopped.interrupted
    client = MlflowClient(tracking_uri=server)
    experiment = client.get_experiment_by_name(str(tmp_path / "runs"))
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "KILLED" and run.info.run_name == "logged"

    result = fit(str(SHAPES_WEIGHTS), shapes, config.replace(resume=str(stopped.save_dir)))
    folder = result.save_dir
    rows = pd.read_csv(folder / "results.csv")
    assert list(rows["epoch"]) == [0, 1]

    # MLflow: the same run, finished, every epoch's metrics once, the settings, the pictures and the weights
    (again,) = client.search_runs([experiment.experiment_id])
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "metrics/mAP50-95")
    assert [m.step for m in history] == [1, 2]
    assert [m.value for m in history] == pytest.approx(list(rows["metrics/mAP50-95"]), rel=1e-5)
    assert again.data.params["imgsz"] == "64" and again.data.params["loggers"] == "['tensorboard', 'mlflow']"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"results.csv", "settings.yaml", "state.yaml", "pictures", "weights"} <= artifacts
    pictures = {a.path for a in client.list_artifacts(run.info.run_id, "pictures")}
    assert {"pictures/labels.jpg", "pictures/results.png", "pictures/confusion_matrix.png"} <= pictures
    best = client.download_artifacts(run.info.run_id, "weights/best.pt", str(tmp_path / "download"))
    assert _sha(best) == _sha(folder / "weights" / "best.pt")

    # TensorBoard: the events files of both parts, read by tensorboard's own reader
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("metrics/mAP50-95")] == [
        (step, pytest.approx(value, rel=1e-5)) for step, value in zip([1, 2], rows["metrics/mAP50-95"])]
    assert [e.step for e in events.Scalars("train/box_loss")] == [1, 2]
    assert {"labels", "results", "train_batch0", "confusion_matrix", "PR_curve"} <= set(events.Tags()["images"])
    assert "settings/text_summary" in events.Tags()["tensors"]
    assert len(list(folder.glob("events.out.tfevents.*"))) == 2  # one per part of the run


@pytest.mark.slow
def test_a_server_that_goes_away_is_a_warning_and_the_run_finishes(tmp_path, caplog):
    process, uri = _start_server(tmp_path / "server")

    def stop_the_server(record):
        """After the first epoch reached the server (the logger sends from its own thread)."""
        if record.epoch != 0:
            return
        from mlflow.tracking import MlflowClient

        client, deadline = MlflowClient(tracking_uri=uri), time.monotonic() + 120
        while time.monotonic() < deadline:
            experiment = client.get_experiment_by_name(str(tmp_path / "runs"))
            found = client.search_runs([experiment.experiment_id]) if experiment else []
            if found and client.get_metric_history(found[0].info.run_id, "metrics/mAP50"):
                break
            time.sleep(0.2)
        _stop(process)

    with caplog.at_level(logging.WARNING, logger="yolo9kit.train.loggers"):
        result = _toy_fit(tmp_path / "runs", "gone", loggers=("mlflow",), mlflow_uri=uri,
                          callbacks={"on_epoch_end": stop_the_server})
    assert not result.interrupted and result.epochs_completed == 3
    assert len(pd.read_csv(result.save_dir / "results.csv")) == 3
    warnings = [r.getMessage() for r in caplog.records if r.name == "yolo9kit.train.loggers"]
    assert len(warnings) == 1 and "mlflow" in warnings[0] and f"no MLflow server answers at {uri}" in warnings[0]


def test_a_full_disk_is_a_warning_and_the_run_finishes(tmp_path, caplog, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(SummaryWriter, "add_scalar", full)
    with caplog.at_level(logging.WARNING, logger="yolo9kit.train.loggers"):
        result = _toy_fit(tmp_path, "full", loggers=("tensorboard",))
    assert result.epochs_completed == 3 and len(pd.read_csv(result.save_dir / "results.csv")) == 3
    warnings = [r.getMessage() for r in caplog.records if r.name == "yolo9kit.train.loggers"]
    assert len(warnings) == 1 and warnings[0].startswith("tensorboard: [Errno 28] No space left on device")


def test_a_local_mlflow_store_by_default_and_a_missing_package_stops_before_training(tmp_path, monkeypatch):
    import importlib.util

    from mlflow.tracking import MlflowClient

    result = _toy_fit(tmp_path / "runs", "local", loggers=("mlflow",))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(str(tmp_path / "runs"))
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.data.metrics["metrics/mAP50"] == pytest.approx(0.3)
    assert (tmp_path / "runs" / "mlartifacts").is_dir()  # beside the store, not in the working folder
    assert {a.path for a in client.list_artifacts(run.info.run_id, "weights")} == {"weights/best.pt",
                                                                                  "weights/last.pt"}
    assert result.save_dir.name == "local"

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ValueError, match=r"tensorboard needs the tensorboard package: pip install 'yolo9kit\["):
        _toy_fit(tmp_path / "runs", "missing", loggers=("tensorboard",))
    assert not (tmp_path / "runs" / "missing").exists()  # a failed start leaves nothing behind


def test_a_logger_without_an_entry_point_is_refused_naming_its_extra(tmp_path, monkeypatch):
    """fit finds the loggers among the entry points of the group yolo9kit.loggers, by their names."""
    from yolo9kit.train import rundir

    monkeypatch.setattr(rundir, "entry_points", lambda group: [])
    with pytest.raises(ValueError, match=r"mlflow needs the mlflow package: pip install 'yolo9kit\[mlflow\]'"):
        _toy_fit(tmp_path / "runs", "unlisted", loggers=("mlflow",))
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_a_local_mlflow_store_without_room_for_the_weights_gets_none(tmp_path, caplog, monkeypatch):
    from mlflow.tracking import MlflowClient

    from yolo9kit import files

    real = files.free_bytes
    monkeypatch.setattr(files, "free_bytes", lambda folder: 0 if "mlartifacts" in str(folder) else real(folder))
    with caplog.at_level(logging.WARNING, logger="yolo9kit.train.loggers"):
        result = _toy_fit(tmp_path / "runs", "room", loggers=("mlflow",))
    warnings = [r.getMessage() for r in caplog.records if r.name == "yolo9kit.train.loggers"]
    assert len(warnings) == 1 and warnings[0].startswith("mlflow: disk full: MLflow's copy of the weights needs")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name(str(tmp_path / "runs")).experiment_id])
    assert not client.list_artifacts(run.info.run_id, "weights")
    assert (result.save_dir / "weights" / "best.pt").is_file() and not result.interrupted


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_the_train_command_takes_the_loggers():
    from yolo9kit.cli import build_parser
    from yolo9kit.cli.train import config_from_args

    args = build_parser().parse_args(["train", "--data", "d.yaml", "--loggers", "tensorboard", "mlflow",
                                      "--mlflow-uri", "http://localhost:5000"])
    config = config_from_args(args)
    assert config.run.loggers == ("tensorboard", "mlflow") and config.run.mlflow_uri == "http://localhost:5000"


def test_an_mlflow_uri_with_a_password_is_refused_and_never_written(shapes, tmp_path, capsys):
    from yolo9kit.cli import main

    code = main(["train", "--data", str(shapes), "--imgsz", "64", "--epochs", "1", "--batch-size", "2", "--device",
                 "cpu", "--project", str(tmp_path / "runs"), "--loggers", "mlflow",
                 "--mlflow-uri", "http://ann:s3cret@127.0.0.1:9"])
    captured = capsys.readouterr()
    assert code == 2 and "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in captured.err
    assert "s3cret" not in captured.err + captured.out and not (tmp_path / "runs").exists()


def test_the_health_check_asks_the_way_the_mlflow_client_does(monkeypatch):
    import base64
    import http.server
    import threading

    from mlflow.tracking import MlflowClient

    from yolo9kit.train.loggers import _check_server

    expected = "Basic " + base64.b64encode(b"ann:s3cret").decode()

    class Guarded(http.server.BaseHTTPRequestHandler):  # a server behind basic authentication
        def do_GET(self):
            self.send_response(200 if self.headers.get("Authorization") == expected else 401)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Guarded)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(ConnectionError, match=f"the MLflow server at {uri} refuses its health check: HTTP 401"):
            _check_server(MlflowClient(tracking_uri=uri), uri)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "ann")  # where MLflow's client reads them
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret")
        _check_server(MlflowClient(tracking_uri=uri), uri)
    finally:
        server.shutdown()
