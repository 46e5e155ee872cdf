"""Widget front ends: setting a control's value redraws the outputs (no kernel, no browser).

ipywidgets run their observers synchronously in plain Python, so a test sets ``control.value`` and
checks that the figure (its title, its data) and the PNG in the ``Output`` widget changed.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ipywidgets")
matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")


def _has(module: str, *names: str) -> bool:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return False
    return all(hasattr(mod, n) for n in names)


def needs(module: str, *names: str):
    return pytest.mark.skipif(not _has(module, *names), reason=f"{module}.{'/'.join(names)} is not available yet")


# -- training dashboard ----------------------------------------------------------------------------

def _step(i: int, **changes):
    """The ``BatchRecord`` that ``train_one_epoch`` would pass to ``on_batch`` at batch ``ni = i``."""
    from yolo9kit.train.records import BatchRecord

    values = dict(epoch=0, batch_index=i, ni=i, optimizer_steps=i // 2, box_loss=3.0 - 0.1 * i, cls_loss=2.0,
                  dfl_loss=1.5, lr_bias=0.01 * i, lr_weight=0.01, lr_norm_weight=0.01, momentum=0.9,
                  accumulate_steps=2, micro_batch_size=4, peak_allocated=1024**3 * (1 + i), images_per_s=10.0 + i)
    return BatchRecord(**{**values, **changes})


def _epoch(epoch: int, **changes):
    """An ``EpochRecord`` of an epoch that was not validated, unless ``changes`` say otherwise."""
    from yolo9kit.train.records import EpochRecord

    values = dict(epoch=epoch, box_loss=2.5, cls_loss=2.0, dfl_loss=1.5, lr_bias=0.01, lr_weight=0.01,
                  lr_norm_weight=0.01, precision=None, recall=None, map50=None, map50_95=None, fitness=None,
                  peak_allocated=None, images_per_s=12.5, epoch_s=4.0)
    return EpochRecord(**{**values, **changes})


def test_dashboard_records_steps_and_redraws_with_the_new_values():
    from yolo9kit.widgets import train_dashboard

    dash = train_dashboard("run", min_interval_s=0.0, show=False)
    dash.on_batch(_step(1))
    first = dash.figure
    dash.on_batch(_step(2))
    assert dash.redraws == 2 and dash.figure is not first
    assert dash.history == [_step(1), _step(2)]  # the records themselves
    ax_loss, ax_lr, ax_mem, ax_speed = dash.figure.axes
    box = [line for line in ax_loss.lines if line.get_label() == "box"][0]
    assert list(box.get_ydata()) == pytest.approx([2.9, 2.8])
    lines = {line.get_label(): list(line.get_ydata()) for line in ax_lr.lines}
    assert lines["biases"] == pytest.approx([0.01, 0.02]) and lines["weights"] == pytest.approx([0.01, 0.01])
    assert list(ax_mem.lines[0].get_ydata()) == pytest.approx([2.0, 3.0])  # GiB
    assert ax_mem.get_title() == "peak VRAM in the epoch (GiB)" and not ax_mem.texts
    assert list(ax_speed.lines[0].get_ydata()) == pytest.approx([11.0, 12.0])
    assert list(box.get_xdata()) == [2, 3]  # x is the batch counted from 1 (ni + 1), not the optimizer step
    assert "training" not in dash.status_text() and "epoch 1, batch 3" in dash.status_text()
    assert "batch 3" in dash.status_text() and "12.0 img/s" in dash.status_text()
    assert "peak VRAM 3.00 GiB" in dash.status_text()


def test_dashboard_status_names_the_run_s_epochs_and_the_time_after_this_one():
    """The epochs as the run has them (a time budget sets them after the first), and while it trains, the epochs
    after this one at the pace of the finished ones, validation included."""
    from types import SimpleNamespace

    from yolo9kit.widgets import train_dashboard

    dash = train_dashboard(min_interval_s=3600.0, show=False)
    dash.on_epoch_end(_epoch(0, epoch_s=60.0, val_s=15.0))
    dash.on_batch(_step(12, epoch=1, epochs=5))
    assert "epoch 2 of 5, batch 13" in dash.status_text() and "after this epoch" not in dash.status_text()  # idle
    dash._job = SimpleNamespace(result=None, error=None)  # a run training in its thread
    assert dash.status_text().endswith(", about 3 min 45 s after this epoch")  # 3 epochs of 60 + 15 s


def test_dashboard_shows_the_first_batch_as_a_point_in_every_panel():
    from yolo9kit.widgets import train_dashboard

    dash = train_dashboard(min_interval_s=0.0, show=False)
    dash.on_batch(_step(0))
    for ax in dash.figure.axes:
        assert ax.lines, ax.get_title()
        for line in ax.lines:  # one point is no line: a marker has to show it
            assert len(line.get_xdata()) == 1 and line.get_marker() == "o", ax.get_title()


def test_an_empty_dashboard_says_it_waits_and_numbers_no_axis():
    from yolo9kit.widgets import train_dashboard
    from yolo9kit.widgets.panel import draw_dashboard

    dash = train_dashboard(min_interval_s=0.0, show=False)
    for ax in draw_dashboard(dash).axes:
        assert list(ax.get_xticks()) == list(ax.get_yticks()) == [], ax.get_title()  # not -0.04 ... 0.04
        assert any(t.get_text() == "waiting for the first batch" for t in ax.texts)
    dash.on_batch(_step(0))
    assert all(len(ax.get_yticks()) > 0 for ax in dash.figure.axes)  # numbered once there is a value


def test_dashboard_throttles_redraws_but_always_draws_at_epoch_end():
    from yolo9kit.widgets import train_dashboard

    dash = train_dashboard(min_interval_s=3600.0, show=False)
    for i in range(1, 6):
        dash.on_batch(_step(i))
    assert dash.redraws == 1 and len(dash.history) == 5
    dash.on_epoch_end(_epoch(0, map50=0.5, map50_95=0.25, precision=0.6, recall=0.4, fitness=0.275,
                             peak_allocated=3 * 1024**3, epoch_s=75.0, data_s=30.0, val_s=12.0))
    assert dash.redraws == 2 and dash.epochs[-1].map50 == 0.5
    table = dash.epoch_table()
    assert list(table.columns) == ["epoch", "box", "cls", "dfl", "P", "R", "mAP50", "mAP50-95", "img/s", "time",
                                   "data", "val", "peak VRAM"]
    assert table.iloc[0]["time"] == "1 min 15 s" and table.iloc[0]["peak VRAM"] == "3.00 GiB"  # readable units
    assert table.iloc[0]["data"] == "40%" and table.iloc[0]["val"] == "12.0 s"  # waiting for data: 30 of 75 s
    assert len(dash.figure.axes[0].lines[0].get_xdata()) == 5
    shown = dash.container.children[2].value  # the panel's table: the values, scrolling rather than cut off
    assert "<td>0.5</td>" in shown and "overflow-x:auto" in shown


def test_dashboard_table_leaves_out_metrics_of_epochs_not_validated():
    from yolo9kit.widgets import train_dashboard

    dash = train_dashboard(show=False)
    dash.on_epoch_end(_epoch(0))
    assert list(dash.epoch_table().columns) == ["epoch", "box", "cls", "dfl", "img/s", "time", "data"]  # no "val"
    dash.on_epoch_end(_epoch(1, map50=0.5))
    assert dash.epoch_table()["mAP50"].tolist()[1] == 0.5


def test_dashboard_shows_process_memory_when_trained_off_cuda():
    from yolo9kit.widgets import train_dashboard

    dash = train_dashboard(min_interval_s=0.0, show=False)
    dash.on_batch(_step(0, peak_allocated=None))  # what a CPU run reports
    dash.on_batch(_step(1, peak_allocated=None))
    ax_mem = dash.figure.axes[2]
    assert dash.series("peak_allocated") == ([], [])
    assert sorted(dash.process_memory) == [0, 1] and min(dash.process_memory.values()) > 10 * 1024**2
    assert ax_mem.get_title() in ("process memory, resident set (MiB)", "process memory, resident set (GiB)")
    assert len(ax_mem.lines[0].get_xdata()) == 2  # not an empty axis
    assert [t.get_text() for t in ax_mem.texts] == ["VRAM is measured on CUDA only"]
    assert "process memory" in dash.status_text()
    dash.on_epoch_end(_epoch(0))
    assert dash.epoch_table()["peak RSS"].iloc[0].endswith("iB")
    assert set(dash.callbacks) == {"on_batch", "on_epoch_end"}


def test_dashboard_series_are_record_fields():
    from yolo9kit.widgets import train_dashboard

    dash = train_dashboard(min_interval_s=3600.0, show=False)
    dash.on_batch(_step(0))
    assert dash.series("lr_norm_weight") == ([0], [0.01])
    with pytest.raises(AttributeError, match="box"):
        dash.series("box")  # no alternative spellings: the field is box_loss


def test_dashboard_interrupts_once_at_the_requested_batch():
    from yolo9kit.widgets import train_dashboard

    dash = train_dashboard(min_interval_s=3600.0, interrupt_at=4, show=False)  # after 4 batches: ni 0 to 3
    dash.on_batch(_step(2))
    with pytest.raises(KeyboardInterrupt, match="batch 4"):
        dash.on_batch(_step(3))
    dash.on_batch(_step(2, box_loss=9.0))  # the resumed run restarts the accumulation window at batch 2
    dash.on_batch(_step(3))
    assert [r.ni for r in dash.history] == [2, 3, 2, 3] and dash.interrupt_at is None
    assert dash.resumes == [2]
    assert dash.series("box_loss") == ([2, 3], [9.0, pytest.approx(2.7)])  # latest value per batch, in order


def test_dashboard_panel_has_buttons_plot_and_table():
    from yolo9kit.widgets import output_png, train_dashboard

    dash = train_dashboard(show=False)
    stop, resume = dash.controls["stop"], dash.controls["resume"]
    assert (stop.description, resume.description) == ("stop", "resume")
    assert stop.disabled and resume.disabled  # nothing runs, nothing to resume
    stop.click()  # a click with no run is ignored: it must not stop the next run at its first batch
    assert not dash.stop_requested
    assert output_png(dash._widgets["plot"]) is not None  # the empty panels, before the first batch
    dash.on_batch(_step(0))
    dash.on_epoch_end(_epoch(0))
    assert "<table" in dash._widgets["table"].value and "epoch 1, batch 1" in dash._widgets["status"].value
    assert dash.epoch_table()["epoch"].tolist() == [1]  # counted from 1, as the progress bar and results.png


def _toy_run(tmp_path, dash, on_batch=None, epochs=2):
    """``dash.fit`` on the toy model of the fit tests: 5 batches of 2 images per epoch, no data folder."""
    import asyncio

    import torch
    from train_toys import ToyNet, make_batches, toy_loss

    from yolo9kit.config import TrainConfig

    torch.manual_seed(0)
    config = TrainConfig(epochs=epochs, batch_size=2, accumulate_steps=2, amp="off", device="cpu",
                         warmup_epochs=0.0, warmup_min_batches=3, project=str(tmp_path / "runs"), name="dash",
                         callbacks={"on_batch": on_batch} if on_batch else None)
    return asyncio.run(dash.fit(ToyNet(), None, config, loss_fn=toy_loss, train_loader=make_batches(5, 2),
                                validate_fn=lambda model: {"map50": 0.5, "map50_95": 0.25, "fitness": 0.275}))


@pytest.mark.slow
def test_dashboard_stop_button_stops_fit_and_resume_button_finishes_the_run(tmp_path, capfd, callbacks_every_batch):
    import asyncio

    from yolo9kit.widgets import train_dashboard

    dash = train_dashboard(min_interval_s=3600.0, show=False)
    seen = []

    def press_stop_at_third_batch(record):  # a user's own callback, kept beside the dashboard's
        seen.append(record.ni)
        if len(seen) == 3:
            dash.controls["stop"].click()  # what the kernel does when the click arrives during training

    first = _toy_run(tmp_path, dash, press_stop_at_third_batch)
    assert first.interrupted and first.last.is_file() and [r.ni for r in dash.history] == [0, 1, 2]
    assert dash.controls["stop"].disabled and not dash.controls["resume"].disabled
    assert any(m.startswith("stopped after batch 3 (epoch 1)") and str(first.last) in m for m in dash.messages)
    assert not [m for m in dash.messages if m.startswith("warning")]  # a requested stop is no warning
    assert "interrupted" not in capfd.readouterr().err  # fit's log record went to the panel, not to stderr

    dash.controls["resume"].click()  # starts the resumed run in the background and returns
    assert dash.running or dash.result is not first
    second = asyncio.run(dash.resume())  # waits for the button's run instead of starting another
    assert not second.interrupted and second.epochs_completed == 2 and second.save_dir == first.save_dir
    assert set(r.ni for r in dash.history) == set(range(10)) and dash.resumes == [2]
    assert dash.controls["resume"].disabled and len(dash.epochs) == 2
    assert asyncio.run(dash.resume()) is second  # the run is complete: resume returns it, trains nothing
    dash.controls["resume"].click()
    assert dash.messages[-1].startswith("warning: nothing to resume: the last run finished all 2 epochs")


_KERNEL_SETUP = """
from train_toys import ToyNet, make_batches, toy_loss
from yolo9kit.config import TrainConfig
from yolo9kit.widgets import train_dashboard
dash = train_dashboard("toy", min_interval_s=0.0, show=False)
config = TrainConfig(epochs=1000, batch_size=2, amp="off", device="cpu", warmup_epochs=0.0, project="runs", name="k")
run = dict(loss_fn=toy_loss, train_loader=make_batches(5, 2), validate_fn=lambda model: {"fitness": 0.0})
print(dash.controls["stop"].model_id)
"""


class _Kernel:
    """A real ipykernel driven over its protocol, as JupyterLab drives it."""

    def __init__(self, cwd):
        import os

        from conftest import REPO
        from jupyter_client.manager import start_new_kernel

        path = os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])
        self.manager, self.client = start_new_kernel(kernel_name="python3", cwd=str(cwd),
                                                     env={**os.environ, "PYTHONPATH": path})

    def reply(self, msg_id, timeout=240):
        """The execute_reply of ``msg_id`` (replies to other requests are skipped)."""
        while True:
            msg = self.client.get_shell_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"]

    def wait_for_iopub(self, predicate, timeout=240):
        """Read IOPub until a message satisfies ``predicate``; returns the stream text seen on the way."""
        import time

        text, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.client.get_iopub_msg(timeout=timeout)
            if msg["msg_type"] == "stream":
                text.append(msg["content"]["text"])
            if predicate(msg):
                return "".join(text)
        raise AssertionError(f"no such IOPub message within {timeout} s; streams: {''.join(text)}")

    def training(self):
        """Wait until the dashboard's status line says it trains (its widget state update on IOPub)."""
        def drawn(msg):
            state = msg["content"].get("data", {}).get("state", {}) if msg["msg_type"] == "comm_msg" else {}
            return "training: epoch" in str(state.get("value", ""))

        self.wait_for_iopub(drawn)


