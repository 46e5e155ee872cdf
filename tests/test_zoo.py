"""create_model is the one way to get a model: registered names, yamls, kit and official checkpoints and the
shipped model, for the classes asked for, with weights transferred."""

from __future__ import annotations

import logging

import pytest
import torch
import yaml

from yolo9kit import create_model
from yolo9kit.models import load_model
from yolo9kit.models.checkpoint import SHAPES_CLASSES, SHAPES_MODEL, SHAPES_WEIGHTS, read_checkpoint, save_checkpoint


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_name_or_a_yaml_builds_a_fresh_model(tmp_path):
    model = create_model("gelan-t", names=["a", "b"])
    assert model.training and model.nc == 2 and model.names == ["a", "b"] and model.name == "gelan-t"
    table = tmp_path / "mine.yaml"
    table.write_text(yaml.safe_dump(create_model("gelan-t").yaml))
    assert create_model(table, 4).nc == 4 and create_model(table).name == "mine"
    with pytest.raises(ValueError, match="2 class names given for num_classes=3"):
        create_model("gelan-t", 3, names=["a", "b"])


def test_a_kit_checkpoint_keeps_its_weights_or_is_rebuilt_for_other_classes(tmp_path, caplog):
    source = create_model("gelan-t", names=["a", "b", "c"])
    path = save_checkpoint(tmp_path / "w.pt", source)
    same = create_model(path)
    assert same.training and same.nc == 3 and _same(same, source)
    renamed = create_model(path, names=["x", "y", "z"])  # as many classes: the weights stay, the names change
    assert renamed.names == ["x", "y", "z"] and _same(renamed, source)
    with caplog.at_level(logging.INFO, logger="yolo9kit.models"):
        other = create_model(path, names=["only"])
    assert other.nc == 1 and other.name == "gelan-t" and "Transferred" in caplog.text
    source_state = source.state_dict()
    kept = {k for k, v in other.state_dict().items() if torch.equal(v, source_state[k])}
    assert kept and len(kept) < len(other.state_dict())  # the class outputs start fresh


def test_weights_are_transferred_into_any_model(tmp_path):
    source = create_model("gelan-t", num_classes=5)
    path = save_checkpoint(tmp_path / "w.pt", source)
    model = create_model("gelan-t", 3, weights=path)
    own, theirs = model.state_dict(), source.state_dict()
    assert all(torch.equal(own[k], theirs[k]) for k in own if own[k].shape == theirs[k].shape)


def test_an_official_checkpoint_loads_by_the_same_call(official_fixture):
    model = create_model(official_fixture("gelan-t-narrow.official-release.pt"))
    assert model.nc == 3 and model.names == ["circle", "square", "triangle"] and model.training


def test_the_shipped_model_by_name_is_its_file_in_fp32():
    model = create_model(SHAPES_MODEL)
    own, stored = model.state_dict(), read_checkpoint(SHAPES_WEIGHTS)["model"]  # stored in fp16
    assert own.keys() == stored.keys() and all(torch.equal(own[k], stored[k].to(own[k].dtype)) for k in own)
    assert model.training and tuple(model.names) == SHAPES_CLASSES and next(model.parameters()).dtype == torch.float32


def test_what_is_no_model_is_refused_naming_it(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"junk\.pt: cannot be read \(truncated, corrupted"):
        create_model(junk)
    with pytest.raises(ValueError, match="unknown model 'yolov9-x'"):
        create_model("yolov9-x")
    with pytest.raises(FileNotFoundError, match="weights missing.pt not found"):
        load_model("missing.pt")


def test_load_model_takes_a_module_as_it_is_and_files_in_eval_mode(tmp_path):
    model = create_model("gelan-t")
    assert load_model(model) is model
    assert not load_model(save_checkpoint(tmp_path / "w.pt", model)).training
