"""``python -m yolo9kit tune``: search the hyper-parameters (train_dual.py's ``--evolve`` space, Optuna's sampler).

    python -m yolo9kit tune --data data.yaml --model yolov9-s --epochs 10 --trials 30     # runs/tune/exp
    python -m yolo9kit tune --data data.yaml --model yolov9-s --epochs 10 --trials 30     # the same: continues it
    python -m yolo9kit tune ... --name lr --space lr0 lrf momentum                        # only these keys
    python -m yolo9kit tune ... --storage postgresql://user@host/db    # workers on several machines, one study
    python -m yolo9kit runs runs/tune/exp                               # every trial as one table
    python -m yolo9kit train --data data.yaml --hyp runs/tune/exp/best_hyp.yaml ...

Every train flag is a setting of every trial (but --resume: the same command continues a stopped study, and a
second process with it shares the study). The best hyper-parameters so far are in <study folder>/best_hyp.yaml.
"""

from __future__ import annotations

import argparse

from yolo9kit.cli.train import DEFAULT_MODEL, add_train_flags, config_from_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from yolo9kit.config.recipe import EVOLVE_SPACE
    from yolo9kit.train.tuning import KEEP_WEIGHTS

    p = subparsers.add_parser("tune", help="search the hyper-parameters (--evolve's space, with Optuna): every trial "
                                           "a run folder, a study that continues and that workers share",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_flags(p)
    p.add_argument("--trials", type=int, default=10, metavar="N",
                   help="complete trials the study should hold, all workers together (default 10)")
    p.add_argument("--space", nargs="+", default=None, choices=list(EVOLVE_SPACE), metavar="KEY",
                   help="search only these keys of --evolve's space (default all of them: "
                        f"{', '.join(EVOLVE_SPACE)})")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="an Optuna storage URL shared by the workers (default sqlite:///<study folder>/study.db)")
    p.add_argument("--keep-weights", default="best", choices=KEEP_WEIGHTS,
                   help="best: remove the weights of every complete trial but the best, and send none to MLflow "
                        "(default); all: keep them")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit status 0 when the study holds its trials, 130 when it was stopped in a trial (the same command
    continues it)."""
    from yolo9kit.train.tuning import tune

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
    return 130 if result.interrupted else 0