@pytest.mark.slow
def test_dashboard_stop_works_while_the_training_cell_runs_in_a_real_kernel(tmp_path):
    """The point of ``await dash.fit``: the kernel handles the stop click (and Kernel > Interrupt) while the cell
    that trains is still running, and a cell queued behind it (Run All) runs after it, in order."""
    pytest.importorskip("jupyter_client")
    kernel = _Kernel(tmp_path)
    try:
        client = kernel.client
        setup = client.execute(_KERNEL_SETUP)
        stop_id = kernel.wait_for_iopub(lambda m: m["msg_type"] == "stream").strip().splitlines()[-1]
        assert kernel.reply(setup)["status"] == "ok"

        train = client.execute("first = await dash.fit(ToyNet(), None, config, **run)")
        queued = client.execute("print('queued cell:', first.interrupted, dash.messages[-1])")
        kernel.training()
        click = {"comm_id": stop_id, "data": {"method": "custom", "content": {"event": "click"}}}
        client.shell_channel.send(client.session.msg("comm_msg", click))  # what the button's view sends
        assert kernel.reply(train)["status"] == "ok"
        assert kernel.reply(queued)["status"] == "ok"
        printed = kernel.wait_for_iopub(lambda m: m["msg_type"] == "stream" and "queued" in m["content"]["text"])
        assert "queued cell: True stopped after batch" in printed

        resumed = client.execute("second = await dash.resume()")
        kernel.training()
        kernel.manager.interrupt_kernel()  # Kernel > Interrupt: the same clean stop, no traceback
        assert kernel.reply(resumed)["status"] == "ok"
        check = client.execute("print('resumed:', second.interrupted, second.last.is_file(), len(dash.resumes))")
        assert kernel.reply(check)["status"] == "ok"
        assert "resumed: True True 1" in kernel.wait_for_iopub(
            lambda m: m["msg_type"] == "stream" and "resumed" in m["content"]["text"])
    finally:
        kernel.manager.shutdown_kernel(now=True)


