"""``python -m yolo9kit train``: train a model (official flag names), and the value checks every verb shares.

    python -m yolo9kit train --data data.yaml --model yolov9-c --batch-size auto   # sized from the estimate
    python -m yolo9kit train --data data.yaml --model yolov9-c.pt --freeze backbone --rect   # fine-tune
    python -m yolo9kit train --resume                      # the newest unfinished run under runs/train"""

from __future__ import annotations

import argparse
import functools
import logging
from typing import Any

import torch

from yolo9kit.config import FAST_SWITCHES, LossConfig, TrainConfig
from yolo9kit.config.recipe import hyp_settings, read_hyp
from yolo9kit.config.step import CHANGE, KEEP, Declared, settings
from yolo9kit.config.train import LOGGERS, SETTINGS
from yolo9kit.env import load_extra, parse_device
from yolo9kit.models import create_model
from yolo9kit.models.checkpoint import read_checkpoint
from yolo9kit.train.fit import fit
from yolo9kit.train.rundir import class_names, resume_conflicts
from yolo9kit.train.state import current, find_resume_checkpoint, finish_processes, init_from_env

LOGGER = logging.getLogger(__name__)
DEFAULT_MODEL = "yolov9-t"


def checked(kind: type, **rule: Any) -> functools.partial:
    """An argparse type: the text as ``kind``, allowed as a setting's declaration allows (``low=1``, ...)."""
    return functools.partial(_parsed, kind, Declared("", no_flag="-", integer=kind is int, **rule))


def setting_type(name: str, of: type = TrainConfig) -> functools.partial:
    """An argparse type: the text as the setting ``name`` of ``of`` takes it, checked by its declaration."""
    _, f, declared = settings(of)[name]
    return functools.partial(_parsed, {"int": int, "float": float}.get(f.type.split(" ")[0], str), declared)


