"""``python -m yolo9kit <verb> ...``: the same functions the notebooks call, from a shell.

An error is one line on stderr (a traceback with ``-v``/``--verbose``, before or after the verb). Exit codes:
0 done; 1 the work failed while running; 2 the input is wrong (fix it and run again); 130 interrupted with Ctrl-C;
``data check``: 1 when files had to be skipped (docs/faults.md)."""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from yolo9kit.cli import export, predict, runs, train, tune
from yolo9kit.cli.train import add_setting_flag, checked, freeze, setting_type
from yolo9kit.config import SaveConfig, StepConfig, TrainConfig
from yolo9kit.data import check, coco_to_yolo, create_dataloader, load_data_config, make_shapes
from yolo9kit.env import environment_report, set_cpu_threads
from yolo9kit.figure import save_figure
from yolo9kit.gpu_check import check_gpu
from yolo9kit.memory import plan, resolve_gpu, sweep
from yolo9kit.models import create_model, list_models, model_table
from yolo9kit.models.checkpoint import save_checkpoint
from yolo9kit.plots import show_batch
from yolo9kit.prediction import predict as predict_images
from yolo9kit.train.fit import fit
from yolo9kit.validate import evaluate

# errors of the input (exit code 2); anything else that escapes a verb is a failure while running (1).
# ValueError covers the kit's own DataError, CheckpointError and LayerTableError.
INPUT_ERRORS = (ValueError, LookupError, FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError)
MAX_MESSAGE = 600  # characters of one error line; the rest is shown with --verbose
DEMO_CLASSES = 3


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (a verb's usage block buries the message)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the flags)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m yolo9kit", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log at DEBUG level and show the traceback of an error")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    p = verbs.add_parser("checks", help="versions, CUDA, GPUs, CPU, RAM, widgets, package data; --gpu: the GPU check")
    p.add_argument("--gpu", action="store_true", help="the two-minute check of this machine's GPU (fast vs plain "
                   "step, images/s, syncs, memory vs estimate) into gpu_check.json; without CUDA it says so, exit 0")
    p.add_argument("--out", default=".", help="folder for gpu_check.json (default: the current folder)")
    p.set_defaults(func=run_checks)
    p = verbs.add_parser("models", help="list the models: parameters, GFLOPs at 640, deploy (fused gelan) size",
                         description="GFLOPs: torch.utils.flop_counter at 64x64 scaled by (imgsz/64)^2, about 1% "
                                     "below the official thop figures (which count BatchNorm and pooling too).")
    p.add_argument("names", nargs="*", help="models to list (default: all registered models)")
    p.add_argument("--imgsz", type=checked(int, low=1), default=640, help="image side of the GFLOPs (default 640)")
    p.add_argument("--num-classes", type=checked(int, low=1), default=80, help="number of classes (default 80)")
    p.set_defaults(func=run_models)
    _add_data(verbs)
    for add in (train.add_parser, tune.add_parser, runs.add_parser, predict.add_val, predict.add_detect,
                export.add_parser, _add_profile, _add_demo):
        add(verbs)
    _verbose_after_the_verb(verbs)
    return parser


def _verbose_after_the_verb(subparsers: argparse._SubParsersAction) -> None:
    """Accept ``-v``/``--verbose`` after a verb too (hidden; unset unless given, so the top-level one holds)."""
    for sub in subparsers.choices.values():
        if "--verbose" not in sub._option_string_actions:
            options = [o for o in ("-v", "--verbose") if o not in sub._option_string_actions]
            sub.add_argument(*options, dest="verbose", action="store_true", default=argparse.SUPPRESS,
                             help=argparse.SUPPRESS)
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                _verbose_after_the_verb(action)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s",
                        stream=sys.stdout)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    prog = f"{parser.prog} {args.verb}"
    set_cpu_threads()  # at most the cores this process may use (a container's quota included)
    try:
        return int(args.func(args) or 0)
    except (KeyboardInterrupt, Exception) as e:
        if args.verbose:
            raise
        code, line = (130, "interrupted") if isinstance(e, KeyboardInterrupt) else \
            (2, f"error: {one_line(e)}") if isinstance(e, INPUT_ERRORS) else \
            (1, f"failed ({type(e).__name__}): {one_line(e)} (add --verbose for the traceback)")
        print(f"{prog}: {line}", file=sys.stderr)
        return code


