"""``fit_seeds``: one run repeated with other seeds, and the spread of its results.

Two runs that differ in one setting also differ in their seed's luck: the initial weights, the data order and
the augmentation. The spread between seeds of one setting is how large a difference must be before it says
more than the seed (``SeedSpread.within``). Each seed is an ordinary run folder, ``<name>-seed<k>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from yolo9kit.config import TrainConfig
from yolo9kit.train.fit import FitResult, fit

SHORT = {"metrics/mAP50": "mAP50", "metrics/mAP50-95": "mAP50-95"}  # results.csv column -> the table's name


@dataclass(frozen=True)
class SeedSpread:
    """The runs of ``fit_seeds``.

    Attributes:
        table: one row per seed: ``seed``, ``epochs``, the last epoch's ``mAP50`` and ``mAP50-95`` and those of
            its best epoch (``best mAP50``, ``best mAP50-95``: what best.pt scores; all None when the run did not
            validate), ``run`` (its folder).
        results: the ``FitResult`` of each seed, in the table's order.
    """

    table: pd.DataFrame
    results: tuple[FitResult, ...]

    def summary(self) -> pd.DataFrame:
        """mean, std (n - 1), min, max and range (max - min) of each metric over the seeds."""
        values = self.table[[*SHORT.values(), *(f"best {m}" for m in SHORT.values())]].astype(float)
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
                 f"over {int(r['seeds'])} seeds" for metric, r in rows.iterrows()]
        return "\n".join(lines)


def fit_seeds(model: str | Path, data: Any, config: TrainConfig, seeds: int | Sequence[int] = 3) -> SeedSpread:
    """``fit`` once per seed, one after the other, each in its own run folder (``<name>-seed<k>``).

    Args:
        model: a model name, yaml or checkpoint path: each run builds it with its own seed (a module would start
            every run from the same weights, which is not what the spread is about).
        data: as for ``fit``.
        config: the run's settings; its ``seed`` is the first seed when ``seeds`` is a count.
        seeds: how many seeds (``config.seed``, ``config.seed + 1``, ...) or the seeds themselves.

    Returns:
        SeedSpread with each seed's final metrics and its ``FitResult``.
    """
    if not isinstance(model, (str, Path)):
        raise TypeError(f"fit_seeds needs a model name or file, built anew for each seed; got a "
                        f"{type(model).__name__}")
    chosen = list(range(config.run.seed, config.run.seed + seeds)) if isinstance(seeds, int) else list(seeds)
    if not chosen or len(set(chosen)) != len(chosen):
        raise ValueError(f"seeds: at least one seed, each once; got {seeds!r}")
    rows, results = [], []
    for seed in chosen:
        result = fit(str(model), data, config.replace(seed=seed, name=f"{config.run.name}-seed{seed}"))
        rows.append({"seed": seed, "epochs": result.epochs_completed, **_metrics(result.results),
                     "run": str(result.save_dir)})
        results.append(result)
    return SeedSpread(pd.DataFrame(rows), tuple(results))


def _metrics(rows: list[dict]) -> dict[str, float | None]:
    """The last epoch's metrics and those of the epoch of the best fitness (the one best.pt keeps)."""
    last = rows[-1] if rows else {}
    scored = [r for r in rows if r.get("fitness") is not None]
    best = max(scored, key=lambda r: r["fitness"]) if scored else {}
    return {**{short: last.get(column) for column, short in SHORT.items()},
            **{f"best {short}": best.get(column) for column, short in SHORT.items()}}
