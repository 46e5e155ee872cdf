"""``python -m yolo9kit <verb> ...``: the same functions the notebooks call, from a shell.

Each verb lives in its own module of this package and exposes ``add_parser(subparsers)``, which
registers a sub-command whose ``func(args) -> int`` does the work. Modules are imported only when
the command line is parsed, so ``--help`` stays fast.

Errors are one line on stderr (what, which file or flag, what to do), without a traceback unless
``-v``/``--verbose`` is given (before or after the verb). Exit codes: 0 done; 1 the work failed while
running (out of memory, a full disk, a non-finite loss, an unexpected error); 2 the input is wrong
(a flag, a file, the data, a checkpoint: fix it and run again); 130 interrupted with Ctrl-C.
Verbs may return other codes of their own (``data check``: 1 when files had to be skipped).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys

# verb modules, in the order ``--help`` lists them
VERB_MODULES = ["checks", "models", "data", "train", "tune", "runs", "val", "detect", "export", "profile", "demo"]
# errors of the input (exit code 2); anything else that escapes a verb is a failure while running (1).
# ValueError covers the kit's own DataError, CheckpointError and LayerTableError.
INPUT_ERRORS = (ValueError, LookupError, FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError)
MAX_MESSAGE = 600  # characters of one error line; the rest is shown with --verbose


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (a verb's usage block buries the message)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the flags)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m yolo9kit", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log at DEBUG level and show the traceback of an error")
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    for name in VERB_MODULES:
        importlib.import_module(f"yolo9kit.cli.{name}").add_parser(subparsers)
    _verbose_after_the_verb(subparsers)
    return parser


def _verbose_after_the_verb(subparsers: argparse._SubParsersAction) -> None:
    """Accept ``-v``/``--verbose`` after a verb too (hidden; unset unless given, so the top-level one holds)."""
    for sub in subparsers.choices.values():
        if "--verbose" not in sub._option_string_actions:
            options = [o for o in ("-v", "--verbose") if o not in sub._option_string_actions]
            sub.add_argument(*options, dest="verbose", action="store_true", default=argparse.SUPPRESS,
                             help=argparse.SUPPRESS)
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                _verbose_after_the_verb(action)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s",
                        stream=sys.stdout)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    prog = f"{parser.prog} {args.verb}"
    from yolo9kit.env import set_cpu_threads

    set_cpu_threads()  # at most the cores this process may use (a container's quota included)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if args.verbose:
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if args.verbose:
            raise
        if isinstance(e, INPUT_ERRORS):
            print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
            return 2
        print(f"{prog}: failed ({type(e).__name__}): {one_line(e)} (add --verbose for the traceback)",
              file=sys.stderr)
        return 1


def one_line(error: BaseException) -> str:
    """The message of ``error`` as one line: its first line, a state-dict mismatch summarised, long ones cut."""
    text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    text = _state_dict_mismatch(text) or text
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0] if lines else type(error).__name__
    if len(line) > MAX_MESSAGE or len(lines) > 1:
        line = f"{line[:MAX_MESSAGE]} ... (--verbose shows all of it)"
    return line


def _state_dict_mismatch(text: str) -> str | None:
    """torch's "Error(s) in loading state_dict" (tens of KB of key names) as counts and what to do."""
    if not text.startswith("Error(s) in loading state_dict"):
        return None

    def keys(label: str) -> int:
        found = re.search(label + r" in state_dict: ([^\n]*)", text)
        return len(re.findall(r'"[^"]*"', found.group(1))) if found else 0

    other = text.count("size mismatch for ")
    return (f"the checkpoint's weights do not fit the model ({other} tensors of another shape, "
            f"{keys('Missing key[(]s[)]')} missing, {keys('Unexpected key[(]s[)]')} unexpected): it was saved from "
            "another architecture or number of classes; start a new run from it with "
            "`python -m yolo9kit train --weights FILE` (the tensors that fit are transferred)")
