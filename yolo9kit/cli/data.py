"""``python -m yolo9kit data ...``: make the shapes data set, check a data set, convert COCO annotations."""

from __future__ import annotations

import argparse
import sys

from yolo9kit.cli.flags import image_size, non_negative_int, positive_int


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("data", help="make-shapes, check, convert-coco")
    verbs = p.add_subparsers(dest="data_verb", metavar="ACTION")
    mk = verbs.add_parser("make-shapes", help="write the synthetic shapes data set")
    mk.add_argument("--out", required=True, help="output folder")
    mk.add_argument("--n-train", type=positive_int, default=256)
    mk.add_argument("--n-val", type=non_negative_int, default=64)
    mk.add_argument("--imgsz", "--img", "--img-size", dest="imgsz", type=image_size, default=320,
                    help="square side in pixels")
    mk.add_argument("--num-classes", type=positive_int, default=4)
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--overwrite", action="store_true",
                    help="replace what OUT holds (without it a folder with other files is refused)")
    mk.set_defaults(func=run_make_shapes)
    ck = verbs.add_parser("check", help="check images and labels; exit code 1 when files had to be skipped, "
                                        "2 when the data set cannot be read")
    ck.add_argument("data", help="path of a data.yaml")
    ck.add_argument("--split", default="train", choices=["train", "val", "test"])
    ck.add_argument("--no-cache", action="store_true", help="check every file again, ignore the label cache")
    ck.set_defaults(func=run_check)
    cv = verbs.add_parser("convert-coco", help="COCO detection JSON -> YOLO labels and a data.yaml")
    cv.add_argument("json", help="COCO annotations file (instances_*.json)")
    cv.add_argument("--out", required=True, help="output folder (labels/<split>/ and data.yaml)")
    cv.add_argument("--images", help="folder of the images (default OUT/images/<split>)")
    cv.add_argument("--split", default="train")
    cv.add_argument("--holdout", type=float, default=0.2,
                    help="share of the train split's images held out for validation (val.txt; 0: validate on the "
                         "training images)")
    cv.add_argument("--overwrite", action="store_true",
                    help="replace OUT/labels/<split> and OUT/data.yaml (without it existing ones are refused)")
    cv.set_defaults(func=run_convert_coco)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run_make_shapes(args: argparse.Namespace) -> int:
    from yolo9kit.data import make_shapes

    path = make_shapes(args.out, n_train=args.n_train, n_val=args.n_val, imgsz=args.imgsz,
                       num_classes=args.num_classes, seed=args.seed, overwrite=args.overwrite)
    print(f"data set written: {path}")
    return 0


def run_check(args: argparse.Namespace) -> int:
    from yolo9kit.data import check

    try:
        report = check(args.data, split=args.split, use_cache=not args.no_cache)
    except KeyError as e:  # a missing key of the data.yaml: its message, not its repr
        raise ValueError(e.args[0]) from e
    print(report)
    return 0 if report.ok else 1


def run_convert_coco(args: argparse.Namespace) -> int:
    from yolo9kit.data import coco_to_yolo

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
