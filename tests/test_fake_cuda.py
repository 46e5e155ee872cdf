"""The kit's CUDA paths run on fake CUDA tensors (``tests/fake_cuda.py``): no tensor crosses devices, and the
host-device synchronisations are counted against a budget stated in each test.

Budgets are per steady-state step (after one warm-up step, which makes the optimizer state and the EMA's
one-time check of frozen tensors). The step with the fused optimizer (the CUDA default) has none. What fake CUDA cannot
check (kernels, their speed, cuDNN per card, NCCL, real memory) is listed in docs/gpu.md.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from fake_cuda import CudaTensor, DeviceMismatchError, fake_cuda, to_host
from train_toys import one_thread

from yolo9kit.config import TrainConfig
from yolo9kit.env import resolve_device
from yolo9kit.loss import DetectionLoss
from yolo9kit.models import create_model
from yolo9kit.train.loop import train_one_epoch
from yolo9kit.train.state import Progress
from yolo9kit.train.step import ModelEMA, build_trainer, train_step

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

NO_WARMUP = {"warmup_epochs": 0.0, "warmup_min_batches": 0}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("yolov9-t", num_classes=4)


def _batches(n: int, batch: int = 2, size: int = 64, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        images = torch.randint(0, 256, (batch, 3, size, size), generator=g, dtype=torch.uint8)
        rows = [[i, int(torch.randint(0, 4, (1,), generator=g)), 0.3 + 0.1 * i, 0.5, 0.3, 0.4] for i in range(batch)]
        out.append((images, torch.tensor(rows, dtype=torch.float32)))
    return out


def _on_card(tensors, device: torch.device) -> list[str]:
    """Names of the tensors that are not fake CUDA tensors on ``device``."""
    return [name for name, t in tensors if not (isinstance(t, CudaTensor) and t.device == device)]


def _check_trainer_on_card(trainer, device: torch.device) -> None:
    module = trainer.model
    assert not _on_card(module.named_parameters(), device)
    assert not _on_card(module.named_buffers(), device)
    state = [(f"{id(p)}.{k}", v) for p, s in trainer.optimizer.state.items() for k, v in s.items()
             if isinstance(v, torch.Tensor) and v.dim() > 0]  # SGD momentum, Adam moments (steps may be host)
    assert state and not _on_card(state, device)
    if trainer.ema is not None:
        assert not _on_card(trainer.ema.ema.state_dict().items(), device)


# ---- the harness itself -----------------------------------------------------------------------------------

def test_fake_tensors_say_cuda_and_keep_their_values():
    with fake_cuda("H200"):
        x = torch.arange(6.0).reshape(2, 3).to("cuda:0")
        y = (x * 2).sum(0)
        assert isinstance(y, CudaTensor) and y.device == torch.device("cuda", 0)
        assert torch.cuda.get_device_name(0) == "NVIDIA H200" and torch.cuda.is_available()
    assert torch.equal(to_host(y), torch.tensor([6.0, 10.0, 14.0]))


def test_the_harness_refuses_what_a_card_refuses():
    with fake_cuda("H200"):
        x = torch.ones(2, 3).to("cuda:0")
        with pytest.raises(DeviceMismatchError, match="CPU tensor of shape"):
            x + torch.ones(2, 3)
        x + torch.tensor(2.0)  # a 0-dim CPU scalar is allowed, as in CUDA kernels
        x[torch.tensor([0, 1])]  # CPU indices too
        with pytest.raises(TypeError):
            x.numpy()  # no host view of device memory


def test_the_harness_counts_each_host_read():
    with fake_cuda("H200") as fake:
        x = torch.tensor([1.0, -2.0, 3.0]).to("cuda:0")
        reads = [lambda: x.sum().item(), lambda: bool(x[0] > 0), lambda: x.tolist(), lambda: x.cpu(),
                 lambda: x.nonzero(), lambda: x[x > 0], lambda: torch.equal(x, x), lambda: float(x.max()),
                 lambda: torch.cuda.synchronize()]
        for read in reads:
            with fake.counting() as syncs:
                read()
            assert len(syncs) == 1, (read, syncs)
        with fake.counting() as syncs:  # device-side work only: queued, the host never waits
            torch.where(x > 0, x, 0.0).topk(2)
            x[torch.tensor([2, 0]).to("cuda:0")]
            torch.ones(3).to("cuda:0", non_blocking=True)
            torch.isfinite(x).all()
        assert syncs == []


def test_a_planted_device_mix_in_the_step_is_caught(model):
    detection_loss = DetectionLoss(model)

    def mixing_loss(outputs, targets):
        loss, items = detection_loss(outputs, targets)
        return loss, items + torch.zeros(3)  # the planted bug: a CPU tensor meets the device's items

    with fake_cuda("H200"):
        trainer = build_trainer(copy.deepcopy(model), TrainConfig(device="cuda", **NO_WARMUP), loss_fn=mixing_loss)
        with pytest.raises(DeviceMismatchError, match="at tests/test_fake_cuda.py"):
            _step(trainer, *_batches(1)[0])


def test_a_planted_sync_in_the_step_is_counted(model):
    detection_loss = DetectionLoss(model)

    def reading_loss(outputs, targets):
        loss, items = detection_loss(outputs, targets)
        if float(loss.detach()) > 1e9:  # the planted bug: a host read of the loss in every micro-step
            raise AssertionError
        return loss, items

    with fake_cuda("H200") as fake:
        trainer = build_trainer(copy.deepcopy(model), TrainConfig(device="cuda", **NO_WARMUP), loss_fn=reading_loss)
        batches = _batches(3)
        _step(trainer, *batches[0])
        with fake.counting() as syncs:
            for images, targets in batches[1:]:
                _step(trainer, images, targets)
    assert len(syncs) == 2, [str(s) for s in syncs]  # the budget of 0 would fail
    assert all(s.op == "aten._local_scalar_dense.default" and s.where.startswith("tests/test_fake_cuda.py:")
               and s.where.endswith("reading_loss") for s in syncs)


# ---- the training step as fit builds it for CUDA ------------------------------------------------------------

def _step(trainer, images, targets):
    """One optimizer step of ``train_step``."""
    return train_step(trainer, images, targets, ni=trainer.last_opt_step + 1, accumulate_steps=1)


def _steady_state_syncs(trainer, fake, batches) -> list:
    _step(trainer, *batches[0])  # warm-up: optimizer state, the EMA's one-time check of frozen tensors
    with fake.counting() as syncs:
        for images, targets in batches[1:]:
            _step(trainer, images, targets)
    return syncs


@pytest.mark.parametrize("amp", ["fp16", "bf16", "off"])
@pytest.mark.parametrize("fused", [True, False])
def test_training_step_on_cuda_stays_on_the_card(model, amp, fused):
    config = TrainConfig(device="cuda", amp=amp, fused_optimizer=fused, **NO_WARMUP)
    with fake_cuda("H200") as fake:
        device = resolve_device(config.run.device)
        trainer = build_trainer(copy.deepcopy(model), config, device=device)
        syncs = _steady_state_syncs(trainer, fake, _batches(3))
        _check_trainer_on_card(trainer, device)
        assert trainer.step.amp == amp and trainer.channels_last and trainer.step.lean_activations
        weight = trainer.model.model[0].conv.weight
        assert weight.is_contiguous(memory_format=torch.channels_last)
        assert trainer.scaler.is_enabled()  # always: fp16 loss scaling, else a fixed scale of 1
    per_step = len(syncs) / 2
    if fused:
        assert syncs == [], [str(s) for s in syncs]  # the fast default: the host never waits inside the step
    else:  # the unfused optimizer: GradScaler.step reads found_inf once per optimizer step
        assert per_step == 1 and all(s.where.endswith("train_step") for s in syncs), [str(s) for s in syncs]


@pytest.mark.parametrize("change", [
    {"micro_batch_size": 1}, {"freeze": "backbone"}, {"activation_checkpointing": "all"},
    {"lean_activations": False}, {"channels_last": False}, {"optimizer": "AdamW"}])
def test_training_step_variants_do_not_sync_on_cuda(model, change):
    config = TrainConfig(device="cuda", **NO_WARMUP, **change)
    with fake_cuda("A100") as fake:
        device = resolve_device("cuda")
        trainer = build_trainer(copy.deepcopy(model), config, device=device)
        syncs = _steady_state_syncs(trainer, fake, _batches(3, batch=2))
        _check_trainer_on_card(trainer, device)
        assert trainer.step.amp == "bf16" and trainer.step.fused_optimizer
        if "freeze" in change:
            frozen = [p for n, p in trainer.model.named_parameters() if n.startswith("model.0.")]
            assert frozen and all(p.grad is None and not p.requires_grad for p in frozen)
    assert syncs == [], [str(s) for s in syncs]


def test_an_epoch_with_multi_scale_reads_back_once_per_log_interval(model, monkeypatch):
    """train_one_epoch as fit runs it: multi-scale resizing on the device, the losses read back every
    LOG_INTERVAL batches (one transfer each: the loss items, whose finiteness is checked on the host) and nothing
    else."""
    monkeypatch.setattr("yolo9kit.train.loop.LOG_INTERVAL", 2)
    config = TrainConfig(device="cuda", epochs=1, multi_scale=True, imgsz=64, **NO_WARMUP)
    with fake_cuda("RTX 4090") as fake:
        trainer = build_trainer(copy.deepcopy(model), config, device=resolve_device("cuda"))
        batches = _batches(5)
        _step(trainer, *batches[0])
        records = []
        with fake.counting() as syncs:
            stats = train_one_epoch(trainer, batches[1:], config, Progress(), batches_per_epoch=4, warmup=0,
                                    progress_bar=False, on_batch=records.append)
    assert stats.images == 8 and len(records) == 4
    assert len(syncs) == 2 and all(s.op.endswith("to the host") for s in syncs), [str(s) for s in syncs]


def test_nonfinite_steps_keep_the_fixed_scale_of_the_bf16_step(model):
    """bf16: NaN gradients make the scaler skip the step on the device, and its scale stays 1."""
    with fake_cuda("H100", grad_value=float("nan")) as fake:
        trainer = build_trainer(copy.deepcopy(model), TrainConfig(device="cuda", ema=False, **NO_WARMUP),
                                device=resolve_device("cuda"))
        before = to_host(next(trainer.model.parameters()))
        with fake.counting() as syncs:
            for images, targets in _batches(3):
                _step(trainer, images, targets)
        assert trainer.scaler.get_growth_interval() == 2**30 and float(to_host(trainer.scaler._scale)) == 1.0
        assert torch.equal(to_host(next(trainer.model.parameters())), before)  # every step was skipped
    assert syncs == []


def test_ema_update_on_cuda_is_two_kernels_and_no_sync(model):
    with fake_cuda("H200") as fake:
        module = copy.deepcopy(model).to(resolve_device("cuda"), memory_format=torch.channels_last)
        ema = ModelEMA(module)
        ema.update(module)  # the first one checks once which frozen tensors equal the model's
        with fake.counting() as syncs:
            for _ in range(3):
                ema.update(module)
        assert not _on_card(ema.ema.state_dict().items(), torch.device("cuda", 0)) and ema.updates == 4
    assert syncs == []


# ---- inference and data on the device ----------------------------------------------------------------------

def test_eval_forward_in_fp16_channels_last_does_not_sync(model):
    """What validation and predict run per batch: the fused deploy model in FP16, channels_last inputs."""
    from yolo9kit.models.deploy import prepare_model

    with fake_cuda("T4") as fake:
        device = resolve_device("cuda")
        deployed = prepare_model(model, device, torch.float16, deploy=True).to(memory_format=torch.channels_last)
        x = torch.rand(2, 3, 64, 96).to(device, torch.half).contiguous(memory_format=torch.channels_last)
        with torch.no_grad(), fake.counting() as syncs:
            out = deployed(x).main
        assert isinstance(out, CudaTensor) and out.dtype == torch.half and out.shape == (2, 8, 126)
    assert syncs == [], [str(s) for s in syncs]
    assert next(model.parameters()).device.type == "cpu"  # the caller's model is not moved


def test_predict_on_cuda_warms_up_in_the_input_layout(model):
    """predict's FP16 path: the warm-up and every image reach the model channels_last, as cuDNN was tuned."""
    from yolo9kit import predict
    from yolo9kit.models.deploy import deploy_for_inference

    layouts = []
    first_conv = deploy_for_inference(model, "main").model[0]  # the cached deployed model predict copies
    hook = first_conv.register_forward_pre_hook(
        lambda _module, args: layouts.append((args[0].is_contiguous(memory_format=torch.channels_last),
                                              args[0].dtype)))
    images = [np.full((60, 80, 3), 90, np.uint8), np.full((64, 64, 3), 200, np.uint8)]
    try:
        with fake_cuda("RTX 4090") as fake, fake.counting() as syncs:
            results = predict(model, images, imgsz=64, device="cuda")
    finally:
        hook.remove()
    assert len(results) == 2 and len(layouts) == 3  # the warm-up, then the two images
    assert all(layout == (True, torch.half) for layout in layouts), layouts
    # per image: NMS and reading its boxes back, and the synchronize calls of the speed timers
    assert len(syncs) <= 10 * len(images), [str(s) for s in syncs]


