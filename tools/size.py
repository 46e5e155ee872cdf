"""Lines of the package per sub-package and per file, against the budgets that tests/test_style.py enforces.

    python tools/size.py            # the table, the totals and anything over a budget
    python tools/size.py --files    # every module, largest first

Lines are physical lines of ``.py`` files (``wc -l``), docstrings and blank lines included. The core is
everything under ``yolo9kit/`` except ``yolo9kit/extras/``.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "yolo9kit"
EXTRAS = PACKAGE / "extras"
BUDGETS = {"core_lines": 11_000, "extras_lines": 1_800, "module_lines": 400, "function_lines": 60, "files": 60}


def modules(package: Path = PACKAGE) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def long_functions(path: Path, limit: int) -> list[tuple[str, int]]:
    """(``file:line name``, length) of each function longer than ``limit``, decorators to last line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if node.end_lineno - start + 1 > limit:
                out.append((f"{path.relative_to(REPO)}:{node.lineno} {node.name}", node.end_lineno - start + 1))
    return out


def measure(package: Path = PACKAGE) -> dict:
    """Totals of the core and the extras, lines per sub-package, and what is over a budget."""
    files = modules(package)
    extras = package / "extras"
    per_package: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for path in files:
        key = str(path.parent.relative_to(package.parent))
        per_package[key][0] += lines(path)
        per_package[key][1] += 1
    core = sum(lines(p) for p in files if extras not in p.parents)
    extra = sum(lines(p) for p in files if extras in p.parents)
    over = [f"{p.relative_to(REPO)}: {n} lines" for p in files if (n := lines(p)) > BUDGETS["module_lines"]]
    over += [f"{name}: {n} lines (a function)" for p in files
             for name, n in long_functions(p, BUDGETS["function_lines"])]
    if core > BUDGETS["core_lines"]:
        over.append(f"the core: {core} lines")
    if extra > BUDGETS["extras_lines"]:
        over.append(f"the extras: {extra} lines")
    if len(files) > BUDGETS["files"]:
        over.append(f"{len(files)} files")
    return {"core": core, "extras": extra, "files": len(files), "packages": dict(per_package), "over": over,
            "modules": {str(p.relative_to(REPO)): lines(p) for p in files}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", action="store_true", help="list every module, largest first")
    args = parser.parse_args(argv)
    m = measure()
    for name, (n, count) in sorted(m["packages"].items()):
        print(f"{name:24s} {n:6d} lines {count:3d} files")
    if args.files:
        for name, n in sorted(m["modules"].items(), key=lambda kv: -kv[1]):
            print(f"  {n:5d} {name}")
    print(f"core {m['core']} lines (budget {BUDGETS['core_lines']}), extras {m['extras']} "
          f"(budget {BUDGETS['extras_lines']}), {m['files']} files (budget {BUDGETS['files']})")
    for item in m["over"]:
        print(f"over budget: {item}")
    return 1 if m["over"] else 0


if __name__ == "__main__":
    sys.exit(main())
