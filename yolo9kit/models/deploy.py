"""The model for inference: yolov9-X -> gelan-X (docs/models.md, "Deploy conversion and fusion"), and the
device, precision and head that prediction, validation and export share."""

from __future__ import annotations

import copy
import logging
import weakref

import torch
from torch import nn

from yolo9kit.env import native_cpu_bf16
from yolo9kit.models.layers import fuse
from yolo9kit.models.model import DetectionModel

LOGGER = logging.getLogger(__name__)
_HEAD_RENAMES = {"cv4": "cv2", "cv5": "cv3", "dfl2": "dfl"}
_DEPLOYED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _source(i: int, x: int) -> int:
    """The layer that ``from`` value ``x`` of row ``i`` reads (-1 for the image)."""
    return i + x if x < 0 else x


def deploy_config(cfg: dict) -> tuple[dict, dict[int, int]]:
    """The single-head (gelan) table of a dual-head one and the old -> new layer index map: the layers the main
    head's inputs need, renumbered (docs/models.md, "Deploy conversion and fusion")."""
    rows = list(cfg["backbone"]) + list(cfg["head"])
    head = len(rows) - 1
    froms = [[f] if isinstance(f, int) else list(f) for f, *_ in rows]
    main_inputs = [_source(head, x) for x in froms[head][len(froms[head]) // 2:]]
    needed, stack = set(), list(main_inputs)
    while stack:  # every layer the main inputs depend on
        i = stack.pop()
        if i >= 0 and i not in needed:
            needed.add(i)
            stack.extend(_source(i, x) for x in froms[i])
    if rows[0][2] == "Silence" and 0 not in {x for i in needed for x in froms[i]}:
        needed.discard(0)
    old_to_new = {old: new for new, old in enumerate(sorted(needed))}
    backbone, head_rows = [], []
    for old, new in old_to_new.items():
        f, n, module, args = rows[old]
        srcs = [_source(old, x) for x in froms[old]]  # -1 where still the previous kept row (or the image)
        mapped = [-1 if x == -1 and old_to_new.get(src, -1) == new - 1 else old_to_new.get(src)
                  for x, src in zip(froms[old], srcs)]
        if None in mapped:
            raise ValueError(f"deploy conversion: layer {old} reads layer {srcs[mapped.index(None)]}, which the main "
                             "branch does not keep")
        row = [mapped[0] if isinstance(f, int) else mapped, n, module, copy.deepcopy(args)]
        (backbone if old < len(cfg["backbone"]) else head_rows).append(row)
    old_to_new[head] = len(old_to_new)
    head_rows.append([[old_to_new[x] for x in main_inputs], 1, "DDetect", copy.deepcopy(rows[head][3])])
    out = {k: copy.deepcopy(v) for k, v in cfg.items() if k not in ("backbone", "head")}
    return {**out, "backbone": backbone, "head": head_rows}, old_to_new


@torch.no_grad()
def to_deploy(model: DetectionModel, *, fuse_layers: bool = True) -> DetectionModel:
    """A copy of ``model`` for inference, in eval mode: yolov9-X -> gelan-X (the same main output), then fused
    unless ``fuse_layers`` is False; a single-head model is copied (and fused)."""
    if not model.is_dual:
        deployed = copy.deepcopy(model)
    else:
        cfg, old_to_new = deploy_config(model.yaml)
        name = model.name.replace("yolov9", "gelan") if model.name.startswith("yolov9") else f"{model.name}-deploy"
        deployed = DetectionModel(cfg, nc=model.nc, names=model.names, source=f"{name} (deploy of {model.name})",
                                  name=name, probe=False)  # no stride probe: the strides are copied below
        state = {}
        for key, value in model.state_dict().items():  # the auxiliary branch dropped, the main head renamed
            _, old, rest = key.split(".", 2)
            first, _, tail = rest.partition(".")
            if int(old) == len(model.model) - 1:
                rest = f"{_HEAD_RENAMES[first]}.{tail}" if first in _HEAD_RENAMES else None
            if rest is not None and int(old) in old_to_new:
                state[f"model.{old_to_new[int(old)]}.{rest}"] = value
        deployed.load_state_dict(state)
        param = next(model.parameters())
        deployed.to(device=param.device, dtype=param.dtype)
        deployed.set_strides(model.head.strides)  # host values: no read from the device
    deployed.eval()
    return fuse(deployed) if fuse_layers else deployed


def deploy_for_inference(model: nn.Module, head: str = "main") -> nn.Module:
    """The fastest equivalent inference model, built once per weights version and cached, the caller's model never
    modified: :func:`to_deploy` for the main head of a dual model, otherwise the model fused."""
    tensors = [*model.parameters(), *model.buffers()]
    key = (head, len(tensors), sum(t._version for t in tensors))  # changes with every in-place update
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


def max_stride(model: nn.Module) -> int:
    """The largest stride of ``model``, at least 32 (official ``gs``): a DetectionModel's host copy, another
    module's ``stride`` tensor (read once), else 32."""
    strides = getattr(getattr(model, "head", None), "strides", None)
    if strides is None:
        stride = getattr(model, "stride", None)
        strides = [stride.max()] if isinstance(stride, torch.Tensor) else [32]
    return max(int(max(strides)), 32)


def resolve_half(half: str | bool | None, device: torch.device, cpu_bf16: bool = False) -> torch.dtype:
    """The inference dtype: ``"auto"`` (or None) is FP16 on CUDA, bf16 on a CPU that computes it in hardware if
    ``cpu_bf16`` (prediction: docs/benchmarks.md), else FP32; True FP16, False FP32, "bf16"; ValueError else."""
    if half is None or half == "auto":
        native = device.type == "cpu" and cpu_bf16 and native_cpu_bf16()
        return torch.float16 if device.type == "cuda" else torch.bfloat16 if native else torch.float32
    if isinstance(half, bool) or half == "bf16":
        return torch.bfloat16 if half == "bf16" else torch.float16 if half else torch.float32
    raise ValueError(f"half={half!r}: expected 'auto' (FP16 on CUDA), True (FP16), False (FP32) or 'bf16'")


def inference_layout(model: nn.Module, device: torch.device, own_copy: bool) -> torch.memory_format:
    """channels_last where the convolutions gain from it (cuDNN, oneDNN on the CPU: docs/benchmarks.md), on a
    copy the kit made (``own_copy``) or a model already laid out so; else a caller's model keeps its layout."""
    nhwc = device.type == "cuda" or (device.type == "cpu" and torch.backends.mkldnn.is_available())
    if nhwc and not own_copy:
        weight = next((p for p in model.parameters() if p.dim() == 4), None)
        nhwc = weight is not None and not weight.is_contiguous() and \
            weight.is_contiguous(memory_format=torch.channels_last)
    return torch.channels_last if nhwc else torch.contiguous_format


def prepare_model(model: nn.Module, device: torch.device, dtype: torch.dtype, deploy: bool = False,
                  head: str = "main") -> nn.Module:
    """The model on ``device`` in ``dtype``, in eval mode; ``deploy``: the deployed model. Moving or
    casting works on a copy (casting a trainer's EMA to FP16 would round it for good); only the caller's
    train/eval mode may change (the caller restores it)."""
    callers = model
    if deploy and hasattr(model, "yaml"):
        model = deploy_for_inference(model, head)  # a cached copy, never the caller's model
    first = next(model.parameters(), None)
    if first is not None and first.dtype != dtype:
        # a copy even of the cached deployed model: casting it back and forth would round its weights
        model = copy.deepcopy(model).to(device=device, dtype=dtype)
    elif first is not None and not (first.device.type == device.type and (  # cuda and cuda:0 are one card
            first.device.index is None or device.index is None or first.device.index == device.index)):
        model = (copy.deepcopy(model) if model is callers else model).to(device)
    return model.eval()


def select_head(output, head: str = "main") -> torch.Tensor:
    """The decoded (B, 4+nc, A) prediction of ``head`` ("main" or "aux") from an eval-mode forward; ValueError
    for another name, or "aux" of a model without one."""
    if head not in ("main", "aux"):
        raise ValueError(f"head must be 'main' or 'aux', got {head!r}")
    chosen = (None if head == "aux" else output) if isinstance(output, torch.Tensor) else getattr(output, head)
    if chosen is None:
        raise ValueError("this model has no auxiliary head (GELAN / converted); head='aux' needs a dual-head YOLOv9 "
                         "model, use head='main'")
    return chosen
