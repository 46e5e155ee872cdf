"""What each notebook must have shown, checked in the notebook's own kernel after its last cell.

``tests/test_notebooks.py`` (headless) and ``tests/test_browser.py`` (JupyterLab) append ``CHECKS[name]`` as one
more code cell to the copy they run (never to the tracked file); the checks use the notebooks' own variables.
Each notebook runs once per test session: those with widgets in JupyterLab, the others headless, and the widget
notebooks headless too where the browser cannot run (``browser_missing``).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np

from yolo9kit.data import load_data_config

CHROMIUM = Path("/usr/bin/chromium")
# the notebooks that show widgets (guarded by test_notebooks.py): they run in the browser test
WIDGET_NOTEBOOKS = ("01_memory_vs_batch.ipynb", "04_data_loading.ipynb", "05_train_dashboard.ipynb",
                    "06_detect_and_validate.ipynb", "09_compare_experiments.ipynb")


@functools.cache
def browser_missing() -> str | None:
    """Why the browser test cannot run here (it skips with this reason), or None when it can."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} not found: install it with `apt-get install chromium`"
    for package in ("playwright", "jupyterlab"):
        if importlib.util.find_spec(package) is None:
            return f"the {package} package is not installed"
    return None


CHECKS = {
    "00_tour.ipynb": """\
assert set(TABLE_MODELS or list_models()) == set(table.name)
assert [t.shape[1] for t in train_out.main] == [4 * model.head.reg_max + NUM_CLASSES] * 3 and train_out.aux is not None
assert eval_out.main.shape[:2] == (2, 4 + NUM_CLASSES)
assert prediction.orig_shape == (IMGSZ, IMGSZ) and report.fits
assert len(prediction) > 0 and found >= 1  # real boxes, on the labelled shapes
assert list(trained.names) == list(config.names)
""",
    "01_memory_vs_batch.ipynb": """\
from yolo9kit.widgets import output_png

# a second explorer, not displayed, takes the interaction test: the one above keeps the parameters' values
probe = memory_explorer(MODEL, imgsz=IMGSZ, batch_range=(BATCH_LOW, BATCH_HIGH), amp=AMP, gpu=GPU,
                        nominal_batch_size=NOMINAL_BATCH, num_classes=NUM_CLASSES, method="estimated")
before = output_png(probe.outputs["curve"])
probe.controls["batch"].value = (BATCH_LOW + 1, BATCH_HIGH)
assert output_png(probe.outputs["curve"]) != before, "moving the batch range must redraw the curve"
assert probe.state["frame"]["batch_size"].min() == BATCH_LOW + 1
assert explorer.controls["batch"].value == (BATCH_LOW, BATCH_HIGH)  # what the reader sees is the parameters'
assert frame["device_bytes"].is_monotonic_increasing and slope > 0
assert search.batch_size >= 1 and sum(report.breakdown.values()) == report.peak_allocated
assert config.batch_size == batch_plan.recommended["batch_size"] <= NOMINAL_BATCH
assert planned.label == step.resolve("cuda", bf16=batch_plan.gpu.bf16).label  # the planned step is the trained one
""",
    "02_mixed_precision.ipynb": """\
assert at_batch["fp16"].device_bytes < at_batch["off"].device_bytes
assert ratio["activations"] < 0.75 and ratio["weights"] >= 1.0
assert table.loc["optimizer_state", "fp16"] == table.loc["optimizer_state", "fp32"]  # AMP leaves momentum in fp32
assert box_px < 0.05 * NUMERICS_IMGSZ
""",
    "03_gradient_accumulation.ipynb": """\
assert rule.set_index("batch_size").loc[16, "accumulate"] == round(nominal / 16)
assert ramp["accumulate"].iloc[0] == 1 and ramp["accumulate"].iloc[-1] == base_accumulate(config)
assert cos.iloc[2] > 0.9999, "frozen BatchNorm on identical images: accumulation must point like one batch"
assert cos.iloc[0] < cos.iloc[2], "BatchNorm batch statistics should make accumulation differ from one batch"
assert len(rows) == 3 * DRAWS and (low <= cos).all() and (cos <= high).all()  # means inside each case's draws
""",
    "04_data_loading.ipynb": """\
from yolo9kit.widgets import output_png

# a second viewer, not displayed, takes the interaction test: the one above keeps the parameters' values
probe = augmentation_viewer(data_yaml, imgsz=IMGSZ, batch_size=BATCH)
before = output_png(probe.outputs["batch"])
probe.controls["mosaic"].value = 0.0
assert probe.state["hyp"]["mosaic"] == 0.0 and output_png(probe.outputs["batch"]) != before
assert viewer.controls["mosaic"].value == viewer.state["hyp"]["mosaic"] == 1.0  # the displayed viewer is untouched
assert report.ok and report.n_images == N_TRAIN
assert targets.shape[1] == 6 and images.dtype.is_floating_point is False
assert (runs.images == N_TRAIN).all() and (runs.images_per_s > 0).all()
assert len(runs) == EPOCH_REPEATS * len(WORKER_COUNTS)
""",
    "05_train_dashboard.ipynb": """\
from yolo9kit import read_checkpoint

assert first.interrupted or STOP_AT_BATCH is None or STOP_AT_BATCH >= first.epochs_completed * per_epoch
assert not first.interrupted or first.last.is_file()
epochs = second.epochs_completed  # what fit in MINUTES (TrainConfig.time)
assert not second.interrupted and epochs >= 1 and read_checkpoint(second.last)["train_config"]["epochs"] == epochs
assert set(batches) == set(range(1, epochs * per_epoch + 1)), "every batch trained once or retried"
assert len(dash.epochs) == epochs and dash.figure is not None
assert all(len(line.get_xdata()) for ax in dash.figure.axes for line in ax.lines)  # no empty panel
assert {"stop", "resume"} == set(dash.controls) and dash.controls["resume"].disabled  # nothing left to resume
assert not [m for m in dash.messages if m.startswith("warning")], dash.messages  # the planned stop is no warning
assert BATCH <= NOMINAL_BATCH and (first.save_dir / "auto_batch.json").is_file()
assert second.step.batch_size == BATCH and (second.auto_batch is None) == first.interrupted  # resumed: same batch
assert actual > 0 and auto.predicted_peak_allocated > 0
""",
    "06_detect_and_validate.ipynb": """\
# The widgets still show the parameters cell's values, and what they show is what predict finds directly.
assert viewer.controls["image"].value == 0 and viewer.controls["conf"].value == CONF
assert abs(viewer.controls["iou"].value - IOU) < 1e-9
direct = predict(model, val_images[0], imgsz=IMGSZ, nms=NMSConfig(conf=CONF, iou=IOU))[0]
assert len(shown) > 0 and (shown.scores >= CONF).all() and len(shown) == len(direct)
assert np.allclose(np.sort(shown.boxes, 0), np.sort(direct.boxes, 0))
assert "PR_curve.png" in val.figures and "confusion_matrix.png" in val.figures and 0 <= val.map50_95 <= val.map50 <= 1
if not (WEIGHTS or DATA):  # the shipped model on the shapes: real detections and metrics
    assert found >= 1 and val.map50 > 0.5
assert list(speed.index) == list(ways) and (speed["total ms"].astype(float) > 0).all()
assert list(heads.index) == ["main", "aux"]
""",
    "07_claims_checked.ipynb": """\
claims = [faster, halves, empty_cache, grows_batch, grows_step, frozen, weights, amp_default, e_elan, accumulate_flag,
          same_defaults]
# Every claim was measured once and judged (a verdict's values are finite: judge refuses anything else); only the
# claims about the official script go unchecked, and only when its references are missing.
assert list(summary.claim) == [c.text for c in claims] and list(verdicts) == list(summary.claim)
assert all(len(verdicts[c.text].values) > 0 for c in claims[:9])
assert all(bool(verdicts[c.text].values) == (official is not None) for c in claims[9:])
assert len(large) == len(accumulated) == REPEATS and len(ratios) == REPEATS**2
assert min(large.min(), accumulated.min()) > 0
assert 0 < steps["fp16"].peak_allocated <= steps["fp16"].peak_reserved and steps["off"].device_bytes > 0
assert len(forwards) == n_batches and len(updates) >= 2 and sum(per_update) <= n_batches * WARMUP_BATCH
assert 0 <= changed <= 1 and total[1.0] > total[0.0] and len(blocks) > 0
assert set(on_gpu.values()) <= {"off", "fp16", "bf16"}
if official:
    assert len(official["flags"]) > 10 and len(compared) == len(FIELDS)
""",
    "08_finetune_your_data.ipynb": """\
assert reports["train"].n_images > 0 and reports["val"].n_images > 0
assert frozen_layers and part < full and part_max >= full_max
assert counts.loc["frozen", "changed"] == 0 and counts.loc["trained", "changed"] > 0
assert result.epochs_completed == len(result.results) >= 1  # the epochs that fit in MINUTES
assert all((folder / name).stat().st_size > 0 for name in PICTURES if name != "F1_curve.png")
assert list(heads.index) == ["main", "aux"]
assert exported is None or (exported.checked and exported.max_abs_diff <= exported.atol)
assert len(frames) == len(data.val) // VID_STRIDE if not VIDEO else len(frames) > 0
assert any(p.suffix == ".mp4" for p in (folder / "video").iterdir())
""",
    "09_compare_experiments.ipynb": """\
assert len(table) == SEEDS * len(settings) and (table["state"] == "finished").all()
assert set(table["run"]) == {f"{name}-seed-{k}" for name in settings for k in range(SEEDS)}
assert "batch_size" in table.columns and "seed" in table.columns  # what differs, and only that
assert len(viewer.figures["curves"].axes[0].lines) == min(4, len(table))
assert summary.loc["b16", "min"] <= summary.loc["b16", "mean"] <= summary.loc["b16", "max"]
assert inside == (abs(difference) <= noise)
""",
}


def coco_export(data_yaml: Path, out: Path, with_images: bool = True) -> tuple[Path, Path]:
    """The training split of a shapes set (64 px) as a COCO export as people have them: ``out/instances.json``
    and an images folder of its own (empty without ``with_images``)."""
    src, names = data_yaml.parent, load_data_config(data_yaml).names
    images, annotations = [], []
    for k, label in enumerate(sorted((src / "labels" / "train").glob("*.txt"))):
        images.append({"id": k, "file_name": label.stem + ".jpg", "width": 64, "height": 64})
        for c, cx, cy, w, h in np.loadtxt(label, ndmin=2):
            annotations.append({"id": len(annotations), "image_id": k, "category_id": int(c) + 1,
                                "bbox": [(cx - w / 2) * 64, (cy - h / 2) * 64, w * 64, h * 64]})
    photos = out / "images"
    photos.mkdir(parents=True)
    json_path = out / "instances.json"
    json_path.write_text(json.dumps({"images": images, "annotations": annotations,
                                     "categories": [{"id": i + 1, "name": n} for i, n in enumerate(names)]}))
    if with_images:
        for image in (src / "images" / "train").iterdir():
            shutil.copy(image, photos / image.name)
    return json_path, photos
