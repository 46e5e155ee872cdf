"""YOLO-format data sets: synthetic shapes, reading and checking, augmentation, letterbox, loaders."""

from __future__ import annotations

from yolo9kit.data.letterbox import letterbox

__all__ = ["letterbox"]
