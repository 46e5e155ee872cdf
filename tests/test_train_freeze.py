"""Freezing layers (official train_dual.py ``--freeze``): which parameters, no gradients, no optimizer state,
no EMA drift, the memory estimate of the frozen step against the traced real step, and a fine-tuning run from a
checkpoint that validates."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch
from train_toys import one_thread

from yolo9kit.cli import train as train_cli
from yolo9kit.config import StepConfig, TrainConfig
from yolo9kit.models import create_model
from yolo9kit.models.checkpoint import read_checkpoint, save_checkpoint
from yolo9kit.models.model import freeze_layers, frozen_layer_indices
from yolo9kit.train.fit import fit
from yolo9kit.train.optim import build_optimizer
from yolo9kit.train.step import ModelEMA, build_trainer, train_step

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def yolov9_t():
    torch.manual_seed(0)
    return create_model("yolov9-t", num_classes=2)


def freeze_words(words: list) -> int | str | list[int] | None:
    """The train command's reading of ``--freeze`` words, as TrainConfig stores it."""
    parser = argparse.ArgumentParser()
    train_cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["train", "--freeze", *map(str, words)]).freeze


def _official_names(model, freeze_flag: list[int]) -> set[str]:
    """The official rule, restated: ``freeze = [f'model.{x}.' for x in (freeze if len(freeze) > 1 else
    range(freeze[0]))]`` and a parameter is frozen when any of those strings is in its name."""
    keys = [f"model.{x}." for x in (freeze_flag if len(freeze_flag) > 1 else range(freeze_flag[0]))]
    return {k for k, _ in model.named_parameters() if any(x in k for x in keys)}


@pytest.mark.parametrize("flag", [[0], [3], [10], [0, 1, 2], [2, 11, 21]])
def test_frozen_parameters_follow_the_official_rule(yolov9_t, flag):
    import copy

    model = copy.deepcopy(yolov9_t)
    value = freeze_words(flag)  # the CLI's reading of the words, as TrainConfig stores it
    names = set(freeze_layers(model, TrainConfig(freeze=value).step.freeze))
    assert names == _official_names(yolov9_t, flag)
    frozen_now = {k for k, p in model.named_parameters() if not p.requires_grad}
    dfl = {k for k, p in yolov9_t.named_parameters() if not p.requires_grad}  # fixed from the start, as official
    assert frozen_now == names | dfl and (len(names) > 0) == (flag != [0])


def test_backbone_is_the_yaml_backbone_rows(yolov9_t):
    assert frozen_layer_indices(yolov9_t, "backbone") == list(range(9)) == list(range(len(yolov9_t.yaml["backbone"])))
    from yolo9kit.models import load_model_config
    from yolo9kit.models.model import DetectionModel

    cfg, _, _ = load_model_config("yolov9-c")
    model = DetectionModel(cfg, nc=2, probe=False)
    assert frozen_layer_indices(model, "backbone") == list(range(10))  # the official --freeze 10 of yolov9-c


def test_freeze_values_checked_and_errors_name_the_range(yolov9_t):
    assert TrainConfig(freeze=[0, 1]).step.freeze == (0, 1) and TrainConfig(freeze=0).step.freeze is None
    assert TrainConfig(freeze=[2, 3]).to_dict()["freeze"] == [2, 3]
    assert StepConfig("yolov9-t", freeze=[4]).freeze == (4,)  # a list of one index is that layer (Python API)
    for bad in (-1, "head", [], [1, -2], True, 1.5):
        with pytest.raises(ValueError, match="freeze"):
            TrainConfig(freeze=bad)
    with pytest.raises(ValueError, match="0..29"):
        frozen_layer_indices(yolov9_t, [3, 30])
    assert freeze_words(["backbone"]) == "backbone" and freeze_words(["none"]) is None
    for bad in (["-3"], ["backbone", "1"], ["x"]):
        with pytest.raises(SystemExit):
            freeze_words(bad)


