"""Experiment loggers (``TrainConfig(loggers=...)``): TensorBoard and MLflow, entry points of the group
"yolo9kit.loggers" that ``fit`` calls through its callbacks, each in its own thread (docs/training.md, loggers)."""

from __future__ import annotations

import getpass
import logging
import queue
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2

from yolo9kit.files import RecordError, check_free_space, dump_record, read_record, write_text_atomically
from yolo9kit.train.records import EpochRecord, read_results

LOGGER = logging.getLogger(__name__)

CLOSE_WAIT_S = 300.0  # after the run, to send what a logger still holds (the weights to a server, say)
# an MLflow server that does not answer its health check in this time is gone (its client would retry for minutes)
HEALTH_TIMEOUT_S = 5.0
MLFLOW_FILE = "mlflow.yaml"  # the run folder's MLflow run, continued on resume
_STATUS = {"finished": "FINISHED", "stopped early": "FINISHED", "interrupted": "KILLED", "failed": "FAILED"}


class _Logger:
    """fit's callbacks: the subclass's ``open``, ``epoch(rows)``, ``close(state)`` (and ``picture(path)``) run in
    order in its thread; the first error is one warning and ends them. Subclasses set their fields, then call this."""

    name = "logger"

    def __init__(self, config: Any, run_dir: Path, resumed: bool, files: list[Path]) -> None:
        self.run_dir, self.files, self.seen = run_dir, files, {}
        # the last epoch sent (results.csv counts from 0); a resumed run's epochs so far were sent by its earlier parts
        self.sent = max((int(row["epoch"]) for row in _rows(run_dir)), default=-1) if resumed else -1
        self.calls: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._work, name=f"yolo9kit-{self.name}", daemon=True)
        self.thread.start()

    def on_epoch_end(self, record: EpochRecord) -> None:
        self._send([record.row()])

    def on_run_end(self, state: str) -> None:
        self._send(_rows(self.run_dir))  # the rows not sent yet (an epoch written by an interrupt), then close
        self.calls.put(("close", (state,)))
        self.thread.join(CLOSE_WAIT_S)
        if self.thread.is_alive():
            LOGGER.warning("%s: still sending after %.0f s; the rest of this run is not sent to it (the run "
                           "folder holds everything)", self.name, CLOSE_WAIT_S)

    def _send(self, rows: Sequence[dict]) -> None:
        new = [dict(row) for row in rows if row.get("epoch") is not None and row["epoch"] > self.sent]
        if new:
            self.sent = int(new[-1]["epoch"])
            self.calls.put(("epoch", (new,)))

    def _send_pictures(self) -> None:
        """The subclass's ``picture(path)`` of each picture (png, jpg) of the run folder drawn since the last call."""
        for path in sorted([*self.run_dir.glob("*.png"), *self.run_dir.glob("*.jpg")]):
            try:
                stamp = path.stat().st_mtime_ns
            except OSError:
                continue
            if self.seen.get(path) != stamp:
                self.seen[path] = stamp
                self.picture(path)

    def _work(self) -> None:
        method, args, failed = "open", (), False
        while True:
            if not failed:
                try:
                    getattr(self, method)(*args)
                except Exception as e:  # a logger never stops the run
                    failed = True
                    LOGGER.warning("%s: %s (%s); the run goes on without it (its folder holds everything)",
                                   self.name, str(e).splitlines()[0][:300] if str(e) else "", type(e).__name__)
            if method == "close":
                return
            method, args = self.calls.get()


def _rows(run_dir: Path) -> list[dict]:
    """results.csv's rows (empty cells None); [] when there is none or it is unreadable."""
    if not (run_dir / "results.csv").is_file():
        return []
    try:
        table = read_results(run_dir)
    except (OSError, ValueError) as e:
        LOGGER.warning("loggers: %s unreadable (%s)", run_dir / "results.csv", e)
        return []
    return table.astype(object).where(table.notna(), None).to_dict("records")


class TensorBoardLogger(_Logger):
    """Events in the run folder (``torch.utils.tensorboard.SummaryWriter``)."""

    name, step = "tensorboard", 0

    def open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        before = set(self.run_dir.glob("events.out.tfevents.*"))
        self.writer = SummaryWriter(log_dir=str(self.run_dir))
        settings = self.run_dir / "settings.yaml"
        if settings.is_file():  # as a code block: TensorBoard renders text as markdown
            self.writer.add_text("settings", "".join(f"    {line}\n" for line in settings.read_text().splitlines()))
        self.writer.flush()
        self.files.extend(set(self.run_dir.glob("events.out.tfevents.*")) - before)

    def epoch(self, rows: list[dict]) -> None:
        for row in rows:
            self.step = int(row["epoch"]) + 1
            for key, value in row.items():
                if key != "epoch" and value is not None:
                    self.writer.add_scalar(key, float(value), self.step)
        self._send_pictures()
        self.writer.flush()

    def close(self, state: str) -> None:
        self._send_pictures()
        self.writer.close()

    def picture(self, path: Path) -> None:
        image = cv2.imread(str(path))
        if image is not None:  # a picture being replaced right now comes with the next call
            self.writer.add_image(path.stem, image[..., ::-1].copy(), self.step, dataformats="HWC")


