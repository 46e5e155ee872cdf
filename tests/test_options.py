"""Grouped settings of the widest entry points (NMSConfig, SaveConfig, LoaderConfig), the old flat keywords
refused, one meaning of ``half`` and ``device=None``, and the layering that keeps validation and training free
of the prediction module."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from yolo9kit.config import PREDICT_NMS, VAL_NMS, LoaderConfig, NMSConfig, SaveConfig
from yolo9kit.data import create_dataloader, make_shapes
from yolo9kit.detections import non_max_suppression
from yolo9kit.models import create_model, deploy
from yolo9kit.models.deploy import prepare_model, resolve_half
from yolo9kit.prediction import predict
from yolo9kit.validate import evaluate

# the flat keywords the grouped settings replaced; the public signatures must not show them any more
OLD_NMS = {"conf", "iou", "max_det", "classes", "agnostic"}
OLD_SAVE = {"save_dir", "save_txt", "save_conf", "save_images", "line_width"}
OLD_LOADER = {"pin_memory", "prefetch_factor", "cache_budget", "close_mosaic"}


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


def test_the_old_flat_keywords_are_refused(model, image, shapes):
    """One spelling per idea: the flat keywords the grouped settings replaced are errors, not aliases."""
    calls = [lambda: predict(model, image, imgsz=128, conf=0.5),
             lambda: predict(model, image, imgsz=128, save_dir="x"),
             lambda: evaluate(model, shapes, imgsz=64, conf=0.5),
             lambda: create_dataloader(shapes, "train", imgsz=64, pin_memory=False),
             lambda: non_max_suppression(torch.zeros(1, 7, 1), conf_thres=0.3),
             lambda: make_shapes("unused", image_size=64),
             lambda: create_model("yolov9-t", checkpoint="all")]
    for call in calls:
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            call()


def test_save_config_writes_labels_and_images(model, image, tmp_path):
    predict(model, image, imgsz=128, nms=NMSConfig(conf=0.5), device="cpu",
            save=SaveConfig(tmp_path / "new", txt=True, conf=True, line_width=1))
    assert (tmp_path / "new" / "labels" / "image0.txt").read_text() != ""
    assert (tmp_path / "new" / "image0.jpg").is_file()
    predict(model, image, imgsz=128, device="cpu", save=SaveConfig(tmp_path / "none", images=False))
    assert not list((tmp_path / "none").iterdir())  # images off, no txt: the folder stays empty


def test_half_auto_resolves_per_device(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    f16, f32, b16 = torch.float16, torch.float32, torch.bfloat16
    assert resolve_half("auto", cpu) is f32 and resolve_half("auto", cuda) is f16
    assert resolve_half(None, cuda) is f16  # the older spelling of "auto"
    assert resolve_half(True, cpu) is f16 and resolve_half(False, cuda) is f32 and resolve_half("bf16", cpu) is b16
    for native in (True, False):  # prediction's "auto": bf16 on a CPU that computes it in hardware, never on CUDA
        monkeypatch.setattr(deploy, "native_cpu_bf16", lambda native=native: native)
        assert resolve_half("auto", cpu, cpu_bf16=True) is (b16 if native else f32)
        assert resolve_half("auto", cuda, cpu_bf16=True) is f16
    with pytest.raises(ValueError, match="'auto'.*True.*False.*'bf16'"):
        resolve_half("fp16", cpu)


def test_prepare_model_never_moves_or_casts_the_callers_model(model):
    caller = create_model("gelan-t", num_classes=3).train()
    moved = prepare_model(caller, torch.device("meta"), torch.float32)  # another device, without needing CUDA
    assert moved is not caller and next(moved.parameters()).device.type == "meta"
    cast = prepare_model(caller, torch.device("cpu"), torch.float16)
    assert cast is not caller and next(cast.parameters()).dtype == torch.float16
    assert {p.device.type for p in caller.parameters()} == {"cpu"}
    assert {p.dtype for p in caller.parameters()} == {torch.float32}
    same = prepare_model(caller, torch.device("cpu"), torch.float32)
    assert same is caller and not caller.training  # nothing to change: only eval mode (the caller restores it)


@pytest.fixture()
def shapes(tmp_path):
    return make_shapes(tmp_path / "shapes", n_train=2, n_val=3, imgsz=64, num_classes=3, seed=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="device=None means the CPU only on a machine without CUDA")
def test_evaluate_device_none_on_a_cpu_machine(model, shapes):
    model.train()
    result = evaluate(model, shapes, imgsz=64, batch_size=2, workers=0, progress_bar=False)
    assert result.seen == 3 and model.training
    assert {p.device.type for p in model.parameters()} == {"cpu"}


def test_evaluate_takes_the_trainer_s_bool_half(model, shapes):
    loader = create_dataloader(shapes, "val", imgsz=64, batch_size=2, workers=0)
    assert evaluate(model, shapes, dataloader=loader, imgsz=64, half=False, device="cpu", progress_bar=False).seen == 3
    simple = create_dataloader(shapes, "train", imgsz=64, batch_size=2, workers=0,
                               options=LoaderConfig(pin_memory=False))
    assert simple.loader.pin_memory is False and simple.dataset.mosaic is True


def test_cli_half_flags_default_to_auto():
    from yolo9kit.cli import build_parser

    parser = build_parser()
    for name, required in (("detect", ["--weights", "w", "--source", "s"]), ("val", ["--weights", "w", "--data", "d"])):
        assert parser.parse_args([name, *required]).half == "auto"
        assert parser.parse_args([name, *required, "--half"]).half is True
        assert parser.parse_args([name, *required, "--no-half"]).half is False