def test_output_png_round_trip():
    import ipywidgets as w
    import matplotlib.pyplot as plt

    from yolo9kit.widgets.panel import output_png, show_figure

    out = w.Output()
    assert output_png(out) is None
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    show_figure(out, fig)
    png = output_png(out)
    assert png is not None and png.startswith(b"\x89PNG")


# -- shared data for the viewers -------------------------------------------------------------------

@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    from yolo9kit.data import make_shapes

    return make_shapes(tmp_path_factory.mktemp("shapes"), n_train=8, n_val=3, imgsz=64, num_classes=3, seed=0)


# -- detection viewer ------------------------------------------------------------------------------

@needs("yolo9kit.prediction", "predict")
def test_detection_viewer_sliders_filter_and_switch_images(shapes):
    import torch

    from yolo9kit.models import create_model
    from yolo9kit.widgets import detection_viewer, output_png

    torch.manual_seed(0)
    model = create_model("yolov9-t", 3)
    val_images = sorted((shapes.parent / "images" / "val").glob("*")) or sorted(shapes.parent.rglob("val*/*.png"))
    app = detection_viewer(model, [str(p) for p in val_images], imgsz=64, conf=0.001, iou=0.7, device="cpu")
    assert set(app.controls) == {"image", "conf", "iou", "head"}
    low = len(app.state["prediction"])
    png_low, title_low = output_png(app.outputs["image"]), app.figures["image"].axes[0].get_title()

    app.controls["conf"].value = 0.99
    high = len(app.state["prediction"])
    assert high <= low and (app.state["prediction"].scores >= 0.99).all()
    assert output_png(app.outputs["image"]) != png_low
    assert "conf >= 0.99" in app.figures["image"].axes[0].get_title()

    app.controls["image"].value = 1
    assert app.figures["image"].axes[0].get_title().split(":")[0] == val_images[1].name != title_low.split(":")[0]

    app.controls["head"].value = "aux"
    assert "aux head" in app.figures["image"].axes[0].get_title()


