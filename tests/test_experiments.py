"""``yolo9kit.runs()`` and ``plots.compare``: the run folders of real (toy-model) fit runs as one table, an
interrupted, a killed and a damaged folder among them, and their curves side by side."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_toys import ToyNet, make_batches, one_thread, toy_loss

from yolo9kit.config import TrainConfig
from yolo9kit.files import LOCK_NAME
from yolo9kit.train.fit import fit

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def _fit(project, name, **settings):
    settings = {"epochs": 3, "batch_size": 2, "accumulate_steps": 1, "amp": "off", "device": "cpu",
                "warmup_epochs": 0.0, "warmup_min_batches": 0, "progress_bar": False, **settings}
    config = TrainConfig(project=str(project), name=name, **settings)
    torch.manual_seed(0)
    epoch = {"n": 0}

    def validate(model):
        epoch["n"] += 1
        return {"precision": 0.5, "recall": 0.5, "map50": 0.1 * epoch["n"], "map50_95": 0.05 * epoch["n"],
                "fitness": 0.055 * epoch["n"]}

    return fit(ToyNet(), None, config, loss_fn=toy_loss, train_loader=make_batches(2, 2), validate_fn=validate)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Six run folders: three finished (batch 2 with seeds 0 and 1, batch 4), one interrupted, one killed, one
    damaged."""
    root = tmp_path_factory.mktemp("runs")
    _fit(root, "small")
    _fit(root, "small-again", seed=1)  # the same settings but for the seed
    _fit(root, "large", batch_size=4)

    def stop(record):
        if record.epoch == 1:
            raise KeyboardInterrupt("stop")

    _fit(root, "stopped", callbacks={"on_batch": stop})
    killed = _fit(root, "killed").save_dir
    (killed / "state.yaml").write_text("state: running\nwall_s: 3.0\n")  # what a SIGKILL leaves
    (killed / LOCK_NAME).write_text("999999999 " + __import__("socket").gethostname() + "\n")  # no such process
    damaged = _fit(root, "damaged").save_dir
    with (damaged / "results.csv").open("a") as f:
        f.write("3,0.5,garbage\n")  # a half-written row
    return root


def test_the_table_has_a_row_per_run_with_its_state_metrics_and_the_settings_that_differ(root):
    from yolo9kit import runs

    table = runs(root).set_index("run")
    assert set(table.index) == {"small", "small-again", "large", "stopped", "killed", "damaged"}
    # the runs whose settings differ only in the seed: their spread (the toy validation scores every seed alike)
    assert table.loc["small", "seed range"] == table.loc["small-again", "seed range"] == 0.0
    assert table["seed range"].isna().sum() == 4 and "seed" in table.columns
    assert table.loc["small", "state"] == "finished" and table.loc["small", "epochs"] == "3/3"
    assert table.loc["small", "best mAP50"] == pytest.approx(0.3) and table.loc["small", "mAP50-95"] == \
        pytest.approx(0.15)
    assert table.loc["small", "batch x accumulate"] == "2 x 1" and table.loc["large", "batch x accumulate"] == "4 x 1"
    assert table.loc["small", "wall time (s)"] > 0 and table.loc["small", "images/s"] > 0
    assert table.loc["stopped", "state"] == "interrupted" and table.loc["stopped", "epochs"] == "1/3"
    assert table.loc["killed", "state"] == "killed" and "process is gone" in table.loc["killed", "reason"]
    assert table.loc["damaged", "state"] == "damaged" and "results.csv line 5" in table.loc["damaged", "reason"]
    # the settings that differ, and only those: the batch; never the folder's name
    assert "batch_size" in table.columns and "name" not in table.columns and "lr0" not in table.columns
    assert list(table.columns[-2:]) == ["reason", "path"]