def one_line(error: BaseException) -> str:
    """The message of ``error`` as one line: its first line, a state-dict mismatch summarised, long ones cut."""
    text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    if text.startswith("Error(s) in loading state_dict"):  # torch's: tens of KB of key names
        def keys(label: str) -> int:
            found = re.search(label + r" in state_dict: ([^\n]*)", text)
            return len(re.findall(r'"[^"]*"', found.group(1))) if found else 0

        text = (f"the checkpoint's weights do not fit the model ({text.count('size mismatch for ')} tensors of "
                f"another shape, {keys('Missing key[(]s[)]')} missing, {keys('Unexpected key[(]s[)]')} unexpected): "
                "it was saved from another architecture or number of classes; start a new run from it with "
                "`python -m yolo9kit train --weights FILE` (the tensors that fit are transferred)")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0] if lines else type(error).__name__
    if len(line) > MAX_MESSAGE or len(lines) > 1:
        line = f"{line[:MAX_MESSAGE]} ... (--verbose shows all of it)"
    return line


def run_checks(args: argparse.Namespace) -> int:
    if args.gpu:
        result = check_gpu(out=args.out, command=f"python -m yolo9kit checks --gpu --out {args.out}")
    else:
        result = environment_report(verbose=False)
    print(result)
    return 0 if result.ok else 1


def run_models(args: argparse.Namespace) -> int:
    unknown = [n for n in args.names if n not in list_models()]
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; registered: {', '.join(list_models())}")
    table = model_table(args.names or None, imgsz=args.imgsz, num_classes=args.num_classes)
    print(table.to_string(index=False, formatters={
        "parameters": "{:,}".format, "deploy_parameters": "{:,}".format,
        "gflops": "{:.1f}".format, "deploy_gflops": "{:.1f}".format}))
    return 0


def _add_data(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("data", help="make-shapes, check, convert-coco")
    actions = p.add_subparsers(dest="data_verb", metavar="ACTION")
    mk = actions.add_parser("make-shapes", help="write the synthetic shapes data set")
    mk.add_argument("--out", required=True, help="output folder")
    mk.add_argument("--n-train", type=checked(int, low=1), default=256)
    mk.add_argument("--n-val", type=checked(int, low=0), default=64)
    mk.add_argument("--imgsz", "--img", "--img-size", dest="imgsz", type=checked(int, low=1), default=320,
                    help="square side in pixels")
    mk.add_argument("--num-classes", type=checked(int, low=1), default=4)
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--overwrite", action="store_true",
                    help="replace what OUT holds (without it a folder with other files is refused)")
    mk.set_defaults(func=run_make_shapes)
    ck = actions.add_parser("check", help="check images and labels (exit 1: files skipped, 2: unreadable data set)")
    ck.add_argument("data", help="path of a data.yaml")
    ck.add_argument("--split", default="train", choices=["train", "val", "test"])
    ck.add_argument("--no-cache", action="store_true", help="check every file again, ignore the label cache")
    ck.set_defaults(func=run_data_check)
    cv = actions.add_parser("convert-coco", help="COCO detection JSON -> YOLO labels and a data.yaml")
    cv.add_argument("json", help="COCO annotations file (instances_*.json)")
    cv.add_argument("--out", required=True, help="output folder (labels/<split>/ and data.yaml)")
    cv.add_argument("--images", help="folder of the images (default OUT/images/<split>)")
    cv.add_argument("--split", default="train")
    cv.add_argument("--holdout", type=float, default=0.2,
                    help="share of the images held out for validation (val.txt; 0: validate on the training images)")
    cv.add_argument("--overwrite", action="store_true",
                    help="replace OUT/labels/<split> and OUT/data.yaml (without it existing ones are refused)")
    cv.set_defaults(func=run_convert_coco)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run_make_shapes(args: argparse.Namespace) -> int:
    path = make_shapes(args.out, n_train=args.n_train, n_val=args.n_val, imgsz=args.imgsz,
                       num_classes=args.num_classes, seed=args.seed, overwrite=args.overwrite)
    print(f"data set written: {path}")
    return 0