def _parsed(kind: type, declared: Declared, text: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {declared.expected}") from None
    problem = declared.problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {problem}")
    return value


def device(text: str) -> str:
    """``cpu``, ``cuda``, ``cuda:N`` or a GPU index ``N``, checked against this machine ("": the default)."""
    if "," in text:
        raise argparse.ArgumentTypeError(f"{text!r}: one device only (cpu, 0, cuda:1); for several GPUs start "
                                         "the command with torchrun --nproc_per_node N")
    try:
        dev = parse_device(text.strip().lower())
    except RuntimeError:  # a device torch does not know
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected cpu, cuda, cuda:N or a GPU index N (e.g. 0)")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not {"cpu": True, "cuda": count > 0, "mps": torch.backends.mps.is_available()}[dev.type]:
        raise argparse.ArgumentTypeError(f"{text!r}: {dev.type.upper()} is not available on this machine; use "
                                         "--device cpu")
    if dev.type == "cuda" and (dev.index or 0) >= count:
        raise argparse.ArgumentTypeError(f"{text!r}: this machine has {count} CUDA device(s), 0..{count - 1}")
    return text


def add_model_limit_flag(p: argparse.ArgumentParser) -> None:
    """``--max-model-gib``, read in bytes as ``args.max_model_bytes`` (None: the default, models.checkpoint's)."""
    gib = checked(float, low=0, low_open=True)
    p.add_argument("--max-model-gib", dest="max_model_bytes", type=lambda text: int(gib(text) * 2**30),
                   metavar="MAX_MODEL_GIB", help="refuse a weights file whose model takes more (parameters and layer "
                   "outputs at 256 px; default 4)")


class Layers(argparse.Action):
    """``--freeze`` words, ``--activation-checkpointing`` text -> the setting: none, backbone, all, indices, N."""

    def __call__(self, parser, namespace, words: list[str] | str, option_string: str | None = None) -> None:
        freeze = self.dest == "freeze"
        text = " ".join(words) if freeze else words
        words = text.lower().replace(",", " ").split()
        if words in (["none"], ["backbone"]) or (words == ["all"] and not freeze):
            value = None if words == ["none"] else words[0]
        elif words and all(w.isdigit() for w in words):
            value = int(words[0]) if freeze and len(words) == 1 else [int(w) for w in words]
        else:
            raise argparse.ArgumentError(self, f"{text!r}: expected " + (
                "backbone or none alone, a number of first layers (10), or layer indices (0 1 2)" if freeze else
                "none, all, backbone or comma-separated layer indices (e.g. 1,2,3)"))
        setattr(namespace, self.dest, value)


# How the command line writes the settings that are not a plain number, word or switch (the rest: their declaration)
_FORMS = {
    "batch_size": {"type": lambda text: "auto" if text.lower() in ("auto", "-1") else setting_type("batch_size")(text)},
    "activation_checkpointing": {"action": Layers, "type": str, "metavar": "LAYERS"}, "device": {"type": device},
    "freeze": {"action": Layers, "type": str, "nargs": "+", "metavar": "LAYERS"},
    "cache": {"choices": ("ram", "disk"), "nargs": "?", "const": "ram"}, "resume": {"nargs": "?", "const": True},
    "compile": {"nargs": "?", "const": True, "metavar": "MODE"},
    "loggers": {"nargs": "+", "choices": LOGGERS, "metavar": "NAME"}}
_PLAIN = dict.fromkeys((*FAST_SWITCHES, "colour_on_device"), False)  # --plain-step
_SCHEDULES = {"cos_lr": "cosine", "flat_cos_lr": "flat-cosine", "fixed_lr": "fixed"}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="train a YOLOv9/GELAN model (AMP, accumulation, EMA, resume, DDP)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_flags(p)
    p.add_argument("--weights", default=None, help="official or kit .pt: same-name same-shape tensors are transferred")
    p.add_argument("--seeds", type=int, default=1, metavar="N", help="train N times (at most 100) from --seed, "
                   "--seed + 1, ... into <name>-seed-<k> and print the spread of the final mAP; run again to continue")
    p.set_defaults(func=run)


def add_train_flags(p: argparse.ArgumentParser) -> None:
    """The flags of a run (``train`` and ``tune``): --data, --model, a flag per declared setting, --hyp, ..."""
    p.add_argument("--data", help="data.yaml")
    p.add_argument("--model", "--cfg", help=f"model name, model yaml or checkpoint (default {DEFAULT_MODEL})")
    for name, (_, _, declared) in SETTINGS.items():
        if declared.flag is not None:
            add_setting_flag(p, name)
    add_model_limit_flag(p)
    p.add_argument("--hyp", help="hyper-parameter yaml (official keys, or tune's best_hyp.yaml); flags win over it")
    p.add_argument("--label-smoothing", type=checked(float, low=0, high=1, high_open=True), default=None,
                   help="official flag, ignored: the official dual loss never applies it (docs/training.md)")
    schedules = p.add_mutually_exclusive_group()
    for flag, what in (("--cos-lr", "cosine"), ("--flat-cos-lr", "flat, then cosine"), ("--fixed-lr", "constant")):
        schedules.add_argument(flag, action="store_true", help=f"{what} learning-rate schedule")
    p.add_argument("--plain-step", action="store_true", help="the CUDA speed switches off (channels_last, lean "
                   "activations, fused optimizer, colour jitter on the GPU): the official step")


def add_setting_flag(p: argparse.ArgumentParser, name: str, of: type = TrainConfig, **changes: Any) -> None:
    """The flag of the setting ``name`` of ``of`` as declared, with ``changes`` (default None: "not given")."""
    _, f, declared = settings(of)[name]
    default = changes.get("default", f.default)
    shown = "" if default is None or default is False or declared.negate else f" (default {default})"
    options: dict[str, Any] = {"dest": name, "default": None, "help": declared.help + shown}
    if f.type == "bool":  # a switch: its flag turns it on (off when negated)
        options.update(action="store_const", const=not declared.negate)
    elif declared.choices is not None:
        options.update(choices=declared.choices)
    else:
        options.update(type=setting_type(name, of))
    forms = _FORMS.get(name, {}) if of is TrainConfig else {}
    p.add_argument(declared.flag, *declared.aliases, **{**options, **forms, **changes})


def given_settings(args: argparse.Namespace) -> dict:
    """{setting: value} of the setting flags given on the command line (in TrainConfig's form), --plain-step's too."""
    out = {name: getattr(args, name) for name, (_, _, declared) in SETTINGS.items()
           if declared.flag is not None and getattr(args, name, None) is not None}
    out.update(("schedule", schedule) for flag, schedule in _SCHEDULES.items() if getattr(args, flag))
    return {**out, **(_PLAIN if args.plain_step else {})}


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """TrainConfig from the flags given, then the --hyp file (an official file means the official recipe)."""
    if args.label_smoothing is not None:
        LOGGER.warning("--label-smoothing %g is ignored: the official dual loss never applies it", args.label_smoothing)
    from_hyp = {"recipe": "official", **hyp_settings(read_hyp(args.hyp), LossConfig())} if args.hyp else {}
    return TrainConfig(**{**from_hyp, **given_settings(args)})


def run(args: argparse.Namespace) -> int:
    """Train; exit status 0 when the run finished, else 128 + the signal (``exit_status``)."""
    init_from_env()
    code = _train(args) if args.seeds == 1 else load_extra("yolo9kit.commands", "seeds")(args)
    finish_processes()  # not after an error: the other ranks may never reach its barrier (torchrun ends them)
    return code


def exit_status(result) -> int:
    """0 when the run was not interrupted, else 128 + the signal: 130 (SIGINT, Ctrl-C, a callback's stop), 143."""
    return 0 if not result.interrupted else 143 if result.interrupted_by == "SIGTERM" else 130


def _train(args: argparse.Namespace) -> Any:
    if args.resume:
        model, data, config = _resume_setup(args)
    else:
        if not args.data:
            raise ValueError("--data is required (a data.yaml), unless --resume")
        config, data = config_from_args(args), args.data
        model = create_model(args.model or DEFAULT_MODEL, names=class_names(data, config.pipeline.single_cls),
                             weights=args.weights, max_model_bytes=args.max_model_bytes, seed=config.run.seed)
    result = fit(model, data, config)
    main = current().is_main
    if main and result.auto_batch is not None:
        print(result.auto_batch)
    if main and result.save_dir:
        state = f"interrupted by {result.interrupted_by}" if result.interrupted else "done"
        print(f"{state}: {result.epochs_completed} epochs, best fitness {result.best_fitness:.4f} "
              f"(epoch {result.best_epoch + 1}); weights in {result.save_dir / 'weights'}")
        if result.interrupted:
            print(f"last.pt saved; continue with: python -m yolo9kit train --resume {result.save_dir}")
    return exit_status(result)


def _resume_setup(args: argparse.Namespace) -> tuple[Any, Any, TrainConfig]:
    """Model, data and config of the run to resume: its settings, with the flags given of resume=CHANGE settings."""
    path = find_resume_checkpoint(args.resume, args.project or SETTINGS["project"][1].default)
    ckpt = read_checkpoint(path)
    if "train_config" not in ckpt:
        raise ValueError(f"{path} has no training state; start a new run with --weights {path}")
    refused = _refused_on_resume(args, ckpt["train_config"], ckpt["model_config"])
    if refused:
        free = [d.flag for _, _, d in SETTINGS.values() if d.resume == CHANGE and d.flag]
        raise ValueError(f"--resume {path}: {', '.join(refused)} cannot change in the middle of a run; leave "
                         f"them out (only {', '.join(free)} and --plain-step may change), or start a new run from "
                         f"its weights: train --weights {path} ...")
    changes = {k: v for k, v in given_settings(args).items() if SETTINGS[k][2].resume == CHANGE}
    config = TrainConfig.from_dict(ckpt["train_config"], resume=str(path), **changes)
    data = args.data or ckpt.get("data")
    if not data:
        raise ValueError(f"{path} does not record its data; pass --data")
    return create_model(path, max_model_bytes=args.max_model_bytes), data, config  # the run's model; fit loads state


def _refused_on_resume(args: argparse.Namespace, saved: dict, model_config: dict) -> list[str]:
    """``--flag value (the run's: x)`` for each flag given that would change the run (``resume_conflicts``, ...)."""
    given = {k: v for k, v in given_settings(args).items() if SETTINGS[k][2].resume == KEEP}
    conflicts = resume_conflicts(saved, TrainConfig.from_dict(saved, **given))
    runs = {**saved, "model": model_config.get("name")}
    for name in ("name", "exist_ok", "model", "weights", "hyp"):
        if getattr(args, name) is not None and runs.get(name) != getattr(args, name):
            conflicts[name] = (runs.get(name), getattr(args, name))
    refused = []
    for name, (theirs, value) in conflicts.items():
        flag = (SETTINGS[name][2].flag if name in SETTINGS else f"--{name}") or "--cos-lr/--flat-cos-lr/--fixed-lr"
        theirs = f" (the run's: {theirs})" if name in runs else ""
        refused.append(flag if value is True else f"{flag} {value}{theirs}")
    return refused
