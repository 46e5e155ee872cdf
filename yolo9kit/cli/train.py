"""``python -m yolo9kit train``: train a model (official flag names where they make sense).

    python -m yolo9kit train --data data.yaml --model yolov9-s --batch-size 16 --epochs 100 --imgsz 640
    python -m yolo9kit train --data data.yaml --model yolov9-c --batch-size auto   # sized from the estimate
    python -m yolo9kit train --data data.yaml --model yolov9-c --weights yolov9-c.pt --batch-size 8
    python -m yolo9kit train --data data.yaml --model yolov9-c.pt --freeze backbone --rect   # fine-tune
    python -m yolo9kit train --resume                      # newest runs/train/*/weights/last.pt
    torchrun --nproc_per_node 2 -m yolo9kit train --data data.yaml --model yolov9-s --batch-size 64 --sync-bn
"""

from __future__ import annotations

import argparse
import functools
import logging
from pathlib import Path

from yolo9kit.cli.flags import (
    activation_checkpointing,
    add_freeze_flag,
    add_model_limit_flag,
    cache_mode,
    device,
    freeze,
    model_limit,
    non_negative_int,
    positive_int,
    share_below_one,
    train_image_size,
)

LOGGER = logging.getLogger(__name__)

# keys of an official hyp yaml that are TrainConfig fields; the augmentation keys go to the data layer
_HYP_TRAIN_KEYS = {"lr0", "lrf", "momentum", "weight_decay", "warmup_epochs", "warmup_momentum", "warmup_bias_lr"}
# official loss keys -> LossConfig fields (the official loss ignores them and hard-codes the same values)
_HYP_LOSS_KEYS = {"box": "box_gain", "cls": "cls_gain", "dfl": "dfl_gain", "cls_pw": "cls_pos_weight"}
_HYP_IGNORED = {"obj", "obj_pw", "iou_t", "anchor_t", "fl_gamma", "label_smoothing"}


# The defaults of the flags a resume checks: None in the parser means "not given", so that a flag given on
# resume is seen even when its value equals the default.
DEFAULTS = {"model": "yolov9-t", "batch_size": 16, "margin": 0.10, "epochs": 100, "imgsz": 640, "close_mosaic": 0,
            "amp": "auto", "optimizer": "SGD", "seed": 0, "name": "exp", "patience": 100, "min_items": 0,
            "label_smoothing": 0.0, "save_period": -1}
# Flags a resumed run takes: how long it trains, when it stops early, where and how fast it runs.
RESUME_CHANGES = ("epochs", "patience", "device", "workers", "cache", "compile", "activation_checkpointing",
                  "save_period")
