"""``tune``, ``python -m yolo9kit tune``: train_dual.py's ``--evolve`` space searched with Optuna, each trial a run
folder; the study, in ``study.db`` or a storage its workers share, continues with the same call (docs/training.md)."""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import re
import shutil
import socket
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pandas as pd

from yolo9kit.cli.train import DEFAULT_MODEL, add_train_flags, config_from_args
from yolo9kit.config import DEFAULT_AUGMENT_HYP, TrainConfig
from yolo9kit.config.recipe import IGNORED, LOSS_KEYS, OPTIM_KEYS, RECIPE_KEYS, choose_recipe, hyp_settings
from yolo9kit.config.train import named_settings
from yolo9kit.data import load_data_config
from yolo9kit.files import FolderInUseError, _pid_alive, dump_record, write_text_atomically
from yolo9kit.train.fit import fit
from yolo9kit.train.guards import NonFiniteLossError, NonFiniteWeightsError
from yolo9kit.train.rundir import FIXED_ON_RESUME, _first_missing
from yolo9kit.train.state import increment_path

LOGGER = logging.getLogger(__name__)

# train_dual.py's --evolve limits (its ``meta``: gain, low, high) of the keys it mutates that YOLOv9 trains with
EVOLVE_SPACE: Mapping[str, tuple[float, float]] = MappingProxyType({
    "lr0": (1e-5, 1e-1), "lrf": (0.01, 1.0), "momentum": (0.6, 0.98), "weight_decay": (0.0, 0.001),
    "warmup_epochs": (0.0, 5.0), "warmup_momentum": (0.0, 0.95), "warmup_bias_lr": (0.0, 0.2), "cls_pw": (0.5, 2.0),
    "hsv_h": (0.0, 0.1), "hsv_s": (0.0, 0.9), "hsv_v": (0.0, 0.9), "degrees": (0.0, 45.0), "translate": (0.0, 0.9),
    "scale": (0.0, 0.9), "shear": (0.0, 10.0), "flipud": (0.0, 1.0), "mosaic": (0.0, 1.0), "mixup": (0.0, 1.0),
    "copy_paste": (0.0, 1.0),
})
LOG_SCALE = {"lr0"}  # four decades: sampled on a log scale, the others evenly
TUNABLE = (*OPTIM_KEYS, *LOSS_KEYS, *DEFAULT_AUGMENT_HYP)  # the keys a custom space may hold
_ORDER = (*OPTIM_KEYS, "box", "cls", "cls_pw", "obj", "obj_pw", "dfl", "iou_t", "anchor_t", "fl_gamma",
          *DEFAULT_AUGMENT_HYP)  # the order of the official hyp file
TUNE_PROJECT = "runs/tune"  # where the study folders go unless the config names a project
HEARTBEAT_S, GRACE_S = 60, 180  # Optuna's heartbeat: a running trial silent for GRACE_S has lost its worker
KEEP_WEIGHTS = ("best", "all")
MAX_FAILED_IN_A_ROW = 5  # a worker stops after so many failed trials in a row


@dataclass(frozen=True)
class TuneResult:
    """What ``tune`` returns: the study ``folder`` (tune.yaml, best_hyp.yaml, study.db, the trials' run folders);
    ``trials``, a row per trial of all workers (``trial``, ``state``, ``fitness``, its hyper-parameters, ``run``,
    ``continues``: the trial it continues after a stop, ``worker``: host:pid); the ``best`` hyper-parameters ({}
    before one completed), ``best_fitness``, ``best_run``, ``hyp_file``; ``interrupted``: the same call continues."""

    folder: Path
    trials: pd.DataFrame
    best: dict[str, float]
    best_fitness: float | None
    best_run: Path | None
    hyp_file: Path | None
    interrupted: bool

    def __str__(self) -> str:
        done = int((self.trials["state"] == "complete").sum()) if len(self.trials) else 0
        head = f"{done} trials complete in {self.folder}" + " (stopped: the same call continues)" * self.interrupted
        best = f"; best fitness {self.best_fitness:.4f} in {self.best_run}; its hyper-parameters: {self.hyp_file}"
        return head + (best if self.best_fitness is not None else "")


