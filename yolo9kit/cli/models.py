"""``python -m yolo9kit models``: the model zoo table (parameters, GFLOPs, deploy size)."""

from __future__ import annotations

import argparse

from yolo9kit.cli.flags import image_size, positive_int


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "models", help="list the models: parameters, GFLOPs at 640, deploy (fused gelan) size",
        description="Build each model on the CPU and print its size. GFLOPs are counted with "
                    "torch.utils.flop_counter on a 64x64 input and scaled by (imgsz/64)^2; they are about 1% "
                    "below the official thop figures, which also count BatchNorm and pooling.")
    p.add_argument("names", nargs="*", help="models to list (default: all registered models)")
    p.add_argument("--imgsz", type=image_size, default=640, help="image side the GFLOPs are reported for (default 640)")
    p.add_argument("--num-classes", type=positive_int, default=80, help="number of classes (default 80)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from yolo9kit.models import list_models, model_table

    unknown = [n for n in args.names if n not in list_models()]
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; registered: {', '.join(list_models())}")
    table = model_table(args.names or None, imgsz=args.imgsz, num_classes=args.num_classes)
    print(table.to_string(index=False, formatters={
        "parameters": "{:,}".format, "deploy_parameters": "{:,}".format,
        "gflops": "{:.1f}".format, "deploy_gflops": "{:.1f}".format}))
    return 0
