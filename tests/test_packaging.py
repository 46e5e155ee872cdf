"""The install story: pyproject and environment.yml agree, the package imports cheaply, CI calls the
README's test command."""

from __future__ import annotations

import re
import subprocess
import sys

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

    overrides = json.loads((REPO / "notebooks" / "overrides.json").read_text())
    assert overrides["@jupyter-widgets/jupyterlab-manager:plugin"]["saveState"] is True
    makefile = (REPO / "Makefile").read_text()
    assert "notebooks/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json" in makefile
