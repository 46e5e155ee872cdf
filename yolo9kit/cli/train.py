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

from yolo9kit.cli.flags import (
    activation_checkpointing,
    add_model_limit_flag,
    cache_mode,
    device,
    freeze,
    freeze_token,
    model_limit,
)
from yolo9kit.config import FAST_SWITCHES, LossConfig, TrainConfig
from yolo9kit.config.declare import CHANGE, declarations
from yolo9kit.config.hyp import hyp_settings, read_hyp
from yolo9kit.config.train import LOGGERS

DEFAULT_MODEL = "yolov9-t"
# How the command line writes the settings whose text is not a plain number, word or switch (the rest of each
# flag, its help, default, range and resume rule, is the setting's declaration in config.train).
_FORMS = {
    "batch_size": {"type": lambda text: _batch_size(text)},
    "activation_checkpointing": {"type": activation_checkpointing, "metavar": "LAYERS"},
    "freeze": {"type": freeze_token, "nargs": "+", "metavar": "LAYERS"},
    "cache": {"type": cache_mode, "nargs": "?", "const": "ram"},
    "compile": {"nargs": "?", "const": True, "metavar": "MODE"},
    "resume": {"nargs": "?", "const": True},
    "device": {"type": device},
    "gpu": {"type": str},
    "loggers": {"nargs": "+", "choices": LOGGERS, "metavar": "NAME"},
}
# The flags a resume reads as how to find the run, not as settings to compare with it.
_HOW_TO_RESUME = ("project", "resume")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="train a YOLOv9/GELAN model (AMP, accumulation, EMA, resume, DDP)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_flags(p)
    p.add_argument("--weights", default=None, help="official or kit .pt: same-name same-shape tensors are transferred")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="train N times (at most 100), with --seed, --seed + 1, ..., each in its own folder "
                        "<name>-seed-<k>, and print the spread of the final mAP (how large a difference between runs "
                        "the seed alone makes); the same command again continues the seeds that did not finish")
    p.set_defaults(func=run)


def add_train_flags(p: argparse.ArgumentParser) -> None:
    """The flags of a run: --data, --model, a flag per declared setting, --hyp, the schedule and --plain-step
    (``train`` and ``tune``; ``config_from_args`` reads them)."""
    p.add_argument("--data", help="data.yaml")
    p.add_argument("--model", "--cfg", default=None,
                   help=f"model name (yolov9-t ... gelan-e), model yaml, or a checkpoint to start from (default "
                        f"{DEFAULT_MODEL})")
    add_setting_flags(p)
    add_model_limit_flag(p)
    p.add_argument("--hyp", default=None, help="hyper-parameter yaml (official keys; tune's best_hyp.yaml also holds "
                                               "the recipe its trials trained); a flag given wins over the file")
    sched = p.add_mutually_exclusive_group()
    sched.add_argument("--cos-lr", action="store_true", help="cosine LR schedule")
    sched.add_argument("--flat-cos-lr", action="store_true", help="flat, then cosine")
    sched.add_argument("--fixed-lr", action="store_true", help="constant LR")
    p.add_argument("--plain-step", action="store_true",
                   help="turn the CUDA speed switches off (channels_last, lean activations, fused optimizer, "
                        "colour jitter on the GPU): the official step's layout")


def add_setting_flags(p: argparse.ArgumentParser) -> None:
    """A flag for every TrainConfig setting declared with one. Every default is None ("not given"), so that a
    resume sees a flag given with its default value; ``given_settings`` reads them back."""
    for name, (f, declared) in declarations(TrainConfig).items():
        if declared.flag is None:
            continue
        default = f.default
        shown = "" if default is None or default is False or declared.negate else f" (default {default})"
        options = {"dest": name, "default": None, "help": declared.help + shown}
        if name in _FORMS:
            options.update(_FORMS[name])
        elif str(f.type) == "bool":  # a switch: its flag turns it on (off when negated)
            options.update(action="store_const", const=not declared.negate)
        elif declared.choices is not None:
            options.update(choices=declared.choices)
        else:
            options.update(type=functools.partial(_parsed, name))
        p.add_argument(declared.flag, *declared.aliases, **options)


