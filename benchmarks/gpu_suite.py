"""GPU suite: the kit's training step, epoch and inference against the official code, side by side in one run.

    python benchmarks/gpu_suite.py --official /path/to/yolov9-checkout --out runs/gpu_suite
    python benchmarks/gpu_suite.py --official /path/to/yolov9-checkout --compile   # adds torch.compile
    python benchmarks/gpu_suite.py --quick --device cpu                          # checks every part runs

Parts (each row is written to ``suite.json`` and ``suite.md`` under ``--out`` as soon as it is measured):

1. Training step, yolov9-t/s/c at 640, batch 8/32/64: the kit's ``train_step`` with its defaults on the
   device (CUDA: channels_last, fused SGD, lean activations, AMP "auto" = bf16 where supported) and, with
   ``--official``, the official step (its Model, ComputeLoss of loss_tal_dual, smart_optimizer SGD,
   GradScaler fp16, clip 10, ModelEMA) on the same synthetic batch (uint8 images, 8 boxes each, nc 80).
   Both: ``--warmup`` steps, then ``--steps`` steps timed between two device synchronisations; peak
   allocated and reserved memory over the timed steps; host synchronisations of one kit step counted
   with ``torch.cuda.set_sync_debug_mode``.
   Ablation (``--parts ablation``, in the default run): the kit's step for yolov9-s at the largest batch with
   one switch changed at a time (AMP fp16 instead of auto, channels_last off, lean activations off,
   fused optimizer off, all of them off), to see what each is worth on this GPU.
2. ``--compile``: the kit's step with ``compile=True`` for yolov9-s at the largest batch: the first
   step's time (compilation) and the step time after it.
3. Epoch: yolov9-s over one epoch of a generated shapes data set (640x480 JPEGs) with the real loader
   (mosaic, mixup, affine, colour jitter on the device): loader alone and loader + training, img/s.
4. Inference, no NMS, FP16, eval mode: the kit's deployed gelan-s and yolov9-s (Conv+BN fused,
   auxiliary branch dropped, channels_last) at batch 1 (latency) and batch 32 (throughput); with
   ``--official``, the official yolov9-s (eval, FP16, as its val path runs it) and gelan-s (fused).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from train_step import _sync, synthetic_batch  # noqa: E402  (the same batch and sync as benchmarks/train_step.py)


def _reset_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peaks(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"peak_alloc_GiB": None, "peak_reserved_GiB": None}
    return {"peak_alloc_GiB": torch.cuda.max_memory_allocated(device) / 2**30,
            "peak_reserved_GiB": torch.cuda.max_memory_reserved(device) / 2**30}


def _timed(step, device: torch.device, warmup: int, steps: int) -> dict:
    """ms per call of ``step`` over ``steps`` calls after ``warmup`` calls; peaks over the timed calls."""
    for _ in range(warmup):
        step()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return {"step_ms": (time.perf_counter() - t) * 1e3 / steps, **_peaks(device)}


def _count_syncs(step, device: torch.device) -> int | None:
    """Host-device synchronisations of one call of ``step`` (CUDA only)."""
    if device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


# ---- 1. training step --------------------------------------------------------------------------------
def kit_step(model_name: str, batch: int, args, device, **config) -> tuple[dict, object]:
    from yolo9kit.config import TrainConfig
    from yolo9kit.models import create_model
    from yolo9kit.train.step import build_trainer, train_step

    torch.manual_seed(0)
    images, targets = synthetic_batch(batch, args.imgsz, 80)
    if device.type == "cuda":
        images = images.pin_memory()
    model = create_model(model_name, num_classes=80).train()
    trainer = build_trainer(model, TrainConfig(batch_size=batch, amp=args.amp, device=str(device), **config),
                            device=device)

    def step():  # every call an optimizer step
        train_step(trainer, images, targets, ni=trainer.last_opt_step + 1, accumulate_steps=1)

    row = _timed(step, device, args.warmup, args.steps)
    row["host_syncs_per_step"] = _count_syncs(step, device)
    row["amp"] = str(trainer.amp_dtype).replace("torch.", "") if trainer.amp_dtype else "fp32"
    return row, trainer


def official_step(checkout: Path, model_name: str, batch: int, args, device) -> dict:
    from official_shim import import_official

    import_official(checkout)
    from models.yolo import Model
    from utils.loss_tal_dual import ComputeLoss
    from utils.torch_utils import ModelEMA, smart_optimizer

    torch.manual_seed(0)
    images, targets = synthetic_batch(batch, args.imgsz, 80)
    model = Model(str(checkout / "models" / "detect" / f"{model_name}.yaml"), ch=3, nc=80).to(device).train()
    model.hyp = {"cls_pw": 1.0, "fl_gamma": 0.0, "label_smoothing": 0.0}
    loss_fn = ComputeLoss(model)
    amp = device.type == "cuda"
    accumulate = max(round(64 / batch), 1)
    optimizer = smart_optimizer(model, "SGD", 0.01, 0.937, 0.0005 * batch * accumulate / 64)
    scaler = torch.amp.GradScaler(device.type, enabled=amp)
    ema = ModelEMA(model)

    def step():  # train_dual.py's inner loop, one optimizer step per batch
        with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
            pred = model(images.to(device, non_blocking=True).float() / 255)
            loss, _ = loss_fn(pred, targets.to(device))
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        ema.update(model)

    row = _timed(step, device, args.warmup, args.steps)
    row["amp"] = "fp16" if amp else "fp32"
    return row


def _guarded(fn, *a, **kw) -> dict:
    """Run one measurement; an out-of-memory error becomes a row that says so."""
    try:
        out = fn(*a, **kw)
        return out[0] if isinstance(out, tuple) else out
    except torch.cuda.OutOfMemoryError as error:
        return {"error": f"out of memory: {str(error).splitlines()[0]}"}


_ESTIMATORS: dict = {}


def _estimate_gib(model_name: str, batch: int, trainer, args, device) -> float | None:
    """The kit's CPU estimate of the same step (same AMP, channels_last and lean settings) for this GPU."""
    from yolo9kit.memory import StepEstimator
    from yolo9kit.memory.gpus import target_gpu

    step = dataclasses.replace(trainer.step, model=model_name, num_classes=None)  # the step the trainer runs
    key = dataclasses.replace(step, batch_size=1)
    if key not in _ESTIMATORS:
        _ESTIMATORS[key] = StepEstimator(step)
    gpu = target_gpu(None, device) if device.type == "cuda" else None
    return _ESTIMATORS[key].reports([batch], gpu)[0].peak_allocated / 2**30