def test_colour_jitter_on_the_device_gives_the_cpu_pixels():
    from yolo9kit.data.images import hsv_jitter

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (3, 3, 16, 24), generator=g, dtype=torch.uint8)
    gains = 1 + 0.5 * (torch.rand(3, 3, generator=g) - 0.5)
    expected = hsv_jitter(images, gains)
    with fake_cuda("H200") as fake:
        device = resolve_device("cuda")
        with fake.counting() as syncs:  # the gains stay on the host, as the loader hands them over
            out = hsv_jitter(images.to(device), gains)
        assert isinstance(out, CudaTensor) and out.device == device
    assert syncs == [] and torch.equal(to_host(out), expected)


def test_loader_hands_batches_to_the_device_and_the_step_takes_them(model, tmp_path_factory):
    from yolo9kit.data import create_dataloader, make_shapes

    data = make_shapes(tmp_path_factory.mktemp("shapes") / "shapes", n_train=4, n_val=2, imgsz=64)
    with fake_cuda("H200") as fake:
        device = resolve_device("cuda")
        loader = create_dataloader(data, "train", imgsz=64, batch_size=2, workers=0, colour_device=device)
        images, targets, *_ = next(iter(loader))
        assert isinstance(images, CudaTensor) and images.dtype == torch.uint8 and images.device == device
        assert not isinstance(targets, CudaTensor)  # boxes stay on the host: the loss pads them there
        trainer = build_trainer(copy.deepcopy(model), TrainConfig(device="cuda", imgsz=64, **NO_WARMUP),
                                device=device)
        _step(trainer, images, targets)
        with fake.counting() as syncs:
            items = _step(trainer, images, targets)
        assert isinstance(items, CudaTensor)
    assert syncs == []


