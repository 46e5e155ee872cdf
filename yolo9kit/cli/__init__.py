"""``python -m yolo9kit <verb> ...``: the same functions the notebooks call, from a shell.

An error is one line on stderr (a traceback with ``-v``); exit codes: docs/faults.md."""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from yolo9kit.cli import predict, train
from yolo9kit.cli.train import add_setting_flag, checked, setting_type
from yolo9kit.config import SaveConfig, StepConfig, TrainConfig
from yolo9kit.data import check, coco_to_yolo, create_dataloader, load_data_config, make_shapes
from yolo9kit.env import environment_report, load_extra, set_cpu_threads
from yolo9kit.figure import save_figure
from yolo9kit.memory import plan, resolve_gpu, sweep
from yolo9kit.models import create_model, model_table
from yolo9kit.models.checkpoint import save_checkpoint
from yolo9kit.plots import show_batch
from yolo9kit.prediction import predict as predict_images
from yolo9kit.train.fit import fit
from yolo9kit.validate import evaluate

# errors of the input (exit code 2; ValueError covers the kit's own DataError, CheckpointError, LayerTableError)
INPUT_ERRORS = (ValueError, LookupError, FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError)
MAX_MESSAGE = 600  # characters of one error line; the rest is shown with --verbose
EXTRA_VERBS = {"tune": "tune", "runs": "", "export": "export"}  # verbs of the extras -> the pip extra they need
DEMO_CLASSES = 3


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (a verb's usage block buries the message), and whose
    verbs take ``-v``/``--verbose`` too (hidden, unset unless given: a verb's own --verbose replaces it)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(conflict_handler="resolve", **kwargs)
        self.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the flags)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m yolo9kit", description=__doc__.splitlines()[0])
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])  # no verb (a verb's own func replaces it)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log at DEBUG level and show the traceback of an error")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    p = verbs.add_parser("checks", help="versions, CUDA, GPUs, CPU, RAM, widgets, package data; --gpu: the GPU check")
    p.add_argument("--gpu", action="store_true", help="the two-minute check of this machine's GPU (fast and plain "
                   "step, images/s, syncs, memory vs estimate) into gpu_check.json")
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
    for add in (train.add_parser, "tune", "runs", predict.add_val, predict.add_detect, "export", _add_profile,
                _add_demo):
        if not isinstance(add, str):
            add(verbs)
            continue
        try:  # an extra's verb, as its entry point adds it; when not installed, a verb that raises the same error
            load_extra("yolo9kit.commands", add, EXTRA_VERBS[add])(verbs)
        except ValueError as e:
            p = verbs.add_parser(add, help=f"(not installed) {e}")
            p.add_argument("rest", nargs=argparse.REMAINDER)
            p.set_defaults(func=lambda args, name=add: load_extra("yolo9kit.commands", name, EXTRA_VERBS[name]))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s", stream=sys.stdout)
    set_cpu_threads()  # at most the cores this process may use (a container's quota included)
    try:
        return int(args.func(args) or 0)
    except (KeyboardInterrupt, Exception) as e:
        if args.verbose:
            raise
        code, line = (130, "interrupted") if isinstance(e, KeyboardInterrupt) else \
            (2, f"error: {one_line(e)}") if isinstance(e, INPUT_ERRORS) else \
            (1, f"failed ({type(e).__name__}): {one_line(e)} (add --verbose for the traceback)")
        print(f"{parser.prog} {args.verb}: {line}", file=sys.stderr)
        return code


def one_line(error: BaseException) -> str:
    """The message of ``error`` as one line: its first line, a state-dict mismatch summarised, long ones cut."""
    text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    if text.startswith("Error(s) in loading state_dict"):  # torch's: tens of KB of key names
        keys = {line.split()[0]: len(re.findall(r'"[^"]*"', line)) for line in text.splitlines()
                if line.strip().startswith(("Missing key(s) in state_dict:", "Unexpected key(s) in state_dict:"))}
        text = (f"the checkpoint's weights do not fit the model ({text.count('size mismatch for ')} tensors of "
                f"another shape, {keys.get('Missing', 0)} missing, {keys.get('Unexpected', 0)} unexpected): "
                "it was saved from another architecture or number of classes; start a new run from it with "
                "`python -m yolo9kit train --weights FILE` (the tensors that fit are transferred)")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0] if lines else type(error).__name__
    if len(line) > MAX_MESSAGE or len(lines) > 1:
        line = f"{line[:MAX_MESSAGE]} ... (--verbose shows all of it)"
    return line


