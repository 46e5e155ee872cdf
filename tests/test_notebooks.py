"""The notebooks follow the layout, and run headless, top to bottom, in smoke mode, without an error.

Each run ends with ``notebook_checks.CHECKS`` (what the walkthrough must have shown), with ``YOLO9KIT_SMOKE=1`` in
the kernel's environment, as a participant runs a notebook opened alone: a copy written by tools/handout.py in a
folder outside the checkout, in a Python without the kit, whose setup cell installs it from a wheel of the checkout.
The widget notebooks run here only when the browser test does not run them in this session (tests/conftest.py);
08 runs on a COCO export. A notebook can name in ``metadata.yolo9kit.requires`` the package functions it calls: one
missing skips it, named.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import build_wheel
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
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and tagged[0] is code[0], f"{path.name}: the first code cell must be the 'parameters' one"
    for setting in ("SMOKE: bool", "WORK: str"):
        assert setting in code[0].source, f"{path.name}: the parameters cell must define {setting}"
    assert code[1].source == _read(NOTEBOOKS[0]).cells[2].source, (
        f"{path.name}: the second code cell must be the setup cell of {NOTEBOOKS[0].name} (install, checks())")
    assert "../" not in "".join(c.source for c in code[1:]), (
        f"{path.name} reaches outside its folder: a notebook opened alone writes under WORK")
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


KERNEL = "alone"  # the kernel of a Python without the kit (the ``alone`` fixture)


def _execute(path: Path, workdir: Path, monkeypatch, **parameters):
    """Run ``workdir``'s copy of ``path`` with its checks in the ``alone`` kernel (``parameters`` set after its
    parameters cell, as papermill injects them); returns the executed notebook and the CellExecutionError raised,
    or None."""
    pytest.importorskip("ipykernel")
    nb = _with_checks(workdir / path.name)
    missing = _missing(nb.metadata.get("yolo9kit", {}).get("requires", []))
    if missing:
        pytest.skip(f"{path.name} needs {', '.join(missing)}, which the package does not provide yet")
    if parameters:
        at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
        nb.cells.insert(at + 1, nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in parameters.items())))
    return _run(nb, workdir, monkeypatch)


def _run(nb, workdir: Path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("YOLO9KIT_SMOKE", "1")  # the kernel inherits this environment
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL,
                                     resources={"metadata": {"path": str(workdir)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:
        return nb, e
    return nb, None


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """A folder outside the checkout holding the notebooks as tools/handout.py writes them (``KIT`` = a wheel
    built from the checkout), and the ``alone`` kernel: a venv that sees this Python's packages except the kit's
    editable install, so the setup cell of the first notebook run installs the kit from the wheel."""
    root = tmp_path_factory.mktemp("alone")
    wheel = build_wheel(root)
    venv.create(root / "env", with_pip=False)
    deps = root / "deps"  # this Python's site-packages without the kit and without its .pth files
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("yolo9kit", "__editable__")) and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    python = root / "env" / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "deps.pth").write_text(f"{deps}\n")
    spec = root / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({"argv": [str(python), "-m", "ipykernel_launcher", "-f",
                                                           "{connection_file}"], "language": "python",
                                                  "display_name": "Python without the kit"}))
    subprocess.run([sys.executable, str(REPO / "tools" / "handout.py"), "--kit", str(wheel), "--out",
                    str(root / "notebooks")], check=True, capture_output=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", str(root / "jupyter"))
    # The parameters and setup cells of 00, run before any notebook installs the kit: once with KIT unset, then
    # as handed out (the test below reads what each did)
    params, setup = _read(root / "notebooks" / NOTEBOOKS[0].name).cells[1:3]
    unset = nbformat.v4.new_code_cell(re.sub(r'^KIT: str = .*$', 'KIT: str = ""', setup.source, flags=re.M))
    where = nbformat.v4.new_code_cell("print(yolo9kit.__file__)")
    runs = [_run(nbformat.v4.new_notebook(cells=cells), root, mp) for cells in ([params, unset],
                                                                                 [params, setup, where])]
    yield SimpleNamespace(root=root, unset=runs[0], handed_out=runs[1])
    mp.undo()


def test_the_handout_sets_kit_and_work_in_every_notebook_and_nothing_else(tmp_path):
    kit, work = "https://example.org/yolo9kit-0.1.0-py3-none-any.whl", "/content/drive/MyDrive/yolo9kit"
    subprocess.run([sys.executable, str(REPO / "tools" / "handout.py"), "--kit", kit, "--work", work, "--out",
                    str(tmp_path)], check=True, capture_output=True)
    for path in NOTEBOOKS:
        ours, handed = _read(path), _read(tmp_path / path.name)
        changed = [(a.source, b.source) for a, b in zip(ours.cells, handed.cells, strict=True) if a != b]
        assert [b for _, b in changed] == [re.sub(r'^WORK: str = "\."', f'WORK: str = "{work}"', changed[0][0],
                                                  flags=re.M),
                                           changed[1][0].replace('KIT: str = ""', f'KIT: str = "{kit}"')], path.name


def test_a_notebook_opened_alone_installs_the_kit_from_its_kit_setting(alone):
    """In the Python without the kit, the parameters and setup cells of 00 stop with one error that says what to
    set when ``KIT`` is unset; with the handout's ``KIT`` (the wheel) they install the kit and import it from that
    install, not from the checkout."""
    _, error = alone.unset
    assert error is not None and error.ename == "ModuleNotFoundError" and "set KIT in this cell" in error.evalue
    nb, error = alone.handed_out
    assert error is None, error
    imported = Path(nb.cells[-1].outputs[-1].text.strip())
    assert imported.is_relative_to(alone.root / "env") and not imported.is_relative_to(REPO), imported


def _outputs(nb, kind: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == kind]


def _workdir(tmp_path: Path, alone) -> Path:
    """A copy of the handout's notebooks: each run writes its data and runs under its own ``WORK``."""
    workdir = tmp_path / "notebooks"
    shutil.copytree(alone.root / "notebooks", workdir)
    return workdir


def _assert_ran_clean(nb, error) -> None:
    """No cell raised, and nothing went to stderr (JupyterLab draws it as a red box: a participant reads an error)."""
    assert error is None, error
    assert not _outputs(nb, "error")
    stderr = [o.text for o in _outputs(nb, "stream") if o.name == "stderr"]
    assert not stderr, f"{len(stderr)} stderr output(s), the first:\n{stderr[0][:1500]}"


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name != COCO_CASE], ids=lambda p: p.name)
def test_notebook_runs_in_smoke_mode(path, alone, tmp_path, monkeypatch):
    tracked = path.read_bytes()
    _assert_ran_clean(*_execute(path, _workdir(tmp_path, alone), monkeypatch))
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
def test_notebook_08_fine_tunes_a_coco_export_and_stops_in_one_line_when_its_images_are_missing(alone, tmp_path,
                                                                                              shapes64, monkeypatch):
    """08 on a COCO export of 5 classes (the shipped checkpoint knows 3): the whole notebook, so this run also
    covers its default run on generated shapes, which differs only in where the data.yaml comes from."""
    workdir = _workdir(tmp_path, alone)
    path = NOTEBOOK_DIR / COCO_CASE
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
