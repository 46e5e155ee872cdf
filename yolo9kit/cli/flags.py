"""Flags that several verbs share, spelled as docs/glossary.md says."""

from __future__ import annotations

import argparse


def activation_checkpointing(text: str | None) -> str | list[int] | None:
    """``none``, ``all``, ``backbone`` or comma-separated layer indices -> the API value."""
    if text is None or text.lower() == "none":
        return None
    if text in ("all", "backbone"):
        return text
    try:
        return [int(i) for i in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected none, all, backbone or comma-separated layer indices (e.g. 1,2,3)") from None


def freeze_token(text: str) -> int | str:
    """One word of ``--freeze``: ``backbone``, ``none`` or a layer number >= 0."""
    if text.lower() in ("backbone", "none"):
        return text.lower()
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected backbone, a number of first layers (10), or layer "
                                         "indices (0 1 2)")
    return value


def freeze(tokens: list[int | str] | None) -> int | str | list[int] | None:
    """``--freeze`` words -> the setting ``freeze``, as the official flag: one number N is the first N layers,
    several are layer indices; ``backbone`` the model yaml's backbone rows; ``none`` (or 0) nothing."""
    if not tokens or tokens == ["none"]:
        return None
    if tokens == ["backbone"]:
        return "backbone"
    if any(isinstance(t, str) for t in tokens):
        raise ValueError(f"--freeze {' '.join(map(str, tokens))}: backbone and none stand alone; give one of them, "
                         "a number of first layers, or layer indices")
    return tokens[0] if len(tokens) == 1 else list(tokens)


def add_freeze_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--freeze", nargs="+", type=freeze_token, default=None, metavar="LAYERS",
                   help="layers that do not train (fine-tuning): N for the first N layers (official: 10 is the "
                        "yolov9-c backbone), several indices (0 1 2), or backbone (the model yaml's backbone rows)")


def add_step_flags(p: argparse.ArgumentParser, *, several: bool = False) -> None:
    """The step's image size, AMP, activation checkpointing and speed switches (StepConfig/TrainConfig)."""
    nargs = "+" if several else None
    p.add_argument("--imgsz", "--img", "--img-size", dest="imgsz", type=train_image_size, default=640,
                   help="image size, a multiple of 32 (default 640)")
    p.add_argument("--amp", nargs=nargs, default=["auto"] if several else "auto",
                   choices=["auto", "fp16", "bf16", "off"],
                   help="mixed precision: auto (bf16 where the GPU has it, else fp16; off on the CPU), fp16, bf16 "
                        "(also on a CPU with bf16 in hardware), off (default auto)")
    p.add_argument("--activation-checkpointing", type=activation_checkpointing, default=None, metavar="LAYERS",
                   help="recompute layers in backward: none, backbone, all, or layer indices 1,2,3")
    add_freeze_flag(p)
    for name, what in (("channels-last", "NHWC weights and inputs"),
                       ("lean-activations", "BatchNorm+SiLU keep one activation for backward")):
        p.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=None,
                       help=f"{what} (default: decided for the device, StepConfig.resolve)")


# ---- argument types: every value is checked while the command line is parsed, before any work starts ----

def _int(text: str, expected: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}") from None


def positive_int(text: str) -> int:
    """An integer >= 1 (batch sizes, epochs, counts)."""
    value = _int(text, "an integer >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: expected an integer >= 1")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (loader workers, epochs without mosaic, patience)."""
    value = _int(text, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: expected an integer >= 0")
    return value


def image_size(text: str) -> int:
    """An inference image side in pixels (>= 1; rounded up to a multiple of the model stride)."""
    value = _int(text, "an image side in pixels, e.g. 640")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: expected an image side in pixels >= 1, e.g. 640")
    return value


def train_image_size(text: str) -> int:
    """A training image side: a multiple of 32 (the largest model stride)."""
    value = _int(text, "a multiple of 32, e.g. 640")
    if value < 32 or value % 32:
        raise argparse.ArgumentTypeError(f"{value}: expected a multiple of 32 (the largest model stride), e.g. 640")
    return value


def _float(text: str, expected: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}") from None
    if value != value:  # NaN passes every comparison below
        raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
    return value


def share(text: str) -> float:
    """A number in [0, 1] (confidence and IoU thresholds)."""
    value = _float(text, "a number in [0, 1]")
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{value}: expected a number in [0, 1]")
    return value


def share_below_one(text: str) -> float:
    """A number in [0, 1) (the share of a card kept free)."""
    value = _float(text, "a number in [0, 1)")
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{value}: expected a number in [0, 1), e.g. 0.10")
    return value


def cache_mode(text: str) -> str:
    """``ram`` or ``disk`` (train --cache)."""
    if text not in ("ram", "disk"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected ram or disk")
    return text


def device(text: str) -> str:
    """``cpu``, ``cuda``, ``cuda:N`` or a GPU index ``N``, checked against this machine; returned as given
    ("" stays "": the default device)."""
    spec = text.strip().lower()
    if not spec:
        return text
    if "," in spec:
        raise argparse.ArgumentTypeError(f"{text!r}: one device only (cpu, 0, cuda:1); for several GPUs start "
                                         "the command with torchrun --nproc_per_node N")
    import torch

    from yolo9kit.env import parse_device

    try:
        dev = parse_device(spec)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected cpu, cuda, cuda:N or a GPU index N (e.g. 0)")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            raise argparse.ArgumentTypeError(f"{text!r}: CUDA is not available on this machine; use --device cpu")
        if dev.index is not None and dev.index >= count:
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has {count} CUDA device(s), 0..{count - 1}")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: MPS is not available on this machine; use --device cpu")
    return text


def add_model_limit_flag(p: argparse.ArgumentParser) -> None:
    """``--max-model-gib``: the limit on the model a weights file describes (``yolo9kit.models.weights``)."""
    p.add_argument("--max-model-gib", type=lambda text: _float(text, "a size in GiB > 0"), default=None,
                   help="refuse a weights file whose model takes more than this (parameters and layer outputs "
                        "for one 256 px image; default 4): raise it for a model that really is that large")


def model_limit(args: argparse.Namespace) -> int | None:
    """``--max-model-gib`` in bytes (None: the default limit)."""
    value = getattr(args, "max_model_gib", None)
    if value is not None and value <= 0:
        raise ValueError(f"--max-model-gib {value}: expected a size in GiB > 0")
    return None if value is None else int(value * 2**30)
