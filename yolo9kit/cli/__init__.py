"""``python -m yolo9kit <verb> ...``: the same functions the notebooks call, from a shell.

Each verb lives in its own module of this package and exposes ``add_parser(subparsers)``, which
registers a sub-command whose ``func(args) -> int`` does the work. Modules are imported only when
the command line is parsed, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# verb modules, in the order ``--help`` lists them
VERB_MODULES = ["checks", "models", "data", "train", "val", "detect", "profile", "demo"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m yolo9kit", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    for name in VERB_MODULES:
        importlib.import_module(f"yolo9kit.cli.{name}").add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s",
                        stream=sys.stdout)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)