def train_steps(args, device, report) -> None:
    for model_name in args.models:
        for batch in args.batches:
            for code in ("yolo9kit", "official") if args.official else ("yolo9kit",):
                _reset_memory(device)
                if code == "yolo9kit":
                    try:
                        row, trainer = kit_step(model_name, batch, args, device)
                        row["estimated_alloc_GiB"] = _estimate_gib(model_name, batch, trainer, args, device)
                        del trainer
                    except torch.cuda.OutOfMemoryError as error:
                        row = {"error": f"out of memory: {str(error).splitlines()[0]}"}
                else:
                    row = _guarded(official_step, args.official, model_name, batch, args, device)
                if "step_ms" in row:
                    row["img_per_s"] = batch / row["step_ms"] * 1e3
                report.add("train_step", {"model": model_name, "batch": batch, "code": code, **row})


ABLATION = {
    "default": {},
    "amp fp16": {"amp": "fp16"},
    "channels_last off": {"channels_last": False},
    "lean off": {"lean_activations": False},
    "fused optimizer off": {"fused_optimizer": False},
    "all off (plain step)": {"channels_last": False, "lean_activations": False, "fused_optimizer": False},
}


def ablation(args, device, report) -> None:
    model_name, batch = args.models[min(1, len(args.models) - 1)], max(args.batches)
    for label, change in ABLATION.items():
        _reset_memory(device)
        amp = change.get("amp", args.amp)
        config = {k: v for k, v in change.items() if k != "amp"}
        row = _guarded(kit_step, model_name, batch, argparse.Namespace(**{**vars(args), "amp": amp}), device,
                       **config)
        if "step_ms" in row:
            row["img_per_s"] = batch / row["step_ms"] * 1e3
        report.add("ablation", {"model": model_name, "batch": batch, "variant": label, **row})


def compile_step(args, device, report) -> None:
    model_name, batch = args.models[min(1, len(args.models) - 1)], max(args.batches)
    _reset_memory(device)
    t = time.perf_counter()
    row, trainer = kit_step(model_name, batch, argparse.Namespace(**{**vars(args), "warmup": 0, "steps": 1}),
                            device, compile=args.compile_mode or True)
    first_s = time.perf_counter() - t
    images, targets = synthetic_batch(batch, args.imgsz, 80)
    from yolo9kit.train.step import train_step

    row = _timed(lambda: train_step(trainer, images, targets, ni=trainer.last_opt_step + 1, accumulate_steps=1), device,
                 args.warmup, args.steps)
    report.add("compile", {"model": model_name, "batch": batch, "mode": args.compile_mode or "default",
                           "first_step_s": first_s, **row, "img_per_s": batch / row["step_ms"] * 1e3})


