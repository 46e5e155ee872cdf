"""``python -m yolo9kit profile``: peak memory against batch size and a batch x accumulation plan.

Measures on the local CUDA card when there is one (``--source auto``), estimates for ``--gpu``
otherwise. Example::

    python -m yolo9kit profile --model yolov9-s --img 640 --batch 8 16 32 64 --amp fp16 --gpu "RTX 4090"
"""

from __future__ import annotations

import argparse

_COLUMNS = ["setting", "batch_size", "source", "peak_allocated_gib", "peak_reserved_gib", "device_gib", "fits",
            "images_per_s"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("profile", help="GPU memory per batch size (measured or estimated) and a batch plan",
                              description=__doc__.splitlines()[0])
    p.add_argument("--model", default="yolov9-s", help="registered model name (default yolov9-s)")
    p.add_argument("--img", type=int, default=640, help="image size, a multiple of 32 (default 640)")
    p.add_argument("--batch", type=int, nargs="+", default=[8, 16, 32, 64], help="batch sizes (default 8 16 32 64)")
    p.add_argument("--amp", nargs="+", default=["fp16"], choices=["fp16", "bf16", "off"], help="AMP mode(s)")
    p.add_argument("--gpu", default=None, help='GPU to estimate for, e.g. "RTX 4090", "T4", "A100-40GB" '
                   "(default: the local CUDA card, else H100)")
    p.add_argument("--checkpoint", default=None, help='activation checkpointing: "all", "backbone" or indices 1,2,3')
    p.add_argument("--channels-last", action="store_true", help="channels_last memory format")
    p.add_argument("--lean", action="store_true",
                   help="lean BatchNorm+SiLU (with --channels-last: the step fit runs on CUDA by default)")
    p.add_argument("--num-targets", type=int, default=8, help="boxes per image in the synthetic batch (default 8)")
    p.add_argument("--nominal-batch", type=int, default=None, help="also plan batch x accumulation for this many "
                   "images per optimizer step (e.g. 64)")
    p.add_argument("--margin", type=float, default=0.10, help="share of the card kept free (default 0.10)")
    p.add_argument("--source", default="auto", choices=["auto", "measured", "estimated", "both"],
                   help="measure (CUDA), estimate, or auto (default)")
    p.add_argument("--csv", default=None, help="also write the sweep to this CSV file")
    p.set_defaults(func=run)


def _checkpoint(text: str | None):
    if text is None or text in ("none", "None"):
        return None
    if text in ("all", "backbone"):
        return text
    try:
        return [int(i) for i in text.split(",")]
    except ValueError:
        raise SystemExit(f"--checkpoint {text!r}: expected all, backbone or comma-separated layer indices") from None


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from yolo9kit.memory import plan, resolve_gpu, sweep

    try:
        gpu = resolve_gpu(args.gpu) if args.gpu else None
    except ValueError as e:
        print(f"error: {e}")
        return 2
    checkpoint = _checkpoint(args.checkpoint)
    df = sweep(args.model, args.batch, imgsz=args.img, amp=args.amp, checkpoint=checkpoint,
               channels_last=args.channels_last, gpu=gpu, num_targets=args.num_targets, source=args.source,
               lean=args.lean)
    with pd.option_context("display.width", 160, "display.max_columns", 20, "display.float_format", "{:.2f}".format):
        print(df[[c for c in _COLUMNS if c in df.columns]].to_string(index=False))
    if args.csv:
        df.to_csv(args.csv, index=False)
        print(f"sweep written to {args.csv}")
    if args.nominal_batch:
        result = plan(args.model, nominal_batch_size=args.nominal_batch, gpu=gpu, imgsz=args.img, amp=args.amp[0],
                      checkpoint=checkpoint, channels_last=args.channels_last, num_targets=args.num_targets,
                      lean=args.lean, margin=args.margin, source="estimated" if args.source == "estimated" else "auto")
        print()
        print(result)
    return 0
