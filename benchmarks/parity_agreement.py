"""How closely the kit agrees with the committed official references, per model (docs/parity.md).

    python benchmarks/parity_agreement.py [--threads N]

For each of the ten models: the largest relative difference (max abs difference over max abs value) of
the eval outputs, of the training-mode maps, of the loss items computed by our loss on the official maps
and by our model end to end, and the relative differences of the total and the per-parameter gradient
norms (parameters whose official gradient is an exact zero up to rounding left out, as in the test).
It runs what ``tests/test_official.py`` and ``tests/test_loss.py`` run; the tests hold the tolerances.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from official_parity import rel, run_kit  # noqa: E402

from yolo9kit.loss import DetectionLoss  # noqa: E402
from yolo9kit.models import list_models  # noqa: E402


def agreement(name: str) -> dict:
    from conftest import committed_fixture

    fx = torch.load(committed_fixture(f"{name}.parity.pt"), map_location="cpu", weights_only=True)
    ours = run_kit(name)
    dual = name.startswith("yolov9")
    ref_maps = fx["train_out"] if dual else [fx["train_out"]]
    got_maps = ours["train_out"] if dual else [ours["train_out"]]
    loss_fn = DetectionLoss(num_classes=fx["nc"], strides=fx["stride"].tolist())
    _, items_on_maps = loss_fn(fx["train_out"], fx["targets"])
    zero = 1e-9 * max(fx["grad_norms"].values())
    return {
        "eval": max(rel(g, r) for g, r in zip(ours["eval_out"], fx["eval_out"])),
        "train maps": max(rel(g, r) for gh, rh in zip(got_maps, ref_maps) for g, r in zip(gh, rh)),
        "loss on maps": rel(items_on_maps.double(), fx["loss_items"].double()),
        "loss end to end": rel(ours["loss_items"].double(), fx["loss_items"].double()),
        "grad total": abs(ours["grad_norm"] - fx["grad_norm"]) / fx["grad_norm"],
        "grad worst": max(abs(ours["grad_norms"][n] - r) / r for n, r in fx["grad_norms"].items() if r > zero),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = {name: agreement(name) for name in list_models()}
    columns = list(next(iter(rows.values())))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| model | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(f"{row[c]:.1e}" for c in columns) + " |")


if __name__ == "__main__":
    main()
