"""Every registered model builds, runs forward and backward, has the official size and layout; the
layer-table builder rejects bad input with errors that name the row."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import yaml

from yolo9kit.models import DualOutput, LayerTableError, create_model, list_models, load_model_config, to_deploy
from yolo9kit.models.deploy import deploy_config

# parameter counts of the official models (nc = 80), as the official models/yolo.py builds them
OFFICIAL_PARAMS = {
    "yolov9-t": 3_717_680, "yolov9-s": 9_804_512, "yolov9-m": 32_878_432, "yolov9-c": 51_182_080,
    "yolov9-e": 69_529_664, "gelan-t": 2_442_640, "gelan-s": 7_226_208, "gelan-m": 20_124_000,
    "gelan-c": 25_498_752, "gelan-e": 58_114_432,
}
OFFICIAL_FUSED_PARAMS = {"t": 2_407_632, "s": 7_105_888, "m": 19_978_672, "c": 25_288_768, "e": 57_345_920}
SIDE = 64


def _randomise_bn(model: torch.nn.Module, seed: int = 0) -> None:
    """Non-trivial BN statistics so that fusion mistakes show up."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.2)
            m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(n, generator=g) * 0.2)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.fixture(scope="module")
def gelan_t():
    """A fresh gelan-t shared by the tests that only read it."""
    return create_model("gelan-t")


def test_registry_lists_the_ten_models():
    assert list_models() == [f"{f}-{s}" for f in ("yolov9", "gelan") for s in "tsmce"]


