"""What the kit decides on a given card, and what it resumes there, on simulated cards (tests/fake_cuda.py):
T4 and V100 (compute capability below 8.0: no bf16), a GTX 1660 Ti (no bf16, and fp16 gives NaN losses), A100,
RTX 4090, H100, H200.

"auto" AMP, ``batch_size="auto"``, ``plan``, the estimate and ``fit``'s step must agree on every card; a run
saved elsewhere (a CPU, another AMP mode, a machine with more GPUs) resumes on it.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from fake_cuda import CARDS, fake_cuda, simulated_cards
from train_toys import ToyNet, make_batches, one_thread, toy_loss

from yolo9kit.config import StepConfig, TrainConfig
from yolo9kit.env import resolve_device
from yolo9kit.memory import estimate, plan
from yolo9kit.memory.estimate import estimator_for
from yolo9kit.memory.gpus import target_gpu
from yolo9kit.memory.measure import require_cuda
from yolo9kit.memory.plan import choose_batch
from yolo9kit.models import create_model
from yolo9kit.train.guards import DistributedOutOfMemoryError
from yolo9kit.train.state import Progress, capture_rng, restore_rng, restore_training_state, training_state
from yolo9kit.train.step import BatchNormSnapshot, build_trainer, describe_step, train_step_with_backoff

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

AUTO_AMP = {"T4": "fp16", "V100": "fp16", "GTX 1660 Ti": "off", "A100": "bf16", "RTX 4090": "bf16", "H100": "bf16",
            "H200": "bf16"}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("yolov9-t", num_classes=4)


@pytest.mark.parametrize("card", list(CARDS))
def test_auto_amp_batch_plan_estimate_and_fit_agree_on_each_card(model, card):
    """torch's is_bf16_supported() says True on a T4 and a V100 (it counts emulation): the kit asks the
    compute capability, in one place, so the step fit trains and the step the memory tools size agree."""
    expected = AUTO_AMP[card]
    config = TrainConfig(imgsz=64, batch_size="auto")
    step = StepConfig(model, 8, imgsz=64)
    with simulated_cards(card):
        device = resolve_device("cuda")
        fitted = describe_step(dataclasses.replace(config, batch_size=8), model, device)
        _, auto = choose_batch(config, model, device)
        decided = {
            "StepConfig.resolve": step.resolve("cuda").amp,
            "fit": fitted.amp,
            "estimate": estimate(step).step.amp,
            "plan": estimator_for(step, plan(step, 64, method="estimated").gpu).step.amp,
            "batch auto": auto.step["amp"],
        }
        card_bf16 = target_gpu(None, device).bf16
    assert decided == dict.fromkeys(decided, expected), decided
    assert card_bf16 == (expected == "bf16")
    assert auto.capacity_bytes == CARDS[card].total_memory


@pytest.mark.parametrize("card", ["T4", "V100"])
def test_explicit_bf16_is_refused_on_a_card_without_it(model, card):
    with simulated_cards(card):
        with pytest.raises(ValueError, match=rf"amp='bf16': {CARDS[card].name} \(cuda:0\) has no bf16.*amp='fp16'"):
            StepConfig(model, 8, amp="bf16").resolve("cuda")
        with pytest.raises(ValueError, match="has no bf16"):
            describe_step(TrainConfig(amp="bf16"), model, resolve_device("cuda"))
    with pytest.raises(ValueError, match=f"amp='bf16': {card}.* has no bf16"):
        estimate(StepConfig(model, 8, imgsz=64, amp="bf16"), gpu=card)


def test_fp16_is_refused_on_a_card_where_it_gives_nan_and_the_estimate_follows(model):
    """GTX 16xx and Quadro T cards give NaN losses in fp16: "auto" is fp32 there (the test above), "fp16" refused."""
    with simulated_cards("GTX 1660 Ti"):
        with pytest.raises(ValueError, match=r"amp='fp16': NVIDIA GeForce GTX 1660 Ti \(cuda:0\) gives NaN.*'auto'"):
            StepConfig(model, 8, amp="fp16").resolve("cuda")
        with pytest.raises(ValueError, match="gives NaN"):
            describe_step(TrainConfig(amp="fp16", batch_size=8), model, resolve_device("cuda"))
    with pytest.raises(ValueError, match="amp='fp16': GTX 1660 Ti gives NaN"):
        estimate(StepConfig(model, 8, imgsz=64, amp="fp16"), gpu="GTX 1660 Ti")
    assert StepConfig(model, 8).resolve("cuda", bf16=False, gpu_name="Quadro T1000").amp == "off"
    assert StepConfig(model, 8).resolve("cuda", bf16=False, gpu_name="Tesla T4").amp == "fp16"


def test_cuda_without_an_index_is_the_current_card(model):
    """On a machine with a T4 as cuda:0 and an H200 as the current device, "cuda" is the H200 everywhere."""
    with simulated_cards("T4", "H200", current=1):
        assert resolve_device("cuda") == torch.device("cuda", 1) == require_cuda("cuda")
        assert target_gpu(TrainConfig().gpu, torch.device("cuda")).total_bytes == CARDS["H200"].total_memory
        assert target_gpu(None).total_bytes == CARDS["H200"].total_memory
        assert StepConfig(model).resolve("cuda").amp == "bf16"
        assert StepConfig(model).resolve("cuda:0").amp == "fp16"  # named, the T4


# ---- resume on another card or machine ---------------------------------------------------------------------

def _toy_trainer(**config):
    return build_trainer(ToyNet(), TrainConfig(ema=False, **config), loss_fn=toy_loss)


def _checkpoint(trainer) -> dict:
    state = training_state(trainer, Progress(), {})
    state["model"] = trainer.model.state_dict()
    return state


def test_a_cpu_run_resumes_on_a_gpu_with_loss_scaling():
    """The CPU run's scaler keeps a fixed scale of 1; the fp16 run on the card starts its own loss scaling."""
    saved = _checkpoint(_toy_trainer(device="cpu"))
    assert saved["scaler"]["scale"] == 1.0 and saved["scaler_kind"] == "fixed"
    with fake_cuda("RTX 4090"):
        trainer = _toy_trainer(device="cuda", amp="fp16")
        restore_training_state(saved, trainer)
        assert trainer.scaler.get_scale() == 2.0**16 and trainer.scaler.get_growth_interval() == 2000


