"""``tune``: train_dual.py's --evolve space, a study stopped in a trial and continued from that trial's last.pt, two
worker processes sharing one study, and best_hyp.yaml as a hyp file that train takes."""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import holding_the_lock
from train_toys import one_thread

from yolo9kit.config import LossConfig, TrainConfig
from yolo9kit.config.recipe import EVOLVE_SPACE, hyp_of, hyp_settings, read_hyp
from yolo9kit.models.checkpoint import SHAPES_WEIGHTS

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

# the keys of OFFICIAL_META that the search leaves out, and why (docs/training.md, tune)
LEFT_OUT = {
    "box, cls": "--evolve mutates them in YOLOv5's ranges (box 0.02-0.2 where YOLOv9 trains with 7.5); the official "
                "YOLOv9 loss ignores them (it hard-codes its gains), the kit's applies them",
    "obj, obj_pw, anchor_t, anchors": "YOLOv5's objectness and anchors: YOLOv9 has neither",
    "iou_t, fl_gamma, perspective, fliplr": "gain 0 in --evolve's table: never mutated",
    "dfl": "not in --evolve's table",
}

# train_dual.py's ``meta`` (WongKinYiu/yolov9, the --evolve branch of main()): key -> (gain, low, high)
OFFICIAL_META = {
    "lr0": (1, 1e-5, 1e-1), "lrf": (1, 0.01, 1.0), "momentum": (0.3, 0.6, 0.98), "weight_decay": (1, 0.0, 0.001),
    "warmup_epochs": (1, 0.0, 5.0), "warmup_momentum": (1, 0.0, 0.95), "warmup_bias_lr": (1, 0.0, 0.2),
    "box": (1, 0.02, 0.2), "cls": (1, 0.2, 4.0), "cls_pw": (1, 0.5, 2.0), "obj": (1, 0.2, 4.0),
    "obj_pw": (1, 0.5, 2.0), "iou_t": (0, 0.1, 0.7), "anchor_t": (1, 2.0, 8.0), "anchors": (2, 2.0, 10.0),
    "fl_gamma": (0, 0.0, 2.0), "hsv_h": (1, 0.0, 0.1), "hsv_s": (1, 0.0, 0.9), "hsv_v": (1, 0.0, 0.9),
    "degrees": (1, 0.0, 45.0), "translate": (1, 0.0, 0.9), "scale": (1, 0.0, 0.9), "shear": (1, 0.0, 10.0),
    "perspective": (0, 0.0, 0.001), "flipud": (1, 0.0, 1.0), "fliplr": (0, 0.0, 1.0), "mosaic": (1, 0.0, 1.0),
    "mixup": (1, 0.0, 1.0), "copy_paste": (1, 0.0, 1.0),
}


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    from yolo9kit.data import make_shapes

    return make_shapes(tmp_path_factory.mktemp("shapes"), n_train=8, n_val=4, imgsz=64, num_classes=3)


def _config(root, name, **settings):
    """Two epochs of the shipped shapes model, one AdamW step per batch and no warmup, so that the
    hyper-parameters change what it learns."""
    return TrainConfig(project=str(root), name=name, epochs=2, batch_size=4, nominal_batch_size=4, imgsz=64,
                       warmup_epochs=0.0, workers=0, device="cpu", val=False, plots=False, progress_bar=False,
                       **settings)


@pytest.fixture
def fake_fit(monkeypatch):
    """``fit`` replaced by a quick stand-in that holds the run folder's lock as fit does, writes best.pt and last.pt
    and scores ``fitness(config)`` (lr0); ``calls`` gets the config of each trial, ``raises(config)`` an exception to
    raise instead."""
    from yolo9kit.files import FolderLock

    fake = SimpleNamespace(calls=[], raises=lambda config: None, fitness=lambda config: config.optim.lr0)

    def fit(model, data, config):
        run = Path(config.run.project) / config.run.name
        run.mkdir(parents=True, exist_ok=True)
        lock = FolderLock(run).acquire()
        try:
            fake.calls.append(config)
            error = fake.raises(config)
            if error is not None:
                raise error
            (run / "weights").mkdir(exist_ok=True)
            for name in ("best.pt", "last.pt"):
                (run / "weights" / name).write_bytes(b"weights")
        finally:
            lock.release()
        return SimpleNamespace(best_fitness=fake.fitness(config), interrupted=False, epochs_completed=config.epochs)

    monkeypatch.setattr(importlib.import_module("yolo9kit.train.fit"), "fit", fit)
    return fake


