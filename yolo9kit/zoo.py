"""One way to get a model: ``create_model(source, num_classes=..., names=..., weights=...)``.

``source`` is a registered name (``yolov9-s``, fresh weights), an official-format model yaml or its dict, a
kit checkpoint (its EMA weights), an official YOLOv9 ``.pt`` (read without its code), or ``"yolov9-t-shapes"``,
the model that ships with the kit. Asked for other classes than a checkpoint has, the model is rebuilt for
them and the tensors whose name and shape still match are transferred (official ``--weights``);
``weights=`` transfers them from a checkpoint into any model. The readers of each format stay where their
format is defined: ``models.build_model`` (layer tables), ``checkpoint.load_checkpoint`` (kit files, with
their options) and ``models.load_official_checkpoint`` (official files).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from yolo9kit.checkpoint import CheckpointError, load_checkpoint
from yolo9kit.models import build_model, class_list, list_models, load_official_checkpoint

LOGGER = logging.getLogger(__name__)

SHAPES_MODEL = "yolov9-t-shapes"  # the shipped model (yolo9kit.pretrained)
SHAPES_WEIGHTS = Path(__file__).with_name("pretrained") / "yolov9-t-shapes.pt"  # package data


def create_model(source: str | Path | dict, num_classes: int | None = None, *,
                 names: list[str] | dict[int, str] | None = None, weights: str | Path | None = None,
                 activation_checkpointing: Any = None, max_model_bytes: int | None = None,
                 seed: int = 0) -> torch.nn.Module:
    """A YOLOv9 / GELAN model in training mode, fp32, on the CPU.

    Args:
        source: a name from ``list_models()`` (freshly initialised), a model yaml path or dict, a kit
            checkpoint, an official YOLOv9 checkpoint, or ``"yolov9-t-shapes"`` (the shipped model).
        num_classes, names: the classes to predict (default: ``len(names)``, else the source's own). A
            checkpoint of other classes is rebuilt for them, its matching tensors transferred.
        weights: a kit or official checkpoint whose same-name, same-shape tensors are copied in ("Transferred
            N/M items", official ``--weights``).
        activation_checkpointing: None, "all", "backbone" or layer indices to recompute in backward.
        max_model_bytes: the limit on the model a file describes (``yolo9kit.models.bounds``; default 4 GiB).
        seed: the seed of the freshly initialised tensors (a model from a name or a layer table, the class
            outputs of a checkpoint rebuilt for other classes): the same seed gives the same model in every
            process (``build_model``).

    Raises:
        FileNotFoundError: neither a file nor a registered name. ValueError: a file of neither format.
    """
    num_classes, names = class_list(num_classes, names)
    if _is_file(source):
        model = _for_classes(_read_file(Path(str(source)), max_model_bytes), num_classes, names, seed)
    else:
        model = build_model(source, num_classes, names=names, seed=seed)
    if weights:
        transfer_weights(model, _read_file(Path(str(weights)), max_model_bytes).state_dict())
    if activation_checkpointing is not None:
        model.set_activation_checkpointing(activation_checkpointing)
    return model.train()


def load_model(model: Any, max_model_bytes: int | None = None) -> torch.nn.Module:
    """What predict, evaluate and export take: a module as it is, else ``create_model(model)`` in eval mode;
    a registered name (random weights, for smoke tests) is named in a warning."""
    if isinstance(model, torch.nn.Module):
        return model
    if not _is_file(model):
        if str(model) not in list_models():
            raise FileNotFoundError(f"weights {model} not found: pass a checkpoint path or one of "
                                    f"{', '.join(list_models())}")
        LOGGER.warning("%s: no weights file given, using a randomly initialised model", model)
    return create_model(model, max_model_bytes=max_model_bytes).eval()


def transfer_weights(model: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> tuple[int, int]:
    """Load the tensors of ``state_dict`` whose name and shape match ``model`` (official ``--weights``).

    Returns (transferred, total in the model) and logs "Transferred N/M items".
    """
    own = model.state_dict()
    match = {k: v for k, v in state_dict.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(match, strict=False)
    LOGGER.info("Transferred %d/%d items from pretrained weights", len(match), len(own))
    return len(match), len(own)


def _is_file(source: Any) -> bool:
    return source == SHAPES_MODEL or (isinstance(source, (str, Path)) and Path(str(source)).is_file()
                                      and Path(str(source)).suffix not in (".yaml", ".yml"))


def _read_file(path: Path, max_model_bytes: int | None) -> torch.nn.Module:
    """A kit checkpoint (EMA weights when present), else an official one; the shipped model by its name."""
    if str(path) == SHAPES_MODEL:
        if not SHAPES_WEIGHTS.is_file():
            raise FileNotFoundError(f"{SHAPES_WEIGHTS} is missing: reinstall yolo9kit (the file is package data), "
                                    f"or make it with `python benchmarks/make_shapes_model.py --out {SHAPES_WEIGHTS}`")
        path = SHAPES_WEIGHTS
    try:
        return load_checkpoint(path, max_model_bytes=max_model_bytes)
    except CheckpointError as kit_error:
        if "model_config cannot be used" in str(kit_error) or "would unpack" in str(kit_error):
            raise  # a kit checkpoint past the bounds: not an official file either
        try:
            return load_official_checkpoint(path, max_model_bytes)
        except Exception as official_error:
            raise ValueError(f"{path}: neither a yolo9kit checkpoint ({kit_error}) nor an official YOLOv9 "
                             f"checkpoint ({official_error})") from official_error


def _for_classes(model: torch.nn.Module, num_classes: int | None, names: list[str] | None,
                 seed: int) -> torch.nn.Module:
    """The loaded model for these classes: renamed when it has as many, else rebuilt with its tensors that
    still fit transferred (the class outputs start fresh)."""
    if num_classes is None or num_classes == model.nc:
        if names is not None:
            model.names = list(names)
        return model
    built = build_model(model.yaml, num_classes, names=names, seed=seed)
    built.name = model.name  # the checkpoint's model ("yolov9-t"), not "custom" for a config dict
    transfer_weights(built, model.state_dict())
    return built
