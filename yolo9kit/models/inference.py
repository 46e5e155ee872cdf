"""A model ready for inference, shared by prediction and validation: device, precision, head.

``prepare_model`` never changes the caller's model: when the device or the precision differ it works on a
copy, because moving or casting in place would, for instance, round a trainer's EMA weights to FP16 for
good or move a notebook's CPU model to the GPU behind its back.
"""

from __future__ import annotations

import copy

import torch

HALF_VALUES = ("auto", True, False)

__all__ = ["HALF_VALUES", "inference_layout", "max_stride", "prepare_model", "resolve_half", "select_head"]


def max_stride(model: torch.nn.Module) -> int:
    """The largest stride of ``model``, at least 32 (official ``gs``): a DetectionModel's host value
    (``max_stride``, no read from the device); another module's ``stride`` tensor (read once); else 32."""
    value = getattr(model, "max_stride", None)
    if value is None:
        stride = getattr(model, "stride", None)
        value = int(stride.max()) if isinstance(stride, torch.Tensor) else 32
    return max(int(value), 32)


def resolve_half(half: str | bool | None, device: torch.device) -> bool:
    """FP16 or not: ``"auto"`` means on CUDA (tensor cores, half the memory traffic), off on the CPU.

    Args:
        half: ``"auto"``, True or False (None, the older spelling of ``"auto"``, is accepted too).
        device: the device inference runs on.

    Raises:
        ValueError: another value.
    """
    if half is None or (isinstance(half, str) and half == "auto"):
        return device.type == "cuda"
    if isinstance(half, bool):
        return half
    raise ValueError(f"half={half!r}: expected 'auto' (FP16 on CUDA, off on the CPU), True or False")


def inference_layout(model: torch.nn.Module, device: torch.device, own_copy: bool) -> torch.memory_format:
    """The layout inference runs in: channels_last where the convolutions gain from it (cuDNN, and oneDNN on
    the CPU: 1.3-1.7x the contiguous deployed model at 640 px, docs/benchmarks.md), on a copy the kit made
    (``own_copy``) or on a model already laid out so (a trainer's); else the model's contiguous layout, which
    a caller's model keeps."""
    nhwc = device.type == "cuda" or (device.type == "cpu" and torch.backends.mkldnn.is_available())
    if nhwc and not own_copy:
        weight = next((p for p in model.parameters() if p.dim() == 4), None)
        nhwc = weight is not None and not weight.is_contiguous() and \
            weight.is_contiguous(memory_format=torch.channels_last)
    return torch.channels_last if nhwc else torch.contiguous_format


def _same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` name the same card when one of them has no index."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def prepare_model(model: torch.nn.Module, device: torch.device, half: bool, deploy: bool = False,
                  head: str = "main") -> torch.nn.Module:
    """The model on ``device`` in FP16 (``half``) or FP32, in eval mode; ``deploy`` fuses it for speed.

    Moving or casting happens on a copy, never on the caller's model; only its train/eval mode changes when
    nothing else has to (the caller restores ``model.train(...)`` when the returned model is the same).
    """
    callers = model
    if deploy and hasattr(model, "yaml"):
        from yolo9kit.models.deploy import deploy_for_inference

        model = deploy_for_inference(model, head)  # a cached copy, never the caller's model
    dtype = torch.float16 if half else torch.float32
    first = next(model.parameters(), None)
    if first is not None and first.dtype != dtype:
        # a copy even of the cached deployed model: casting it back and forth would round its weights
        model = copy.deepcopy(model).to(device=device, dtype=dtype)
    elif first is not None and not _same_device(first.device, device):
        model = (copy.deepcopy(model) if model is callers else model).to(device)
    return model.eval()


def select_head(output, head: str = "main") -> torch.Tensor:
    """The decoded (B, 4+nc, A) prediction of ``head`` ("main" or "aux") from an eval-mode forward."""
    if head not in ("main", "aux"):
        raise ValueError(f"head must be 'main' or 'aux', got {head!r}")
    if isinstance(output, torch.Tensor):
        if head == "aux":
            raise ValueError("this model has a single head (GELAN); head='aux' needs a dual-head YOLOv9 model")
        return output
    chosen = getattr(output, head)
    if chosen is None:
        raise ValueError("this model has no auxiliary head (GELAN / converted); use head='main'")
    return chosen