def run_checks(args: argparse.Namespace) -> int:
    if args.gpu:
        check_gpu = load_extra("yolo9kit.commands", "gpu_check")
        result = check_gpu(out=args.out, command=f"python -m yolo9kit checks --gpu --out {args.out}")
    else:
        result = environment_report(verbose=False)
    print(result)
    return 0 if result.ok else 1


def run_models(args: argparse.Namespace) -> int:
    table = model_table(args.names or None, imgsz=args.imgsz, num_classes=args.num_classes)  # a wrong name: exit 2
    formats = {"parameters": "{:,}", "deploy_parameters": "{:,}", "gflops": "{:.1f}", "deploy_gflops": "{:.1f}"}
    print(table.to_string(index=False, formatters={name: form.format for name, form in formats.items()}))
    return 0


def _add_data(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("data", help="make-shapes, check, convert-coco")
    actions = p.add_subparsers(dest="data_verb", metavar="ACTION")
    mk = actions.add_parser("make-shapes", help="write the synthetic shapes data set")
    mk.add_argument("--out", required=True, help="output folder")
    mk.add_argument("--n-train", type=checked(int, low=1), default=256)
    mk.add_argument("--n-val", type=checked(int, low=0), default=64)
    mk.add_argument("--imgsz", "--img", "--img-size", type=checked(int, low=1), default=320, help="square side")
    mk.add_argument("--num-classes", type=checked(int, low=1), default=4)
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--overwrite", action="store_true", help="replace what OUT holds (else other files are refused)")
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
    cv.add_argument("--holdout", type=float, default=0.2, help="share of the images held out for val.txt (0: none)")
    cv.add_argument("--overwrite", action="store_true", help="replace OUT/labels/<split> and OUT/data.yaml")
    cv.set_defaults(func=run_convert_coco)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run_make_shapes(args: argparse.Namespace) -> int:
    path = make_shapes(args.out, n_train=args.n_train, n_val=args.n_val, imgsz=args.imgsz,
                       num_classes=args.num_classes, seed=args.seed, overwrite=args.overwrite)
    print(f"data set written: {path}")
    return 0


def run_data_check(args: argparse.Namespace) -> int:
    report = check(args.data, split=args.split, use_cache=not args.no_cache)  # a key missing in data.yaml: exit 2
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
                                     "for --gpu), for the step fit would run there, and a batch x accumulation plan.")
    p.add_argument("--model", default="yolov9-s", help="registered model name (default yolov9-s)")
    p.add_argument("--batch-size", "--batch", type=checked(int, low=1), nargs="+", default=[8, 16, 32, 64],
                   help="batch sizes (default 8 16 32 64)")
    add_setting_flag(p, "imgsz", default=640)
    add_setting_flag(p, "amp", nargs="+", default=["auto"])
    add_setting_flag(p, "activation_checkpointing")
    add_setting_flag(p, "freeze")
    for name, what in (("channels-last", "NHWC weights and inputs"),
                       ("lean-activations", "BatchNorm+SiLU keep one activation for backward")):
        p.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=None,
                       help=f"{what} (default: decided for the device, StepConfig.resolve)")
    p.add_argument("--gpu", help='GPU to estimate for, e.g. "T4" (default: the local CUDA card, else RTX 4090)')
    p.add_argument("--num-targets", type=checked(int, low=0), default=8, help="boxes per image in the batch (8)")
    p.add_argument("--nominal-batch-size", type=setting_type("nominal_batch_size"), default=None,
                   help="also plan batch x accumulation for this many images per optimizer step (e.g. 64)")
    add_setting_flag(p, "margin", default=0.10, help="share of the card kept free (default 0.10)")
    p.add_argument("--method", default="auto", choices=["auto", "measured", "estimated", "both"],
                   help="measure (CUDA), estimate, or auto (default)")
    p.add_argument("--images", type=checked(int, low=1), help="training images: adds the minutes per epoch (--gpu)")
    p.add_argument("--csv", help="also write the sweep to this CSV file")
    p.set_defaults(func=run_profile)


