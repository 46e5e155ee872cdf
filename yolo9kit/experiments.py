"""``runs()``: every run folder under a root as one table, to compare experiments.

A run folder is any folder holding ``settings.yaml`` or ``results.csv`` (what ``fit`` writes). The table reads
only those files, ``state.yaml`` and the folder's lock, never a checkpoint, so it stays fast on hundreds of runs.
A folder whose files are damaged, half written or refused (``files.read_record``) is a row that says which file
and why. The copies of a run's files in an MLflow store (``mlartifacts/``, ``mlruns/``) are not run folders.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from yolo9kit.files import LOCK_NAME, FolderLock, RecordError, read_record
from yolo9kit.train.records import ENDED, SETTINGS_FILE, STATE_FILE

RESULTS_FILE = "results.csv"
# settings that name the run rather than describe it: never shown as a difference
_NOT_A_DIFFERENCE = {"project", "name", "exist_ok", "resume", "progress_bar", "loggers", "mlflow_uri"}
# MLflow's local stores, which keep copies of a run's results.csv, settings.yaml and state.yaml
_COPIES = {"mlartifacts", "mlruns"}
NUMBERS = ["best mAP50", "best mAP50-95", "mAP50", "mAP50-95", "wall time (s)", "images/s", "peak memory (GiB)"]
COLUMNS = ["run", "state", "epochs", "best mAP50", "best mAP50-95", "mAP50", "mAP50-95", "seed range", "wall time (s)",
           "images/s", "peak memory (GiB)", "batch x accumulate"]


def runs(root: str | Path | Sequence[str | Path] = "runs") -> pd.DataFrame:
    """One row per run folder under ``root`` (or per folder of a list of run folders), the newest first.

    Columns: ``run`` (the folder, relative to ``root``), ``state`` (running, finished, stopped early,
    interrupted, failed, killed, damaged; ``reason`` says why when it did not finish), ``epochs`` (done / planned),
    the best epoch's and the last epoch's ``mAP50`` and ``mAP50-95`` (the EMA's validation), the ``seed range``
    of the last mAP50-95 over the listed runs that ended on their own whose settings differ only in the seed,
    the ``wall time (s)`` of all its parts, the median training ``images/s`` over its epochs, the ``peak memory
    (GiB)`` allocated on CUDA (empty off CUDA), ``batch x accumulate`` after warmup; then every setting whose value
    differs between the listed runs (``differing_settings``); ``reason`` and ``path`` last.

    Raises:
        FileNotFoundError: ``root`` is not a folder, or a listed run folder does not exist.
    """
    if isinstance(root, (str, Path)):
        base = Path(root)
        if not base.is_dir():
            raise FileNotFoundError(f"{base}: no such folder of runs (fit writes them under runs/train/ by default)")
        folders = {p.parent for name in (SETTINGS_FILE, RESULTS_FILE) for p in base.rglob(name)
                   if _COPIES.isdisjoint(p.relative_to(base).parts)}
    else:
        folders = {Path(f) for f in root}
        missing = [str(f) for f in folders if not f.is_dir()]
        if missing:
            raise FileNotFoundError(f"no such run folder: {', '.join(sorted(missing))}")
        base = Path(os.path.commonpath([str(f.resolve()) for f in folders])) if folders else Path(".")
        folders = {f.resolve() for f in folders}
    rows, settings = [], []
    for folder in sorted(folders, key=_mtime, reverse=True):
        row, config = _row(folder, base)
        rows.append(row)
        settings.append(config)
    differing = _differing(settings)
    for row, config in zip(rows, settings):
        row.update({name: _cell(config.get(name)) for name in differing})
    table = pd.DataFrame(rows, columns=[*COLUMNS, *differing, "reason", "path"])
    for column in NUMBERS:  # NaN where a run has no value: a number column, not None among floats
        table[column] = pd.to_numeric(table[column], errors="coerce")
    table["seed range"] = _seed_range(table, settings)
    return table


def _seed_range(table: pd.DataFrame, settings: list[dict[str, Any]]) -> list[float]:
    """For each run that ended on its own (finished, or stopped early by patience), the range (max - min) of the
    last mAP50-95 over such runs whose settings are its own but for the seed (at least two; else NaN): a difference
    between two settings inside it could come from the seed alone (``fit_seeds`` makes such groups, whatever the
    folders are named)."""
    keys = [repr(sorted((k, _cell(v)) for k, v in c.items() if k not in _NOT_A_DIFFERENCE | {"seed"})) if c else None
            for c in settings]
    finished = table["state"].isin(ENDED).to_numpy()
    values = pd.Series(table["mAP50-95"].where(finished).to_numpy(), index=keys)
    ranges = []
    for key, done in zip(keys, finished):
        group = values[values.index == key].dropna() if key is not None and done else pd.Series(dtype=float)
        ranges.append(float(group.max() - group.min()) if len(group) >= 2 else float("nan"))
    return ranges


def differing_settings(table: pd.DataFrame) -> list[str]:
    """The setting columns of a ``runs()`` table (or of some of its rows) whose values are not all the same."""
    settings = [c for c in table.columns if c not in COLUMNS and c not in ("reason", "path")]
    return [c for c in settings if table[c].astype(str).nunique(dropna=False) > 1]


def _row(folder: Path, root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The table's row of one folder, and its settings (``train_config``; {} when unreadable). Any error in
    reading the folder makes it a "damaged" row naming the error: one bad folder never ends the table."""
    name = folder.relative_to(root).as_posix() if folder.is_relative_to(root) else str(folder)
    row: dict[str, Any] = {"run": name if name != "." else folder.name, "path": str(folder)}
    try:
        return _read_row(folder, row)
    except Exception as e:  # a value the kit never writes (epochs: abc) in one of its files
        files = " or ".join(n for n in (SETTINGS_FILE, STATE_FILE, RESULTS_FILE, LOCK_NAME) if (folder / n).exists())
        return {**row, "state": "damaged", "reason": f"{files}: unexpected content ({type(e).__name__}: {e})"}, {}


def _read_row(folder: Path, row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    problems: list[str] = []
    settings = _read_yaml(folder / SETTINGS_FILE, problems)
    config = settings.get("train_config") if isinstance(settings.get("train_config"), dict) else {}
    results = _read_results(folder / RESULTS_FILE, problems)
    state = _read_yaml(folder / STATE_FILE, problems)  # older runs have none: the state is inferred below
    planned = config.get("epochs") or state.get("epochs")
    row["epochs"] = f"{len(results)}/{planned}" if planned else str(len(results))
    row.update(_metrics(results))
    row["wall time (s)"] = state.get("wall_s")
    speeds = [r["images_per_s"] for r in results if r.get("images_per_s") is not None]
    row["images/s"] = round(float(pd.Series(speeds).median()), 1) if speeds else None
    peaks = [r["peak_allocated"] for r in results if r.get("peak_allocated") is not None]
    row["peak memory (GiB)"] = round(max(peaks) / 2**30, 3) if peaks else None
    derived = settings.get("derived") if isinstance(settings.get("derived"), dict) else {}
    if config.get("batch_size") is not None and derived.get("accumulate_steps") is not None:
        row["batch x accumulate"] = f"{config['batch_size']} x {derived['accumulate_steps']}"
    row["state"], row["reason"] = _state(folder, state, len(results), planned, problems)
    return row, config


def _state(folder: Path, state: dict, done: int, planned: Any, problems: list[str]) -> tuple[str, str | None]:
    if problems:
        return "damaged", "; ".join(problems)
    recorded = state.get("state")
    if recorded == "running" or (not recorded and (folder / LOCK_NAME).exists()):
        if FolderLock(folder).in_use():
            return "running", None
        return "killed", "ended without a word (the process is gone); resume continues from weights/last.pt"
    if recorded:
        return str(recorded), state.get("reason")
    if planned and done >= int(planned):
        return "finished", None
    return "stopped", "no state.yaml (a run of an older kit): interrupted, failed or stopped early"


def _metrics(results: list[dict[str, Any]]) -> dict[str, float | None]:
    """The last epoch's mAP and the best epoch's (the highest fitness: what best.pt holds)."""
    last = results[-1] if results else {}
    scored = [r for r in results if r.get("fitness") is not None]
    best = max(scored, key=lambda r: r["fitness"]) if scored else {}
    return {"best mAP50": best.get("metrics/mAP50"), "best mAP50-95": best.get("metrics/mAP50-95"),
            "mAP50": last.get("metrics/mAP50"), "mAP50-95": last.get("metrics/mAP50-95")}


def _read_yaml(path: Path, problems: list[str]) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = read_record(path)
    except (OSError, RecordError) as e:
        problems.append(f"{path.name} unreadable ({e})")
        return {}
    if value is not None and not isinstance(value, dict):
        problems.append(f"{path.name} holds no settings")
        return {}
    return value or {}


def _read_results(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    """results.csv as rows of numbers (None for an empty cell); a row that does not parse is a problem."""
    if not path.is_file():
        return []
    try:
        with path.open(newline="") as f:
            raw = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        problems.append(f"{path.name} unreadable ({type(e).__name__}: {e})")
        return []
    rows = []
    for line, values in enumerate(raw, start=2):
        try:
            rows.append({k: _number(v) for k, v in values.items() if k is not None})
        except ValueError:
            problems.append(f"{path.name} line {line} is not a row of numbers (half written?)")
            break
    return rows


def _number(text: str | None) -> float | None:
    if text is None or text.strip() == "":
        return None
    value = float(text)
    if math.isnan(value):
        return None
    return value


def _differing(settings: list[dict[str, Any]]) -> list[str]:
    """The settings whose values are not the same in every listed run (in the settings' own order)."""
    names: dict[str, None] = {}
    for config in settings:
        names.update(dict.fromkeys(config))
    readable = [c for c in settings if c]
    return [n for n in names if n not in _NOT_A_DIFFERENCE
            and len({repr(_cell(c.get(n))) for c in readable}) > 1]


def _cell(value: Any) -> Any:
    """A setting as a table cell: lists and dicts as text."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else yaml.safe_dump(
        value, default_flow_style=True).strip()


def _mtime(folder: Path) -> float:
    try:
        return max(p.stat().st_mtime for p in folder.iterdir())
    except (OSError, ValueError):
        return 0.0
