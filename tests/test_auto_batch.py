"""TrainConfig(batch_size="auto"): the batch is memory.plan's recommendation for the card, chosen before the
first step from the estimate; the run folder records the prediction; an out-of-memory error still backs off."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from train_toys import one_thread

from yolo9kit import memory
from yolo9kit.config import StepConfig, TrainConfig
from yolo9kit.env import memory_limits
from yolo9kit.loss import DetectionLoss
from yolo9kit.memory.gpus import target_gpu
from yolo9kit.memory.plan import choose_batch
from yolo9kit.models import create_model
from yolo9kit.train.fit import fit
from yolo9kit.train.optim import base_accumulate
from yolo9kit.train.step import describe_step

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def shapes64(tmp_path_factory):
    from yolo9kit.data import make_shapes

    return make_shapes(tmp_path_factory.mktemp("shapes64"), n_train=8, n_val=4, imgsz=64, num_classes=2)


def _model():
    torch.manual_seed(0)
    return create_model("yolov9-t", num_classes=2)


def test_batch_auto_and_minus_one_are_the_same_and_validated():
    assert TrainConfig(batch_size=-1).batch_size == "auto"
    with pytest.raises(ValueError, match="batch_size=0"):
        TrainConfig(batch_size=0)
    with pytest.raises(ValueError, match="micro_batch_size"):
        TrainConfig(batch_size="auto", micro_batch_size=4)
    with pytest.raises(ValueError, match="margin"):
        TrainConfig(margin=1.0)
    with pytest.raises(ValueError, match="'auto'"):
        describe_step(TrainConfig(batch_size="auto"), _model(), CPU)  # sized before the step is described


def test_cpu_training_is_sized_against_the_available_ram():
    target = target_gpu(TrainConfig(batch_size="auto").gpu, CPU)
    assert target.device_type == "cpu" and target.total_bytes == pytest.approx(memory_limits()["RAM"], rel=0.05)
    assert target_gpu(TrainConfig(batch_size="auto", gpu="T4").gpu, CPU).name == "T4"


def test_batch_auto_on_the_cpu_is_bounded_by_the_process_limit():
    """Under ``prlimit --as`` (here: setrlimit in the child) the CPU batch is sized against what the process may
    still map, not the machine's RAM."""
    code = ("import torch; from yolo9kit.memory.gpus import host_memory; m = host_memory(); "
            "print(m.name); print(m.total_bytes)")

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                         preexec_fn=limit)
    name, total = run.stdout.split("\n")[:2]
    assert run.returncode == 0, run.stderr
    assert name == "CPU RAM (RLIMIT_AS limit)" and 0 < int(total) < 6 << 30


def test_memory_limits_read_cgroup_v1_and_v2(tmp_path):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 16000000 kB\nMemAvailable: 8000000 kB\n")
    (proc / "self" / "status").write_text("VmSize: 1000 kB\n")
    root = tmp_path / "cgroup"
    (root / "job").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("0::/job\n")
    (root / "job" / "memory.max").write_text(f"{4 << 30}\n")
    (root / "job" / "memory.current").write_text(f"{1 << 30}\n")
    assert memory_limits(proc, root)["cgroup"] == 3 << 30 and memory_limits(proc, root)["RAM"] == 8_192_000_000
    (root / "job" / "memory.max").write_text("max\n")
    assert "cgroup" not in memory_limits(proc, root)
    (proc / "self" / "cgroup").write_text("4:memory:/box\n")
    (root / "memory" / "box").mkdir(parents=True)
    (root / "memory" / "box" / "memory.limit_in_bytes").write_text(f"{2 << 30}\n")
    (root / "memory" / "box" / "memory.usage_in_bytes").write_text(f"{1 << 29}\n")
    assert memory_limits(proc, root)["cgroup"] == (2 << 30) - (1 << 29)


@pytest.mark.slow
def test_batch_auto_for_two_gpus_is_the_plan_of_the_estimate():
    """For two cards (a named one and one given by its capacity) the chosen batch is memory.plan's
    recommendation for the step fit will run, and fit's accumulation rule reaches the nominal batch."""
    model = _model()
    # the same step by name (memory keeps traced steps of named models: the expected values cost no trace)
    step = StepConfig("yolov9-t", imgsz=128, num_classes=2)
    at12, at13 = (memory.estimate(step, b, gpu=80 << 30).device_bytes for b in (12, 13))
    for gpu in ("T4", int((at12 + at13) / 2 / 0.9)):  # the second: 12 fits in 90 % of it, 13 does not
        config = TrainConfig(batch_size="auto", gpu=gpu, imgsz=128, nominal_batch_size=64)
        sized, record = choose_batch(config, model, CPU)
        expected = memory.plan(step, 64, gpu=gpu, method="estimated")
        assert sized.batch_size == record.batch_size == expected.recommended["batch_size"], gpu
        assert record.accumulate == base_accumulate(sized) == expected.recommended["accumulate"]
        assert record.predicted_device_bytes <= (1 - config.margin) * record.capacity_bytes
        assert record.largest_batch == expected.largest_batch
        if isinstance(gpu, int):  # the small card: 12 x round(64 / 12) = 60 images per optimizer step
            assert (record.largest_batch, record.batch_size, record.accumulate) == (12, 12, 5)
        else:
            assert record.batch_size == 64 and record.accumulate == 1  # a 128 px step fits a T4 at 64
            assert record.step["amp"] == "fp16"  # "auto": the T4 has no bf16


class _OutOfMemoryOnce:
    """The kit's loss, raising a CUDA out-of-memory error the first time a micro-batch above 2 images comes."""

    def __init__(self, model):
        self.loss, self.raised = DetectionLoss(model), False

    def __call__(self, outputs, targets):
        if not self.raised and outputs.main[0].shape[0] > 2:
            self.raised = True
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return self.loss(outputs, targets)


@pytest.mark.slow
def test_fit_with_batch_auto_records_the_prediction_and_survives_out_of_memory(shapes64, tmp_path):
    model = _model()
    loss = _OutOfMemoryOnce(model)
    config = TrainConfig(batch_size="auto", nominal_batch_size=4, epochs=1, imgsz=64, workers=0, device="cpu",
                         val=False, warmup_epochs=0.0, warmup_min_batches=1, project=str(tmp_path), name="auto")
    result = fit(model, shapes64, config, loss_fn=loss)
    assert not result.interrupted and result.epochs_completed == 1
    assert loss.raised and result.oom_events == 1 and result.micro_batch_size == 2  # halved from 4, run kept
    record = json.loads((result.save_dir / "auto_batch.json").read_text())
    assert record == result.auto_batch.to_dict()
    assert record["gpu"] == "CPU RAM" and record["batch_size"] == 4 and record["accumulate"] == 1
    cpu_step = StepConfig().resolve("cpu")  # the CPU step, as this processor decides it
    assert (record["step"]["amp"], record["step"]["channels_last"]) == (cpu_step.amp, cpu_step.channels_last)
    assert record["predicted_peak_allocated"] > 0 and record["measured_peak_allocated"] is None  # no CUDA here
    from yolo9kit.models.checkpoint import read_checkpoint

    assert read_checkpoint(result.last)["train_config"]["batch_size"] == 4  # resume keeps the chosen batch
    assert result.step.batch_size == 4 and result.step.device_type == "cpu"
