"""The notebooks follow the layout, and run headless, top to bottom, in smoke mode, without an error.

Each run ends with ``notebook_checks.CHECKS`` (what the walkthrough must have shown), from a temporary copy of
``notebooks/`` with ``YOLO9KIT_SMOKE=1`` in the kernel's environment. The widget notebooks run here only when
the browser test does not run them in this session (tests/conftest.py); 08 runs on a COCO export. A notebook
can name in ``metadata.yolo9kit.requires`` the package functions it calls: one missing skips it, named.
"""

from __future__ import annotations

import ast
import importlib
import shutil
from pathlib import Path

import pytest
from notebook_checks import CHECKS, WIDGET_NOTEBOOKS, coco_export

from yolo9kit.data import make_shapes

nbformat = pytest.importorskip("nbformat")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
COCO_CASE = "08_finetune_your_data.ipynb"  # runs once, on a COCO export (its own test below)
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


def test_the_widget_notebooks_are_those_that_show_widgets():
    """The browser test runs exactly the notebooks that display widgets (the kit's, its extras' runs viewer, or
    ipywidgets')."""
    imports = {p.name: [n for c in _read(p).cells if c.cell_type == "code" for n in _imported_names(c.source)]
               for p in NOTEBOOKS}
    widget_makers = ("yolo9kit.widgets", "ipywidgets", "yolo9kit.extras.runs_viewer")
    shown = [name for name, names in imports.items() if any(n.startswith(widget_makers) for n in names)]
    assert shown == list(WIDGET_NOTEBOOKS)


def _execute(path: Path, workdir: Path, monkeypatch, **parameters):
    """Run ``path`` with its checks from ``workdir`` (``parameters`` set after its parameters cell, as papermill
    injects them); returns the executed notebook and the CellExecutionError raised, or None."""
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = _with_checks(path)
    missing = _missing(nb.metadata.get("yolo9kit", {}).get("requires", []))
    if missing:
        pytest.skip(f"{path.name} needs {', '.join(missing)}, which the package does not provide yet")
    if parameters:
        at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
        nb.cells.insert(at + 1, nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in parameters.items())))
    monkeypatch.setenv("YOLO9KIT_SMOKE", "1")  # the kernel inherits this environment
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(workdir)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:
        return nb, e
    return nb, None


def _outputs(nb, kind: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == kind]


def _workdir(tmp_path: Path) -> Path:
    workdir = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOK_DIR, workdir, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    return workdir


def _assert_ran_clean(nb, error) -> None:
    """No cell raised, and nothing went to stderr (JupyterLab draws it as a red box: a participant reads an error)."""
    assert error is None, error
    assert not _outputs(nb, "error")
    stderr = [o.text for o in _outputs(nb, "stream") if o.name == "stderr"]
    assert not stderr, f"{len(stderr)} stderr output(s), the first:\n{stderr[0][:1500]}"


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name != COCO_CASE], ids=lambda p: p.name)
def test_notebook_runs_in_smoke_mode(path, tmp_path, monkeypatch):
    tracked = path.read_bytes()
    _assert_ran_clean(*_execute(path, _workdir(tmp_path), monkeypatch))
    assert path.read_bytes() == tracked, f"running {path.name} modified the tracked file"


def _imported_names(source: str) -> list[str]:
    """Dotted names a cell imports (``from a.b import c`` -> ``a.b.c``); IPython magics are skipped."""
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


@pytest.mark.slow
def test_notebook_08_fine_tunes_a_coco_export_and_stops_in_one_line_when_its_images_are_missing(tmp_path, shapes64,
                                                                                              monkeypatch):
    """08 on a COCO export of 5 classes (the shipped checkpoint knows 3): the whole notebook, so this run also
    covers its default run on generated shapes, which differs only in where the data.yaml comes from."""
    workdir = _workdir(tmp_path)
    path = workdir / COCO_CASE
    five = make_shapes(tmp_path / "src", n_train=12, n_val=1, imgsz=64, num_classes=5, seed=3)
    json_path, photos = coco_export(five, tmp_path / "export")
    nb, error = _execute(path, workdir, monkeypatch, DATA=str(json_path), COCO_IMAGES=str(photos))
    _assert_ran_clean(nb, error)
    shown = "\n".join(o.get("text", "") + o.get("data", {}).get("text/markdown", "")
                      for o in _outputs(nb, "stream") + _outputs(nb, "display_data") + _outputs(nb, "execute_result"))
    assert "12 images" in shown and "held out for validation" in shown and "no label file" not in shown
    assert "5 classes: rectangle, ellipse, triangle, star, cross" in shown

    missing_json, empty = coco_export(shapes64, tmp_path / "second", with_images=False)
    nb, error = _execute(path, workdir, monkeypatch, DATA=str(missing_json), COCO_IMAGES=str(empty))
    assert error is not None and error.ename == "DataError"
    stopped = _outputs(nb, "error")
    assert len(stopped) == 1 and len(stopped[0].traceback) == 1, stopped  # one line, no traceback through the kit
    assert "has no images" in stopped[0].traceback[0]