@pytest.mark.slow
def test_frozen_step_trains_only_the_unfrozen_parameters(yolov9_t):
    """A few real steps with the backbone frozen: frozen tensors (and their EMA) bit-identical, the trained
    tensors changed (all but those whose gradient is exactly zero: a head branch with no assigned box at this
    size), no gradient and no optimizer state for a frozen one, state for every trained one."""
    import copy

    from yolo9kit.memory.tracer import synthetic_batch

    model = copy.deepcopy(yolov9_t)
    config = TrainConfig(batch_size=2, imgsz=64, amp="off", device="cpu", freeze="backbone", lr0=0.05)
    trainer = build_trainer(model, config)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    ema_before = {k: v.clone() for k, v in trainer.ema.ema.state_dict().items()}
    for group in trainer.optimizer.param_groups:
        group["lr"] = 0.05
    images, targets = synthetic_batch(2, 64, 4, 2)
    for ni in range(3):
        assert torch.isfinite(train_step(trainer, images, targets, ni=ni, accumulate_steps=1)).all()
    frozen = {k for k, p in model.named_parameters() if not p.requires_grad}
    dfl = {k for k, p in yolov9_t.named_parameters() if not p.requires_grad}  # fixed DFL convolutions
    assert frozen - dfl == {k for k in before if k.startswith(
        tuple(f"model.{i}." for i in range(9)))}
    in_optimizer = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    ema_after = trainer.ema.ema.state_dict()
    for k, p in model.named_parameters():
        if k in frozen:
            assert torch.equal(p, before[k]) and p.grad is None and id(p) not in in_optimizer, k
            assert torch.equal(ema_after[k], ema_before[k]), k
        else:
            assert id(p) in in_optimizer, k
    trained = [k for k, p in model.named_parameters() if p.requires_grad]
    assert sum(not torch.equal(model.get_parameter(k), before[k]) for k in trained) > 0.9 * len(trained)
    assert set(map(id, trainer.optimizer.state)) == in_optimizer  # state only for the trained tensors


def test_ema_averages_a_frozen_tensor_it_does_not_equal():
    """Leaving a frozen tensor out of the EMA is exact only while the EMA equals it; otherwise the official
    update runs on it."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.Conv2d(4, 4, 1))
    model[0].weight.requires_grad_(False)
    ema = ModelEMA(model, decay=0.5, tau=1e-9)
    ema.update(model)
    assert torch.equal(ema.ema[0].weight, model[0].weight)
    state = ema.state_dict()
    state["model"]["0.weight"] = state["model"]["0.weight"] + 1
    ema.load_state_dict(state)
    ema.update(model)
    torch.testing.assert_close(ema.ema[0].weight, model[0].weight + 0.5)


def test_optimizer_groups_without_freeze_are_the_official_ones(yolov9_t):
    plain = build_optimizer(yolov9_t, TrainConfig())
    frozen = build_optimizer(yolov9_t, TrainConfig(freeze=3))
    assert [len(g["params"]) for g in plain.param_groups] == [303, 305, 291]  # the official smart_optimizer
    assert sum(len(g["params"]) for g in frozen.param_groups) == sum(p.requires_grad for p in yolov9_t.parameters())


@pytest.mark.slow
def test_estimate_of_the_frozen_step_is_lower_and_equals_the_traced_step():
    """The estimate of yolov9-t with the backbone frozen keeps no gradient and no optimizer state for it and
    fewer activations (autograd saves nothing for layers whose inputs and weights need no gradient); it
    equals the kit's real step on the CPU traced by the same tracker, category by category at the peak."""
    from yolo9kit.memory import StepEstimator
    from yolo9kit.memory.tracer import synthetic_batch, trace_real_step
    from yolo9kit.train.step import describe_step

    config = TrainConfig(batch_size=2, imgsz=64, amp="off", device="cpu", freeze="backbone")
    step = describe_step(config, create_model("yolov9-t"), torch.device("cpu"))
    assert step.freeze == "backbone" and "freeze=backbone" in step.label
    step = dataclasses.replace(step, model="yolov9-t", num_targets=4, num_classes=80)
    frozen_est, full_est = StepEstimator(step), StepEstimator(dataclasses.replace(step, freeze=None))
    for b in (2, 64):  # the optimizer step's peak (b = 2), the backward's (b = 64: activations dominate)
        (frozen_peak, frozen_parts), (full_peak, full_parts) = frozen_est.memory.peak(b), full_est.memory.peak(b)
        assert frozen_peak < full_peak and frozen_parts["weights"] == full_parts["weights"], b
        for cat in ("optimizer_state",) + (("activations",) if b == 64 else ("gradients",)):
            assert frozen_parts[cat] < full_parts[cat], (b, cat)
    frozen_peak, frozen_parts = frozen_est.memory.peak(2)
    torch.manual_seed(0)
    model = create_model("yolov9-t")
    trainer = build_trainer(model, config)
    for group in trainer.optimizer.param_groups:  # the multi-tensor kernels, CUDA's default (as the estimate)
        group["foreach"] = True
    images, targets = synthetic_batch(2, 64, 4, 80)
    train_step(trainer, images, targets, ni=0, accumulate_steps=1)  # steady state: momentum exists, as in the estimate
    real = trace_real_step(trainer, images, targets, device_type="cuda").peak()
    for cat in ("weights", "gradients", "optimizer_state", "ema", "activations"):
        assert abs(frozen_parts[cat] - real[cat]) <= 4 * 512, (cat, frozen_parts[cat], real[cat])
    assert frozen_peak == pytest.approx(sum(real.values()), rel=0.01)


