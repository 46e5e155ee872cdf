"""Grouped settings of the widest entry points (NMSConfig, SaveConfig, LoaderConfig), the old flat keywords
that still work with one FutureWarning each, one meaning of ``half`` and ``device=None``, and the layering
that keeps validation and training free of the prediction module."""

from __future__ import annotations

import inspect
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from yolo9kit import _renamed
from yolo9kit.config import PREDICT_NMS, VAL_NMS, LoaderConfig, NMSConfig, SaveConfig
from yolo9kit.data import create_dataloader, make_shapes
from yolo9kit.models import create_model
from yolo9kit.models.inference import prepare_model, resolve_half
from yolo9kit.ops import non_max_suppression
from yolo9kit.prediction import predict
from yolo9kit.validate import evaluate

# the flat keywords the grouped settings replaced; the public signatures must not show them any more
OLD_NMS = {"conf", "iou", "max_det", "classes", "agnostic"}
OLD_SAVE = {"save_dir", "save_txt", "save_conf", "save_images", "line_width"}
OLD_LOADER = {"pin_memory", "prefetch_factor", "cache_budget", "close_mosaic"}


@pytest.fixture(autouse=True)
def fresh_warnings():
    """Each test sees the first use of an old keyword (the warnings are once per process)."""
    _renamed._WARNED.clear()
    yield
    _renamed._WARNED.clear()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    model = create_model("gelan-t", num_classes=3).eval()
    for conv in model.head.cv3:  # class scores high enough to give detections at conf 0.5
        torch.nn.init.constant_(conv[-1].bias, 2.0)
    return model


@pytest.fixture(scope="module")
def image():
    return np.random.default_rng(0).integers(0, 255, (96, 128, 3), dtype=np.uint8)


def _same(a, b) -> None:
    assert len(a.boxes) == len(b.boxes) > 0
    np.testing.assert_array_equal(a.boxes, b.boxes)
    np.testing.assert_array_equal(a.scores, b.scores)
    np.testing.assert_array_equal(a.classes, b.classes)


@pytest.mark.parametrize("function, old, new", [
    (predict, OLD_NMS | OLD_SAVE, {"nms", "save", "half", "device"}),
    (evaluate, OLD_NMS, {"nms", "half", "device", "save_dir"}),  # evaluate's own output folder keeps its name
    (create_dataloader, OLD_LOADER, {"options"}),
    (non_max_suppression, {"conf_thres", "iou_thres"}, {"conf", "iou"}),
], ids=lambda x: getattr(x, "__name__", ""))
def test_signatures_show_only_the_new_names(function, old, new):
    parameters = inspect.signature(function).parameters
    assert not set(parameters) & old and new <= set(parameters)
    assert not any(p.kind is p.VAR_KEYWORD for p in parameters.values())  # no **kwargs shown either


def test_nms_config_fills_unset_fields_from_the_official_defaults():
    assert NMSConfig().filled(PREDICT_NMS) == PREDICT_NMS == NMSConfig(conf=0.25, iou=0.45, max_det=1000)
    assert NMSConfig().filled(VAL_NMS) == VAL_NMS == NMSConfig(conf=0.001, iou=0.7, max_det=300)
    assert NMSConfig(conf=0.5).filled(VAL_NMS) == NMSConfig(conf=0.5, iou=0.7, max_det=300)
    assert NMSConfig(classes=[2, 0]).classes == (2, 0)  # a tuple: the settings stay hashable
    with pytest.raises(ValueError, match=r"NMSConfig.conf=1.5"):
        NMSConfig(conf=1.5)
    with pytest.raises(ValueError, match="max_det"):
        NMSConfig(max_det=0)
    with pytest.raises(ValueError, match="prefetch_factor"):
        LoaderConfig(prefetch_factor=0)


