"""Inference conversion: yolov9-X -> gelan-X (drop the PGI auxiliary branch) and Conv+BN / RepConvN fusion.

The conversion reproduces the official ``tools/reparameterization.ipynb`` key renaming:
the main head's inputs are traced back through the layer table, the layers they need are kept and
renumbered in order, the auxiliary layers are dropped, and the head's main branch (``cv4``/``cv5``/``dfl2``)
becomes a single DDetect (``cv2``/``cv3``/``dfl``). For the ten registered configs this gives exactly the
gelan-X layer tables; it works the same way on a custom yaml.
"""

from __future__ import annotations

import copy
import logging
import weakref

import torch
from torch import nn

from yolo9kit.models.layers import fuse_layers
from yolo9kit.models.model import DetectionModel

LOGGER = logging.getLogger(__name__)
_HEAD_RENAMES = {"cv4": "cv2", "cv5": "cv3", "dfl2": "dfl"}


@torch.no_grad()
def fuse(model: nn.Module) -> nn.Module:
    """Fold every BatchNorm into its conv and collapse every RepConvN, in place; eval mode.

    Matches the official ``DetectionModel.fuse()``. The result is for inference only (no BatchNorm left
    to train). Works on any module tree built from these layers. Returns ``model``.
    """
    if isinstance(model, DetectionModel):
        return model.fuse()
    return fuse_layers(model)


def _main_dependencies(rows: list, head_inputs: list[int]) -> set[int]:
    """Indices of the layers the given head inputs depend on (transitively)."""
    needed, stack = set(), list(head_inputs)
    while stack:
        i = stack.pop()
        if i in needed:
            continue
        needed.add(i)
        f = rows[i][0]
        for x in [f] if isinstance(f, int) else f:
            src = i - 1 if x == -1 else (i + x if x < 0 else x)
            if src >= 0:
                stack.append(src)
    return needed


def deploy_config(cfg: dict) -> tuple[dict, dict[int, int]]:
    """The single-head (gelan) config of a dual-head config and the old -> new layer index map.

    A Silence at layer 0 that no kept row names explicitly is dropped (gelan-m/c); the CBNet second
    backbone of -e is kept because the main branch reads it (as in the official ``models/detect/gelan-e.yaml``
    table).
    """
    rows = list(cfg["backbone"]) + list(cfg["head"])
    head_row = rows[-1]
    nl = len(head_row[0]) // 2
    main_inputs = [x % (len(rows) - 1) if x < 0 else x for x in head_row[0][nl:]]
    needed = _main_dependencies(rows, main_inputs)
    explicit_refs = {x for i in needed for x in ([rows[i][0]] if isinstance(rows[i][0], int) else rows[i][0])
                     if x >= 0}
    if rows[0][2] == "Silence" and 0 not in explicit_refs:
        needed.discard(0)
    old_to_new = {old: new for new, old in enumerate(sorted(needed))}
    new_rows_backbone, new_rows_head = [], []
    for old in sorted(needed):
        new = old_to_new[old]
        f, n, module, args = rows[old]
        mapped = [_map_from(old, x, new, old_to_new) for x in ([f] if isinstance(f, int) else f)]
        row = [mapped[0] if isinstance(f, int) else mapped, n, module, copy.deepcopy(args)]
        (new_rows_backbone if old < len(cfg["backbone"]) else new_rows_head).append(row)
    head_new = len(old_to_new)
    old_to_new[len(rows) - 1] = head_new
    new_rows_head.append([[old_to_new[x] for x in main_inputs], 1, "DDetect", copy.deepcopy(head_row[3])])
    out = {k: copy.deepcopy(v) for k, v in cfg.items() if k not in ("backbone", "head")}
    out.update(backbone=new_rows_backbone, head=new_rows_head)
    return out, old_to_new


