"""``python -m yolo9kit runs [ROOT]``: every run folder under ROOT as one table (``yolo9kit.runs``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("runs", help="list the run folders under a root: state, metrics, speed, memory and "
                                           "the settings that differ")
    p.add_argument("root", nargs="?", default="runs", help="folder of run folders (default: runs)")
    p.add_argument("--csv", default=None, metavar="FILE", help="also write the table to FILE")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from yolo9kit.experiments import runs

    table = runs(args.root)
    if table.empty:
        print(f"no run folders under {args.root}")
        return 0
    with pd.option_context("display.max_columns", None, "display.width", 200, "display.max_colwidth", 60):
        shown = table.drop(columns="path").astype(object)
        print(shown.where(shown.notna(), "").to_string(index=False))  # an empty cell, not None or NaN
    if args.csv:
        from yolo9kit.files import OwnInputError, write_text_atomically

        out = Path(args.csv).resolve()
        if out.exists() and any(out.is_relative_to(Path(p).resolve()) for p in table["path"]):
            raise OwnInputError(f"--csv {args.csv} is a file of a run folder listed here: the table would replace it; "
                                "choose a path outside the run folders")
        write_text_atomically(args.csv, table.to_csv(index=False))
        print(f"table written to {args.csv}")
    return 0