def test_grouped_predict_equals_the_old_flat_call_and_warns_once(model, image):
    grouped = predict(model, image, imgsz=128, nms=NMSConfig(conf=0.5, iou=0.6, max_det=20), device="cpu")[0]
    with pytest.warns(FutureWarning) as record:
        flat = predict(model, image, imgsz=128, conf=0.5, iou=0.6, max_det=20, device="cpu")[0]
    _same(grouped, flat)
    assert [str(w.message).split(";")[0] for w in record] == [  # one warning per old name, naming the new one
        f"predict({name}=...) is now predict(nms=NMSConfig({name}=...))" for name in ("conf", "iou", "max_det")]
    assert all(w.filename == __file__ for w in record)  # pointing at the caller's line, not the library
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second use of the same old names stays quiet
        again = predict(model, image, imgsz=128, conf=0.5, iou=0.6, max_det=20, device="cpu")[0]
    _same(grouped, again)


def test_old_keywords_apply_on_top_of_a_given_config(model, image):
    expected = predict(model, image, imgsz=128, nms=NMSConfig(conf=0.5, classes=(1,)), device="cpu")[0]
    with pytest.warns(FutureWarning, match=r"predict\(classes=\.\.\.\)"):
        mixed = predict(model, image, imgsz=128, nms=NMSConfig(conf=0.5), classes=[1], device="cpu")[0]
    assert set(mixed.classes.tolist()) <= {1}
    np.testing.assert_array_equal(mixed.boxes, expected.boxes)


def test_old_save_keywords_write_what_save_config_writes(model, image, tmp_path):
    predict(model, image, imgsz=128, nms=NMSConfig(conf=0.5), device="cpu",
            save=SaveConfig(tmp_path / "new", txt=True, conf=True, line_width=1))
    with pytest.warns(FutureWarning) as record:
        predict(model, image, imgsz=128, nms=NMSConfig(conf=0.5), device="cpu", save_dir=tmp_path / "old",
                save_txt=True, save_conf=True, line_width=1)
    messages = {str(w.message).split(";")[0] for w in record}
    assert "predict(save_txt=...) is now predict(save=SaveConfig(txt=...))" in messages and len(messages) == 4
    new, old = (tmp_path / "new" / "labels" / "image0.txt"), (tmp_path / "old" / "labels" / "image0.txt")
    assert new.read_text() == old.read_text() != ""
    assert (tmp_path / "old" / "image0.jpg").is_file()
    predict(model, image, imgsz=128, device="cpu", save=SaveConfig(tmp_path / "none", images=False))
    assert not list((tmp_path / "none").iterdir())  # images off, no txt: the folder stays empty


def test_non_max_suppression_old_threshold_names():
    pred = torch.rand(2, 7, 50, generator=torch.Generator().manual_seed(0)) * torch.tensor([64, 64, 16, 16, 1, 1, 1])[
        None, :, None]
    with pytest.warns(FutureWarning) as record:
        old = non_max_suppression(pred, conf_thres=0.3, iou_thres=0.5)
    assert {str(w.message).split(";")[0] for w in record} == {
        "non_max_suppression(conf_thres=...) is now non_max_suppression(conf=...)",
        "non_max_suppression(iou_thres=...) is now non_max_suppression(iou=...)"}
    new = non_max_suppression(pred, conf=0.3, iou=0.5)
    assert all(torch.equal(a, b) for a, b in zip(old, new))
    with pytest.raises(TypeError, match="both conf_thres= and its new spelling conf="):
        non_max_suppression(pred, conf=0.3, conf_thres=0.3)


def test_half_auto_resolves_per_device():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_half("auto", cpu) is False and resolve_half("auto", cuda) is True
    assert resolve_half(None, cuda) is True  # the older spelling of "auto"
    assert resolve_half(True, cpu) is True and resolve_half(False, cuda) is False
    with pytest.raises(ValueError, match="'auto'.*True or False"):
        resolve_half("fp16", cpu)


