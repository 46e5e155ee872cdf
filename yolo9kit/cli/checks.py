"""``python -m yolo9kit checks``: print the environment report."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("checks", help="versions, CUDA, GPUs, CPU, RAM, JupyterLab widgets, package data")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from yolo9kit.env import checks

    report = checks(verbose=False)
    print(report)
    return 0 if report.ok else 1