@needs("yolo9kit.prediction", "predict")
def test_detection_viewer_rejects_an_empty_folder(tmp_path):
    from yolo9kit.models import create_model
    from yolo9kit.widgets import detection_viewer

    with pytest.raises(ValueError, match="no images"):
        detection_viewer(create_model("gelan-t", 2), tmp_path)


# -- augmentation viewer ---------------------------------------------------------------------------

@needs("yolo9kit.plots", "show_batch")
def test_augmentation_viewer_sliders_change_the_batch(shapes):
    from yolo9kit.widgets import augmentation_viewer, output_png

    app = augmentation_viewer(shapes, imgsz=64, batch_size=4, seed=0)
    assert set(app.controls) == {"mosaic", "mixup", "hsv", "scale", "fliplr", "seed"}
    assert app.state["hyp"]["mosaic"] == 1.0 and app.state["hyp"]["hsv_s"] == pytest.approx(0.7)
    first_png, first_images = output_png(app.outputs["batch"]), app.state["batch"][0].clone()

    app.controls["hsv"].value = 0.0
    assert app.state["hyp"]["hsv_h"] == app.state["hyp"]["hsv_s"] == app.state["hyp"]["hsv_v"] == 0.0
    assert "HSV x0.0" in app.figures["batch"]._suptitle.get_text()
    assert output_png(app.outputs["batch"]) != first_png
    assert not app.state["batch"][0].equal(first_images)

    app.controls["mosaic"].value = 0.0
    assert app.state["hyp"]["mosaic"] == 0.0 and "mosaic 0.00" in app.figures["batch"]._suptitle.get_text()