# ---- 3. epoch with the real loader --------------------------------------------------------------------
def epoch(args, device, report) -> None:
    from yolo9kit.config import TrainConfig
    from yolo9kit.data import create_dataloader
    from yolo9kit.models import create_model
    from yolo9kit.train.loop import train_one_epoch
    from yolo9kit.train.state import Progress
    from yolo9kit.train.step import build_trainer

    model_name, batch = args.models[min(1, len(args.models) - 1)], args.epoch_batch
    colour = device if device.type == "cuda" else None
    loader = create_dataloader(args.epoch_data, "train", imgsz=args.imgsz, batch_size=batch, workers=args.workers,
                               seed=0, colour_device=colour)
    for _ in loader:  # the first pass starts the workers and fills the RAM cache
        pass
    t, n = time.perf_counter(), 0
    for images, *_ in loader:
        n += images.shape[0]
    _sync(device)
    loader_rate = n / (time.perf_counter() - t)
    _reset_memory(device)
    torch.manual_seed(0)
    config = TrainConfig(batch_size=batch, amp=args.amp, device=str(device), epochs=1, warmup_min_batches=0,
                         warmup_epochs=0.0)
    trainer = build_trainer(create_model(model_name, num_classes=8).train(), config, device=device)
    train_one_epoch(trainer, loader, config, Progress(), batches_per_epoch=len(loader), warmup=0, progress_bar=False)
    _sync(device)
    stats = train_one_epoch(trainer, loader, config, Progress(epoch=0), batches_per_epoch=len(loader), warmup=0,
                            progress_bar=False)
    _sync(device)
    report.add("epoch", {"model": model_name, "batch": batch, "images": stats.images,
                         "workers": loader.loader.num_workers, "loader_img_per_s": loader_rate,
                         "train_img_per_s": stats.images / stats.seconds, **_peaks(device)})


# ---- 4. inference --------------------------------------------------------------------------------------
def _forward_rate(model, device, imgsz: int, batch: int, warmup: int, steps: int, half: bool) -> dict:
    fmt = torch.channels_last if device.type == "cuda" else torch.contiguous_format
    x = torch.rand(batch, 3, imgsz, imgsz, device=device, dtype=torch.half if half else torch.float)
    x = x.contiguous(memory_format=fmt)
    with torch.inference_mode():
        row = _timed(lambda: model(x), device, warmup, steps)
    return {"batch": batch, "ms_per_batch": row["step_ms"], "img_per_s": batch / row["step_ms"] * 1e3}


def inference(args, device, report) -> None:
    from yolo9kit.models import create_model
    from yolo9kit.models.deploy import deploy_for_inference

    half = device.type == "cuda"
    dtype = torch.half if half else torch.float
    fmt = torch.channels_last if device.type == "cuda" else torch.contiguous_format
    for name in args.predict_models:
        torch.manual_seed(0)
        model = deploy_for_inference(create_model(name, num_classes=80).eval())
        model = model.to(device=device, dtype=dtype, memory_format=fmt).eval()
        for batch in (1, args.predict_batch):
            report.add("inference", {"model": name, "code": "yolo9kit (deployed)", "precision": str(dtype)[6:],
                                     **_forward_rate(model, device, args.imgsz, batch, args.warmup, args.steps, half)})
    if not args.official:
        return
    from official_shim import import_official

    import_official(args.official)
    from models.yolo import Model

    for name in args.predict_models:
        torch.manual_seed(0)
        model = Model(str(args.official / "models" / "detect" / f"{name}.yaml"), ch=3, nc=80)
        label = "official (eval)"
        if name.startswith("gelan"):
            model, label = model.fuse(), "official (fused, eval)"
        model = model.to(device=device, dtype=dtype).eval()
        for batch in (1, args.predict_batch):
            row = _forward_rate(model, device, args.imgsz, batch, args.warmup, args.steps, half)
            report.add("inference", {"model": name, "code": label, "precision": str(dtype)[6:], **row})


