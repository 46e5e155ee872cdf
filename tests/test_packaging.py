"""The install story: pyproject and environment.yml agree, the package imports cheaply, CI calls the
README's test command."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from conftest import REPO, build_wheel


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].strip().lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["notebooks"]
    expected = {_name(r): r.replace(" ", "") for r in requirements}
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    assert "defaults" not in env["channels"] and "conda-forge" in env["channels"]
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = {_name(r): r.replace(" ", "") for r in pip_section if not r.startswith("-e")}
    assert listed == expected
    assert any(r.startswith("-e .") for r in pip_section), "environment.yml must install the package itself"


def test_import_leaves_out_the_widgets_and_the_extras():
    """``import yolo9kit`` imports the core (torch too), never ipywidgets (the notebooks extra) nor yolo9kit.extras."""
    code = ("import sys, yolo9kit; print('ipywidgets' in sys.modules, "
            "any(m == 'yolo9kit.extras' or m.startswith('yolo9kit.extras.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_ci_runs_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in readme and "make demo" in readme
    assert re.search(r"^make test$", ci, re.M)


def test_public_names_exist():
    import yolo9kit

    for name in yolo9kit.__all__:
        assert getattr(yolo9kit, name) is not None, name


def test_top_level_functions_are_not_shadowed_by_modules():
    code = ("import yolo9kit.prediction, yolo9kit.validate, yolo9kit.train, yolo9kit; "
            "print(callable(yolo9kit.predict), callable(yolo9kit.evaluate), callable(yolo9kit.fit))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "True"]
    import yolo9kit.extras

    modules = {p.stem for p in (REPO / "yolo9kit" / "extras").glob("*.py")}
    assert not modules & set(yolo9kit.extras.__all__), "a module of the extras shadows one of their functions"


def test_lab_saves_widget_state():
    """`make lab` installs the JupyterLab override that keeps widget state in saved notebooks."""
    import json

    overrides = json.loads((REPO / "notebooks" / ".jupyter" / "overrides.json").read_text())
    assert overrides["@jupyter-widgets/jupyterlab-manager:plugin"]["saveState"] is True
    makefile = (REPO / "Makefile").read_text()
    assert "notebooks/.jupyter/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json" in makefile


def test_lab_starts_as_root_where_jupyterlab_would_refuse():
    """As root (a container, a cloud GPU machine) JupyterLab stops with "Running as root is not recommended"
    unless --allow-root: `make lab` passes it exactly then (make's dry run shows the command)."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    # -o: the install stamp counts as done, so the dry run shows only the lab commands
    shown = subprocess.run([make, "-n", "-o", ".venv/.yolo9kit-installed", "lab"], cwd=REPO, capture_output=True,
                           text=True).stdout
    line = next(x for x in shown.splitlines() if "jupyter lab" in x)
    assert ("--allow-root" in line) == (os.geteuid() == 0), line


@pytest.mark.slow
def test_installs_from_a_built_wheel_with_its_data_files(tmp_path):
    """A wheel (not the editable checkout) carries the layer tables, the calibration and the shipped model;
    from that install alone `python -m yolo9kit checks` reports them and the API reads each of them (notebook 00,
    which uses all three, runs once per test run, in tests/test_notebooks.py)."""
    import zipfile

    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    for folder, suffix in (("models/cfg/", ".yaml"), ("memory_calibration/", ".json"), ("models/", ".pt")):
        assert any(n.startswith(f"yolo9kit/{folder}") and n.endswith(suffix) for n in names), (
            f"{wheel.name} has no yolo9kit/{folder}*{suffix}")

    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                                str(wheel)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-3000:]
    # The wheel's folder first on the path: it shadows the editable install of the checkout.
    env = {**os.environ, "PYTHONPATH": str(site)}
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    where = subprocess.run([sys.executable, "-c", "import yolo9kit; print(yolo9kit.__file__)"], cwd=run_dir,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(site), f"imported {where}, not the wheel's install in {site}"
    checks = subprocess.run([sys.executable, "-m", "yolo9kit", "checks"], cwd=run_dir, env=env,
                            capture_output=True, text=True)
    assert f"package data ({site / 'yolo9kit'})" in checks.stdout, checks.stdout + checks.stderr
    assert "PROBLEM: no " not in checks.stdout, checks.stdout

    code = ("from yolo9kit.memory.gpus import packaged_calibrations; "
            "from yolo9kit.models import create_model, model_table; "
            "print(create_model('yolov9-t-shapes').names, len(packaged_calibrations()), "
            "list(model_table(['gelan-t']).name))")
    used = subprocess.run([sys.executable, "-c", code], cwd=run_dir, env=env, capture_output=True, text=True)
    assert used.returncode == 0, used.stderr[-3000:]
    assert used.stdout.split("\n")[0] == "['rectangle', 'ellipse', 'triangle'] 1 ['gelan-t']", used.stdout