def test_prepare_model_never_moves_or_casts_the_callers_model(model):
    caller = create_model("gelan-t", num_classes=3).train()
    moved = prepare_model(caller, torch.device("meta"), half=False)  # another device, without needing CUDA
    assert moved is not caller and next(moved.parameters()).device.type == "meta"
    cast = prepare_model(caller, torch.device("cpu"), half=True)
    assert cast is not caller and next(cast.parameters()).dtype == torch.float16
    assert {p.device.type for p in caller.parameters()} == {"cpu"}
    assert {p.dtype for p in caller.parameters()} == {torch.float32}
    same = prepare_model(caller, torch.device("cpu"), half=False)
    assert same is caller and not caller.training  # nothing to change: only eval mode (the caller restores it)


@pytest.fixture()
def shapes(tmp_path):
    return make_shapes(tmp_path / "shapes", n_train=2, n_val=3, imgsz=64, num_classes=3, seed=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="device=None means the CPU only on a machine without CUDA")
def test_evaluate_device_none_on_a_cpu_machine(model, shapes):
    model.train()
    result = evaluate(model, shapes, imgsz=64, batch_size=2, workers=0, progress=False)
    assert result.seen == 3 and model.training
    assert {p.device.type for p in model.parameters()} == {"cpu"}


def test_evaluate_old_nms_keywords_warn_and_keep_the_val_defaults(model, shapes):
    loader = create_dataloader(shapes, "val", imgsz=64, batch_size=2, workers=0)
    grouped = evaluate(model, shapes, dataloader=loader, imgsz=64, nms=NMSConfig(conf=0.5), device="cpu",
                       progress=False)
    with pytest.warns(FutureWarning, match=r"evaluate\(conf=\.\.\.\) is now evaluate\(nms=NMSConfig\(conf="):
        flat = evaluate(model, shapes, dataloader=loader, imgsz=64, conf=0.5, device="cpu", progress=False)
    assert flat.to_dict() == grouped.to_dict()
    half_bool = evaluate(model, shapes, dataloader=loader, imgsz=64, half=False, device="cpu", progress=False)
    assert half_bool.seen == 3  # the trainer passes a bool


def test_old_loader_keywords_warn_and_still_work(shapes):
    with pytest.warns(FutureWarning, match=r"create_dataloader\(pin_memory=\.\.\.\) is now "
                                           r"create_dataloader\(options=LoaderConfig\(pin_memory=\.\.\.\)\)"):
        loader = create_dataloader(shapes, "train", imgsz=64, batch_size=2, workers=0, pin_memory=False)
    assert loader.loader.pin_memory is False
    with pytest.warns(FutureWarning, match=r"set_mosaic\(loader, False\)"):
        closed = create_dataloader(shapes, "train", imgsz=64, batch_size=2, workers=0, close_mosaic=True)
    assert closed.dataset.mosaic is False
    simple = create_dataloader(shapes, "train", imgsz=64, batch_size=2, workers=0,
                               options=LoaderConfig(pin_memory=False))
    assert simple.loader.pin_memory is False and simple.dataset.mosaic is True


def test_cli_half_flags_default_to_auto():
    import argparse

    from yolo9kit.cli import detect, val

    for module, required in ((detect, ["--weights", "w", "--source", "s"]), (val, ["--weights", "w", "--data", "d"])):
        parser = argparse.ArgumentParser()
        module.add_parser(parser.add_subparsers())
        name = module.__name__.rsplit(".", 1)[1]
        assert parser.parse_args([name, *required]).half == "auto"
        assert parser.parse_args([name, *required, "--half"]).half is True
        assert parser.parse_args([name, *required, "--no-half"]).half is False


def test_validation_and_training_do_not_import_the_prediction_module():
    code = ("import sys, yolo9kit.validate, yolo9kit.train, yolo9kit.train.fit, yolo9kit.checkpoint; "
            "print('yolo9kit.prediction' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