# ---- report --------------------------------------------------------------------------------------------
class Report:
    """Rows by section, written to JSON and Markdown after every row (a long run keeps what it measured)."""

    def __init__(self, out: Path, meta: dict):
        self.out, self.meta, self.sections = out, meta, {}
        out.mkdir(parents=True, exist_ok=True)

    def add(self, section: str, row: dict) -> None:
        self.sections.setdefault(section, []).append(row)
        print(section, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        (self.out / "suite.json").write_text(json.dumps({"meta": self.meta, **self.sections}, indent=1))
        (self.out / "suite.md").write_text(self.markdown())

    def markdown(self) -> str:
        lines = [f"GPU: {self.meta['device_name']}; torch {self.meta['torch']}, CUDA {self.meta['cuda']}, "
                 f"cuDNN {self.meta['cudnn']}, Python {self.meta['python']}; imgsz {self.meta['imgsz']}.",
                 f"Command: `{self.meta['command']}`", ""]
        for section, rows in self.sections.items():
            cols = list(dict.fromkeys(k for r in rows for k in r))
            lines += [f"### {section}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            for r in rows:
                lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
            lines.append("")
        lines += self._ratios()
        return "\n".join(lines)

    def _ratios(self) -> list[str]:
        rows = self.sections.get("train_step", [])
        ours = {(r["model"], r["batch"]): r for r in rows if r["code"] == "yolo9kit" and "step_ms" in r}
        theirs = {(r["model"], r["batch"]): r for r in rows if r["code"] == "official" and "step_ms" in r}
        common = [k for k in ours if k in theirs]
        if not common:
            return []
        out = ["### ratios (yolo9kit / official, same run)", "",
               "| model | batch | img/s ratio | peak allocated ratio |", "|---|---|---|---|"]
        for k in common:
            mem = "-"
            if ours[k]["peak_alloc_GiB"] and theirs[k]["peak_alloc_GiB"]:
                mem = f"{ours[k]['peak_alloc_GiB'] / theirs[k]['peak_alloc_GiB']:.2f}"
            out.append(f"| {k[0]} | {k[1]} | {ours[k]['img_per_s'] / theirs[k]['img_per_s']:.2f}x | {mem} |")
        return out + [""]


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--official", type=Path, help="a checkout of WongKinYiu/yolov9 to time side by side")
    p.add_argument("--out", type=Path, default=Path("runs/gpu_suite"))
    p.add_argument("--device", default=None)
    p.add_argument("--models", nargs="+", default=["yolov9-t", "yolov9-s", "yolov9-c"])
    p.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--amp", default="auto", choices=["auto", "fp16", "bf16", "off"], help="the kit's AMP mode")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--parts", nargs="+", default=["train", "ablation", "epoch", "inference"],
                   choices=["train", "ablation", "epoch", "inference"])
    p.add_argument("--compile", action="store_true", help="also time compile=True (minutes of compilation)")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode, e.g. reduce-overhead (CUDA graphs)")
    p.add_argument("--epoch-images", type=int, default=512)
    p.add_argument("--epoch-batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=None, help="loader workers (default: the kit's rule)")
    p.add_argument("--predict-models", nargs="+", default=["gelan-s", "yolov9-s"])
    p.add_argument("--predict-batch", type=int, default=32)
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks that every part runs (CPU)")
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.batches, args.imgsz, args.steps, args.warmup = ["yolov9-t"], [2], 128, 1, 1
        args.epoch_images, args.epoch_batch, args.predict_models, args.predict_batch = 8, 4, ["gelan-t"], 2
        args.workers = 0 if args.workers is None else args.workers
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    meta = {"device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
            or "CPU", "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
            "python": platform.python_version(), "imgsz": args.imgsz,
            "command": "python benchmarks/gpu_suite.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    report = Report(args.out, meta)
    tmp = tempfile.TemporaryDirectory()
    if "epoch" in args.parts:  # before the official code is imported: it replaces cv2.imwrite
        from yolo9kit.data import make_shapes

        args.epoch_data = make_shapes(Path(tmp.name) / "shapes", args.epoch_images, 4,
                                      (160, 120) if args.quick else (640, 480), num_classes=8, seed=0)
    parts = {"train": train_steps, "ablation": ablation, "epoch": epoch, "inference": inference}
    for name in args.parts:
        parts[name](args, device, report)
    if args.compile:
        compile_step(args, device, report)
    tmp.cleanup()
    print("\n" + report.markdown())


if __name__ == "__main__":
    main()