def _parsed(name: str, text: str):
    """The flag's text as the setting's type (int, float or str), checked against its declared range."""
    f, declared = declarations(TrainConfig)[name]
    kind = str(f.type)
    try:
        value = int(text) if "int" in kind else float(text) if "float" in kind else text
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {declared.expected}") from None
    problem = declared.problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {problem}")
    return value


def given_settings(args: argparse.Namespace) -> dict:
    """{setting: value} of the setting flags given on the command line (in TrainConfig's form)."""
    out = {name: getattr(args, name) for name, (_, declared) in declarations(TrainConfig).items()
           if declared.flag is not None and getattr(args, name, None) is not None}
    if "freeze" in out:
        out["freeze"] = freeze(out["freeze"])
    schedule = _schedule(args)
    if schedule:
        out["schedule"] = schedule
    return out


def run(args: argparse.Namespace) -> int:
    """Train; exit status 0 when the run finished, 130 when interrupted (SIGINT, Ctrl-C), 143 (SIGTERM)."""
    from yolo9kit.train import ddp

    ddp.init_from_env()
    code = _train(args)
    ddp.finish()  # not after an error: the other ranks may never reach its barrier (torchrun ends them)
    return code


def _train(args: argparse.Namespace) -> int:
    from yolo9kit.train import ddp, fit
    from yolo9kit.train.inputs import class_names
    from yolo9kit.zoo import create_model

    if args.seeds != 1:
        return _train_seeds(args)
    if args.resume:
        model, data, config = _resume_setup(args)
    else:
        if not args.data:
            raise ValueError("--data is required (a data.yaml), unless --resume")
        config = config_from_args(args)
        data = args.data
        model = create_model(args.model or DEFAULT_MODEL, names=class_names(data, config.pipeline.single_cls),
                             weights=args.weights, max_model_bytes=model_limit(args), seed=config.run.seed)
    result = fit(model, data, config)
    main = ddp.current().is_main
    if main and result.auto_batch is not None:
        print(result.auto_batch)
    if main and result.save_dir:
        state = f"interrupted by {result.interrupted_by}" if result.interrupted else "done"
        print(f"{state}: {result.epochs_completed} epochs, best fitness {result.best_fitness:.4f} "
              f"(epoch {result.best_epoch + 1}); weights in {result.save_dir / 'weights'}")
        if result.interrupted:
            print(f"last.pt saved; continue with: python -m yolo9kit train --resume {result.save_dir}")
    return _exit_status(result)


def _exit_status(result) -> int:
    """0 when the run was not interrupted, else 130 (SIGINT, Ctrl-C, a callback's stop) or 143 (SIGTERM)."""
    if not result.interrupted:
        return 0
    return 143 if result.interrupted_by == "SIGTERM" else 130  # 128 + the signal, as a shell reports it


def _train_seeds(args: argparse.Namespace) -> int:
    """``--seeds N``: the run N times (``fit_seeds``), then each seed's final metrics and their spread."""
    from yolo9kit.train.seeds import fit_seeds

    if args.seeds < 1 or args.resume or args.weights or not args.data:
        raise ValueError("--seeds N takes N >= 1 new runs of a --data set; not with --resume (the same --seeds "
                         "command again continues its seeds), and not with --weights: pass the checkpoint as "
                         "--model, it is built anew for each seed")
    spread = fit_seeds(args.model or DEFAULT_MODEL, args.data, config_from_args(args), seeds=args.seeds)
    print(spread.table.to_string(index=False))
    print(spread)
    return _exit_status(spread.results[-1]) if spread.results else 0  # a stop is the last run: it ends the command


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


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """TrainConfig from the flags given (the others keep their declared defaults) and the --hyp yaml: its values
    and recipe (tune's best_hyp.yaml holds the one its trials trained; an official file means the official recipe)
    where no flag is given, a flag given wins."""
    from_hyp = {"recipe": "official", **_hyp_settings(args.hyp)} if args.hyp else {}
    return TrainConfig(**{**from_hyp, **given_settings(args)}, **(_PLAIN if args.plain_step else {}))