def run_data_check(args: argparse.Namespace) -> int:
    try:
        report = check(args.data, split=args.split, use_cache=not args.no_cache)
    except KeyError as e:  # a missing key of the data.yaml: its message, not its repr
        raise ValueError(e.args[0]) from e
    print(report)
    return 0 if report.ok else 1


def run_convert_coco(args: argparse.Namespace) -> int:
    result = coco_to_yolo(args.json, args.out, images_dir=args.images, split=args.split, overwrite=args.overwrite,
                          holdout=args.holdout)
    for line in result.skipped:
        print(f"dropped {line}", file=sys.stderr)
    print(f"{result.n_images} images, {result.n_boxes} boxes, {len(result.names)} classes, "
          f"{result.n_crowd_skipped} crowd annotations skipped, {result.n_invalid_skipped} boxes dropped "
          "(zero size or outside the image; boxes partly outside were clipped)")
    if result.n_val:
        print(f"validation: {result.n_val} of the images held out (val.txt), not trained on")
    print(f"data.yaml: {result.yaml_path}")
    return 0


def _add_profile(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("profile", help="GPU memory per batch size (measured or estimated) and a batch plan",
                         description="Peak memory against batch size (measured on the local CUDA card, else estimated "
                                     "for --gpu) and a batch x accumulation plan, for the step fit would run there. "
                                     "Example: profile --model yolov9-s --batch-size 8 16 32 --gpu \"RTX 4090\"")
    p.add_argument("--model", default="yolov9-s", help="registered model name (default yolov9-s)")
    p.add_argument("--batch-size", "--batch", dest="batch_size", type=checked(int, low=1), nargs="+",
                   default=[8, 16, 32, 64], help="batch sizes (default 8 16 32 64)")
    add_setting_flag(p, "imgsz", default=640)
    add_setting_flag(p, "amp", nargs="+", default=["auto"])
    add_setting_flag(p, "activation_checkpointing")
    add_setting_flag(p, "freeze")
    for name, what in (("channels-last", "NHWC weights and inputs"),
                       ("lean-activations", "BatchNorm+SiLU keep one activation for backward")):
        p.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=None,
                       help=f"{what} (default: decided for the device, StepConfig.resolve)")
    p.add_argument("--gpu", default=None, help='GPU to estimate for, e.g. "RTX 4090", "T4", "A100-40GB" '
                   "(default: the local CUDA card, else RTX 4090)")
    p.add_argument("--num-targets", type=checked(int, low=0), default=8,
                   help="boxes per image in the synthetic batch (default 8)")
    p.add_argument("--nominal-batch-size", type=setting_type("nominal_batch_size"), default=None,
                   help="also plan batch x accumulation for this many images per optimizer step (e.g. 64)")
    add_setting_flag(p, "margin", default=0.10, help="share of the card kept free (default 0.10)")
    p.add_argument("--method", default="auto", choices=["auto", "measured", "estimated", "both"],
                   help="measure (CUDA), estimate, or auto (default)")
    p.add_argument("--csv", default=None, help="also write the sweep to this CSV file")
    p.set_defaults(func=run_profile)


def run_profile(args: argparse.Namespace) -> int:
    gpu = resolve_gpu(args.gpu) if args.gpu else None  # an unknown name: a one-line error, exit code 2
    steps = [StepConfig(args.model, imgsz=args.imgsz, amp=amp, activation_checkpointing=args.activation_checkpointing,
                        freeze=freeze(args.freeze), channels_last=args.channels_last,
                        lean_activations=args.lean_activations, num_targets=args.num_targets) for amp in args.amp]
    df = sweep(steps, args.batch_size, gpu=gpu, method=args.method)
    columns = ["setting", "batch_size", "method", "peak_allocated_gib", "peak_reserved_gib", "device_gib", "fits",
               "images_per_s"]
    with pd.option_context("display.width", 160, "display.max_columns", 20, "display.float_format", "{:.2f}".format):
        print(df[[c for c in columns if c in df.columns]].to_string(index=False))
    if args.csv:
        df.to_csv(args.csv, index=False)
        print(f"sweep written to {args.csv}")
    if args.nominal_batch_size:
        print()
        print(plan(steps[0], args.nominal_batch_size, gpu=gpu, margin=args.margin,
                   method="estimated" if args.method == "estimated" else "auto"))
    return 0