def _study(folder):
    import optuna

    return optuna.load_study(study_name=folder.name, storage=f"sqlite:///{folder / 'study.db'}")


def test_the_space_is_the_limits_evolve_mutates_of_what_yolov9_trains_with():
    mutated = {k for k, (gain, _, _) in OFFICIAL_META.items() if gain > 0}
    for key, bounds in EVOLVE_SPACE.items():
        assert key in mutated and bounds == OFFICIAL_META[key][1:], key
    left_out = {k.strip() for keys in LEFT_OUT for k in keys.split(",")}
    assert set(OFFICIAL_META) <= set(EVOLVE_SPACE) | left_out
    # every searched key reaches the settings a run trains with (hyp_of reads them back)
    base = TrainConfig()
    for key, (low, high) in EVOLVE_SPACE.items():
        value = (low + high) / 2
        assert hyp_of(base.replace(**hyp_settings({key: value}, base.optim.loss)))[key] == pytest.approx(value), key


def test_bad_spaces_and_counts_are_refused_in_one_line(shapes, tmp_path):
    from yolo9kit import tune

    config = _config(tmp_path, "bad")
    for space, match in (({"lr0": (0.1, 0.01)}, "low < high"), ({"obj": (0.1, 1.0)}, "key of a hyp file"),
                         (["lr0", "anchors"], "--evolve's space"), ({"lr0": (0.0, 0.1)}, "log scale")):
        with pytest.raises(ValueError, match=match):
            tune("yolov9-t", shapes, config, space=space)
    with pytest.raises(ValueError, match="trials=0"):
        tune("yolov9-t", shapes, config, trials=0)
    with pytest.raises(ValueError, match="resume is for one run"):
        tune("yolov9-t", shapes, config.replace(resume=True))
    assert not (tmp_path / "bad").exists()
    done = subprocess.run([sys.executable, "-m", "yolo9kit", "tune", "--data", str(shapes), "--space", "anchors"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "invalid choice: 'anchors'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_stopped_study_continues_its_stopped_trial_from_last_pt(shapes, tmp_path):
    from yolo9kit import runs, tune

    ends = {"n": 0}

    def stop_in_the_second_trial(record):
        ends["n"] += 1
        if ends["n"] == 3:  # trial 0 ends its two epochs, trial 1 its first
            raise KeyboardInterrupt

    space = {"lr0": (1e-4, 1e-2), "mosaic": (0.0, 1.0)}
    config = _config(tmp_path, "study")
    stopped = tune(SHAPES_WEIGHTS, shapes, config.replace(callbacks={"on_epoch_end": stop_in_the_second_trial}),
                   trials=3, space=space)
    folder = tmp_path / "study"
    assert stopped.interrupted and stopped.folder == folder
    table = stopped.trials.set_index("trial")
    assert list(table["state"]) == ["complete", "fail", "waiting"]
    assert table.loc[0, ["lr0", "mosaic"]].tolist() == pytest.approx([0.0015, 0.5])  # the first trial: the study's own
    assert table.loc[2, "continues"] == 1 and table.loc[2, "run"] == "trial-1"
    assert (folder / "trial-1" / "weights" / "last.pt").is_file()

    done = tune(SHAPES_WEIGHTS, shapes, config, trials=3, space=space)
    assert not done.interrupted
    table = done.trials.set_index("trial")
    assert (table["state"] == "complete").sum() == 3 and table.loc[1, "state"] == "fail"
    assert table.loc[2, ["lr0", "mosaic"]].tolist() == table.loc[1, ["lr0", "mosaic"]].tolist()
    assert table.loc[2, "run"] == "trial-1"
    # the stopped trial went on from its last.pt: its first epoch is the one trained before the stop
    import pandas as pd

    rows = pd.read_csv(folder / "trial-1" / "results.csv")
    assert list(rows["epoch"]) == [0, 1]
    listed = runs(folder).set_index("run")
    assert set(listed.index) == {"trial-0", "trial-1", "trial-3"} and set(listed["state"]) == {"finished"}
    assert listed.loc["trial-1", "lr0"] == pytest.approx(table.loc[1, "lr0"])

    # best_hyp.yaml: the best trial's values of the searched keys, the study's own of the rest; train takes it
    complete = table[table["state"] == "complete"]
    best = complete.sort_values(["fitness"], ascending=False, kind="stable").iloc[0]
    assert done.best_fitness == pytest.approx(complete["fitness"].max()) and done.best_run == folder / best["run"]
    values = read_hyp(done.hyp_file)
    assert values["lr0"] == pytest.approx(best["lr0"], rel=1e-5) and values["mosaic"] == pytest.approx(
        best["mosaic"], rel=1e-5)
    own = hyp_of(TrainConfig(**hyp_settings(values, LossConfig())))
    assert own["momentum"] == 0.937 and own["mixup"] == 0.0  # the short recipe's, as the study trained
    # keep_weights="best": the weights of the best trial only
    assert {p.parent.name for p in folder.glob("*/weights")} == {best["run"]}

    with pytest.raises(ValueError, match=r"other settings: .*epochs 2 \(now 3\)"):
        tune(SHAPES_WEIGHTS, shapes, config.replace(epochs=3), trials=3, space=space)


@pytest.mark.slow
def test_two_worker_processes_share_one_study(shapes, tmp_path):
    import optuna

    command = [sys.executable, "-m", "yolo9kit", "tune", "--data", str(shapes), "--model", str(SHAPES_WEIGHTS),
               "--epochs", "1", "--batch-size", "4", "--imgsz", "64", "--workers", "0", "--device", "cpu",
               "--no-plots", "--noval", "--trials", "4", "--space", "lr0", "--project", str(tmp_path),
               "--name", "shared"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two processes on two cores
    workers = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
               for _ in range(2)]
    outputs = [w.communicate(timeout=900)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    study = optuna.load_study(study_name="shared", storage=f"sqlite:///{tmp_path / 'shared' / 'study.db'}")
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert 4 <= len(complete) <= 5  # a worker that starts the last trial while the other does makes one more
    assert len({t.user_attrs["worker"] for t in complete}) == 2  # both worked on the one study
    assert len({t.user_attrs["run"] for t in complete}) == len(complete)
    assert all((tmp_path / "shared" / t.user_attrs["run"] / "results.csv").is_file() for t in complete)
    assert "best_hyp.yaml" in outputs[0] + outputs[1] and (tmp_path / "shared" / "best_hyp.yaml").is_file()


def test_five_failed_trials_in_a_row_stop_the_study(shapes, tmp_path, monkeypatch):
    from yolo9kit import tune
    from yolo9kit.train.guards import NonFiniteLossError

    def diverges(model, data, config):  # what fit raises after MAX_NONFINITE_BATCHES non-finite losses
        raise NonFiniteLossError(10, 0, 9)

    monkeypatch.setattr(importlib.import_module("yolo9kit.train.fit"), "fit", diverges)
    with pytest.raises(RuntimeError, match="trials 0, 1, 2, 3, 4 failed in a row"):
        tune(SHAPES_WEIGHTS, shapes, _config(tmp_path, "diverges"), trials=2, space=["lr0"])
    import optuna

    study = optuna.load_study(study_name="diverges", storage=f"sqlite:///{tmp_path / 'diverges' / 'study.db'}")
    assert [t.state.name for t in study.trials] == ["FAIL"] * 5


@pytest.mark.parametrize("outside", ["../../victim", "absolute"])
def test_a_run_name_in_the_storage_that_leads_out_of_the_study_is_refused(shapes, tmp_path, fake_fit, outside):
    import optuna

    from yolo9kit import tune

    config = _config(tmp_path / "p", "s")
    tune(SHAPES_WEIGHTS, shapes, config, trials=1, space=["lr0"])
    victim = tmp_path / "victim" / "weights"
    victim.mkdir(parents=True)
    (victim / "best.pt").write_bytes(b"another run's weights")
    # a worse trial, what any worker of a shared storage can write, whose weights the pruning would remove
    _study(tmp_path / "p" / "s").add_trial(optuna.trial.create_trial(
        params={"lr0": 1e-4}, distributions={"lr0": optuna.distributions.FloatDistribution(1e-5, 0.1, log=True)},
        value=-1.0, user_attrs={"run": str(tmp_path / "victim") if outside == "absolute" else outside}))
    with pytest.raises(ValueError, match=r"the run folder of trial 1 '.*victim' is not a name inside"):
        tune(SHAPES_WEIGHTS, shapes, config, trials=3, space=["lr0"])
    assert (victim / "best.pt").read_bytes() == b"another run's weights" and len(fake_fit.calls) == 1


def test_a_study_is_its_data_set_too(tmp_path, fake_fit):
    from yolo9kit import tune
    from yolo9kit.data import make_shapes

    four = make_shapes(tmp_path / "four", n_train=4, n_val=2, imgsz=64, num_classes=4)
    two = make_shapes(tmp_path / "two", n_train=4, n_val=2, imgsz=64, num_classes=2)
    config = _config(tmp_path, "s")
    tune(SHAPES_WEIGHTS, four, config, trials=1, space=["lr0"])
    record = (tmp_path / "s" / "tune.yaml").read_text()
    with pytest.raises(ValueError, match=r"other settings: data \{'names': \[.*\], 'train images': 4"):
        tune(SHAPES_WEIGHTS, two, config, trials=2, space=["lr0"])
    assert (tmp_path / "s" / "tune.yaml").read_text() == record and len(fake_fit.calls) == 1


def test_best_hyp_trains_the_recipe_the_study_found_it_with(shapes, tmp_path, fake_fit):
    from yolo9kit.cli import build_parser, main
    from yolo9kit.cli.train import config_from_args
    from yolo9kit.config.recipe import choose_recipe

    flags = ["--data", str(shapes), "--epochs", "2", "--batch-size", "4", "--imgsz", "64", "--workers", "0",
             "--device", "cpu", "--noval", "--no-plots"]
    fake_fit.fitness = lambda config: float(config.run.name == "trial-1")  # a sampled trial is the best
    assert main(["tune", *flags, "--cos-lr", "--space", "lr0", "mosaic", "--trials", "2", "--project", str(tmp_path),
                 "--name", "s"]) == 0
    best = fake_fit.calls[1]
    hyp = tmp_path / "s" / "best_hyp.yaml"

    def trained(config):  # what fit trains with, but where it writes
        config = choose_recipe(config, 8)[0]
        return {**config.to_dict(), "hyp": config.pipeline.augment_hyp, "project": 0, "name": 0, "exist_ok": 0,
                "resume": 0, "log_weights": 0}

    # the study's flags but --cos-lr: the file holds the schedule, the optimizer, the nominal batch ... too
    train = config_from_args(build_parser().parse_args(["train", *flags, "--hyp", str(hyp)]))
    assert trained(train) == trained(best) and train.step.optimizer == "AdamW" and train.optim.schedule == "cosine"
    sgd = config_from_args(build_parser().parse_args(["train", *flags, "--hyp", str(hyp), "--optimizer", "SGD"]))
    assert sgd.step.optimizer == "SGD" and sgd.optim.lr0 == best.optim.lr0  # a flag given wins
    bad = tmp_path / "bad_hyp.yaml"
    bad.write_text(hyp.read_text().replace("optimizer: AdamW", "optimizer: Adam W"))
    with pytest.raises(ValueError, match=r"bad_hyp.yaml: optimizer: \S*='Adam W': expected one of"):
        config_from_args(build_parser().parse_args(["train", *flags, "--hyp", str(bad)]))


def test_a_folder_whose_storage_lost_its_study_is_refused(shapes, tmp_path, fake_fit):
    from yolo9kit import tune

    config = _config(tmp_path, "s")
    tune(SHAPES_WEIGHTS, shapes, config, trials=1, space=["lr0"])
    best = (tmp_path / "s" / "best_hyp.yaml").read_bytes()
    (tmp_path / "s" / "study.db").write_bytes(b"")
    with pytest.raises(ValueError, match=r"holds the study 's' \(tune.yaml\), which its storage does not hold"):
        tune(SHAPES_WEIGHTS, shapes, config, trials=2, space=["lr0"])
    assert (tmp_path / "s" / "best_hyp.yaml").read_bytes() == best and len(fake_fit.calls) == 1
    assert [p.name for p in (tmp_path / "s").glob("trial-*")] == ["trial-0"]


def test_a_refused_tune_leaves_nothing_behind(shapes, tmp_path, fake_fit, capsys):
    from yolo9kit.cli import main

    project = tmp_path / "p"
    flags = ["--model", str(SHAPES_WEIGHTS), "--epochs", "2", "--space", "lr0", "--trials", "1", "--project",
             str(project), "--name", "s"]
    assert main(["tune", "--data", str(tmp_path / "typo.yaml"), *flags]) == 2
    unreachable = f"sqlite:///{tmp_path / 'no' / 'such' / 'study.db'}"
    assert main(["tune", "--data", str(shapes), *flags, "--storage", unreachable]) == 2
    assert "cannot be opened" in capsys.readouterr().err
    fake_fit.raises = lambda config: ValueError("refused")  # e.g. a model that does not build
    assert main(["tune", "--data", str(shapes), *flags]) == 2
    assert not project.exists() and not (tmp_path / "no").exists()
    fake_fit.raises = lambda config: None
    assert main(["tune", "--data", str(shapes), *flags]) == 0  # the corrected command: a new study
    assert fake_fit.calls[-1].optim.lr0 == 0.0015  # its first trial trains the study's own values


def test_a_trial_whose_run_folder_is_in_use_is_queued_again(shapes, tmp_path, fake_fit):
    from yolo9kit import tune
    from yolo9kit.files import FolderInUseError

    config = _config(tmp_path, "s")
    fake_fit.raises = lambda config: KeyboardInterrupt() if config.run.name == "trial-1" else None
    assert tune(SHAPES_WEIGHTS, shapes, config, trials=2, space=["lr0"]).interrupted
    fake_fit.raises = lambda config: None
    other = holding_the_lock(tmp_path / "s" / "trial-1")  # a live run of another worker in the trial's folder
    try:
        with pytest.raises(FolderInUseError):
            tune(SHAPES_WEIGHTS, shapes, config, trials=2, space=["lr0"])
    finally:
        other.kill()
        other.wait()
    table = tune(SHAPES_WEIGHTS, shapes, config, trials=2, space=["lr0"]).trials.set_index("trial")
    assert list(table["state"]) == ["complete", "fail", "fail", "complete"]
    assert table.loc[3, "run"] == "trial-1" and table.loc[3, "continues"] == 1
    assert table.loc[3, "lr0"] == table.loc[1, "lr0"]


def test_a_killed_worker_rerun_on_its_host_continues_its_trial_at_once(shapes, tmp_path, fake_fit):
    import optuna

    from yolo9kit import tune

    config = _config(tmp_path, "s")
    tune(SHAPES_WEIGHTS, shapes, config, trials=1, space=["lr0"])
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    killed = _study(tmp_path / "s").ask({"lr0": optuna.distributions.FloatDistribution(1e-5, 0.1, log=True)})
    killed.set_user_attr("run", "trial-1")
    killed.set_user_attr("worker", f"{socket.gethostname()}:{gone.pid}")  # its heartbeat is younger than GRACE_S
    last = tmp_path / "s" / "trial-1" / "weights" / "last.pt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"its last epoch")
    table = tune(SHAPES_WEIGHTS, shapes, config, trials=2, space=["lr0"]).trials.set_index("trial")
    assert list(table["state"]) == ["complete", "fail", "complete"] and fake_fit.calls[-1].run.resume == str(last)
    assert table.loc[2, "run"] == "trial-1" and table.loc[2, "continues"] == 1
    assert table.loc[2, "lr0"] == table.loc[1, "lr0"]


@pytest.mark.slow
def test_trials_whose_weights_are_removed_send_none_to_mlflow(shapes, tmp_path):
    from mlflow.tracking import MlflowClient

    from yolo9kit import tune

    done = tune(SHAPES_WEIGHTS, shapes, _config(tmp_path, "s", loggers=("mlflow",)), trials=2, space=["lr0"])
    assert {p.parent.parent for p in tmp_path.rglob("*.pt")} == {done.best_run}  # nothing in mlartifacts
    client = MlflowClient(f"sqlite:///{tmp_path / 's' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(str(tmp_path / "s")).experiment_id])
    assert len(runs) == 2 and all(client.list_artifacts(run.info.run_id) for run in runs)
    assert not any(client.list_artifacts(run.info.run_id, "weights") for run in runs)
