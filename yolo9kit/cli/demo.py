"""``python -m yolo9kit demo``: the kit's main job end to end, on built-in defaults, with no file the
user must bring.

1. build every registered model (--quick: the smallest of each family) and print the model table;
2. save a kit checkpoint, reload it, and check the outputs are identical;
3. generate the synthetic shapes data set and save a picture of an augmented training batch;
4. train yolov9-t on it on whatever device there is (a few minutes on a CPU);
5. validate the trained EMA model and print the metrics;
6. predict on a validation image with the trained model and save the annotated picture.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from yolo9kit.cli.flags import device, positive_int, train_image_size

NUM_CLASSES = 3


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="build, save/reload, make data, train, validate and predict end to end")
    p.add_argument("--out", default="runs/demo", help="output folder (default: runs/demo)")
    p.add_argument("--model", default="yolov9-t", help="model to train (default: yolov9-t)")
    p.add_argument("--imgsz", "--img", "--img-size", dest="imgsz", type=train_image_size, default=160,
                   help="image size (default: 160, CPU-friendly)")
    p.add_argument("--epochs", type=positive_int, default=None, help="training epochs (default: the built-in recipe)")
    p.add_argument("--n-train", type=positive_int, default=None, help="synthetic training images (default: recipe)")
    p.add_argument("--device", type=device, default=None, help="cuda, cpu, ... (default: cuda when available)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run (about a minute): the smallest model of each family, 8 + 4 images, one epoch")
    p.set_defaults(func=run)


def _step(title: str) -> float:
    print(f"\n== {title}")
    return time.perf_counter()


def _build_models(quick: bool) -> None:
    from yolo9kit.models import model_table

    print(model_table(["yolov9-t", "gelan-t"] if quick else None).to_string(index=False))
    if quick:
        print("(the smallest of each family; `python -m yolo9kit models` lists them all)")


def _checkpoint_round_trip(out: Path, name: str) -> None:
    import torch

    from yolo9kit.checkpoint import load_checkpoint, save_checkpoint
    from yolo9kit.models import build_model

    model = build_model(name).eval()
    path = save_checkpoint(out / f"{name}-init.pt", model)
    reloaded = load_checkpoint(path).eval()
    x = torch.rand(1, 3, 128, 128, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = model(x).main, reloaded(x).main
    if not torch.equal(a, b):
        raise RuntimeError(f"reloaded checkpoint {path} does not reproduce the model's outputs")
    print(f"saved {path} ({Path(path).stat().st_size / 1e6:.1f} MB) and reloaded it: outputs identical")


def run(args: argparse.Namespace) -> int:
    from yolo9kit.data import make_shapes

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t = _step("1. the model zoo")
    _build_models(args.quick)
    print(f"({time.perf_counter() - t:.1f} s)")

    _step("2. kit checkpoint: save, reload, compare")
    _checkpoint_round_trip(out, args.model)

    t = _step("3. synthetic shapes data")
    n_train = args.n_train or (8 if args.quick else 384)
    n_val = 4 if args.quick else 64
    data_yaml = make_shapes(out / "shapes", n_train=n_train, n_val=n_val, imgsz=args.imgsz,
                            num_classes=NUM_CLASSES, max_objects=3, seed=0)
    print(f"{data_yaml}: {n_train} train / {n_val} val images ({time.perf_counter() - t:.1f} s)")
    _save_batch_picture(data_yaml, out, args.imgsz)

    t = _step(f"4. train {args.model}")
    best = _train(args, data_yaml, out)
    print(f"({time.perf_counter() - t:.0f} s)")

    _step("5. validate the trained model")
    from yolo9kit.checkpoint import load_checkpoint
    from yolo9kit.validate import evaluate

    model = load_checkpoint(best)
    result = evaluate(model, data_yaml, imgsz=args.imgsz, batch_size=16, device=args.device)
    print(result)

    _step("6. predict")
    _predict_one(model, data_yaml, out, args)
    print(f"\nDone. Everything is in {out}/")
    return 0


def _save_batch_picture(data_yaml: Path, out: Path, imgsz: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from yolo9kit.data import create_dataloader, load_data_config
    from yolo9kit.figure import save_figure
    from yolo9kit.plots import show_batch

    loader = create_dataloader(data_yaml, "train", imgsz=imgsz, batch_size=8, augment=True, workers=0, seed=0)
    fig = show_batch(next(iter(loader)), load_data_config(data_yaml).names)
    save_figure(fig, out / "train_batch.png", 80)
    print(f"an augmented training batch: {out / 'train_batch.png'}")


def recipe(epochs: int, imgsz: int, device: str | None, project: Path, validate: bool = True):
    """The demo's training settings as a ``TrainConfig`` (also used to make the shipped shapes model): the
    short recipe (``yolo9kit.config.recipe``: AdamW, one optimizer step per batch of 16, one warmup epoch,
    lighter augmentation, mosaic off for the last epochs) at small images, loading in the main process. On a
    GPU the same settings train in seconds.
    """
    from yolo9kit.config import TrainConfig

    return TrainConfig(recipe="short", epochs=epochs, batch_size=16, imgsz=imgsz, device=device, workers=0,
                       val=validate, project=str(project), name="train", exist_ok=True)


def _train(args: argparse.Namespace, data_yaml: Path, out: Path) -> Path:
    from yolo9kit.data import load_data_config
    from yolo9kit.models import build_model
    from yolo9kit.train import fit

    config = recipe(args.epochs or (1 if args.quick else 30), args.imgsz, args.device, out, validate=not args.quick)
    model = build_model(args.model, names=load_data_config(data_yaml).names, seed=config.run.seed)
    result = fit(model, data_yaml, config)
    print(f"trained {result.epochs_completed} epochs; weights in {result.save_dir}")
    return Path(result.best if result.best and Path(result.best).exists() else result.last)


def _predict_one(model, data_yaml: Path, out: Path, args: argparse.Namespace) -> None:
    from yolo9kit.config import SaveConfig
    from yolo9kit.data import load_data_config
    from yolo9kit.prediction import predict

    image = sorted(load_data_config(data_yaml).images("val"))[0]
    results = predict(model, image, imgsz=args.imgsz, device=args.device, save=SaveConfig(out / "predict"))
    print(results[0].to_frame().to_string(index=False))
    print(f"annotated image in {out / 'predict'}")