def test_an_fp16_run_never_inherits_the_fixed_scale_of_a_bf16_state():
    with fake_cuda("H100"):
        saved = _checkpoint(_toy_trainer(device="cuda", amp="bf16"))  # a fixed scale of 1
        assert saved["scaler"]["scale"] == 1.0 and saved["scaler_kind"] == "fixed"
        fp16 = _toy_trainer(device="cuda", amp="fp16")
        restore_training_state(saved, fp16)
        assert fp16.scaler.get_scale() == 2.0**16 and fp16.scaler.get_growth_interval() == 2000

        same = _toy_trainer(device="cuda", amp="fp16")
        same.scaler.load_state_dict({**same.scaler.state_dict(), "scale": 1024.0})
        kept = _toy_trainer(device="cuda", amp="fp16")
        restore_training_state(_checkpoint(same), kept)  # the same kind: its state is kept
        assert kept.scaler.get_scale() == 1024.0


def test_the_cuda_random_state_resumes_on_a_machine_with_fewer_gpus():
    with simulated_cards("H200", "H200"):
        state = capture_rng(torch.device("cuda", 1))  # a run on the second GPU of two
        saved = torch.cuda.get_rng_state(1)
    assert isinstance(state["cuda"], torch.Tensor)
    with simulated_cards("H200"):
        restore_rng(state, torch.device("cuda", 0))
        assert torch.equal(torch.cuda.get_rng_state(0), saved)


# ---- out of memory under DDP -------------------------------------------------------------------------------

class _OutOfMemoryInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")


def _oom_loss(on_calls: set[int]):
    calls = {"n": 0}

    def loss_fn(outputs, targets):
        calls["n"] += 1
        loss, items = toy_loss(outputs, targets)
        return (_OutOfMemoryInBackward.apply(loss) if calls["n"] in on_calls else loss), items

    return loss_fn


@pytest.fixture
def one_rank(tmp_path):
    """A process group of this process alone (gloo): a real DistributedDataParallel wrapper on the CPU."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _ddp_backoff(on_calls: set[int], ddp: bool):
    """Batch 4 as micro-batches of 2, out of memory in the backward of the micro-steps ``on_calls``."""
    (images, targets, *_), = make_batches(1, 4)
    model = torch.nn.parallel.DistributedDataParallel(ToyNet()) if ddp else ToyNet()
    config = TrainConfig(device="cpu", amp="off", ema=False, micro_batch_size=2, channels_last=False)  # DDP's layout
    trainer = build_trainer(model, config, loss_fn=_oom_loss(on_calls))
    train_step_with_backoff(trainer, images, targets, BatchNormSnapshot(model), ni=0, accumulate_steps=1)
    return trainer


def test_out_of_memory_in_the_synchronising_micro_step_of_ddp_stops(one_rank):
    """Under DDP the last micro-step of a batch all-reduces the gradients: one rank cannot redo it alone."""
    with pytest.raises(DistributedOutOfMemoryError, match="cannot retry it alone"):
        _ddp_backoff({2}, ddp=True)
    trainer = _ddp_backoff({2}, ddp=False)  # a single process backs off there too
    assert trainer.micro_batch_size == 1 and trainer.oom_events == 1 and trainer.optimizer_steps == 1


def test_out_of_memory_in_a_no_sync_micro_step_of_ddp_backs_off(one_rank):
    trainer = _ddp_backoff({1}, ddp=True)
    assert trainer.micro_batch_size == 1 and trainer.oom_events == 1 and trainer.optimizer_steps == 1
    assert trainer.model.require_backward_grad_sync  # the last of the 4 new micro-steps synchronised
