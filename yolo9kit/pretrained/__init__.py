"""Weights that ship with the kit: a yolov9-t trained on the synthetic shapes data.

``shapes_model()`` gives the notebooks, the tests and anyone trying the kit a model that finds real
boxes at once, without a training run: yolov9-t (with its auxiliary head) trained from scratch on
``make_shapes(..., num_classes=3, seed=...)`` images at 160 px. It detects the three shapes
(rectangle, ellipse, triangle) of any shapes image predicted at :data:`SHAPES_IMGSZ`, whatever size the
image was generated at (64-pixel images are enlarged to 160 by the letterbox, as in its training).

The file was made by ``python benchmarks/make_shapes_model.py --out yolo9kit/pretrained/yolov9-t-shapes.pt``;
its measured mAP50 is stated in docs/validation.md and stored in the file (``read_checkpoint(SHAPES_WEIGHTS)
["map50"]``). Weights are stored in fp16 (half the size) and loaded as fp32.
"""

from __future__ import annotations

from yolo9kit.zoo import SHAPES_MODEL, SHAPES_WEIGHTS, create_model

__all__ = ["SHAPES_CLASSES", "SHAPES_IMGSZ", "SHAPES_MODEL", "SHAPES_WEIGHTS", "shapes_model"]

# The kit checkpoint (its format: yolo9kit.checkpoint), installed with the package as package data; its name
# for create_model is SHAPES_MODEL.
# The size it was trained and validated at: predict and evaluate with imgsz=SHAPES_IMGSZ. At other sizes
# the shapes reach the network at scales it has not seen (at 64 px an object is 8-29 px wide) and it misses them.
SHAPES_IMGSZ = 160
SHAPES_CLASSES = ("rectangle", "ellipse", "triangle")  # make_shapes(num_classes=3)


def shapes_model():
    """The shipped yolov9-t trained on the shapes data, in eval mode, fp32, on the CPU: ``create_model(
    "yolov9-t-shapes").eval()``.

    Returns:
        DetectionModel with 3 classes (:data:`SHAPES_CLASSES`) and both heads; predict and evaluate it at
        ``imgsz=SHAPES_IMGSZ`` (160). A new model each call (change it freely).

    Raises:
        FileNotFoundError: the weights file is missing from the installation.
    """
    return create_model(SHAPES_MODEL).eval()