def test_augmentation_hyp_scales_hsv_and_keeps_other_keys():
    from yolo9kit.config import DEFAULT_AUGMENT_HYP
    from yolo9kit.widgets import augmentation_hyp

    hyp = augmentation_hyp({"hsv": 0.5, "mixup": 0.0})
    assert hyp["hsv_v"] == pytest.approx(DEFAULT_AUGMENT_HYP["hsv_v"] / 2) and hyp["mixup"] == 0.0
    assert hyp["translate"] == DEFAULT_AUGMENT_HYP["translate"]


# -- memory explorer -------------------------------------------------------------------------------

def test_batch_grid_covers_the_range_with_about_two_points_per_octave():
    from yolo9kit.memory import batch_grid

    assert batch_grid(1, 16) == [1, 2, 3, 4, 6, 8, 12, 16]
    assert batch_grid(5, 20) == [5, 6, 8, 12, 16, 20]
    assert batch_grid(7, 7) == [7]
    with pytest.raises(ValueError, match="batch range"):
        batch_grid(0, 4)


@pytest.mark.slow
def test_memory_explorer_draws_the_package_figures_and_its_plan_is_memory_plan():
    from yolo9kit import memory
    from yolo9kit.widgets import memory_explorer, output_png

    app = memory_explorer("yolov9-t", imgsz=64, batch_range=(1, 8), gpu="T4", num_classes=3, max_batch=64,
                          method="estimated", nominal_batch_size=16)
    assert set(app.controls) == {"model", "imgsz", "batch", "amp", "activation_checkpointing", "switches", "gpu",
                                 "method"}
    step = app.state["step"]
    assert (step.model, step.imgsz, step.amp, step.num_classes) == ("yolov9-t", 64, "auto", 3)
    assert app.state["frame"]["batch_size"].tolist() == [1, 2, 3, 4, 6, 8]
    first = output_png(app.outputs["curve"])
    assert "Largest batch on T4: 64" in app.outputs["plan"].value  # a 64 px step is tiny: max_batch caps it

    # the explorer's plan is memory.plan's for the same step and card
    expected = memory.plan(step, 16, gpu="T4", method="estimated")
    shown = app.state["plan"]
    assert shown.recommended == expected.recommended and shown.table.equals(expected.table)
    best = expected.recommended
    assert f"batch {best['batch_size']} x accumulate {best['accumulate']} = {best['effective_batch']}" \
        in app.outputs["plan"].value

    # while it computes, the explorer says what it does (the trace only once per setting) and then how long it took
    assert app.outputs["progress"].layout.visibility == "hidden" and "computed in" in app.outputs["status"].value
    said = []
    app.outputs["status"].observe(lambda change: said.append(change["new"]), names="value")
    app.controls["batch"].value = (4, 32)
    assert [text[:7] for text in said[:4]] == ["<i>1/4 ", "<i>2/4 ", "<i>3/4 ", "<i>4/4 "]
    assert "traced before" in said[0] and "the curve at 7 batch sizes" in said[1], said
    frame = app.state["frame"]
    assert frame["batch_size"].tolist() == [4, 6, 8, 12, 16, 24, 32]
    assert frame["device_bytes"].is_monotonic_increasing
    assert output_png(app.outputs["curve"]) != first
    assert app.state["report"].batch_size == 32

    app.controls["gpu"].value = "RTX 3060"
    assert "RTX 3060" in app.figures["curve"].axes[0].get_title()
    assert "Largest batch on RTX 3060" in app.outputs["plan"].value
    app.controls["switches"].value = "off (official layout)"
    assert app.state["step"].channels_last is False and app.state["report"].step.lean_activations is False
    said.clear()
    app.controls["imgsz"].value = 96  # a setting not seen before is traced, and the explorer says so
    assert said[0].startswith("<i>1/4 tracing yolov9-t at 96 px"), said


@pytest.mark.slow
def test_the_widget_front_ends_work_with_ipywidgets_7_7():
    """Colab ships ipywidgets 7.7: this file's tests and the runs viewer's pass with it as they do with 8 (make
    installs 7.7 into the folder .venv/ipywidgets7, ahead of 8 on the path of this run only)."""
    old = Path(sys.prefix) / "ipywidgets7"
    assert (old / "ipywidgets").is_dir(), f"no ipywidgets 7.7 in {old}: `make test` installs it (see the Makefile)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(old), os.environ.get("PYTHONPATH", "")])}
    version = subprocess.run([sys.executable, "-c", "import ipywidgets; print(ipywidgets.__version__)"], env=env,
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version.startswith("7.7."), version
    tests = Path(__file__).parent
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not ipywidgets_7_7",
                          str(tests / "test_widgets.py"), f"{tests / 'test_experiments.py'}::"
                          "test_the_runs_viewer_draws_the_chosen_runs_and_the_chosen_metric"],
                         env=env, capture_output=True, text=True, cwd=tests.parent)
    assert run.returncode == 0 and " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-3000:]