def _map_from(old: int, x: int, new: int, old_to_new: dict[int, int]) -> int:
    """New 'from' value of a kept row: -1 stays -1 when its source is the previous kept row (or the image)."""
    src = old - 1 if x == -1 else (old + x if x < 0 else x)
    if x == -1 and (src not in old_to_new or old_to_new[src] == new - 1):
        if src in old_to_new or new == 0:
            return -1
    if src not in old_to_new:
        raise ValueError(f"deploy conversion: layer {old} reads layer {src}, which the main branch does not keep")
    return old_to_new[src]


def deploy_state_dict(state_dict: dict[str, torch.Tensor], old_to_new: dict[int, int],
                      head_old: int) -> dict[str, torch.Tensor]:
    """Rename dual-model keys to single-head keys (official ``tools/reparameterization.ipynb``): layer indices
    by ``old_to_new``; in the head ``cv4``/``cv5``/``dfl2`` -> ``cv2``/``cv3``/``dfl``; everything else (aux
    branch) is dropped."""
    out = {}
    for key, value in state_dict.items():
        _, idx, rest = key.split(".", 2)
        old = int(idx)
        if old == head_old:
            first, _, tail = rest.partition(".")
            if first not in _HEAD_RENAMES:
                continue
            rest = f"{_HEAD_RENAMES[first]}.{tail}"
        elif old not in old_to_new:
            continue
        out[f"model.{old_to_new[old]}.{rest}"] = value
    return out


@torch.no_grad()
def to_deploy(model: DetectionModel, *, fuse_layers: bool = True) -> DetectionModel:
    """Inference model: yolov9-X -> gelan-X (auxiliary branch dropped), then :func:`fuse`; eval mode.

    The main output is unchanged (the auxiliary branch never feeds the main head). The input model is not
    modified. A single-head model is copied and fused.
    """
    if not model.is_dual:
        deployed = copy.deepcopy(model)
    else:
        cfg, old_to_new = deploy_config(model.yaml)
        name = model.name.replace("yolov9", "gelan") if model.name.startswith("yolov9") else f"{model.name}-deploy"
        # no stride probe: the strides are copied from the source model below
        deployed = DetectionModel(cfg, nc=model.nc, names=model.names, source=f"{name} (deploy of {model.name})",
                                  name=name, probe=False)
        head_old = len(model.model) - 1
        sd = deploy_state_dict(model.state_dict(), old_to_new, head_old)
        deployed.load_state_dict(sd, strict=True)
        param = next(model.parameters())
        deployed.to(device=param.device, dtype=param.dtype)
        deployed.set_strides(model.head.strides)  # host values: no read from the device
    deployed.eval()
    return fuse(deployed) if fuse_layers else deployed


_DEPLOYED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _weights_version(model: torch.nn.Module) -> tuple[int, int]:
    """Changes whenever a parameter or buffer is modified in place (an optimizer step, a load)."""
    tensors = [*model.parameters(), *model.buffers()]
    return len(tensors), sum(t._version for t in tensors)


def deploy_for_inference(model: torch.nn.Module, head: str = "main") -> torch.nn.Module:
    """The fastest equivalent inference model, built once per weights version and cached.

    For the main head of a dual model this is the official deployment (``to_deploy``: the auxiliary
    branch dropped, Conv+BN folded, RepConvN collapsed), which the official detect_dual path does not
    do: it computes the auxiliary output and throws it away. Otherwise (a GELAN model, ``head="aux"``,
    a custom layer table that cannot be converted) the model is fused as the official loader does.
    The caller's model is never modified.
    """
    key = (head, _weights_version(model))
    cached = _DEPLOYED.get(model)
    if cached is not None and cached[0] == key:
        return cached[1]
    deployed = None
    if head == "main" and getattr(model, "is_dual", False):
        try:
            deployed = to_deploy(model)
        except (ValueError, KeyError, RuntimeError) as e:  # a custom layer table without a gelan twin
            LOGGER.debug("to_deploy failed (%s); fusing the dual model instead", e)
    if deployed is None:
        deployed = fuse(copy.deepcopy(model))
    _DEPLOYED[model] = (key, deployed)
    return deployed