def _hyp_settings(path: str) -> dict:
    """The settings of a --hyp file, each key's value checked alone so that a ValueError names the file and key."""
    values = read_hyp(path)
    for key, value in values.items():
        try:
            TrainConfig(**hyp_settings({key: value}, LossConfig()))
        except ValueError as e:
            raise ValueError(f"--hyp {path}: {key}: {e}") from None
    return hyp_settings(values, LossConfig())


def _schedule(args: argparse.Namespace) -> str | None:
    """The schedule the flags ask for (None: no schedule flag, the linear default)."""
    return ("cosine" if args.cos_lr else "flat-cosine" if args.flat_cos_lr else "fixed" if args.fixed_lr
            else None)


_PLAIN = dict.fromkeys((*FAST_SWITCHES, "colour_on_device"), False)  # --plain-step


def _resume_setup(args: argparse.Namespace):
    """Model, data and config of the run to resume: its checkpoint's settings, with the flags of settings a
    resume may change (declared resume=CHANGE); a flag that would change the run is refused, naming it."""
    from yolo9kit.checkpoint import check_model_config, read_checkpoint
    from yolo9kit.models.model import DetectionModel
    from yolo9kit.train.state import find_resume_checkpoint

    path = find_resume_checkpoint(args.resume, args.project or declarations(TrainConfig)["project"][0].default)
    ckpt = read_checkpoint(path)
    if "train_config" not in ckpt:
        raise ValueError(f"{path} has no training state; start a new run with --weights {path}")
    saved = ckpt["train_config"]
    refused = _refused_on_resume(args, saved, ckpt["model_config"])
    if refused:
        free = [declared.flag for _, declared in declarations(TrainConfig).values()
                if declared.resume == CHANGE and declared.flag]
        raise ValueError(f"--resume {path}: {', '.join(refused)} cannot change in the middle of a run; leave "
                         f"them out (only {', '.join(free)} and --plain-step may change), or start a new run from "
                         f"its weights: train --weights {path} ...")
    changes = {k: v for k, v in given_settings(args).items() if declarations(TrainConfig)[k][1].resume == CHANGE}
    config = TrainConfig.from_dict(saved, resume=str(path), **changes, **(_PLAIN if args.plain_step else {}))
    cfg = check_model_config(ckpt, path, ckpt["model"], model_limit(args))
    model = DetectionModel(cfg["yaml"], nc=cfg["nc"], names=cfg["names"], name=cfg.get("name"))
    data = args.data or ckpt.get("data")
    if not data:
        raise ValueError(f"{path} does not record its data; pass --data")
    return model, data, config


def _refused_on_resume(args: argparse.Namespace, saved: dict, model_config: dict) -> list[str]:
    """``--flag value (the run's: x)`` for each given flag that would change the run: the model, the weights,
    the --hyp file, and every setting a resume may not change (declared KEEP, or the run folder's RUN)."""
    declared = declarations(TrainConfig)
    given = {k: v for k, v in given_settings(args).items()
             if declared[k][1].resume != CHANGE and k not in _HOW_TO_RESUME}
    flags = {k: declared[k][1].flag or "--cos-lr/--flat-cos-lr/--fixed-lr" for k in given}
    for name, value in (("model", args.model), ("weights", args.weights), ("hyp", args.hyp)):
        if value is not None:
            given[name], flags[name] = value, f"--{name}"
    runs = {**saved, "model": model_config.get("name")}
    refused = []
    for key, value in given.items():
        if key not in runs or runs[key] != value:
            theirs = f" (the run's: {runs[key]})" if key in runs else ""
            refused.append(f"{flags[key]} {value}{theirs}" if value is not True else flags[key])
    return refused
