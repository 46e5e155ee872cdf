"""Run folders compared: ``runs()`` (one table, ``python -m yolo9kit runs``), ``compare`` (their curves),
``runs_viewer`` (both in a notebook), ``fit_seeds`` (a run repeated with other seeds, ``train --seeds``)."""

from __future__ import annotations

import argparse
import csv
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from yolo9kit.cli.train import DEFAULT_MODEL, config_from_args, exit_status
from yolo9kit.config import TrainConfig
from yolo9kit.config.recipe import choose_recipe
from yolo9kit.figure import axes_for
from yolo9kit.files import LOCK_NAME, FolderLock, OwnInputError, RecordError, read_record, write_text_atomically
from yolo9kit.train.fit import FitResult, fit
from yolo9kit.train.records import ENDED, SETTINGS_FILE, STATE_FILE, read_results, read_state
from yolo9kit.train.rundir import FIXED_ON_RESUME

RESULTS_FILE = "results.csv"
_NOT_A_DIFFERENCE = {"project", "name", "exist_ok", "resume", "progress_bar", "loggers", "mlflow_uri"}  # name the run
_COPIES = {"mlartifacts", "mlruns"}  # MLflow's local stores keep copies of a run's files: not run folders
NUMBERS = ["best mAP50", "best mAP50-95", "mAP50", "mAP50-95", "wall time (s)", "images/s", "peak memory (GiB)"]
COLUMNS = ["run", "state", "epochs", "best mAP50", "best mAP50-95", "mAP50", "mAP50-95", "seed range", "wall time (s)",
           "images/s", "peak memory (GiB)", "batch x accumulate"]
# the results.csv columns the viewer compares, by the names its dropdown shows
METRICS = {"mAP50-95": "metrics/mAP50-95", "mAP50": "metrics/mAP50", "precision": "metrics/precision",
           "recall": "metrics/recall", "box loss": "train/box_loss", "cls loss": "train/cls_loss",
           "dfl loss": "train/dfl_loss", "images/s": "images_per_s"}
SHORT = {"metrics/mAP50": "mAP50", "metrics/mAP50-95": "mAP50-95"}  # results.csv column -> the seeds table's name
MAX_SEEDS = 100  # each seed is a whole training run: a spread needs a handful, 30 million is a typo


def runs(root: str | Path | Sequence[str | Path] = "runs") -> pd.DataFrame:
    """One row per run folder (holding settings.yaml or results.csv) under ``root``, or of a list, the newest first.

    Args:
        root: a folder of run folders, or a list of run folders.

    Returns:
        ``COLUMNS``, the settings that differ between runs, ``reason`` (why not finished; what is damaged), ``path``.

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
    pairs = [_row(folder, base) for folder in sorted(folders, key=_mtime, reverse=True)]
    rows, settings = [row for row, _ in pairs], [config for _, config in pairs]
    names = dict.fromkeys(name for config in settings for name in config)  # the settings that differ, in their order
    known = [c for c in settings if c]
    differing = [n for n in names if n not in _NOT_A_DIFFERENCE and len({repr(_cell(c.get(n))) for c in known}) > 1]
    for row, config in zip(rows, settings):
        row.update({name: _cell(config.get(name)) for name in differing})
    table = pd.DataFrame(rows, columns=[*COLUMNS, *differing, "reason", "path"])
    for column in NUMBERS:  # NaN where a run has no value: a number column, not None among floats
        table[column] = pd.to_numeric(table[column], errors="coerce")
    table["seed range"] = _seed_range(table, settings)
    return table


_table_of = runs  # compare's argument is called runs


def _seed_range(table: pd.DataFrame, settings: list[dict[str, Any]]) -> list[float]:
    """Per ended run: the range of the last mAP50-95 over ended runs with its settings but the seed (2+, else NaN)."""
    keys = [repr(sorted((k, _cell(v)) for k, v in c.items() if k not in _NOT_A_DIFFERENCE | {"seed"})) if c else None
            for c in settings]
    finished = table["state"].isin(ENDED).to_numpy()
    values = pd.Series(table["mAP50-95"].where(finished).to_numpy(), index=keys)
    ranges = []
    for key, done in zip(keys, finished):
        group = values[values.index == key].dropna() if key is not None and done else pd.Series(dtype=float)
        ranges.append(float(group.max() - group.min()) if len(group) >= 2 else float("nan"))
    return ranges


def _row(folder: Path, root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The row of one folder and its settings ({} when unreadable); any error makes it a "damaged" row."""
    name = folder.relative_to(root).as_posix() if folder.is_relative_to(root) else str(folder)
    row: dict[str, Any] = {"run": name if name != "." else folder.name, "path": str(folder)}
    problems: list[str] = []
    try:
        settings = _read_yaml(folder / SETTINGS_FILE, problems)
        config = settings.get("train_config") if isinstance(settings.get("train_config"), dict) else {}
        results = _read_results(folder / RESULTS_FILE, problems)
        state = _read_yaml(folder / STATE_FILE, problems)  # older runs have none: the state is inferred
        planned = config.get("epochs") or state.get("epochs")
        row["epochs"] = f"{len(results)}/{planned}" if planned else str(len(results))
        row.update(_scores(results))
        row["wall time (s)"] = state.get("wall_s")
        speeds = [r["images_per_s"] for r in results if r.get("images_per_s") is not None]
        row["images/s"] = round(float(pd.Series(speeds).median()), 1) if speeds else None
        peaks = [r["peak_allocated"] for r in results if r.get("peak_allocated") is not None]
        row["peak memory (GiB)"] = round(max(peaks) / 2**30, 3) if peaks else None
        derived = settings.get("derived") if isinstance(settings.get("derived"), dict) else {}
        if config.get("batch_size") is not None and derived.get("accumulate_steps") is not None:
            row["batch x accumulate"] = f"{config['batch_size']} x {derived['accumulate_steps']}"
        row["state"], row["reason"] = _state(folder, state, len(results), planned, problems)
    except Exception as e:  # a value the kit never writes (epochs: abc) in one of its files
        files = " or ".join(n for n in (SETTINGS_FILE, STATE_FILE, RESULTS_FILE, LOCK_NAME) if (folder / n).exists())
        return {**row, "state": "damaged", "reason": f"{files}: unexpected content ({type(e).__name__}: {e})"}, {}
    return row, config


