"""Settings of the ONNX export (``yolo9kit.export``): the file's operator set, its batch axis, the check."""

from __future__ import annotations

from dataclasses import dataclass

# Opset 17 is the newest the TorchScript exporter of torch 2.4+ writes without warnings and every ONNX Runtime
# since 1.13 runs; NonMaxSuppression (opset 10+) and GatherND (12+) are in it.
DEFAULT_OPSET = 17


@dataclass(frozen=True)
class ExportConfig:
    """How :func:`yolo9kit.export` writes and checks an ONNX file. Frozen: change a copy with
    ``dataclasses.replace``."""

    opset: int = DEFAULT_OPSET  # the ONNX operator set version written into the file
    # A symbolic batch axis: one file runs any batch size. Off fixes it to the traced batch of 1 (some
    # accelerators' compilers want static shapes).
    dynamic_batch: bool = True
    # Run the file in ONNX Runtime after writing it and compare with PyTorch (skipped, and said so in the
    # report, when onnxruntime is not installed). Costs one session start and two forward passes.
    check: bool = True
    # Largest allowed |ONNX Runtime - PyTorch| over the predictions, in their units: input pixels for the boxes,
    # probabilities for the scores. Measured (docs/export.md): 3e-5 px at most for random-weight gelan-t, yolov9-t
    # and yolov9-s at 64 and 640 px, 6.7e-4 px for the shipped trained yolov9-t at 160 px (float32 rounding in
    # another kernel order); 1e-2 px flags a wrong graph, never rounding.
    atol: float = 1e-2

    def __post_init__(self) -> None:
        if not 13 <= self.opset <= 20:  # 13: Unsqueeze with axes as an input (the NMS part); 20: the exporter's newest
            raise ValueError(f"ExportConfig.opset={self.opset!r}: expected an ONNX opset from 13 to 20 (17 default)")
        if not self.atol > 0:
            raise ValueError(f"ExportConfig.atol={self.atol!r}: expected a tolerance > 0")