def tune(model: str | Path, data: Any, config: TrainConfig, *, trials: int = 10,
         space: Mapping[str, tuple[float, float]] | Sequence[str] | None = None, storage: Any = None,
         keep_weights: str = "best") -> TuneResult:
    """Train ``model`` on ``data`` with other hyper-parameters until the study holds ``trials`` complete trials.

    Args:
        model: a model name, yaml or checkpoint, built anew with the run's ``seed`` in every trial.
        data: a data.yaml path or dict, as for ``fit``.
        config: every trial's settings (one recipe for all); ``project`` (default ``runs/tune``) / ``name``: the study.
        trials: complete trials the study should hold, all workers together.
        space: keys of ``EVOLVE_SPACE``, or ``{key: (low, high)}`` over ``TUNABLE``; default ``EVOLVE_SPACE``.
        storage: an Optuna storage URL or object; default ``sqlite:///<folder>/study.db``.
        keep_weights: "best" removes the weights of every complete trial but the best (none go to mlflow); "all".

    Returns:
        TuneResult with every trial and the best so far.

    Raises:
        ValueError: a bad space, count, setting or data set, no optuna, a storage that cannot be opened, a study made
            with other settings or data, a trial's run folder outside it or in use; each named, nothing left behind.
        RuntimeError: ``MAX_FAILED_IN_A_ROW`` trials failed in a row.
    """
    try:
        import optuna  # the tune extra
    except ImportError:
        raise ValueError("tune needs optuna: pip install 'yolo9kit[tune]'") from None
    space = _checked(model, trials, keep_weights, config, space)
    found = load_data_config(data)  # one that cannot be read is refused here
    seen = {"names": found.names, "train images": len(found.images("train")), "val images": len(found.val)}
    config, recipe = choose_recipe(config, seen["train images"])  # one recipe for every trial
    LOGGER.info("tune: %s", recipe)
    folder = Path(config.run.project if "project" in named_settings(config) else TUNE_PROJECT) / config.run.name
    record = _record(model, config, space, seen)
    made, ours = _first_missing(folder), [p for p in (folder / "tune.yaml", folder / "study.db") if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    study = new = None
    try:
        own = hyp_of(config)  # the first trial: the study's own values, within the limits
        base = {k: min(max(own[k], low), high) for k, (low, high) in space.items()}
        study, opened, new = _open_study(optuna, folder, storage, config.run.name, record, base)
        where = storage if isinstance(storage, str) else type(storage).__name__ if storage else "study.db"
        write_text_atomically(folder / "tune.yaml", dump_record({"study": config.run.name, "storage": _masked(where),
                                                                "trials": trials, **record,
                                                                "data": {"file": str(data), **seen}}))
        every = config.replace(project=str(folder), log_weights=keep_weights == "all")  # each trial's settings
        interrupted = _Trials(study, model, data, every, space).optimize(trials)
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


def _checked(model: Any, trials: Any, keep_weights: Any, config: TrainConfig,
             space: Mapping[str, tuple[float, float]] | Sequence[str] | None) -> dict[str, tuple[float, float]]:
    """``tune``'s arguments checked; the space as {key: (low, high)}."""
    if not isinstance(model, (str, Path)):
        raise TypeError(f"tune needs a model name or file, built anew for each trial; got a {type(model).__name__}")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials={trials!r}: expected an integer >= 1")
    if keep_weights not in KEEP_WEIGHTS:
        raise ValueError(f"keep_weights={keep_weights!r}: expected one of {KEEP_WEIGHTS}")
    if config.run.resume:
        raise ValueError("tune: a stopped study continues with the same call (same name and storage); resume is "
                         "for one run")
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


class _Trials:
    """This worker's trials: each one's hyper-parameters, run folder (a stopped trial's, continued), ``fit`` and
    fitness; after each, the best trial's ``best_hyp.yaml`` and, unless ``log_weights``, the others' weights removed."""

    def __init__(self, study: Any, model: str | Path, data: Any, config: TrainConfig,
                 space: Mapping[str, tuple[float, float]]) -> None:
        self.study, self.model, self.data, self.config, self.space = study, model, data, config, space
        self.folder = Path(config.run.project)  # the study folder
        self.number = -1  # the trial this worker trains or trained last

    def optimize(self, trials: int) -> bool:  # True: stopped in a trial
        failed: list[int] = []
        while len(_complete(self.study)) < trials:
            try:
                self.study.optimize(self, n_trials=1, catch=(NonFiniteLossError, NonFiniteWeightsError),
                                    callbacks=[self.after])
            except KeyboardInterrupt:
                return True
            last = self.study.get_trials(deepcopy=False)[self.number]
            failed = [*failed, last.number] if last.state.name == "FAIL" else []
            if len(failed) == MAX_FAILED_IN_A_ROW:  # the settings do not train, whatever the hyper-parameters
                raise RuntimeError(f"tune: trials {', '.join(map(str, failed))} failed in a row (non-finite losses or "
                                   f"weights; their run folders in {self.folder} say why): the settings do not train")
        return False

    def __call__(self, trial: Any) -> float:
        self.number = trial.number
        values = {k: trial.suggest_float(k, low, high, log=k in LOG_SCALE) for k, (low, high) in self.space.items()}
        name = trial.user_attrs.get("run")
        continued = name is not None and _run_dir(self.folder, trial).is_dir()
        if not continued:
            name = increment_path(self.folder / f"trial-{trial.number}").name
        trial.set_user_attr("run", name)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        last = self.folder / name / "weights" / "last.pt"
        config = _trial_config(self.config, values).replace(name=name, exist_ok=continued,
                                                            resume=str(last) if last.is_file() else False)
        if last.is_file():
            LOGGER.info("tune: trial %d continues %s from its last.pt", trial.number, self.folder / name)
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

    def after(self, study: Any, trial: Any) -> None:
        best = _best(study)
        if best is None:
            return
        header = (f"# the best hyper-parameters of the study {self.folder.name} ({self.folder}): trial {best.number}, "
                  f"fitness {best.value:.5f} (0.1 mAP50 + 0.9 mAP50-95), run folder {best.user_attrs.get('run')}\n"
                  f"# searched: {', '.join(self.space)}; the rest are the study's settings, and below them its recipe\n"
                  "# python -m yolo9kit train --hyp best_hyp.yaml ... trains that recipe (a flag given wins)\n")
        values = hyp_of(_trial_config(self.config, best.params))  # a hyp file, every digit kept
        write_text_atomically(self.folder / "best_hyp.yaml", header + "".join(
            f"{k}: {_number(v) if isinstance(v, float) else v}\n" for k, v in values.items()))
        for done in _complete(study) if not self.config.run.log_weights else ():  # keep_weights "best"
            weights = _run_dir(self.folder, done) / "weights"
            if done.user_attrs.get("run") != best.user_attrs.get("run") and weights.is_dir():
                shutil.rmtree(weights, ignore_errors=True)


def hyp_of(config: TrainConfig) -> dict[str, Any]:
    """Every key of an official hyp file, in its order, then ``RECIPE_KEYS``, with the values ``config`` trains with."""
    values = {k: getattr(config.optim, k) for k in OPTIM_KEYS}
    values.update({k: getattr(config.optim.loss, field) for k, field in LOSS_KEYS.items()})
    values.update({**IGNORED, **config.pipeline.augment_hyp})
    saved = config.to_dict()
    return {**{k: float(values[k]) for k in _ORDER}, **{k: saved[k] for k in RECIPE_KEYS}}


def _number(value: float) -> str:
    """Every digit, as a float YAML 1.1 reads back (``1.0e-05``: PyYAML takes ``1e-05`` for a string)."""
    mantissa, _, exponent = repr(float(value)).partition("e")
    return f"{mantissa}.0e{exponent}" if exponent and "." not in mantissa else repr(float(value))


def _trial_config(config: TrainConfig, values: Mapping[str, float]) -> TrainConfig:
    # the trial's augmentation keys on top of the config's own
    changes = hyp_settings(values, config.optim.loss)
    if "hyp" in changes:
        changes["hyp"] = {**(config.pipeline.hyp or {}), **changes["hyp"]}
    return config.replace(**changes)


def _record(model: str | Path, config: TrainConfig, space: Mapping[str, tuple[float, float]],
            data: dict[str, Any]) -> dict[str, Any]:
    """What every worker shares: model, data, space, the settings a resume keeps and the epochs (not the searched)."""
    values = config.to_dict()
    settings = {k: values[k] for k in (*FIXED_ON_RESUME, "epochs") if k in values and k not in space}
    gains = {LOSS_KEYS[k] for k in space if k in LOSS_KEYS}
    for part, searched in (("hyp", set(space)), ("loss", gains)):
        if isinstance(settings.get(part), dict):
            settings[part] = {k: v for k, v in settings[part].items() if k not in searched}
    record = {"model": str(model), "data": data, "space": {k: list(v) for k, v in space.items()}, "settings": settings}
    return json.loads(json.dumps(record, default=str))  # as a storage keeps it: read back, it compares equal


def _open_study(optuna: Any, folder: Path, storage: Any, name: str, record: dict, base: dict
                ) -> tuple[Any, Any, bool]:
    """The study made (first trial: ``base``) or loaded and checked against ``record``, its storage, whether new."""
    url = storage or f"sqlite:///{(folder / 'study.db').resolve().as_posix()}"
    with open(folder / ".tune.lock", "w") as lock, warnings.catch_warnings():
        fcntl.flock(lock, fcntl.LOCK_EX)  # also while a new storage makes its tables
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # the heartbeat, stable since 2.x
        if isinstance(url, str):
            try:
                url = optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
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
            old = saved.get("settings", {})
            changed = [f"{part} {saved.get(part)} (now {record[part]})" for part in ("model", "data", "space")
                       if saved.get(part) != record[part]]
            changed += [f"{k} {old.get(k)!r} (now {v!r})" for k, v in record["settings"].items() if old.get(k) != v]
            raise ValueError(f"the study {name!r} ({folder}) was made with other settings: "
                             f"{'; '.join(changed) or 'an older record'}; run it with its own, or pick another --name")
        for trial in study.get_trials(deepcopy=False):
            _run_dir(folder, trial)  # refused before anything trains or is removed
            host, _, pid = str(trial.user_attrs.get("worker")).rpartition(":")
            if trial.state.name == "RUNNING" and host == socket.gethostname() and pid.isdigit() and \
                    not _pid_alive(int(pid)):  # its worker was killed (this host): continued now, not after GRACE_S
                study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
                _queue_again(study, trial)
    return study, url, new


def _run_dir(folder: Path, trial: Any) -> Path:
    """The trial's run folder, resolved; refused when its name (from the storage, which any worker writes: ``..``,
    absolute, empty, a symbolic link) leads out of ``folder``."""
    folder, name = folder.resolve(), str(trial.user_attrs.get("run"))
    target = (folder / name).resolve()
    if not name or Path(name).is_absolute() or target == folder or not target.is_relative_to(folder):
        raise ValueError(f"the run folder of trial {trial.number} {name!r} is not a name inside {folder}; refused")
    return target


def _queue_again(study: Any, trial: Any) -> None:  # a stopped trial (in use, a dead worker's), continued later
    LOGGER.warning("tune: trial %d queued again: the next trial continues it", trial.number)
    attrs = {"continues": trial.user_attrs.get("continues", trial.number), "run": trial.user_attrs.get("run")}
    study.enqueue_trial(trial.params, user_attrs={k: v for k, v in attrs.items() if v is not None})


def _complete(study: Any) -> list[Any]:
    return [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]


def _best(study: Any) -> Any:
    return max(_complete(study), key=lambda t: (t.value, -t.number), default=None)


def _result(study: Any, folder: Path, interrupted: bool) -> TuneResult:
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


def _masked(text: str) -> str:  # a URL's password as ***
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", text)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``python -m yolo9kit tune``: every train flag is a setting of every trial (the same command continues)."""
    p = subparsers.add_parser("tune", help="search the hyper-parameters (--evolve's space, with Optuna): every trial "
                                           "a run folder, a study that continues and that workers share",
                              description=__doc__)
    add_train_flags(p)
    p.add_argument("--trials", type=int, default=10, metavar="N",
                   help="complete trials the study should hold, all workers together (default 10)")
    p.add_argument("--space", nargs="+", default=None, choices=list(EVOLVE_SPACE), metavar="KEY",
                   help=f"search only these keys of --evolve's space (default all of them: {', '.join(EVOLVE_SPACE)})")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="an Optuna storage URL shared by the workers (default sqlite:///<study folder>/study.db)")
    p.add_argument("--keep-weights", default="best", choices=KEEP_WEIGHTS,
                   help="best: remove the weights of every complete trial but the best, and send none to MLflow "
                        "(default); all: keep them")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if not args.data:
        raise ValueError("--data is required (a data.yaml)")
    result = tune(args.model or DEFAULT_MODEL, args.data, config_from_args(args), trials=args.trials,
                  space=args.space, storage=args.storage, keep_weights=args.keep_weights)
    table = result.trials.astype(object)
    print(table.where(table.notna(), "").to_string(index=False, float_format=lambda x: f"{x:.5g}"))
    print(result)
    if result.hyp_file is not None:
        print(f"train with them: python -m yolo9kit train --data {args.data} --hyp {result.hyp_file} ...; every "
              f"trial: python -m yolo9kit runs {result.folder}")
    return 130 if result.interrupted else 0  # stopped in a trial: the same command continues it

