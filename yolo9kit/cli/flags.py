"""Flags that several verbs share, spelled as docs/glossary.md says, and the renamed ones that still work."""

from __future__ import annotations

import argparse
from typing import Any


class Renamed(argparse.Action):
    """An old flag kept for a while: stores into the new flag's destination and warns once, naming it."""

    def __init__(self, option_strings, dest, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from yolo9kit._renamed import warn_renamed

        warn_renamed(option_string, self.new)
        setattr(namespace, self.dest, values if self.nargs != 0 else self.const)


def renamed(parser: argparse.ArgumentParser, old: str, new: str, dest: str, **kwargs: Any) -> None:
    """Accept ``old`` as a hidden spelling of ``new`` (same destination and parsing)."""
    parser.add_argument(old, action=Renamed, new=new, dest=dest, **kwargs)


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


def add_step_flags(p: argparse.ArgumentParser, *, several: bool = False) -> None:
    """The step's image size, AMP, activation checkpointing and speed switches (StepConfig/TrainConfig)."""
    nargs = "+" if several else None
    p.add_argument("--imgsz", "--img", "--img-size", dest="imgsz", type=int, default=640,
                   help="image size, a multiple of 32 (default 640)")
    p.add_argument("--amp", nargs=nargs, default=["auto"] if several else "auto",
                   choices=["auto", "fp16", "bf16", "off"],
                   help="mixed precision: auto (bf16 where the GPU has it, else fp16; off on the CPU), fp16, bf16, "
                        "off (default auto)")
    p.add_argument("--activation-checkpointing", type=activation_checkpointing, default=None, metavar="LAYERS",
                   help="recompute layers in backward: none, backbone, all, or layer indices 1,2,3")
    renamed(p, "--checkpoint", "--activation-checkpointing", "activation_checkpointing", type=activation_checkpointing)
    for name, what in (("channels-last", "NHWC weights and inputs"),
                       ("lean-activations", "BatchNorm+SiLU keep one activation for backward")):
        p.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=None,
                       help=f"{what} (default: on for CUDA, off on the CPU)")
    renamed(p, "--lean", "--lean-activations", "lean_activations", nargs=0, const=True)