def run_profile(args: argparse.Namespace) -> int:
    gpu = resolve_gpu(args.gpu) if args.gpu else None  # an unknown name: a one-line error, exit code 2
    steps = [StepConfig(args.model, imgsz=args.imgsz, amp=amp, activation_checkpointing=args.activation_checkpointing,
                        freeze=args.freeze, channels_last=args.channels_last, lean_activations=args.lean_activations,
                        num_targets=args.num_targets) for amp in args.amp]
    df = sweep(steps, args.batch_size, gpu=gpu, method=args.method)
    if args.images and "images_per_s" in df:  # the throughput model's figure for the card (docs/memory.md)
        df["epoch_min"] = args.images / df["images_per_s"] / 60
    columns = ["setting", "batch_size", "method", "peak_allocated_gib", "peak_reserved_gib", "device_gib", "fits",
               "images_per_s", "epoch_min"]
    with pd.option_context("display.width", 160, "display.max_columns", 20, "display.float_format", "{:.2f}".format):
        print(df[[c for c in columns if c in df.columns]].to_string(index=False))
    if args.csv:
        df.to_csv(args.csv, index=False)
        print(f"sweep written to {args.csv}")
    if args.nominal_batch_size:
        method = "estimated" if args.method == "estimated" else "auto"
        print(f"\n{plan(steps[0], args.nominal_batch_size, gpu=gpu, margin=args.margin, method=method)}")
    return 0


def _add_demo(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("demo", help="build, save/reload, make data, train, validate and predict end to end (the "
                                      "shapes data: a few minutes on a CPU)")
    p.add_argument("--out", default="runs/demo", help="output folder (default: runs/demo)")
    p.add_argument("--model", default="yolov9-t", help="model to train (default: yolov9-t)")
    add_setting_flag(p, "imgsz", default=160, help="image size (default: 160, CPU-friendly)")
    add_setting_flag(p, "epochs", help="training epochs (default: the built-in recipe)")
    p.add_argument("--n-train", type=checked(int, low=1), help="synthetic training images (default 384)")
    add_setting_flag(p, "device", help="cuda, cpu, ... (default: cuda when available)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run (about a minute): the smallest model of each family, 8 + 4 images, one epoch")
    p.set_defaults(func=run_demo)


def demo_config(epochs: int, imgsz: int, device: str | None, project: Path, validate: bool = True) -> TrainConfig:
    """The demo's training settings, also the shipped shapes model's: the short recipe, loading in this process."""
    return TrainConfig(recipe="short", epochs=epochs, batch_size=16, imgsz=imgsz, device=device, workers=0,
                       val=validate, project=str(project), name="train", exist_ok=True)


def run_demo(args: argparse.Namespace) -> int:
    """The zoo, a checkpoint saved and reloaded, the shapes data, a training run, its validation, a prediction."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print("\n== 1. the model zoo")
    print(model_table(["yolov9-t", "gelan-t"] if args.quick else None).to_string(index=False))
    print("\n== 2. kit checkpoint: save, reload, compare")
    model = create_model(args.model).eval()
    path = save_checkpoint(out / f"{args.model}-init.pt", model)
    x = torch.rand(1, 3, 128, 128, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        if not torch.equal(model(x).main, create_model(path).eval()(x).main):
            raise RuntimeError(f"reloaded checkpoint {path} does not reproduce the model's outputs")
    print(f"saved {path} ({Path(path).stat().st_size / 1e6:.1f} MB) and reloaded it: outputs identical")
    print("\n== 3. synthetic shapes data")
    n_train, n_val = args.n_train or (8 if args.quick else 384), 4 if args.quick else 64
    data = make_shapes(out / "shapes", n_train=n_train, n_val=n_val, imgsz=args.imgsz, num_classes=DEMO_CLASSES,
                       max_objects=3, seed=0)
    names = load_data_config(data).names
    loader = create_dataloader(data, "train", imgsz=args.imgsz, batch_size=8, augment=True, workers=0, seed=0)
    save_figure(show_batch(next(iter(loader)), names), out / "train_batch.png", 80)
    print(f"{data}: {n_train} train / {n_val} val images; an augmented training batch: {out / 'train_batch.png'}")
    print(f"\n== 4. train {args.model}")
    start = time.perf_counter()
    config = demo_config(args.epochs or (1 if args.quick else 30), args.imgsz, args.device, out, not args.quick)
    result = fit(create_model(args.model, names=names, seed=config.run.seed), data, config)
    print(f"trained {result.epochs_completed} epochs in {time.perf_counter() - start:.0f} s; weights in "
          f"{result.save_dir}")
    print("\n== 5. validate the trained model")
    model = create_model(result.best if result.best and Path(result.best).exists() else result.last).eval()
    print(evaluate(model, data, imgsz=args.imgsz, batch_size=16, device=args.device))
    print("\n== 6. predict")
    image = sorted(load_data_config(data).images("val"))[0]
    found = predict_images(model, image, imgsz=args.imgsz, device=args.device, save=SaveConfig(out / "predict"))
    print(found[0].to_frame().to_string(index=False))
    print(f"annotated image in {out / 'predict'}\n\nDone. Everything is in {out}/")
    return 0
