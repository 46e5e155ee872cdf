"""Every notebook runs headless, top to bottom, in smoke mode, without an error.

Each notebook ends with what a participant saw; ``notebook_checks.CHECKS`` holds what the run must have
shown, appended as one more cell to the copy that runs, so a run is a test of the walkthrough, not only of
the code. Notebooks run from a temporary copy of ``notebooks/`` (the tracked files are never written)
with ``YOLO9KIT_SMOKE=1`` in the kernel's environment: tiny images, few steps, about a minute each on
a 2-core CPU.

A notebook can declare in its metadata (``metadata.yolo9kit.requires``) the package functions it calls;
if one is missing the notebook is skipped with that name as the reason.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest
from notebook_checks import CHECKS, coco_export

nbformat = pytest.importorskip("nbformat")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 600


def _missing(requires: list[str]) -> list[str]:
    """Dotted names (``yolo9kit.memory.sweep``) that do not import."""
    missing = []
    for dotted in requires:
        module, _, attr = dotted.rpartition(".")
        try:
            if not hasattr(importlib.import_module(module), attr):
                missing.append(dotted)
        except ImportError:
            try:
                importlib.import_module(dotted)
            except ImportError:
                missing.append(dotted)
    return missing


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _with_checks(path: Path):
    """The notebook at ``path`` with its ``CHECKS`` appended as the last code cell (in memory only)."""
    nb = _read(path)
    nb.cells.append(nbformat.v4.new_code_cell(CHECKS[path.name]))
    return nb


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_clean_and_follows_the_layout(path):
    nb = _read(path)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code cell"
    for i, cell in enumerate(code):
        assert not cell.outputs and cell.execution_count is None, (
            f"{path.name} code cell {i} is committed with outputs; clear them before committing")
    assert "yolo9kit.checks()" in code[0].source, f"{path.name}: the first code cell must report the environment"
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: expected exactly one cell tagged 'parameters'"
    assert "SMOKE" in tagged[0].source, f"{path.name}: the parameters cell must define the SMOKE setting"
    scaffolding = [i for i, cell in enumerate(code) if "assert " in cell.source]
    assert not scaffolding, (f"{path.name} code cells {scaffolding} assert: checks belong in "
                             "tests/notebook_checks.py, the notebook shows what a participant reads")
    assert path.name in CHECKS, f"{path.name} has no checks in tests/notebook_checks.py"
    assert "**What you saw:**" in code[-1].source and "**Next:**" in code[-1].source, (
        f"{path.name}: the last cell must say what the notebook showed, from its numbers, and what to open next")
    intro = nb.cells[0].source if nb.cells[0].cell_type == "markdown" else ""
    assert "**Run time**" in intro and "Smoke mode" in intro, (
        f"{path.name}: the first (markdown) cell must state the measured run time in default and smoke mode")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_in_smoke_mode(path, tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    tracked = path.read_bytes()
    nb = _with_checks(path)
    missing = _missing(nb.metadata.get("yolo9kit", {}).get("requires", []))
    if missing:
        pytest.skip(f"{path.name} needs {', '.join(missing)}, which the package does not provide yet")

    workdir = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOK_DIR, workdir, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    monkeypatch.setenv("YOLO9KIT_SMOKE", "1")  # the kernel inherits this environment
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(workdir)}})
    client.execute()  # raises CellExecutionError naming the cell and the traceback on any error

    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert path.read_bytes() == tracked, f"running {path.name} modified the tracked file"


def _imported_names(source: str) -> list[str]:
    """Dotted names a cell imports (``from a.b import c`` -> ``a.b.c``); IPython magics are skipped."""
    import ast

    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    names = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_imports_only_public_names(path):
    """Notebooks show what a user can write: no private module or name of the package (``_common``, ``_x``)."""
    private = [name for cell in _read(path).cells if cell.cell_type == "code"
               for name in _imported_names(cell.source)
               if name.startswith("yolo9kit") and any(part.startswith("_") for part in name.split("."))]
    assert not private, f"{path.name} imports private names: {private}"


def _run_with(path: Path, workdir: Path, monkeypatch, **parameters):
    """Execute ``path`` from ``workdir`` with ``parameters`` set after its parameters cell (as papermill injects
    them); returns the executed notebook, or the CellExecutionError raised."""
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = _with_checks(path)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in parameters.items())))
    monkeypatch.setenv("YOLO9KIT_SMOKE", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(workdir)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:
        return nb, e
    return nb, None


@pytest.mark.slow
def test_notebook_08_fine_tunes_a_coco_export_and_stops_in_one_line_when_its_images_are_missing(tmp_path,
                                                                                              monkeypatch):
    workdir = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOK_DIR, workdir, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    path = workdir / "08_finetune_your_data.ipynb"
    json_path, photos = coco_export(tmp_path)
    nb, error = _run_with(path, workdir, monkeypatch, DATA=str(json_path), COCO_IMAGES=str(photos))
    assert error is None, error
    shown = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "12 images" in shown and "held out for validation" in shown and "no label file" not in shown

    missing_json, empty = coco_export(tmp_path / "second", with_images=False)
    nb, error = _run_with(path, workdir, monkeypatch, DATA=str(missing_json), COCO_IMAGES=str(empty))
    assert error is not None and error.ename == "DataError"
    stopped = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert len(stopped) == 1 and len(stopped[0].traceback) == 1, stopped  # one line, no traceback through the kit
    assert "has no images" in stopped[0].traceback[0]
