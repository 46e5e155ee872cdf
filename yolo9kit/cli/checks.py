"""``python -m yolo9kit checks [--gpu]``: print the environment report, or run the GPU check."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("checks", help="versions, CUDA, GPUs, CPU, RAM, JupyterLab widgets, package data; "
                                             "--gpu: the two-minute check on this machine's GPU")
    p.add_argument("--gpu", action="store_true",
                   help="run the GPU check (fast vs plain step, images/s, syncs, memory vs estimate) and write "
                        "gpu_check.json; without CUDA it says so and exits 0")
    p.add_argument("--out", default=".", help="folder for gpu_check.json (default: the current folder)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.gpu:
        from yolo9kit.gpu_check import check_gpu

        result = check_gpu(out=args.out, command=f"python -m yolo9kit checks --gpu --out {args.out}")
        print(result)
        return 0 if result.ok else 1
    from yolo9kit.env import environment_report

    report = environment_report(verbose=False)
    print(report)
    return 0 if report.ok else 1
