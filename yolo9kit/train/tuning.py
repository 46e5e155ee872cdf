"""``tune``: search the hyper-parameters in train_dual.py's ``--evolve`` space (``EVOLVE_SPACE``) with Optuna's sampler,
from the study's own values. Every trial is a run folder, ``<project>/<name>/trial-<n>``, scored by the fitness of its
best.pt; the study lives in ``study.db`` beside them, or in any Optuna storage its workers share, and the same call
continues it. ``best_hyp.yaml`` holds the best hyper-parameters so far and their recipe, for ``train --hyp``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from yolo9kit.config import TrainConfig
from yolo9kit.config.recipe import (
    EVOLVE_SPACE,
    LOG_SCALE,
    LOSS_KEYS,
    TUNABLE,
    choose_recipe,
    hyp_of,
    hyp_settings,
    write_hyp,
)
from yolo9kit.config.train import named_settings
from yolo9kit.files import FolderInUseError, _pid_alive, dump_record, path_inside, write_text_atomically

if TYPE_CHECKING:  # the training modules (torch) are imported when a study runs: the CLI's parser reads this one
    import pandas as pd

LOGGER = logging.getLogger(__name__)

TUNE_PROJECT = "runs/tune"  # where the study folders go unless the config names a project
# A worker's heartbeat (Optuna's RDB storages): a running trial whose heartbeat is older than GRACE_S belongs to
# a worker that is gone, and is continued by the next trial another worker starts.
HEARTBEAT_S, GRACE_S = 60, 180
KEEP_WEIGHTS = ("best", "all")
MAX_FAILED_IN_A_ROW = 5  # a worker stops after so many failed trials in a row


@dataclass(frozen=True)
class TuneResult:
    """What ``tune`` returns.

    Attributes:
        folder: the study folder: ``tune.yaml``, ``best_hyp.yaml``, ``study.db`` and the trials' run folders.
        trials: one row per trial of the study (all workers'): ``trial``, ``state`` (complete, running, waiting,
            fail), ``fitness``, its hyper-parameters, ``run`` (its run folder in ``folder``), ``continues`` (the
            trial it continues after a stop), ``worker`` (host:pid).
        best: the best trial's hyper-parameters ({} before one completed); with best_fitness, best_run, hyp_file.
        interrupted: the study stopped in a trial (Ctrl-C, SIGTERM); the same call continues it.
    """

    folder: Path
    trials: pd.DataFrame
    best: dict[str, float]
    best_fitness: float | None
    best_run: Path | None
    hyp_file: Path | None
    interrupted: bool

    def __str__(self) -> str:
        done = int((self.trials["state"] == "complete").sum()) if len(self.trials) else 0
        head = f"{done} trials complete in {self.folder}" + (" (stopped: the same call continues)"
                                                              if self.interrupted else "")
        if self.best_fitness is None:
            return head
        return (f"{head}; best fitness {self.best_fitness:.4f} in {self.best_run}; its hyper-parameters: "
                f"{self.hyp_file}")


def tune(model: str | Path, data: Any, config: TrainConfig, *, trials: int = 10,
         space: Mapping[str, tuple[float, float]] | Sequence[str] | None = None, storage: Any = None,
         keep_weights: str = "best") -> TuneResult:
    """Train ``model`` on ``data`` with other hyper-parameters until the study holds ``trials`` complete trials.

    Args:
        model: a model name, yaml or checkpoint: each trial builds it anew with the run's ``seed`` (the same
            initial weights in every trial).
        data: a data.yaml path or dict, as for ``fit``.
        config: the settings of every trial (its recipe is decided once, for all of them), whose ``project``
            (default ``runs/tune``) and ``name`` are the study folder, ``name`` the study's name in the storage.
        trials: complete trials the study should hold (all workers' together; a worker that starts the last one
            while another does too makes one more).
        space: the keys of ``EVOLVE_SPACE`` to search, or ``{key: (low, high)}`` over the keys of a hyp file
            (``TUNABLE``); default ``EVOLVE_SPACE``.
        storage: an Optuna storage URL (``sqlite:///...``, ``postgresql://...``) or object; default
            ``sqlite:///<folder>/study.db``.
        keep_weights: "best" removes the weights of every complete trial but the best (a study of a large model
            fills a disk otherwise), and the mlflow logger gets none of them; "all" keeps them.

    Raises:
        ValueError: a bad space, count, setting or data set, no optuna, a storage that cannot be opened, a study made
            with other settings or data, a trial's run folder outside the study folder, or in use (the trial is queued
            again); each named. A refused call, or a new study's first call refused so, leaves nothing behind.
    """
    from yolo9kit.train.rundir import _first_missing

    optuna = _optuna()
    space = _space(space)
    _check(model, trials, keep_weights, config)
    seen = _data_set(data)
    config, recipe = choose_recipe(config, seen["train images"])  # one recipe for every trial
    LOGGER.info("tune: %s", recipe)
    folder = Path(config.run.project if "project" in named_settings(config) else TUNE_PROJECT) / config.run.name
    record = _record(model, config, space, seen)
    made, ours = _first_missing(folder), [p for p in (folder / "tune.yaml", folder / "study.db") if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    study = new = None
    try:
        study, opened, new = _open_study(optuna, folder, storage, config.run.name, record, _base(config, space))
        where = storage if isinstance(storage, str) else type(storage).__name__ if storage else "study.db"
        write_text_atomically(folder / "tune.yaml", dump_record({"study": config.run.name, "storage": _masked(where),
                                                                "trials": trials, **record,
                                                                "data": {"file": str(data), **seen}}))
        objective = _Objective(study, model, data, config.replace(project=str(folder),
                                                                  log_weights=keep_weights == "all"), space)
        interrupted = _optimize(study, objective, trials, _Keeper(folder, config, space, keep_weights))
    except (ValueError, LookupError, OSError):  # refused: nothing left behind, nor a new study that trained nothing
        if study is None or new and not _complete(study):
            if new:
                optuna.delete_study(study_name=config.run.name, storage=opened)
            if made:
                shutil.rmtree(made, ignore_errors=True)
            for path in ours:
                path.unlink(missing_ok=True)
        raise
    return _result(study, folder, interrupted)


def _check(model: Any, trials: Any, keep_weights: Any, config: TrainConfig) -> None:
    """Refuse a model object (each trial builds its own), a count below 1, other ``KEEP_WEIGHTS``, a resume."""
    if not isinstance(model, (str, Path)):
        raise TypeError(f"tune needs a model name or file, built anew for each trial; got a {type(model).__name__}")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials={trials!r}: expected an integer >= 1")
    if keep_weights not in KEEP_WEIGHTS:
        raise ValueError(f"keep_weights={keep_weights!r}: expected one of {KEEP_WEIGHTS}")
    if config.run.resume:
        raise ValueError("tune: a stopped study continues with the same call (same name and storage); resume is "
                         "for one run")


def _optimize(study: Any, objective: _Objective, trials: int, keeper: _Keeper) -> bool:
    """One trial after the other until the study holds ``trials`` complete ones; True when stopped in a trial."""
    from yolo9kit.train.guards import NonFiniteLossError, NonFiniteWeightsError

    failed: list[int] = []
    while len(_complete(study)) < trials:
        try:
            study.optimize(objective, n_trials=1, catch=(NonFiniteLossError, NonFiniteWeightsError),
                           callbacks=[keeper])
        except KeyboardInterrupt:
            return True
        last = study.get_trials(deepcopy=False)[objective.number]
        failed = [*failed, last.number] if last.state.name == "FAIL" else []
        if len(failed) == MAX_FAILED_IN_A_ROW:  # the settings do not train, whatever the hyper-parameters
            raise RuntimeError(f"tune: trials {', '.join(map(str, failed))} failed in a row (non-finite losses or "
                               f"weights; their run folders in {keeper.folder} say why): the settings do not train")
    return False


class _Objective:
    """One trial: its hyper-parameters, its run folder (a stopped trial's, continued), ``fit``, its fitness."""

    def __init__(self, study: Any, model: str | Path, data: Any, config: TrainConfig,
                 space: Mapping[str, tuple[float, float]]) -> None:
        self.study, self.model, self.data, self.config, self.space = study, model, data, config, space
        self.number = -1  # the trial this worker trains or trained last

    def __call__(self, trial: Any) -> float:
        from yolo9kit.train.fit import fit
        from yolo9kit.train.state import increment_path

        self.number = trial.number
        values = {k: trial.suggest_float(k, low, high, log=k in LOG_SCALE) for k, (low, high) in self.space.items()}
        folder = Path(self.config.run.project)
        name = trial.user_attrs.get("run")
        continued = name is not None and _run_dir(folder, trial).is_dir()
        if not continued:
            name = increment_path(folder / f"trial-{trial.number}").name
        trial.set_user_attr("run", name)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        last = folder / name / "weights" / "last.pt"
        config = _trial_config(self.config, values).replace(name=name, exist_ok=continued,
                                                            resume=str(last) if last.is_file() else False)
        if last.is_file():
            LOGGER.info("tune: trial %d continues %s from its last.pt", trial.number, folder / name)
        try:
            result = fit(str(self.model), self.data, config)
        except KeyboardInterrupt:
            result = None
        except FolderInUseError:  # not lost: a later call continues it, once the folder is free
            _queue_again(self.study, trial)
            raise
        if result is None or result.interrupted:  # the next call continues it, from its last.pt
            _queue_again(self.study, trial)
            raise KeyboardInterrupt(f"trial {trial.number} stopped")
        trial.set_user_attr("epochs", result.epochs_completed)
        return float(result.best_fitness)


class _Keeper:
    """After each trial: the best trial's ``best_hyp.yaml``, the other trials' weights removed (keep "best")."""

    def __init__(self, folder: Path, config: TrainConfig, space: Mapping[str, tuple[float, float]],
                 keep_weights: str) -> None:
        self.folder, self.config, self.space, self.keep_weights = folder, config, space, keep_weights

    def __call__(self, study: Any, trial: Any) -> None:
        best = _best(study)
        if best is None:
            return
        header = (f"the best hyper-parameters of the study {self.folder.name} ({self.folder}): trial {best.number}, "
                  f"fitness {best.value:.5f} (0.1 mAP50 + 0.9 mAP50-95), run folder {best.user_attrs.get('run')}\n"
                  f"searched: {', '.join(self.space)}; the rest are the study's settings, and below them its recipe\n"
                  "python -m yolo9kit train --hyp best_hyp.yaml ... trains that recipe (a flag given wins)")
        write_hyp(self.folder / "best_hyp.yaml", hyp_of(_trial_config(self.config, best.params)), header)
        if self.keep_weights == "all":
            return
        for done in _complete(study):
            weights = _run_dir(self.folder, done) / "weights"
            if done.user_attrs.get("run") != best.user_attrs.get("run") and weights.is_dir():
                shutil.rmtree(weights, ignore_errors=True)


def _optuna():
    try:
        import optuna
    except ImportError:
        raise ValueError("tune needs optuna: pip install 'yolo9kit[tune]'") from None
    return optuna


def _space(space: Mapping[str, tuple[float, float]] | Sequence[str] | None) -> dict[str, tuple[float, float]]:
    """The space as {key: (low, high)}, checked (a name, a range of two numbers low < high)."""
    if space is None:
        return dict(EVOLVE_SPACE)
    if not isinstance(space, Mapping):
        names = [space] if isinstance(space, str) else list(space)
        unknown = [k for k in names if k not in EVOLVE_SPACE]
        if unknown or not names:
            raise ValueError(f"space: {unknown or 'nothing'}: expected keys of --evolve's space "
                             f"({', '.join(EVOLVE_SPACE)}), or a dict {{key: (low, high)}}")
        return {k: EVOLVE_SPACE[k] for k in names}
    out = {}
    for key, bounds in space.items():
        ok = isinstance(bounds, (list, tuple)) and len(bounds) == 2 and all(
            isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds) and bounds[0] < bounds[1]
        if key not in TUNABLE or not ok:
            raise ValueError(f"space[{key!r}]={bounds!r}: expected a key of a hyp file ({', '.join(TUNABLE)}) "
                             "with (low, high), low < high")
        if key in LOG_SCALE and bounds[0] <= 0:
            raise ValueError(f"space[{key!r}]={bounds!r}: {key} is searched on a log scale: low > 0")
        out[key] = (float(bounds[0]), float(bounds[1]))
    if not out:
        raise ValueError("space: expected at least one key")
    return out


def _trial_config(config: TrainConfig, values: Mapping[str, float]) -> TrainConfig:
    """``config`` with the hyp ``values`` of a trial (the augmentation keys on top of the config's own)."""
    changes = hyp_settings(values, config.optim.loss)
    if "hyp" in changes:
        changes["hyp"] = {**(config.pipeline.hyp or {}), **changes["hyp"]}
    return config.replace(**changes)


def _base(config: TrainConfig, space: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """The study's own values of the searched keys (within their limits): the first trial's."""
    values = hyp_of(config)
    return {k: min(max(values[k], low), high) for k, (low, high) in space.items()}


def _data_set(data: Any) -> dict[str, Any]:
    """The data set as the study records it, its classes and images (one that cannot be read is refused here)."""
    from yolo9kit.data import load_data_config

    found = load_data_config(data)
    return {"names": found.names, "train images": len(found.images("train")), "val images": len(found.val)}


def _record(model: str | Path, config: TrainConfig, space: Mapping[str, tuple[float, float]],
            data: dict[str, Any]) -> dict[str, Any]:
    """What every worker shares: model, data, space, the settings a resume keeps and the epochs (not the searched)."""
    from yolo9kit.train.rundir import FIXED_ON_RESUME

    values = config.to_dict()
    settings = {k: values[k] for k in (*FIXED_ON_RESUME, "epochs") if k in values and k not in space}
    gains = {LOSS_KEYS[k] for k in space if k in LOSS_KEYS}
    for part, searched in (("hyp", set(space)), ("loss", gains)):
        if isinstance(settings.get(part), dict):
            settings[part] = {k: v for k, v in settings[part].items() if k not in searched}
    return _plain({"model": str(model), "data": data, "space": {k: list(v) for k, v in space.items()},
                   "settings": settings})


def _open_study(optuna: Any, folder: Path, storage: Any, name: str, record: dict, base: dict
                ) -> tuple[Any, Any, bool]:
    """The study made (first trial: ``base``) or loaded and checked against ``record``, its storage, whether new."""
    import fcntl

    url = storage or f"sqlite:///{(folder / 'study.db').resolve().as_posix()}"
    with open(folder / ".tune.lock", "w") as lock, warnings.catch_warnings():
        fcntl.flock(lock, fcntl.LOCK_EX)  # also while a new storage makes its tables
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # the heartbeat, stable since 2.x
        if isinstance(url, str):
            from optuna.storages import RDBStorage

            try:
                url = RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
                                 heartbeat_stale_trial_callback=_queue_again)
            except Exception as e:  # SQLAlchemy's: a bad URL, a missing driver, a server or file out of reach
                raise ValueError(_masked(f"the study storage {url} cannot be opened: {str(e).splitlines()[0]}; "
                                         "check --storage")) from None
        new = name not in optuna.get_all_study_names(url)
        if new and (folder / "tune.yaml").is_file():  # its trial folders and best_hyp.yaml would be another's
            raise ValueError(f"{folder} holds the study {name!r} (tune.yaml), which its storage does not hold: "
                             "pass the --storage that holds it, or pick another --name")
        study = optuna.create_study(study_name=name, storage=url, direction="maximize", load_if_exists=True)
        saved = study.user_attrs.get("yolo9kit")
        if saved is None:
            study.set_user_attr("yolo9kit", record)
            study.enqueue_trial(base, user_attrs={"base": True}, skip_if_exists=True)
        elif saved != record:
            raise ValueError(f"the study {name!r} ({folder}) was made with other settings: "
                             f"{_differences(saved, record)}; run it with its own, or pick another --name")
        for trial in study.get_trials(deepcopy=False):
            _run_dir(folder, trial)  # refused before anything trains or is removed
            host, _, pid = str(trial.user_attrs.get("worker")).rpartition(":")
            if trial.state.name == "RUNNING" and host == socket.gethostname() and pid.isdigit() and \
                    not _pid_alive(int(pid)):  # its worker was killed (this host): continued now, not after GRACE_S
                study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
                _queue_again(study, trial)
    return study, url, new


def _run_dir(folder: Path, trial: Any) -> Path:
    """A trial's run folder, from the name the storage holds (any worker writes it), refused outside ``folder``."""
    return path_inside(folder, str(trial.user_attrs.get("run")), f"the run folder of trial {trial.number}")


def _queue_again(study: Any, trial: Any) -> None:
    """A stopped trial (or in use, or a dead worker's) queued again, to continue in its run folder from last.pt."""
    LOGGER.warning("tune: trial %d queued again: the next trial continues it", trial.number)
    study.enqueue_trial(trial.params, user_attrs={k: v for k, v in (
        ("continues", trial.user_attrs.get("continues", trial.number)), ("run", trial.user_attrs.get("run")))
        if v is not None})


def _complete(study: Any) -> list[Any]:
    return [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]


def _best(study: Any) -> Any:
    return max(_complete(study), key=lambda t: (t.value, -t.number), default=None)


def _result(study: Any, folder: Path, interrupted: bool) -> TuneResult:
    import pandas as pd

    rows = [{"trial": t.number, "state": t.state.name.lower(), "fitness": t.value, **t.params,
             "run": t.user_attrs.get("run"), "continues": t.user_attrs.get("continues"),
             "worker": t.user_attrs.get("worker")} for t in study.get_trials(deepcopy=False)]
    best = _best(study)
    hyp_file = folder / "best_hyp.yaml"
    table = pd.DataFrame(rows, columns=["trial", "state", "fitness", *study.user_attrs["yolo9kit"]["space"], "run",
                                        "continues", "worker"])
    table["continues"] = table["continues"].astype("Int64")  # a trial number, or empty
    return TuneResult(folder, table, dict(best.params) if best else {},
                      float(best.value) if best else None, _run_dir(folder, best) if best else None,
                      hyp_file if best and hyp_file.is_file() else None, interrupted)


def _differences(saved: dict, record: dict) -> str:
    out = []
    for part in ("model", "data", "space"):
        if saved.get(part) != record[part]:
            out.append(f"{part} {saved.get(part)} (now {record[part]})")
    theirs = saved.get("settings", {})
    out += [f"{k} {theirs.get(k)!r} (now {v!r})" for k, v in record["settings"].items() if theirs.get(k) != v]
    return "; ".join(out) or "an older record"


def _plain(value: Any) -> Any:
    """JSON-able: what an Optuna storage keeps (tuples become lists), so that a record read back compares equal."""
    import json

    return json.loads(json.dumps(value, default=str))


def _masked(text: str) -> str:
    """``text`` with the password of a URL in it (``//user:password@host``) as ``***``."""
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", text)