# Flags that fix the run's model, data order, schedule or folder: refused on resume when they differ from it.
RESUME_FIXED = {"model": "--model", "weights": "--weights", "batch_size": "--batch-size", "gpu": "--gpu",
                "margin": "--margin", "accumulate_steps": "--accumulate-steps",
                "micro_batch_size": "--micro-batch-size",
                "imgsz": "--imgsz", "hyp": "--hyp", "close_mosaic": "--close-mosaic", "amp": "--amp",
                "optimizer": "--optimizer", "schedule": "--cos-lr/--flat-cos-lr/--fixed-lr", "seed": "--seed",
                "name": "--name", "exist_ok": "--exist-ok", "sync_bn": "--sync-bn", "freeze": "--freeze",
                "rect": "--rect", "multi_scale": "--multi-scale", "single_cls": "--single-cls",
                "min_items": "--min-items", "label_smoothing": "--label-smoothing"}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="train a YOLOv9/GELAN model (AMP, accumulation, EMA, resume, DDP)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="data.yaml")
    p.add_argument("--model", "--cfg", default=None,
                   help="model name (yolov9-t ... gelan-e), model yaml, or a checkpoint to start from (default "
                        "yolov9-t)")
    p.add_argument("--weights", default=None, help="official or kit .pt: same-name same-shape tensors are transferred")
    p.add_argument("--batch-size", "--batch", dest="batch_size", type=_batch_size, default=None,
                   help="images per batch (all GPUs; default 16), or auto (also -1): the largest that the memory "
                        "estimate fits into the GPU (--gpu, --margin), with accumulation to the nominal 64")
    p.add_argument("--gpu", default=None, help='--batch-size auto: size for this card (e.g. "RTX 4090"; default: '
                   "the training device, on the CPU its RAM)")
    p.add_argument("--margin", type=share_below_one, default=None,
                   help="--batch-size auto: share of the card kept free (0.10)")
    p.add_argument("--accumulate-steps", type=positive_int, default=None,
                   help="batches per optimizer step (default max(round(64 / batch), 1))")
    p.add_argument("--micro-batch-size", type=positive_int, default=None,
                   help="split each batch into micro-batches of this size")
    p.add_argument("--epochs", type=positive_int, default=None,
                   help="epochs to train (default 100); with --resume, a larger number extends the run")
    p.add_argument("--imgsz", "--img", "--img-size", dest="imgsz", type=train_image_size, default=None,
                   help="image size, a multiple of 32 (default 640)")
    p.add_argument("--activation-checkpointing", type=activation_checkpointing, default=None, metavar="LAYERS",
                   help="recompute layers in backward to save memory: backbone, all, or layer indices 1,2,3")
    add_freeze_flag(p)
    add_model_limit_flag(p)
    p.add_argument("--rect", action="store_true",
                   help="rectangular training batches (images sorted by aspect ratio; no mosaic, no shuffling)")
    p.add_argument("--multi-scale", action="store_true",
                   help="resize each batch to a random multiple of 32 in [0.5, 1.5] x imgsz")
    p.add_argument("--single-cls", action="store_true", help="train multi-class data as one class")
    p.add_argument("--min-items", type=non_negative_int, default=None,
                   help="drop training images with fewer labelled boxes (default 0)")
    p.add_argument("--label-smoothing", type=_epsilon, default=None,
                   help="official flag, accepted for official commands: the official dual loss never applies it "
                        "(default 0.0)")
    p.add_argument("--save-period", type=int, default=None,
                   help="also save weights/epoch<e>.pt every N epochs (e = 0, N, 2N, ...; default -1: off)")
    p.add_argument("--hyp", default=None, help="hyper-parameter yaml (official keys)")
    p.add_argument("--close-mosaic", type=non_negative_int, default=None,
                   help="mosaic off for the last N epochs (default 0)")
    p.add_argument("--cache", type=cache_mode, nargs="?", const="ram", default=None,
                   help="ram (default when given) or disk")
    p.add_argument("--workers", type=non_negative_int, default=None,
                   help="loader processes (default min(CPUs, batch, 8))")
    p.add_argument("--amp", choices=["auto", "fp16", "bf16", "off"], default=None,
                   help="mixed precision (default auto)")
    p.add_argument("--optimizer", choices=["SGD", "Adam", "AdamW"], default=None, help="default SGD")
    sched = p.add_mutually_exclusive_group()
    sched.add_argument("--cos-lr", action="store_true", help="cosine LR schedule")
    sched.add_argument("--flat-cos-lr", action="store_true", help="flat, then cosine")
    sched.add_argument("--fixed-lr", action="store_true", help="constant LR")
    p.add_argument("--seed", type=int, default=None, help="default 0")
    p.add_argument("--device", type=device, default=None, help="cpu, 0, cuda:1 (default: first GPU, else CPU)")
    p.add_argument("--project", default="runs/train")
    p.add_argument("--name", default=None, help="run folder name under --project (default exp)")
    p.add_argument("--exist-ok", action="store_true")
    p.add_argument("--resume", nargs="?", const=True, default=False,
                   help="resume the newest run, or this run folder / last.pt (its settings; --epochs may extend it)")
    p.add_argument("--sync-bn", action="store_true", help="SyncBatchNorm (DDP only)")
    p.add_argument("--patience", type=non_negative_int, default=None,
                   help="stop after N epochs without a better fitness (100)")
    p.add_argument("--noval", action="store_true", help="validate only after the last epoch")
    p.add_argument("--no-plots", action="store_true",
                   help="write no pictures into the run folder (labels, training batches, curves, validation plots)")
    p.add_argument("--allow-bad-labels", action="store_true",
                   help="train even when labels use unnamed classes, no image has a box, or many labelled images "
                        "would be dropped (refused by default, before the first step)")
    p.add_argument("--compile", nargs="?", const=True, default=False, metavar="MODE",
                   help="torch.compile the forward (optionally a mode: reduce-overhead, max-autotune)")
    p.add_argument("--plain-step", action="store_true",
                   help="turn the CUDA speed switches off (channels_last, lean activations, sync-free step, fused "
                        "optimizer, colour jitter on the GPU): the official step's layout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Train; exit status 0 when the run finished, 130 when interrupted (SIGINT, Ctrl-C), 143 (SIGTERM)."""
    from yolo9kit.train import ddp

    ddp.init_from_env()
    code = _train(args)
    ddp.finish()  # not after an error: the other ranks may never reach its barrier (torchrun ends them)
    return code


def _train(args: argparse.Namespace) -> int:
    from yolo9kit.train import ddp, fit
    from yolo9kit.train.state import seed_everything
    from yolo9kit.train.weights import model_for_data

    if args.resume:
        model, data, config = _resume_setup(args)
    else:
        if not args.data:
            raise ValueError("--data is required (a data.yaml), unless --resume")
        config = config_from_args(args)
        data = args.data
        seed_everything(config.seed)  # the initial weights follow --seed (official: init_seeds before the model)
        model = model_for_data(_value(args, "model"), data, args.weights or "", single_cls=config.single_cls,
                               max_model_bytes=model_limit(args))
    result = fit(model, data, config)
    main = ddp.current().is_main
    if main and result.auto_batch is not None:
        print(result.auto_batch)
    if main and result.save_dir:
        state = f"interrupted by {result.interrupted_by}" if result.interrupted else "done"
        print(f"{state}: {result.epochs_completed} epochs, best fitness {result.best_fitness:.4f} "
              f"(epoch {result.best_epoch}); weights in {result.save_dir / 'weights'}")
        if result.interrupted:
            print(f"last.pt saved; continue with: python -m yolo9kit train --resume {result.save_dir}")
    if result.interrupted:
        return 143 if result.interrupted_by == "SIGTERM" else 130  # 128 + the signal, as a shell reports it
    return 0


def _value(args: argparse.Namespace, name: str):
    """A flag's value, or its default when it was not given."""
    value = getattr(args, name)
    return DEFAULTS[name] if value is None else value


def _batch_size(text: str) -> int | str:
    if text.lower() in ("auto", "-1"):
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of images, or auto (also -1)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: expected at least 1 image, or auto (also -1)")
    return value


def _epsilon(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an epsilon in [0, 1) (e.g. 0.1)")
    return value


def config_from_args(args: argparse.Namespace):
    """TrainConfig from the flags (and the --hyp yaml)."""
    from yolo9kit.config import TrainConfig

    train_keys, augment, loss = _read_hyp(args.hyp)
    v = functools.partial(_value, args)
    return TrainConfig(
        epochs=v("epochs"), batch_size=v("batch_size"), gpu=args.gpu, margin=v("margin"),
        activation_checkpointing=args.activation_checkpointing, accumulate_steps=args.accumulate_steps,
        micro_batch_size=args.micro_batch_size, imgsz=v("imgsz"), amp=v("amp"), optimizer=v("optimizer"),
        schedule=_schedule(args) or "linear", close_mosaic=v("close_mosaic"), hyp=augment or None, loss=loss,
        cache=args.cache, workers=args.workers, seed=v("seed"), device=args.device, val=not args.noval,
        project=args.project, name=v("name"), exist_ok=args.exist_ok, sync_bn=args.sync_bn, patience=v("patience"),
        compile=args.compile, allow_bad_labels=args.allow_bad_labels, freeze=freeze(args.freeze), rect=args.rect,
        multi_scale=args.multi_scale, single_cls=args.single_cls, min_items=v("min_items"),
        label_smoothing=v("label_smoothing"), save_period=v("save_period"), **(_PLAIN if args.plain_step else {}),
        plots=not args.no_plots,
        **train_keys)


def _schedule(args: argparse.Namespace) -> str | None:
    """The schedule the flags ask for (None: no schedule flag, the linear default)."""
    return ("cosine" if args.cos_lr else "flat-cosine" if args.flat_cos_lr else "fixed" if args.fixed_lr
            else None)


_PLAIN = {"channels_last": False, "lean_activations": False, "sync_free": False, "fused_optimizer": False,
          "colour_on_device": False}


def _read_hyp(path: str | None) -> tuple[dict, dict, object]:
    """Split an official hyp yaml into TrainConfig fields, augmentation keys and a LossConfig (or None)."""
    if not path:
        return {}, {}, None
    import yaml

    from yolo9kit.config import DEFAULT_AUGMENT_HYP

    try:
        values = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as e:  # a syntax error, or a tag such as !!python/... that safe_load refuses
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"--hyp {path}:{where}: not a plain YAML mapping ({problem}); the file holds "
                         "'name: number' lines (official hyp.*.yaml keys)") from None
    if not isinstance(values, dict):
        raise ValueError(f"--hyp {path}: expected 'name: number' lines, got a {type(values).__name__}")
    try:
        train = {k: float(v) for k, v in values.items() if k in _HYP_TRAIN_KEYS}
        augment = {k: float(v) for k, v in values.items() if k in DEFAULT_AUGMENT_HYP}
    except (TypeError, ValueError) as e:
        raise ValueError(f"--hyp {path}: every value must be a number ({e})") from None
    unknown = set(values) - _HYP_TRAIN_KEYS - set(DEFAULT_AUGMENT_HYP) - set(_HYP_LOSS_KEYS) - _HYP_IGNORED
    if unknown:
        LOGGER.warning("%s: ignoring unknown keys %s", path, sorted(unknown))
    gains = {_HYP_LOSS_KEYS[k]: float(v) for k, v in values.items() if k in _HYP_LOSS_KEYS}
    loss = None
    if gains:
        from yolo9kit.config import LossConfig

        loss = LossConfig(**gains)
    return train, augment, loss


def _resume_setup(args: argparse.Namespace):
    """Model, data and config of the run to resume: its checkpoint's settings, with the flags a resume may change
    (``RESUME_CHANGES``); a flag that would change the run (``RESUME_FIXED``) is refused, naming it."""
    from yolo9kit.checkpoint import check_model_config, read_checkpoint
    from yolo9kit.config import TrainConfig
    from yolo9kit.models.model import DetectionModel
    from yolo9kit.train.state import find_resume_checkpoint

    path = find_resume_checkpoint(args.resume, args.project)
    ckpt = read_checkpoint(path)
    if "train_config" not in ckpt:
        raise ValueError(f"{path} has no training state; start a new run with --weights {path}")
    saved = ckpt["train_config"]
    refused = _refused_on_resume(args, saved, ckpt["model_config"])
    if refused:
        raise ValueError(f"--resume {path}: {', '.join(refused)} cannot change in the middle of a run; leave "
                         f"them out (only {', '.join('--' + k.replace('_', '-') for k in RESUME_CHANGES)} and --noval, "
                         f"--plain-step, --no-plots may change), or start a new run from its weights: "
                         f"train --weights {path} ...")
    changes = {k: getattr(args, k) for k in RESUME_CHANGES if _given(getattr(args, k))}
    changes.update({"val": False} if args.noval else {}, **(_PLAIN if args.plain_step else {}))
    changes.update({"plots": False} if args.no_plots else {})
    config = TrainConfig.from_dict(saved, resume=str(path), **changes)
    cfg = check_model_config(ckpt, path, ckpt["model"], model_limit(args))
    model = DetectionModel(cfg["yaml"], nc=cfg["nc"], names=cfg["names"], name=cfg.get("name"))
    data = args.data or ckpt.get("data")
    if not data:
        raise ValueError(f"{path} does not record its data; pass --data")
    return model, data, config


def _given(value) -> bool:
    """A flag was given: not its parser default (None, or False for a switch); 0 counts as given."""
    return value is not None and value is not False


def _refused_on_resume(args: argparse.Namespace, saved: dict, model_config: dict) -> list[str]:
    """``--flag value (the run's: x)`` for each given flag of ``RESUME_FIXED`` that differs from the run."""
    given = {k: getattr(args, k) for k in RESUME_FIXED if k != "schedule" and _given(getattr(args, k))}
    if _schedule(args):
        given["schedule"] = _schedule(args)
    if "freeze" in given:  # the words as TrainConfig stores them (a list of indices, as in the checkpoint)
        given["freeze"] = freeze(given["freeze"])
    runs = {**saved, "model": model_config.get("name")}
    refused = []
    for key, value in given.items():
        if key not in runs or runs[key] != value:
            theirs = f" (the run's: {runs[key]})" if key in runs else ""
            refused.append(f"{RESUME_FIXED[key]} {value}{theirs}" if value is not True else RESUME_FIXED[key])
    return refused
