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
from conftest import REPO


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


def test_import_is_cheap():
    code = "import sys, yolo9kit; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


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
    `python -m yolo9kit checks` and notebook 00 (smoke mode) run from that install alone."""
    import zipfile

    src = tmp_path / "src"  # build from a copy, so the checkout gets no build/ or egg-info of the wheel's
    shutil.copytree(REPO / "yolo9kit", src / "yolo9kit", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next((tmp_path / "dist").glob("yolo9kit-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for folder, suffix in (("models/cfg/", ".yaml"), ("memory_calibration/", ".json"), ("models/", ".pt")):
        assert any(n.startswith(f"yolo9kit/{folder}") and n.endswith(suffix) for n in names), (
            f"{wheel.name} has no yolo9kit/{folder}*{suffix}")

    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                                str(wheel)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-3000:]
    # The wheel's folder first on the path: it shadows the editable install of the checkout.
    env = {**os.environ, "PYTHONPATH": str(site), "YOLO9KIT_SMOKE": "1", "MPLBACKEND": "Agg"}
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    where = subprocess.run([sys.executable, "-c", "import yolo9kit; print(yolo9kit.__file__)"], cwd=run_dir,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(site), f"imported {where}, not the wheel's install in {site}"
    checks = subprocess.run([sys.executable, "-m", "yolo9kit", "checks"], cwd=run_dir, env=env,
                            capture_output=True, text=True)
    assert f"package data ({site / 'yolo9kit'})" in checks.stdout, checks.stdout + checks.stderr
    assert "PROBLEM: no " not in checks.stdout, checks.stdout

    notebook = run_dir / "00_tour.ipynb"
    shutil.copy(REPO / "notebooks" / "00_tour.ipynb", notebook)
    ran = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                          "--ExecutePreprocessor.timeout=600", "--output", "ran.ipynb", str(notebook)],
                         cwd=run_dir, env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-3000:]
    text = (run_dir / "ran.ipynb").read_text()
    assert str(site / "yolo9kit") in text, "the notebook's checks() cell did not report the wheel's install"
