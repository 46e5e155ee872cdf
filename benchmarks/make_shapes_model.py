"""Make the small trained model the kit ships (``yolo9kit/models/yolov9-t-shapes.pt``) and print its mAP50.

    python benchmarks/make_shapes_model.py --out yolo9kit/models/yolov9-t-shapes.pt   # the shipped file
    python benchmarks/make_shapes_model.py --quick --out /tmp/tiny.pt                   # a smoke run (seconds)

yolov9-t (with its auxiliary head, so ``compare_heads`` works on it) trained from scratch on the synthetic
shapes data with the demo's CPU recipe (``yolo9kit.cli.demo_config``), on the data the notebooks generate:
3 classes, up to 6 objects per image. The network works at 160 px (``yolo9kit.models.checkpoint.SHAPES_IMGSZ``);
a quarter of the training images are generated at 64 px and so reach the network enlarged 2.5 times, as the
notebooks' 64-pixel smoke-mode images do when they are predicted at 160 px. The validation split is the
notebooks' own (seed 0, 160 px), never trained on; the 64-pixel validation split (seed 0) is scored too.

The file holds the best EMA weights in fp16 (half the size; loading casts them back to fp32, and the
mAP printed is measured on the file as loaded), in the kit's checkpoint format, with the recipe and the
measured mAP50 as extra entries. Everything is seeded (data, initial weights, loader order, augmentation):
the same command on the same torch build gives the same file.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

NUM_CLASSES = 3
MAX_OBJECTS = 6  # as the notebooks' make_shapes calls (its default)
SMALL_SIDE = 64  # the notebooks' smoke-mode image size


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the checkpoint file to write")
    p.add_argument("--model", default="yolov9-t")
    p.add_argument("--imgsz", type=int, default=160, help="training and validation size (px)")
    p.add_argument("--train", type=int, default=768, help="training images generated at --imgsz")
    p.add_argument("--train-small", type=int, default=256, help=f"training images generated at {SMALL_SIDE} px")
    p.add_argument("--val", type=int, default=128, help="validation images (each size)")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--device", default="cpu", help="cpu (the measured run), cuda, ...")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1: steadier on a busy machine; the measured run used 1)")
    p.add_argument("--work", default=None, help="folder for the data and the run (default: a temp folder)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 8 + 4 images at 64 px, one epoch")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
    if args.quick:
        args.imgsz, args.train, args.train_small, args.val, args.epochs = 64, 8, 4, 4, 1

    import torch

    from yolo9kit.cli import demo_config
    from yolo9kit.models import create_model
    from yolo9kit.train.fit import fit

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    work = Path(args.work or tempfile.mkdtemp(prefix="yolo9kit-shapes-model-"))
    data, val_small = _data(work, args)
    torch.manual_seed(0)
    model = create_model(args.model, names=data["names"])
    config = replace(demo_config(args.epochs, args.imgsz, args.device, work / "runs", validate=not args.quick),
                     progress_bar=False, callbacks={"on_epoch_end": _epoch_line(start)})
    print(f"training {args.model} on {args.train} + {args.train_small} images, {args.epochs} epochs at "
          f"{args.imgsz} px on {args.device}, torch threads {torch.get_num_threads()}; work folder {work}", flush=True)
    result = fit(model, data, config)
    best = result.best if result.best and result.best.is_file() else result.last
    minutes = (time.perf_counter() - start) / 60
    print(f"trained {result.epochs_completed} epochs in {minutes:.1f} min; best weights {best}", flush=True)

    trained = create_model(best)  # the EMA weights
    out = _save_half(trained, Path(args.out), {"imgsz": args.imgsz, "epochs": result.epochs_completed,
                                               "train_images": [args.train, args.train_small],
                                               "command": _command(sys.argv)})
    scores = _score(out, data, val_small, args)
    _save_half(create_model(out), out, {**_extras(out), "map50": scores})
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    for name, map50 in scores.items():
        print(f"mAP50 on {name}: {map50:.3f}")
    return 0


def _epoch_line(start: float):
    """An ``on_epoch_end`` callback printing one line per epoch: losses, EMA mAP50, minutes so far."""

    def line(record) -> None:
        map50 = "" if record.map50 is None else f" mAP50 {record.map50:.3f}"
        print(f"epoch {record.epoch + 1}: box {record.box_loss:.3f} cls {record.cls_loss:.3f} dfl "
              f"{record.dfl_loss:.3f}{map50} ({(time.perf_counter() - start) / 60:.1f} min)", flush=True)

    return line


def _data(work: Path, args: argparse.Namespace) -> tuple[dict, dict]:
    """The training data (two sizes) and the two validation splits, as data dicts."""
    from yolo9kit.data import make_shapes
    from yolo9kit.data.shapes import SHAPE_NAMES

    common = {"num_classes": NUM_CLASSES, "max_objects": MAX_OBJECTS}
    # seed 0: the notebooks' seed, so their validation images are the ones scored here (never trained on)
    large = make_shapes(work / f"shapes-{args.imgsz}", n_train=args.train, n_val=args.val, imgsz=args.imgsz,
                        seed=0, **common).parent
    # seed 1 for the small training images: other scenes than the seed-0 ones drawn at the large size
    small_train = make_shapes(work / f"shapes-{SMALL_SIDE}-train", n_train=args.train_small, n_val=0,
                              imgsz=SMALL_SIDE, seed=1, **common).parent
    small_val = make_shapes(work / f"shapes-{SMALL_SIDE}-val", n_train=0, n_val=args.val, imgsz=SMALL_SIDE,
                            seed=0, **common).parent
    names = list(SHAPE_NAMES[:NUM_CLASSES])
    data = {"path": str(work), "train": [str(large / "images/train"), str(small_train / "images/train")],
            "val": str(large / "images/val"), "names": names}
    val_small = {"path": str(work), "train": str(small_val / "images/val"), "val": str(small_val / "images/val"),
                 "names": names}
    return data, val_small


def _command(argv: list[str]) -> str:
    """The command line as run, without ``--work``: a scratch folder of one machine, not part of the recipe."""
    kept, skip = [], False
    for arg in argv:
        if skip or arg.startswith("--work="):
            skip = False
            continue
        skip = arg == "--work"
        kept += [] if skip else [arg]
    return " ".join(["python", *kept])


def _save_half(model, path: Path, extras: dict) -> Path:
    """Save ``model`` with fp16 floating-point tensors (integer buffers stay as they are)."""
    from yolo9kit.models.checkpoint import save_checkpoint

    half = model.half()  # create_model casts back: load_state_dict copies into the fp32 model it builds
    return save_checkpoint(path, half, **extras)


def _extras(path: Path) -> dict:
    from yolo9kit.models.checkpoint import RESERVED_KEYS, read_checkpoint

    return {k: v for k, v in read_checkpoint(path).items() if k not in RESERVED_KEYS}


def _score(path: Path, data: dict, val_small: dict, args: argparse.Namespace) -> dict[str, float]:
    """mAP50 of the saved file (fp16 weights, loaded as fp32) at ``--imgsz`` on both validation splits."""
    from yolo9kit.models import create_model
    from yolo9kit.validate import evaluate

    model = create_model(path).eval()
    scores = {}
    for name, split in ((f"{args.val} val images at {args.imgsz} px", data),
                        (f"{args.val} val images at {SMALL_SIDE} px, enlarged", val_small)):
        result = evaluate(model, split, imgsz=args.imgsz, batch_size=16, device=args.device, workers=0,
                          progress_bar=False)
        scores[name] = round(float(result.map50), 4)
    return scores


if __name__ == "__main__":
    raise SystemExit(main())
