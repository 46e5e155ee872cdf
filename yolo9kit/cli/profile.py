"""``python -m yolo9kit profile``: peak memory against batch size and a batch x accumulation plan.

Measures on the local CUDA card when there is one (``--method auto``), estimates for ``--gpu``
otherwise. The step is the one ``fit`` would run on the card (AMP auto, channels_last and lean activations
on CUDA) unless the flags change it. Example::

    python -m yolo9kit profile --model yolov9-s --imgsz 640 --batch-size 8 16 32 64 --gpu "RTX 4090"
"""

from __future__ import annotations

import argparse

from yolo9kit.cli.flags import add_step_flags, freeze, non_negative_int, positive_int, share_below_one

_COLUMNS = ["setting", "batch_size", "method", "peak_allocated_gib", "peak_reserved_gib", "device_gib", "fits",
            "images_per_s"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("profile", help="GPU memory per batch size (measured or estimated) and a batch plan",
                              description=__doc__.splitlines()[0])
    p.add_argument("--model", default="yolov9-s", help="registered model name (default yolov9-s)")
    p.add_argument("--batch-size", "--batch", dest="batch_size", type=positive_int, nargs="+", default=[8, 16, 32, 64],
                   help="batch sizes (default 8 16 32 64)")
    add_step_flags(p, several=True)
    p.add_argument("--gpu", default=None, help='GPU to estimate for, e.g. "RTX 4090", "T4", "A100-40GB" '
                   "(default: the local CUDA card, else RTX 4090)")
    p.add_argument("--num-targets", type=non_negative_int, default=8,
                   help="boxes per image in the synthetic batch (default 8)")
    p.add_argument("--nominal-batch-size", type=positive_int, default=None,
                   help="also plan batch x accumulation for this many images per optimizer step (e.g. 64)")
    p.add_argument("--margin", type=share_below_one, default=0.10, help="share of the card kept free (default 0.10)")
    p.add_argument("--method", default="auto", choices=["auto", "measured", "estimated", "both"],
                   help="measure (CUDA), estimate, or auto (default)")
    p.add_argument("--csv", default=None, help="also write the sweep to this CSV file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from yolo9kit.config import StepConfig
    from yolo9kit.memory import plan, resolve_gpu, sweep

    gpu = resolve_gpu(args.gpu) if args.gpu else None  # an unknown name: a one-line error, exit code 2
    steps = [StepConfig(args.model, imgsz=args.imgsz, amp=amp, activation_checkpointing=args.activation_checkpointing,
                        freeze=freeze(args.freeze), channels_last=args.channels_last,
                        lean_activations=args.lean_activations, num_targets=args.num_targets) for amp in args.amp]
    df = sweep(steps, args.batch_size, gpu=gpu, method=args.method)
    with pd.option_context("display.width", 160, "display.max_columns", 20, "display.float_format", "{:.2f}".format):
        print(df[[c for c in _COLUMNS if c in df.columns]].to_string(index=False))
    if args.csv:
        df.to_csv(args.csv, index=False)
        print(f"sweep written to {args.csv}")
    if args.nominal_batch_size:
        result = plan(steps[0], args.nominal_batch_size, gpu=gpu, margin=args.margin,
                      method="estimated" if args.method == "estimated" else "auto")
        print()
        print(result)
    return 0