def test_build_trainer_leaves_cudnn_autotuning_alone(model):
    from yolo9kit.train.step import cudnn_autotune

    previous = torch.backends.cudnn.benchmark
    with fake_cuda("H200"):
        build_trainer(copy.deepcopy(model), TrainConfig(device="cuda", **NO_WARMUP))
        assert torch.backends.cudnn.benchmark == previous
        with pytest.raises(KeyError), cudnn_autotune(torch.device("cuda", 0)):
            assert torch.backends.cudnn.benchmark
            raise KeyError
    assert torch.backends.cudnn.benchmark == previous


@pytest.mark.slow
def test_fit_on_cuda_end_to_end(model, tmp_path, monkeypatch):
    """fit as a user calls it on a card: the loader's batches jittered on the device, the fused step, the
    FP16 validation of the EMA, the checkpoints (they load on a CPU), cuDNN autotuning for the run only. The
    only syncs of the epoch's training are the read-backs of the logged losses; validation and the saves read
    back as they must (NMS, metrics, the checkpoint's bytes)."""
    from yolo9kit.data import make_shapes
    from yolo9kit.train.fit import fit

    data = make_shapes(tmp_path / "shapes", n_train=8, n_val=4, imgsz=64)
    autotuned = []
    config = TrainConfig(epochs=1, batch_size=4, imgsz=64, workers=0, project=str(tmp_path / "runs"), name="cuda",
                         plots=False, progress_bar=False,
                         callbacks={"on_batch": lambda record: autotuned.append(torch.backends.cudnn.benchmark)})
    previous = torch.backends.cudnn.benchmark
    monkeypatch.setattr("yolo9kit.train.loop.LOG_INTERVAL", 1)
    with fake_cuda("A100") as fake:
        result = fit(copy.deepcopy(model), data, config)
    assert result.epochs_completed == 1 and result.step.amp == "bf16" and result.step.fused_optimizer
    assert autotuned == [True, True] and torch.backends.cudnn.benchmark == previous
    assert result.results[0]["peak_allocated"] > 0  # the fake counters followed the step's tensors
    in_step = [s for s in fake.syncs if s.where.startswith(("train/step.py", "loss.py", "assigner.py", "models/"))
               and not s.where.endswith(" _same")  # but the EMA's one-time check of the frozen tensors
               and not s.where.startswith("models/checkpoint.py")]  # the saves read the weights back, as they must
    assert in_step == [], [str(s) for s in in_step]
    read_backs = [s for s in fake.syncs if s.where.startswith("train/loop.py")]
    assert len(read_backs) == 2 and all(s.where.endswith("flush") for s in read_backs)  # 2 batches, 1 each
    saved = torch.load(result.last, map_location="cpu", weights_only=True)
    assert all(type(v) is torch.Tensor for v in saved["model"].values())