@pytest.mark.parametrize("name", list_models())
def test_model_builds_trains_and_deploys(name):
    torch.manual_seed(0)
    model = create_model(name)
    assert sum(p.numel() for p in model.parameters()) == OFFICIAL_PARAMS[name]
    assert model.is_dual == name.startswith("yolov9") and model.nc == 80 and len(model.names) == 80
    assert model.stride.tolist() == [8.0, 16.0, 32.0] and model.head.stride.tolist() == [8.0, 16.0, 32.0]
    assert (model.head.reg_max, model.head.no) == (16, 80 + 64)

    x = torch.rand(1, 3, SIDE, SIDE)
    out = model(x)
    assert isinstance(out, DualOutput)
    shapes = [(1, 144, SIDE // s, SIDE // s) for s in (8, 16, 32)]
    assert [tuple(m.shape) for m in out.main] == shapes
    assert (out.aux is None) if not model.is_dual else [tuple(m.shape) for m in out.aux] == shapes
    loss = sum(m.float().square().mean() for head in out if head is not None for m in head)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"parameters without gradient: {missing[:5]}"
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(n.endswith(("dfl.conv.weight", "dfl2.conv.weight")) for n in frozen)

    # eval: decoded (B, 4+nc, A); the deploy model (gelan, fused) gives the same main output
    model.eval()
    _randomise_bn(model)
    with torch.no_grad():
        ref = model(x)
        deployed = to_deploy(model)
        got = deployed(x)
    anchors = sum((SIDE // s) ** 2 for s in (8, 16, 32))
    assert tuple(ref.main.shape) == (1, 84, anchors)
    assert (ref.aux is None) != model.is_dual
    assert got.aux is None and not deployed.is_dual
    assert _rel(got.main, ref.main) < 1e-5
    assert sum(p.numel() for p in deployed.parameters()) == OFFICIAL_FUSED_PARAMS[name.split("-")[1]]
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in deployed.modules())


def test_build_conventions(gelan_t):
    model = gelan_t
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert all(m.eps == 1e-3 and m.momentum == 0.03 for m in bns)
    # the official build probes the strides once in training mode, before eps/momentum are set
    assert all(int(m.num_batches_tracked) == 1 and torch.allclose(m.running_var, torch.tensor(0.9)) for m in bns)
    head = model.head
    for box, cls, stride in zip(head.cv2, head.cv3, (8, 16, 32)):
        assert torch.all(box[-1].bias == 1.0)
        assert torch.allclose(cls[-1].bias, torch.tensor(math.log(5 / 80 / (640 / stride) ** 2)))
    assert head.dfl.conv.weight.flatten().tolist() == list(range(16))


def test_num_classes_and_names():
    model = create_model("gelan-t", names={0: "cat", 1: "dog"}, activation_checkpointing="backbone")
    assert model.activation_checkpointing == list(range(9))
    assert model.nc == 2 and model.names == ["cat", "dog"] and model.head.no == 66
    assert model.yaml["nc"] == 2
    with torch.no_grad():
        assert model.eval()(torch.rand(1, 3, 64, 96)).main.shape == (1, 6, 8 * 12 + 4 * 6 + 2 * 3)
    with pytest.raises(ValueError, match="2 class names"):
        create_model("gelan-t", 3, names=["a", "b"])


@pytest.mark.parametrize("shape, match", [
    ((1, 3, 100, 64), r"multiples of 32.*\(1, 3, 100, 64\)"),
    ((1, 3, 64, 48), "multiples of 32"),
    ((1, 1, 64, 64), r"\(B, 3, H, W\)"),
    ((3, 64, 64), r"\(B, 3, H, W\)"),
])
def test_bad_input_shape(gelan_t, shape, match):
    with pytest.raises(ValueError, match=match):
        gelan_t(torch.zeros(shape))


def _tiny_cfg(**changes) -> dict:
    cfg, _, _ = load_model_config("gelan-t")
    cfg = copy.deepcopy(cfg)
    cfg.update(changes)
    return cfg


def test_custom_yaml_path_and_width_rule(tmp_path):
    cfg = _tiny_cfg(width_multiple=0.5, nc=3)
    path = tmp_path / "half.yaml"
    path.write_text(yaml.safe_dump(cfg))
    model = create_model(path)
    assert model.nc == 3 and model.name == "half"
    assert model.model[0].conv.out_channels == 8  # ceil(16 * 0.5 / 8) * 8
    assert model.model[2].cv4.conv.out_channels == 16  # only args[0] is scaled; hidden widths are verbatim
    assert model.model[2].cv1.conv.out_channels == 32
    # rounding to a multiple of 8 even at width 1.0: AConv [180] -> 184 (gelan-m layer 16)
    cfg = _tiny_cfg()
    cfg["head"][7] = [-1, 1, "AConv", [180]]
    assert create_model(cfg).model[16].cv1.conv.out_channels == 184


def test_unknown_module_names_the_row(tmp_path):
    cfg = _tiny_cfg()
    cfg["head"][3] = [-1, 1, "FancyBlock", [96]]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(LayerTableError, match=r"bad\.yaml: layer 12 \(head row 3\).*unknown module 'FancyBlock'"):
        create_model(path)


@pytest.mark.parametrize("row, match", [
    ([-1, 1, "RepNCSPELAN4", [96, "x", 48, 3]], r"layer 12 \(head row 3\).*cannot build RepNCSPELAN4"),
    ([[-1, 40], 1, "Concat", [1]], r"layer 12 \(head row 3\).*'from'"),
    ([-1, 0, "Conv", [16]], r"layer 12 \(head row 3\).*repeats"),
    ([-1, 1, "Conv"], r"layer 12 \(head row 3\).*\[from, repeats, module, args\]"),
])
def test_bad_rows_name_the_row(row, match):
    cfg = _tiny_cfg()
    cfg["head"][3] = row
    with pytest.raises(LayerTableError, match=match):
        create_model(cfg)


def test_row_that_does_not_fit_its_inputs_is_named():
    cfg = _tiny_cfg()
    cfg["head"][2] = [[-1, 2], 1, "Concat", [1]]  # layer 11 concatenates 40x40 with 160x160 maps
    with pytest.raises(LayerTableError, match=r"layer 11 \(Concat, from \[-1, 2\]\)"):
        create_model(cfg)


def test_unknown_model_name():
    with pytest.raises(ValueError, match="unknown model 'yolov9-x'.*yolov9-t"):
        create_model("yolov9-x")


def test_depth_multiple_repeats_rows():
    cfg = _tiny_cfg(depth_multiple=0.5)
    cfg["backbone"][2] = [-1, 4, "ELAN1", [32, 32, 16]]  # n = 4 -> round(4 * 0.5) = 2 copies
    model = create_model(cfg)
    assert isinstance(model.model[2], torch.nn.Sequential) and len(model.model[2]) == 2


@pytest.mark.parametrize("size", list("tsmce"))
def test_deploy_config_is_the_gelan_table(size):
    """Tracing the main branch of yolov9-X gives exactly the gelan-X layer table (the rows of the official
    models/detect/gelan-X.yaml)."""
    dual, _, _ = load_model_config(f"yolov9-{size}")
    gelan, _, _ = load_model_config(f"gelan-{size}")
    cfg, old_to_new = deploy_config(dual)
    assert cfg["backbone"] == gelan["backbone"] and cfg["head"] == gelan["head"]
    head_old, head_new = {"t": (29, 22), "s": (29, 22), "m": (38, 22), "c": (38, 22), "e": (49, 42)}[size]
    assert old_to_new[head_old] == head_new
    shift = {"t": lambda i: i, "s": lambda i: i, "m": lambda i: i - 1, "c": lambda i: i - 1,
             "e": lambda i: i if i < 29 else i - 7}[size]
    assert all(new == shift(old) for old, new in old_to_new.items() if old != head_old)


def test_activation_checkpointing_keeps_outputs_gradients_and_bn_stats():
    torch.manual_seed(0)
    plain = create_model("gelan-t")
    ckpt = copy.deepcopy(plain)
    assert ckpt.set_activation_checkpointing("all") == [i for i in range(23) if i not in (10, 11, 13, 14, 17, 20)]
    x = torch.rand(2, 3, 64, 64)
    outs = []
    for model in (plain, ckpt):
        out = model(x)
        sum((m * torch.linspace(-1, 1, m.numel()).view_as(m)).sum() for m in out.main).backward()
        outs.append(out)
    assert outs[1].aux is None
    for a, b in zip(outs[0].main, outs[1].main):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    grads = {n: p.grad for n, p in plain.named_parameters() if p.grad is not None}
    assert len(grads) == sum(p.requires_grad for p in plain.parameters())
    for n, p in ckpt.named_parameters():
        if n in grads:
            torch.testing.assert_close(p.grad, grads[n], rtol=1e-5, atol=1e-6)
    for (n, a), b in zip(plain.state_dict().items(), ckpt.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"{n} differs after a checkpointed step")


def test_activation_checkpointing_options(gelan_t):
    model = gelan_t
    assert model.set_activation_checkpointing("backbone") == list(range(9))
    assert model.activation_checkpointing == list(range(9))
    assert model.set_activation_checkpointing([21, 4]) == [4, 21]
    assert model.set_activation_checkpointing(None) == []
    with pytest.raises(ValueError, match="out of range"):
        model.set_activation_checkpointing([99])
    with pytest.raises(ValueError, match="'backbone'"):
        model.set_activation_checkpointing("everything")


def test_flop_count_matches_the_reference_measurement(gelan_t):
    from yolo9kit.models import count_flops

    # reference: torch FlopCounter on the official gelan-t at 640 = 9.900 GFLOPs (thop/official method: 10.078)
    assert count_flops(gelan_t, imgsz=640) == pytest.approx(9.900, rel=2e-3)
    assert count_flops(gelan_t, imgsz=320) == pytest.approx(9.900 / 4, rel=2e-3)
    assert gelan_t.training  # mode restored


def test_models_cli_prints_the_table(capsys):
    from yolo9kit.cli import build_parser, main

    args = build_parser().parse_args(["models", "gelan-t", "--num-classes", "80"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "gelan-t" in out and "2,442,640" in out and "2,407,632" in out and " 9.9 " in out

    assert main(["models", "yolov9-x"]) == 2 and "unknown model" in capsys.readouterr().err