def _add_demo(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("demo", help="build, save/reload, make data, train, validate and predict end to end (no "
                                      "file to bring: the shapes data, yolov9-t, a few minutes on a CPU)")
    p.add_argument("--out", default="runs/demo", help="output folder (default: runs/demo)")
    p.add_argument("--model", default="yolov9-t", help="model to train (default: yolov9-t)")
    add_setting_flag(p, "imgsz", default=160, help="image size (default: 160, CPU-friendly)")
    add_setting_flag(p, "epochs", help="training epochs (default: the built-in recipe)")
    p.add_argument("--n-train", type=checked(int, low=1), default=None, help="synthetic training images (default: "
                                                                                 "recipe)")
    add_setting_flag(p, "device", help="cuda, cpu, ... (default: cuda when available)")
    p.add_argument("--quick", action="store_true", help="a one-minute smoke run: tiny data, one short epoch")
    p.set_defaults(func=run_demo)


def demo_config(epochs: int, imgsz: int, device: str | None, project: Path, validate: bool = True) -> TrainConfig:
    """The demo's training settings (also those of the shipped shapes model): the short recipe
    (``yolo9kit.config.recipe``) at small images, loading in the main process."""
    return TrainConfig(recipe="short", epochs=epochs, batch_size=16, imgsz=imgsz, device=device, workers=0,
                       val=validate, project=str(project), name="train", exist_ok=True)


def run_demo(args: argparse.Namespace) -> int:
    """The zoo, a checkpoint saved and reloaded, the shapes data, a training run, its validation, a prediction."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = _step("1. the model zoo")
    print(model_table().to_string(index=False))
    print(f"({time.perf_counter() - start:.1f} s)")
    _step("2. kit checkpoint: save, reload, compare")
    model = create_model(args.model).eval()
    path = save_checkpoint(out / f"{args.model}-init.pt", model)
    x = torch.rand(1, 3, 128, 128, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        if not torch.equal(model(x).main, create_model(path).eval()(x).main):
            raise RuntimeError(f"reloaded checkpoint {path} does not reproduce the model's outputs")
    print(f"saved {path} ({Path(path).stat().st_size / 1e6:.1f} MB) and reloaded it: outputs identical")
    start = _step("3. synthetic shapes data")
    n_train, n_val = args.n_train or (32 if args.quick else 384), 8 if args.quick else 64
    data = make_shapes(out / "shapes", n_train=n_train, n_val=n_val, imgsz=args.imgsz, num_classes=DEMO_CLASSES,
                       max_objects=3, seed=0)
    print(f"{data}: {n_train} train / {n_val} val images ({time.perf_counter() - start:.1f} s)")
    loader = create_dataloader(data, "train", imgsz=args.imgsz, batch_size=8, augment=True, workers=0, seed=0)
    save_figure(show_batch(next(iter(loader)), load_data_config(data).names), out / "train_batch.png", 80)
    print(f"an augmented training batch: {out / 'train_batch.png'}")
    start = _step(f"4. train {args.model}")
    config = demo_config(args.epochs or (2 if args.quick else 30), args.imgsz, args.device, out,
                         validate=not args.quick)
    result = fit(create_model(args.model, names=load_data_config(data).names, seed=config.run.seed), data, config)
    print(f"trained {result.epochs_completed} epochs; weights in {result.save_dir}")
    print(f"({time.perf_counter() - start:.0f} s)")
    _step("5. validate the trained model")
    model = create_model(result.best if result.best and Path(result.best).exists() else result.last).eval()
    print(evaluate(model, data, imgsz=args.imgsz, batch_size=16, device=args.device))
    _step("6. predict")
    image = sorted(load_data_config(data).images("val"))[0]
    found = predict_images(model, image, imgsz=args.imgsz, device=args.device, save=SaveConfig(out / "predict"))
    print(found[0].to_frame().to_string(index=False))
    print(f"annotated image in {out / 'predict'}\n\nDone. Everything is in {out}/")
    return 0


def _step(title: str) -> float:
    print(f"\n== {title}")
    return time.perf_counter()
