"""One training step, phase by phase: forward, loss, backward, optimizer, EMA (each timed with a device sync).

    python benchmarks/train_step.py --model yolov9-t --batch 8 --imgsz 320 --device cpu
    python benchmarks/train_step.py --model yolov9-s --batch 64 --amp fp16 --device cuda --layout channels_last
    python benchmarks/train_step.py --model yolov9-s --batch 16 --amp fp16 --official /path/to/yolov9-checkout
    python benchmarks/train_step.py --model yolov9-t --batch 8 --imgsz 128 --accumulation-gap 4   # 4x2 vs 8

The kit's step is ``yolo9kit.train`` as ``fit`` runs it (official optimizer groups, GradScaler, clip 10,
EMA with ``torch._foreach`` ops). Timed twice: phase by phase (a device sync between phases, which costs a
little) and as one ``train_step`` call without inner syncs ("step ms"). With ``--official PATH`` the
same run times the official code from that checkout, imported in this process (see ``official_shim.py``):
its ``models.yolo.Model`` from its yaml, ``utils.loss_tal_dual.ComputeLoss``, ``smart_optimizer`` (SGD)
and ``ModelEMA``, with the same synthetic batch (uint8 images, 8 random boxes each). Median of
``--steps`` timed steps after ``--warmup`` steps; peak memory is ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import torch

PHASES = ("forward_ms", "loss_ms", "backward_ms", "optimizer_ms", "ema_ms")


def synthetic_batch(batch: int, imgsz: int, nc: int, boxes: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (batch, 3, imgsz, imgsz), dtype=torch.uint8, generator=g)
    idx = torch.arange(batch).repeat_interleave(boxes).float()
    cls = torch.randint(0, nc, (batch * boxes,), generator=g).float()
    wh = 0.05 + 0.3 * torch.rand(batch * boxes, 2, generator=g)
    xy = wh / 2 + (1 - wh) * torch.rand(batch * boxes, 2, generator=g)
    return images, torch.cat([idx[:, None], cls[:, None], xy, wh], 1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Clock:
    def __init__(self, device):
        self.device, self.times = device, {p: [] for p in PHASES}

    @contextlib.contextmanager
    def phase(self, name: str, record: bool):
        _sync(self.device)
        t = time.perf_counter()
        yield
        _sync(self.device)
        if record:
            self.times[name].append((time.perf_counter() - t) * 1e3)


def time_kit(args, device, images, targets) -> dict:
    from yolo9kit.config import TrainConfig
    from yolo9kit.models import create_model
    from yolo9kit.train.step import build_trainer, to_input, train_step

    torch.manual_seed(0)
    model = create_model(args.model, num_classes=args.nc).train()
    layout = {"auto": None, "contiguous": False, "channels_last": True}[args.layout]
    trainer = build_trainer(model, TrainConfig(batch_size=args.batch, amp=args.amp, device=str(device),
                                               channels_last=layout), device=device)
    clock = _Clock(device)
    autocast = dict(device_type=device.type, dtype=trainer.amp_dtype or torch.float32,
                    enabled=trainer.amp_dtype is not None)
    for i in range(args.warmup + args.steps):
        rec = i >= args.warmup
        with clock.phase("forward_ms", rec), torch.autocast(**autocast):
            out = model(to_input(images, trainer))
        with clock.phase("loss_ms", rec), torch.autocast(**autocast):
            loss, _ = trainer.loss_fn(out, targets.to(device))
        with clock.phase("backward_ms", rec):
            trainer.scaler.scale(loss).backward()
        with clock.phase("optimizer_ms", rec):
            trainer.scaler.unscale_(trainer.optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            trainer.scaler.step(trainer.optimizer)
            trainer.scaler.update()
            trainer.optimizer.zero_grad(set_to_none=True)
        with clock.phase("ema_ms", rec):
            trainer.ema.update(model)
        del out, loss
    whole = []
    for i in range(args.warmup + args.steps):
        _sync(device)
        t = time.perf_counter()
        train_step(trainer, images, targets, ni=i, accumulate_steps=1)  # exactly the step fit runs
        _sync(device)
        if i >= args.warmup:
            whole.append((time.perf_counter() - t) * 1e3)
    return _summary(f"yolo9kit ({trainer.step.amp}, {'channels_last' if trainer.channels_last else 'contiguous'})",
                    clock, whole, args.batch, device)


def time_official(args, device, images, targets) -> dict:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from official_shim import import_official

    import_official(args.official)
    from models.yolo import Model
    from utils.loss_tal_dual import ComputeLoss
    from utils.torch_utils import ModelEMA, smart_optimizer

    torch.manual_seed(0)
    cfg = Path(args.official) / "models" / "detect" / f"{args.model}.yaml"
    model = Model(str(cfg), ch=3, nc=args.nc).to(device).train()
    model.hyp = {"cls_pw": 1.0, "fl_gamma": 0.0, "label_smoothing": 0.0}
    loss_fn = ComputeLoss(model)
    amp = args.amp != "off" and device.type == "cuda"
    dtype = torch.bfloat16 if args.amp == "bf16" else torch.float16
    optimizer = smart_optimizer(model, "SGD", 0.01, 0.937, 0.0005 * args.batch * max(round(64 / args.batch), 1) / 64)
    scaler = torch.amp.GradScaler(device.type, enabled=amp and dtype == torch.float16)
    ema = ModelEMA(model)
    clock = _Clock(device)
    for i in range(args.warmup + args.steps):
        rec = i >= args.warmup
        with clock.phase("forward_ms", rec), torch.autocast(device.type, dtype=dtype, enabled=amp):
            pred = model(images.to(device, non_blocking=True).float() / 255)
        with clock.phase("loss_ms", rec), torch.autocast(device.type, dtype=dtype, enabled=amp):
            loss, _ = loss_fn(pred, targets.to(device))
        with clock.phase("backward_ms", rec):
            scaler.scale(loss).backward()
        with clock.phase("optimizer_ms", rec):
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        with clock.phase("ema_ms", rec):
            ema.update(model)
        del pred, loss
    return _summary("official", clock, None, args.batch, device)


def _summary(name, clock, whole, batch, device) -> dict:
    row = {"code": name, **{p: statistics.median(v) for p, v in clock.times.items()}}
    row["phases_ms"] = sum(row[p] for p in PHASES)
    row["step_ms"] = statistics.median(whole) if whole else row["phases_ms"]
    row["img_per_s"] = batch / row["step_ms"] * 1e3
    row["peak_alloc_GiB"] = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    return row


def accumulation_gap(args, device, images, targets) -> None:
    """Gradient of one batch of B against K micro-batches of B/K (summed, no division: the kit's and the
    official accumulation), with BatchNorm in batch-statistics mode (as in training) and with BatchNorm
    frozen to its running statistics (isolates the loss's per-micro-batch normalisation by target_scores_sum)."""
    from yolo9kit.config import TrainConfig
    from yolo9kit.models import create_model
    from yolo9kit.train.step import build_trainer, train_step

    def grads(micro, frozen_bn):
        torch.manual_seed(0)
        if args.weights:  # a trained model: gradients of a random init are dominated by BatchNorm
            model = create_model(args.weights).to(device).train()
        else:
            model = create_model(args.model, num_classes=args.nc).train()
        if frozen_bn:
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.eval()
        trainer = build_trainer(model, TrainConfig(batch_size=args.batch, micro_batch_size=micro, amp="off",
                                                   device=str(device)), device=device)
        train_step(trainer, images, targets, ni=0, accumulate_steps=2)  # a window's first batch: gradients, no step
        named = [(n, p.grad.flatten()) for n, p in model.named_parameters() if p.grad is not None]
        if not layer_of:
            layer_of.extend((".".join(n.split(".")[:2]), g.numel()) for n, g in named)
        return torch.cat([g for _, g in named]).double()

    layer_of: list[tuple[str, int]] = []  # (layer "model.<i>", elements) of each gradient, in order

    k = args.accumulation_gap
    name = args.weights or args.model
    print(f"{name} {args.imgsz} px, batch {args.batch} vs {k} x {args.batch // k}, fp32, {device}")
    print("| BatchNorm | relative L2 difference | cosine similarity | norm ratio (micro / full) |")
    print("|---|---|---|---|")
    notes = []
    for frozen in (False, True):
        full, micro = grads(None, frozen), grads(args.batch // k, frozen)
        rel = float((micro - full).norm() / full.norm())
        cos = float(torch.nn.functional.cosine_similarity(micro, full, dim=0))
        label = "running stats (frozen)" if frozen else "batch stats (training)"
        print(f"| {label} | {rel:.4f} | {cos:.5f} | {float(micro.norm() / full.norm()):.4f} |")
        notes.append(f"{label}: gradient norm (before any clipping) {float(full.norm()):.4g}; "
                     f"share of the squared difference by layer: {_top_layers(micro - full, layer_of)}")
    print("\n".join(notes))


def _top_layers(diff: torch.Tensor, layer_of: list[tuple[str, int]], n: int = 4) -> str:
    """The ``n`` layers holding the largest share of ``||diff||^2``."""
    shares: dict[str, float] = {}
    for (layer, _), part in zip(layer_of, torch.split(diff**2, [k for _, k in layer_of])):
        shares[layer] = shares.get(layer, 0.0) + float(part.sum())
    total = sum(shares.values()) or 1.0
    top = sorted(shares.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{name} {100 * v / total:.0f} %" for name, v in top)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="yolov9-t")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--imgsz", type=int, default=320)
    p.add_argument("--nc", type=int, default=80)
    p.add_argument("--amp", choices=["auto", "fp16", "bf16", "off"], default="auto")
    p.add_argument("--device", default=None)
    p.add_argument("--layout", choices=["auto", "contiguous", "channels_last"], default="auto",
                   help="the step's memory layout (auto: the kit's default for the device)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--official", default=None, help="path of a WongKinYiu/yolov9 checkout")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--accumulation-gap", type=int, default=0, metavar="K",
                   help="instead of timing: compare the gradient of one batch with K accumulated micro-batches")
    p.add_argument("--weights", default=None, help="with --accumulation-gap: a kit checkpoint instead of a fresh model")
    args = p.parse_args(argv)
    if args.weights:
        from yolo9kit.models.checkpoint import read_checkpoint

        args.nc = int(read_checkpoint(args.weights)["model_config"]["nc"])
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    images, targets = synthetic_batch(args.batch, args.imgsz, args.nc)
    if args.accumulation_gap:
        return accumulation_gap(args, device, images, targets)
    rows = []
    for fn in [time_kit] + ([time_official] if args.official else []):
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        rows.append(fn(args, device, images, targets))
    print(f"{args.model} batch {args.batch} imgsz {args.imgsz} amp {args.amp} layout {args.layout} device {device}"
          f", torch threads {torch.get_num_threads()}; median of {args.steps} steps")
    cols = ["code", *PHASES, "phases_ms", "step_ms", "img_per_s", "peak_alloc_GiB"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) if isinstance(r[c], str) else f"{r[c]:.3g}" for c in cols) + " |")


if __name__ == "__main__":
    main()
