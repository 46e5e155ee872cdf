"""``fit_seeds``: one run repeated with other seeds, and the spread of its results.

Two runs that differ in one setting also differ in their seed's luck: the initial weights, the data order and
the augmentation. The spread between seeds of one setting is how large a difference must be before it says
more than the seed (``SeedSpread.within``). Each seed is an ordinary run folder, ``<name>-seed-<k>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from yolo9kit.config import TrainConfig
from yolo9kit.config.recipe import choose_recipe
from yolo9kit.files import read_record
from yolo9kit.train.fit import FitResult, fit
from yolo9kit.train.records import ENDED, SETTINGS_FILE, read_results, read_state
from yolo9kit.train.rundir import FIXED_ON_RESUME

SHORT = {"metrics/mAP50": "mAP50", "metrics/mAP50-95": "mAP50-95"}  # results.csv column -> the table's name
MAX_SEEDS = 100  # each seed is a whole training run: a spread needs a handful, 30 million is a typo


@dataclass(frozen=True)
class SeedSpread:
    """The runs of ``fit_seeds``.

    Attributes:
        table: one row per seed started: ``seed``, ``state`` (state.yaml's: finished, stopped early,
            interrupted, ...), ``epochs`` done, the last epoch's ``mAP50`` and ``mAP50-95`` and those of its best
            epoch (``best mAP50``, ``best mAP50-95``: what best.pt scores; NaN when the run did not validate),
            ``run`` (its folder).
        results: the ``FitResult`` of each seed this call trained, in the table's order (a seed that an earlier
            call finished has none).
    """

    table: pd.DataFrame
    results: tuple[FitResult, ...]

    def summary(self) -> pd.DataFrame:
        """mean, std (n - 1), min, max and range (max - min) of each metric over the seeds whose run ended on its
        own (``seeds`` counts them): an interrupted run is not counted."""
        ended = self.table[self.table["state"].isin(ENDED)]
        values = ended[[*SHORT.values(), *(f"best {m}" for m in SHORT.values())]].astype(float)
        out = values.agg(["mean", "std", "min", "max"]).T
        out["range"] = out["max"] - out["min"]
        out.insert(0, "seeds", len(values))
        return out

    def within(self, difference: float, metric: str = "mAP50") -> bool:
        """Whether a difference of ``metric`` between two runs is inside the spread of these seeds (not larger
        than their range): such a difference could come from the seed alone."""
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
    """``fit`` once per seed, one after the other, each in its own run folder (``<name>-seed-<k>``).

    An interrupt (Ctrl-C, SIGTERM, a callback's stop) stops the whole call after the seed it stopped. The same
    call again skips the seeds whose run ended on its own, resumes the others from their last.pt and starts the
    seeds not begun yet.

    Args:
        model: a model name, yaml or checkpoint path: each run builds it with its own seed (a module would start
            every run from the same weights, which is not what the spread is about).
        data: as for ``fit``.
        config: the run's settings; its ``seed`` is the first seed when ``seeds`` is a count.
        seeds: how many seeds (``config.seed``, ``config.seed + 1``, ...) or the seeds themselves, at most
            ``MAX_SEEDS``.

    Returns:
        SeedSpread with each seed's final metrics and the ``FitResult`` of each seed trained.

    Raises:
        ValueError: no seeds, more than ``MAX_SEEDS``, a seed twice, or a seed's folder that holds a run with
            other settings (named).
    """
    if not isinstance(model, (str, Path)):
        raise TypeError(f"fit_seeds needs a model name or file, built anew for each seed; got a "
                        f"{type(model).__name__}")
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
        rows.append({"seed": seed, "state": read_state(folder).get("state"), **_metrics(folder), "run": str(folder)})
        if results and results[-1].interrupted:  # a stop stops the whole call; the same call continues it
            break
    return SeedSpread(pd.DataFrame(rows), tuple(results))


def _ended(folder: Path, config: TrainConfig) -> bool:
    """Whether ``folder`` holds this seed's run, ended on its own: a rerun skips it. A run with other settings
    (those a resume keeps, and the epochs) is refused, naming them."""
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


def _metrics(folder: Path) -> dict[str, Any]:
    """The epochs in the run's results.csv, the last one's metrics and those of the epoch of the best fitness
    (the one best.pt keeps)."""
    rows = read_results(folder) if (folder / "results.csv").is_file() else pd.DataFrame(columns=["fitness"])
    last = rows.iloc[-1] if len(rows) else {}
    scored = rows.dropna(subset=["fitness"])
    best = scored.loc[scored["fitness"].idxmax()] if len(scored) else {}
    return {"epochs": len(rows), **{short: last.get(column) for column, short in SHORT.items()},
            **{f"best {short}": best.get(column) for column, short in SHORT.items()}}