def _scores(results: list[dict[str, Any]]) -> dict[str, float | None]:
    """The last epoch's mAP and the best epoch's (the highest fitness: what best.pt holds)."""
    scored = [r for r in results if r.get("fitness") is not None]
    best, last = max(scored, key=lambda r: r["fitness"]) if scored else {}, results[-1] if results else {}
    return {f"{label}{short}": chosen.get(column) for label, chosen in (("", last), ("best ", best))
            for column, short in SHORT.items()}


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


def _read_yaml(path: Path, problems: list[str]) -> dict[str, Any]:
    try:
        value = read_record(path) if path.is_file() else {}
    except (OSError, RecordError) as e:
        problems.append(f"{path.name} unreadable ({e})")
        return {}
    if value is not None and not isinstance(value, dict):
        problems.append(f"{path.name} holds no settings")
        return {}
    return value or {}


def _read_results(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    """results.csv as rows of numbers (None for an empty cell or NaN); a row that does not parse is a problem."""
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
            numbers = {k: float(v) if v is not None and v.strip() else None for k, v in values.items() if k is not None}
        except ValueError:
            problems.append(f"{path.name} line {line} is not a row of numbers (half written?)")
            break
        rows.append({k: None if v is None or math.isnan(v) else v for k, v in numbers.items()})
    return rows


def _cell(value: Any) -> Any:
    """A setting as a table cell: lists and dicts as text."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else yaml.safe_dump(
        value, default_flow_style=True).strip()


def _mtime(folder: Path) -> float:  # the newest first
    try:
        return max(p.stat().st_mtime for p in folder.iterdir())
    except (OSError, ValueError):
        return 0.0


def compare(runs: Any, metric: str = "metrics/mAP50-95", ax=None):
    """The runs' curves of ``metric`` against the epoch (from 1), each labelled by the settings that differ.

    Args:
        runs: rows of a ``runs()`` table, or run folders. metric: a results.csv column. ax: axes, or None.

    Returns:
        The figure; a run without that column or without rows is "(no data)" in the legend.

    Raises:
        ValueError: no runs.
    """
    table = runs if isinstance(runs, pd.DataFrame) else _table_of(list(runs))
    if table.empty:
        raise ValueError("compare: no runs to draw")
    differ = [c for c in table.columns if c not in (*COLUMNS, "reason", "path")  # the settings these rows differ in
              and table[c].astype(str).nunique(dropna=False) > 1]
    _, ax = axes_for(ax, (7, 4))
    for _, row in table.iterrows():
        label = ", ".join(f"{name}={row[name]}" for name in differ) or str(row["run"])
        try:
            df = read_results(row["path"])
            ax.plot(df["epoch"] + 1, df[metric], marker="o", markersize=3, label=label)
        except (OSError, KeyError, ValueError, pd.errors.ParserError):
            ax.plot([], [], label=f"{label} (no data)")
    ax.set(xlabel="epoch", ylabel=metric, title=f"{metric}, {len(table)} runs")
    ax.legend(fontsize=8)
    return ax.figure


def runs_viewer(root: str | Path = "runs", metric: str = "metrics/mAP50-95"):
    """Pick run folders under ``root`` and a metric (``METRICS``): a table of the chosen runs and their curves.

    Args:
        root: the folder of run folders, as for ``runs``. metric: the results.csv column shown first.

    Returns:
        WidgetApp: controls ``runs`` (the four newest first), ``metric``; outputs ``table``, ``curves``; ``state``
        ``table`` (all runs) and ``chosen``.

    Raises:
        ValueError: ``metric`` is not one of ``METRICS``.
    """
    import ipywidgets as w  # the notebooks extra, as the widgets' panel that draws the viewer

    from yolo9kit.widgets.panel import WidgetApp, html_table, launch, show_error, show_figure

    table = runs(root)
    label = next((k for k, v in METRICS.items() if v == metric), None)
    if label is None:
        raise ValueError(f"metric {metric!r}: one of {', '.join(METRICS.values())}")
    names = list(table["run"])
    controls = {"runs": w.SelectMultiple(options=names, value=tuple(names[:4]), rows=min(max(len(names), 2), 8),
                                         description="runs", layout=w.Layout(width="420px")),
                "metric": w.Dropdown(options=list(METRICS), value=label, description="metric")}
    outputs = {"table": w.HTML(), "curves": w.Output()}

    def update() -> None:
        chosen = table[table["run"].isin(controls["runs"].value)]
        app.state.update(table=table, chosen=chosen)
        shown = chosen.drop(columns=["path"]).astype(object)
        outputs["table"].value = html_table(shown.where(shown.notna(), ""), float_format="{:.4g}")
        if chosen.empty:
            show_error(outputs["curves"], "choose one or more runs")
            return
        app.figures["curves"] = compare(chosen, metric=METRICS[controls["metric"].value])
        show_figure(outputs["curves"], app.figures["curves"])

    container = w.VBox([w.HBox([controls["runs"], controls["metric"]]), outputs["table"], outputs["curves"]])
    app = WidgetApp(container, controls, outputs, update)
    return launch(app)


@dataclass(frozen=True)
class SeedSpread:
    """The runs of ``fit_seeds``: ``table``, a row per seed started (``seed``, ``state``, ``epochs`` done, the last
    and the best epoch's mAP50 and mAP50-95, ``run``), and the ``FitResult`` of each seed this call trained."""

    table: pd.DataFrame
    results: tuple[FitResult, ...]

    def summary(self) -> pd.DataFrame:
        """mean, std (n - 1), min, max and range of each metric over the seeds whose run ended on its own."""
        ended = self.table[self.table["state"].isin(ENDED)]
        values = ended[[*SHORT.values(), *(f"best {m}" for m in SHORT.values())]].astype(float)
        out = values.agg(["mean", "std", "min", "max"]).T
        out["range"] = out["max"] - out["min"]
        out.insert(0, "seeds", len(values))
        return out

    def within(self, difference: float, metric: str = "mAP50") -> bool:
        """Whether a difference of ``metric`` between two runs is inside these seeds' range: the seed could make it."""
        return abs(difference) <= float(self.summary().loc[metric, "range"])

    def __str__(self) -> str:
        rows = self.summary().round(4)
        lines = [f"{metric}: mean {r['mean']:.4f}, std {r['std']:.4f}, range {r['min']:.4f}-{r['max']:.4f} "
                 f"over {int(r['seeds'])} finished seeds" for metric, r in rows.iterrows()]
        unfinished = len(self.table) - int(rows["seeds"].iloc[0])
        if unfinished:
            lines.append(f"{unfinished} of the {len(self.table)} runs did not finish and are not counted: the same "
                         "call again continues them")
        return "\n".join(lines)


def fit_seeds(model: str | Path, data: Any, config: TrainConfig, seeds: int | Sequence[int] = 3) -> SeedSpread:
    """``fit`` once per seed, each in its run folder ``<name>-seed-<k>``; a stopped call continues (docs/training.md).

    Args:
        model: a model name, yaml or checkpoint path, built anew with each seed.
        data: as for ``fit``.
        config: the run's settings; its ``seed`` is the first seed when ``seeds`` is a count.
        seeds: how many seeds (``config.seed``, ``config.seed + 1``, ...) or the seeds, at most ``MAX_SEEDS``.

    Returns:
        SeedSpread with each seed's final metrics and the ``FitResult`` of each seed trained.

    Raises:
        ValueError: no seeds, more than ``MAX_SEEDS``, a seed twice, or a seed's folder holding a run with other
            settings (named).
    """
    if not isinstance(model, (str, Path)):
        raise TypeError(f"fit_seeds needs a model name or file, built anew for each seed; got a {type(model).__name__}")
    count = seeds if isinstance(seeds, int) else len(seeds)
    if not 1 <= count <= MAX_SEEDS:  # checked before the list is made: --seeds 30000000 took 3.4 GB here
        raise ValueError(f"seeds: 1 to {MAX_SEEDS} seeds (each one a whole training run); got {count}")
    chosen = list(range(config.run.seed, config.run.seed + seeds)) if isinstance(seeds, int) else list(seeds)
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"seeds: each once; got {seeds!r}")
    rows, results = [], []
    for seed in chosen:
        run = config.replace(seed=seed, name=f"{config.run.name}-seed-{seed}", exist_ok=True)
        folder = Path(run.run.project) / run.run.name
        if not _ended(folder, run):
            last = folder / "weights" / "last.pt"
            results.append(fit(str(model), data, run.replace(resume=str(last)) if last.is_file() else run))
        results_csv = _read_results(folder / RESULTS_FILE, [])
        rows.append({"seed": seed, "state": read_state(folder).get("state"), "epochs": len(results_csv),
                     **_scores(results_csv), "run": str(folder)})
        if results and results[-1].interrupted:  # a stop stops the whole call; the same call continues it
            break
    table = pd.DataFrame(rows)
    scores = list(_scores([]))
    table[scores] = table[scores].astype(float)  # NaN where a run did not validate
    return SeedSpread(table, tuple(results))


def _ended(folder: Path, config: TrainConfig) -> bool:
    """Whether ``folder`` holds this seed's run, ended on its own; one with other settings is refused, naming them."""
    if read_state(folder).get("state") not in ENDED:
        return False
    saved = (read_record(folder / SETTINGS_FILE) or {}).get("train_config") or {}
    theirs = TrainConfig.from_dict(saved).to_dict()
    ours = choose_recipe(config, None, saved)[0].to_dict()  # the recipe as the run decided it, as a resume would
    changed = [f"{k} {theirs[k]!r} (now {ours[k]!r})" for k in (*FIXED_ON_RESUME, "epochs")
               if k in saved and theirs[k] != ours[k] and not (k == "batch_size" and ours[k] == "auto")]
    if changed:
        raise ValueError(f"{folder} holds a finished run with other settings: {', '.join(changed)}; give these "
                         "seeds another name, or move that folder away")
    return True


def train_seeds(args: argparse.Namespace) -> int:
    """``train --seeds N``: the run N times (``fit_seeds``), then each seed's final metrics and their spread."""
    if args.seeds < 1 or args.resume or args.weights or not args.data:
        raise ValueError("--seeds N takes N >= 1 new runs of a --data set; not with --resume (the same --seeds "
                         "command again continues its seeds), and not with --weights: pass the checkpoint as "
                         "--model, it is built anew for each seed")
    spread = fit_seeds(args.model or DEFAULT_MODEL, args.data, config_from_args(args), seeds=args.seeds)
    print(spread.table.to_string(index=False))
    print(spread)
    return exit_status(spread.results[-1]) if spread.results else 0  # a stop is the last run: it ends the command


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``python -m yolo9kit runs [ROOT] [--csv FILE]``."""
    p = subparsers.add_parser("runs", help="list the run folders under a root: state, metrics, speed, memory and "
                                           "the settings that differ")
    p.add_argument("root", nargs="?", default="runs", help="folder of run folders (default: runs)")
    p.add_argument("--csv", default=None, metavar="FILE", help="also write the table to FILE")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    table = runs(args.root)
    if table.empty:
        print(f"no run folders under {args.root}")
        return 0
    with pd.option_context("display.max_columns", None, "display.width", 200, "display.max_colwidth", 60):
        shown = table.drop(columns="path").astype(object)
        print(shown.where(shown.notna(), "").to_string(index=False))  # an empty cell, not None or NaN
    if args.csv:
        out = Path(args.csv).resolve()
        if out.exists() and any(out.is_relative_to(Path(p).resolve()) for p in table["path"]):
            raise OwnInputError(f"--csv {args.csv} is a file of a run folder listed here: the table would replace it; "
                                "choose a path outside the run folders")
        write_text_atomically(args.csv, table.to_csv(index=False))
        print(f"table written to {args.csv}")
    return 0