@pytest.mark.slow
def test_fine_tuning_a_checkpoint_with_the_backbone_frozen(tmp_path):
    """fit from a checkpoint file with freeze="backbone": the backbone's parameters in last.pt (model and EMA)
    are those of the checkpoint bit for bit, the rest trained, the optimizer state holds only the trained tensors,
    and the result validates."""
    from yolo9kit.data import make_shapes
    from yolo9kit.validate import evaluate

    data = make_shapes(tmp_path / "shapes", n_train=4, n_val=2, imgsz=64, num_classes=2)
    torch.manual_seed(0)
    start = save_checkpoint(tmp_path / "start.pt", create_model("yolov9-t", num_classes=2))
    config = TrainConfig(epochs=1, batch_size=2, imgsz=64, workers=0, device="cpu", warmup_epochs=0.0,
                         warmup_min_batches=0, accumulate_steps=1, freeze="backbone", project=str(tmp_path / "runs"),
                         progress_bar=False)
    result = fit(str(start), data, config)
    before = read_checkpoint(start)["model"]
    last = read_checkpoint(result.last)
    backbone = tuple(f"model.{i}." for i in range(9))
    trained = [k for k, p in result.model.named_parameters() if p.requires_grad]
    for k, _ in result.model.named_parameters():  # BatchNorm running statistics keep following the data
        if k.startswith(backbone):
            assert torch.equal(last["model"][k].float(), before[k].float()), k
            assert torch.equal(last["ema"][k].float(), before[k].float()), k
    assert all(not k.startswith(backbone) for k in trained)
    assert sum(not torch.equal(last["model"][k].float(), before[k].float()) for k in trained) > 0.9 * len(trained)
    counts = [len(g["params"]) for g in last["optimizer"]["param_groups"]]
    assert sum(counts) == len(trained) and len(last["optimizer"]["state"]) == len(trained)
    assert result.results[-1]["metrics/mAP50"] is not None  # the last epoch was validated
    r = evaluate(result.best or result.last, data, imgsz=64, batch_size=2, device="cpu", workers=0)
    assert 0.0 <= r.map50 <= 1.0


class _Layered(torch.nn.Module):
    """Conv -> SiLU -> conv in ``self.model`` (the layer list freezing reads), no BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.SiLU(), torch.nn.Conv2d(8, 4, 1))
        self.nc, self.names, self.yaml = 1, ["thing"], {"toy": True}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


def _ddp_worker(rank, project, out_file):
    import torch.distributed as dist
    from train_toys import make_batches, rebatch, toy_loss

    torch.manual_seed(0)
    batches = [rebatch([(im, tg, None, None)], 2)[rank] for im, tg, *_ in make_batches(3, 4)]
    config = TrainConfig(epochs=2, batch_size=4, accumulate_steps=1, amp="off", device="cpu", warmup_epochs=0.0,
                         warmup_min_batches=0, lr0=0.05, freeze=1, project=str(project), progress_bar=False)
    result = fit(_Layered(), None, config, loss_fn=toy_loss, train_loader=batches)
    gathered = [None] * 2
    dist.all_gather_object(gathered, {k: v.detach().clone() for k, v in result.model.state_dict().items()})
    if rank == 0:
        torch.save({"ranks": gathered, "steps": result.optimizer_steps}, out_file)


@pytest.mark.slow
def test_ddp_trains_with_frozen_layers(tmp_path):
    """fit freezes before wrapping the model in DDP: DDP's reducer then expects no gradient for the frozen layer
    (frozen after wrapping, the second step fails waiting for it). Both ranks keep it as it was."""
    import torch.distributed as dist
    from train_toys import spawn_ranks

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    out_file = tmp_path / "ddp.pt"
    spawn_ranks(_ddp_worker, str(tmp_path / "init"), tmp_path / "runs", str(out_file))
    out = torch.load(out_file, weights_only=False)
    torch.manual_seed(0)
    start = _Layered().state_dict()
    assert out["steps"] == 6
    for k, v in start.items():
        assert torch.equal(out["ranks"][0][k], out["ranks"][1][k]), k
        assert torch.equal(out["ranks"][0][k], v) == k.startswith("model.0."), k