class MlflowLogger(_Logger):
    """A run on an MLflow tracking server or store (``mlflow.tracking.MlflowClient``)."""

    name = "mlflow"

    def __init__(self, config: Any, run_dir: Path, resumed: bool, files: list[Path]) -> None:
        self.uri = config.run.mlflow_uri or f"sqlite:///{(Path(config.run.project) / 'mlflow.db').resolve().as_posix()}"
        self.experiment, self.resumed = config.run.project, resumed
        self.params = _flat(config.to_dict())
        self.log_weights = config.run.log_weights
        super().__init__(config, run_dir, resumed, files)

    def open(self) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        _check_server(self.client, self.uri)
        path = self.run_dir / MLFLOW_FILE  # a resume logging to the same place continues the folder's MLflow run
        try:
            saved = read_record(path) if self.resumed and path.is_file() else None
        except (OSError, RecordError):
            saved = None
        self.run_id = saved.get("run_id") if isinstance(saved, dict) and saved.get("uri") == self.uri else None
        if self.run_id is not None:
            self.client.update_run(self.run_id, status="RUNNING")
            return
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # a container's user without a name
            user = "unknown"
        tags = {"mlflow.source.name": "yolo9kit", "mlflow.user": user, "host": socket.gethostname(),
                "run folder": str(self.run_dir.resolve())}
        self.run_id = self.client.create_run(self._experiment_id(), run_name=self.run_dir.name, tags=tags).info.run_id
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in self.params.items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters per request
            self.client.log_batch(self.run_id, params=params[start:start + 100])
        record = {"uri": self.uri, "experiment": self.experiment, "run_id": self.run_id}
        write_text_atomically(path, dump_record(record))
        self.files.append(path)

    def epoch(self, rows: list[dict]) -> None:
        from mlflow.entities import Metric

        _check_server(self.client, self.uri)
        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, int(row["epoch"]) + 1) for row in rows
                   for key, value in row.items() if key != "epoch" and value is not None]
        self.client.log_batch(self.run_id, metrics=metrics)
        self._send_pictures()

    def close(self, state: str) -> None:
        _check_server(self.client, self.uri)
        self._send_pictures()
        for name in ("results.csv", "settings.yaml", "state.yaml"):
            if (self.run_dir / name).is_file():
                self.client.log_artifact(self.run_id, str(self.run_dir / name))
        files = (self.run_dir / "weights" / name for name in ("best.pt", "last.pt"))
        weights = [path for path in files if path.is_file()] if self.log_weights else []
        where = self.client.get_run(self.run_id).info.artifact_uri if weights else ""
        if where.startswith("file:"):  # a local store copies them: room for the copies first
            from mlflow.utils.file_utils import local_file_uri_to_path

            check_free_space(Path(local_file_uri_to_path(where)), sum(path.stat().st_size for path in weights),
                             "MLflow's copy of the weights")
        for path in weights:
            self.client.log_artifact(self.run_id, str(path), "weights")
        self.client.set_terminated(self.run_id, _STATUS.get(state, "FINISHED"))

    def picture(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path), "pictures")

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        local = self.uri.startswith("sqlite:///")  # artifacts beside the store, not in the working folder
        where = Path(self.uri[len("sqlite:///"):]).parent / "mlartifacts" if local else None
        try:
            return self.client.create_experiment(self.experiment, artifact_location=where.as_uri() if where else None)
        except MlflowException:  # made by another run at the same moment
            return self.client.get_experiment_by_name(self.experiment).experiment_id


def _check_server(client: Any, uri: str) -> None:
    """ConnectionError unless an http(s) server answers its health check, asked as ``client`` asks, in time."""
    if not uri.startswith(("http://", "https://")):
        return
    from mlflow.utils.rest_utils import http_request

    try:  # the client's store holds how it connects (RestStore.get_host_creds)
        answer = http_request(client._tracking_client.store.get_host_creds(), "/health", "GET", max_retries=0,
                              timeout=HEALTH_TIMEOUT_S)
    except Exception as e:  # MlflowException around requests' errors
        raise ConnectionError(f"no MLflow server answers at {uri} ({str(e).splitlines()[0][:200]})") from None
    if answer.status_code != 200:
        raise ConnectionError(f"the MLflow server at {uri} refuses its health check: HTTP {answer.status_code}")


def _flat(values: dict, prefix: str = "") -> dict[str, str]:
    """Nested settings as MLflow parameters: ``loss.box_gain`` -> "7.5" (6000 characters at most)."""
    out = {}
    for key, value in values.items():
        if str(key).startswith("__"):
            continue
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)[:6000]
    return out
