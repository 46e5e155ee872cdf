# yolo9kit: every target sets itself up (creates .venv, installs the package with its extras) and is
# safe to run twice. Override the interpreter with `make PYTHON=python3.12 ...`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.yolo9kit-installed

.PHONY: demo test test-fast lab lint clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Reinstall only when the dependency list changes (editable install: code edits need nothing). pip compiles the
# modules on one core, compileall on all of them (a file that does not compile is left to its import, as pip does).
# ipywidgets 7.7 (Colab's) goes into a folder of its own: tests/test_widgets.py runs the widget tests again with it
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --no-compile -e ".[notebooks,dev]"
	$(PY) -m pip install --quiet --no-deps --upgrade --target $(VENV)/ipywidgets7 "ipywidgets>=7.7,<7.8" ipython_genutils
	$(PY) -m compileall -qq -j 0 $(VENV)/lib || true
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m yolo9kit demo

# two workers of one thread each (tests/conftest.py): two cores stay busy while the other worker waits on a
# subprocess, a browser or the Python interpreter; a file's tests stay on one worker (its module fixtures), and
# the files go out in conftest's order (slow ones first). compileall: the kit's subprocesses (CLI, kernels, DDP
# ranks) read compiled modules even where PYTHONDONTWRITEBYTECODE is set
test: $(STAMP)
	$(PY) -m compileall -qq -j 0 yolo9kit tests
	$(PY) -m pytest -q -ra -n 2 --dist loadfile --no-loadscope-reorder tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -ra -m "not slow and not browser" tests

# saveState: a saved notebook keeps its widgets' state, so it reopens with the figures instead of
# "Error displaying widget: model not found" (notebooks/.jupyter/overrides.json, JupyterLab's settings
# overrides, hidden from the file browser). As root (containers, cloud GPU machines) JupyterLab refuses to
# start without --allow-root.
lab: $(STAMP)
	mkdir -p $(VENV)/share/jupyter/lab/settings
	cp notebooks/.jupyter/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root,) notebooks/

lint: $(STAMP)
	$(VENV)/bin/ruff check yolo9kit tests benchmarks

clean-venv:
	rm -rf $(VENV)