def test_the_cli_prints_the_table_and_a_missing_root_is_one_line(root, tmp_path):
    done = subprocess.run([sys.executable, "-m", "yolo9kit", "runs", str(root), "--csv", str(tmp_path / "t.csv")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "interrupted" in done.stdout and "damaged" in done.stdout and (tmp_path / "t.csv").stat().st_size > 0
    missing = subprocess.run([sys.executable, "-m", "yolo9kit", "runs", str(tmp_path / "nothing")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no such folder of runs" in missing.stderr and "Traceback" not in missing.stderr


def test_compare_draws_each_runs_curve_labelled_by_what_differs(root):
    from yolo9kit import runs
    from yolo9kit.plots import compare

    table = runs(root)
    chosen = table[table["run"].isin(["small", "large"])]
    fig = compare(chosen, metric="metrics/mAP50")
    lines = fig.axes[0].lines
    assert sorted(line.get_label() for line in lines) == ["batch_size=2", "batch_size=4"]
    assert all(list(line.get_xdata()) == [1, 2, 3] for line in lines)  # epochs counted from 1
    assert list(lines[0].get_ydata()) == pytest.approx([0.1, 0.2, 0.3])
    folders = compare([root / "small", root / "stopped"], metric="metrics/mAP50")  # run folders work too
    assert len(folders.axes[0].lines) == 2


def test_the_runs_viewer_draws_the_chosen_runs_and_the_chosen_metric(root):
    from yolo9kit.widgets import output_png, runs_viewer

    app = runs_viewer(root)
    assert set(app.controls) == {"runs", "metric"} and len(app.controls["runs"].value) == 4  # the four newest
    app.controls["runs"].value = ("small", "large")
    assert list(app.state["chosen"]["run"]) == ["large", "small"] and app.outputs["table"].value.count("<tr") == 3
    before = output_png(app.outputs["curves"])
    assert len(app.figures["curves"].axes[0].lines) == 2 and before is not None
    app.controls["metric"].value = "box loss"
    assert app.figures["curves"].axes[0].get_ylabel() == "train/box_loss"
    assert output_png(app.outputs["curves"]) != before
    with pytest.raises(ValueError, match="metric"):
        runs_viewer(root, metric="accuracy")


def _copy_run(root, name, to):
    return Path(shutil.copytree(root / name, to / name))


def test_the_csv_table_never_replaces_a_file_of_a_run_folder(root, tmp_path, capsys):
    from yolo9kit.cli import main

    run = _copy_run(root, "small", tmp_path)
    for name in ("results.csv", "settings.yaml"):
        target = run / name
        before = target.read_bytes()
        assert main(["runs", str(tmp_path), "--csv", str(target)]) == 2
        assert f"--csv {target} is a file of a run folder" in capsys.readouterr().err
        assert target.read_bytes() == before


def test_the_copies_in_an_mlflow_store_are_not_runs(root, tmp_path):
    """The default MLflow store inside the project copies results.csv, settings.yaml and state.yaml into
    mlartifacts/: the run is listed once, and has no seed range of its own copy."""
    from yolo9kit import runs

    run = _copy_run(root, "small", tmp_path)
    copy = tmp_path / "mlartifacts" / "1" / "0a1b2c" / "artifacts"
    copy.mkdir(parents=True)
    for name in ("results.csv", "settings.yaml", "state.yaml"):
        shutil.copy(run / name, copy / name)
    table = runs(tmp_path)
    assert table["run"].tolist() == ["small"] and table["seed range"].isna().all()


def test_a_record_with_aliases_or_over_a_mib_is_a_damaged_row_naming_it(root, tmp_path):
    """A few hundred bytes of nested aliases expand to gigabytes once read ("billion laughs"): refused unread,
    as is a record over 1 MiB; elsewhere (read_state) the refusal is an error naming the file."""
    from yolo9kit import runs
    from yolo9kit.files import RecordError
    from yolo9kit.train.records import read_state

    bomb = _copy_run(root, "small", tmp_path / "a")
    (bomb / "state.yaml").write_text('a: &a ["x", "x", "x"]\nb: &b [*a, *a, *a]\nstate: [*b, *b, *b]\n')
    huge = _copy_run(root, "small", tmp_path / "b")
    with (huge / "settings.yaml").open("a") as f:
        f.write("# " + "x" * (1 << 20) + "\n")
    table = runs(tmp_path).set_index("run")
    assert table.loc["a/small", "state"] == table.loc["b/small", "state"] == "damaged"
    assert "state.yaml unreadable" in table.loc["a/small", "reason"] and "aliases" in table.loc["a/small", "reason"]
    assert "settings.yaml unreadable" in table.loc["b/small", "reason"] and "MiB" in table.loc["b/small", "reason"]
    with pytest.raises(RecordError, match="state.yaml: line 2: .*aliases"):
        read_state(bomb)


def test_one_bad_folder_is_a_damaged_row_and_never_ends_the_table(root, tmp_path, capsys):
    """``epochs: abc`` in a settings.yaml (before: exit 2, no file named), a lock with a 20-digit pid (before:
    OverflowError, exit 1): each is one row, the others are listed as ever."""
    from yolo9kit import runs
    from yolo9kit.cli import main

    good = _copy_run(root, "small", tmp_path / "good")
    bad = _copy_run(root, "small", tmp_path / "bad")
    settings = bad / "settings.yaml"
    settings.write_text(settings.read_text().replace("\n  epochs: 3\n", "\n  epochs: abc\n", 1))
    (bad / "state.yaml").unlink()  # a run of an older kit: its state is inferred from the epochs
    locked = _copy_run(root, "killed", tmp_path)
    (locked / LOCK_NAME).write_text("9" * 20 + " " + __import__("socket").gethostname() + "\n")
    table = runs(tmp_path).set_index("run")
    assert table.loc["bad/small", "state"] == "damaged" and "settings.yaml" in table.loc["bad/small", "reason"]
    assert table.loc["killed", "state"] == "killed" and table.loc["good/small", "state"] == "finished"
    assert main(["runs", str(tmp_path)]) == 0 and str(good.relative_to(tmp_path)) in capsys.readouterr().out
