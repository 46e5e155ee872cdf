"""The model to train: built for the data's classes, optionally starting from pretrained weights."""

from __future__ import annotations

import logging

import torch

LOGGER = logging.getLogger(__name__)


def transfer_weights(model: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> tuple[int, int]:
    """Load the tensors of ``state_dict`` whose name and shape match ``model`` (official ``--weights``).

    Returns (transferred, total in the model) and logs "Transferred N/M items".
    """
    own = model.state_dict()
    match = {k: v for k, v in state_dict.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(match, strict=False)
    LOGGER.info("Transferred %d/%d items from pretrained weights", len(match), len(own))
    return len(match), len(own)


def model_for_data(model: str, data, weights: str = "", single_cls: bool = False, max_model_bytes: int | None = None):
    """The model to train on ``data``: built from a name/yaml (or a checkpoint's config), with ``weights`` transferred.

    A checkpoint given as the model keeps its weights when its classes match the data; otherwise (and for
    ``weights``) the tensors with the same name and shape are copied into a fresh model ("Transferred N/M").
    ``single_cls``: one class, named "item" unless the data has a single name (official train_dual.py).
    ``max_model_bytes``: the limit on the model a weights file describes (``yolo9kit.models.bounds``).
    """
    from yolo9kit.checkpoint import load_model
    from yolo9kit.data import load_data_config
    from yolo9kit.models import create_model

    data_config = load_data_config(data)
    nc, names = data_config.nc, list(data_config.names)
    if single_cls:
        nc, names = 1, (names if len(names) == 1 else ["item"])
    if str(model).endswith(".pt"):
        source = load_model(model, max_model_bytes)
        if source.nc == nc and not weights:
            source.names = names
            return source.train()
        built = create_model(source.yaml, num_classes=nc, names=names)
        built.name = source.name  # the checkpoint's model ("yolov9-t"), not "custom" for a config dict
        transfer_weights(built, source.state_dict())
    else:
        built = create_model(model, num_classes=nc, names=names)
    if weights:
        transfer_weights(built, load_model(weights, max_model_bytes).state_dict())
    return built.train()
