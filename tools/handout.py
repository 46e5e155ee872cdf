"""Copies the notebooks for participants who open them alone (Colab, Kaggle, a link): in each, the setup cell's
``KIT`` names where the kit installs from and, with ``--work``, ``WORK`` names the folder for data and runs.

    pip wheel --no-deps -w dist .
    python tools/handout.py --kit https://example.org/yolo9kit-0.1.0-py3-none-any.whl --out handout/

docs/notebooks.md ("Colab and Kaggle") says where a wheel can live and what each platform takes.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SETTINGS = {"KIT": r'^KIT: str = ".*"$', "WORK": r'^WORK: str = "[^"]*"'}  # the line each sets, in every notebook


def handout(out: Path, kit: str, work: str | None = None) -> list[Path]:
    """Writes every notebook of ``notebooks/`` into ``out`` with ``KIT`` (and ``WORK``) set; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        values = {"KIT": kit, "WORK": work}
        for name, pattern in SETTINGS.items():
            if values[name] is None:
                continue
            cells = [c for c in nb["cells"] if c["cell_type"] == "code" and re.search(pattern, "".join(c["source"]),
                                                                                          re.M)]
            if len(cells) != 1:
                raise SystemExit(f"{path.name}: expected one cell that sets {name}, found {len(cells)}")
            line = f"{name}: str = {json.dumps(values[name])}"
            source = re.sub(pattern, line.replace("\\", "\\\\"), "".join(cells[0]["source"]), count=1, flags=re.M)
            cells[0]["source"] = source.splitlines(keepends=True)
        written.append(out / path.name)
        written[-1].write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kit", required=True, help="a wheel (a path or URL) or a repository address, "
                                                     "e.g. git+https://github.com/you/yolo9kit")
    parser.add_argument("--work", help='the folder for data and runs (default "."; on Colab, e.g. '
                                       '"/content/drive/MyDrive/yolo9kit" keeps runs past the session)')
    parser.add_argument("--out", type=Path, required=True, help="the folder to write the notebooks into")
    args = parser.parse_args(argv)
    for path in handout(args.out, args.kit, args.work):
        print(path)


if __name__ == "__main__":
    main()
