"""YOLO-format data sets: making them, reading and checking them, augmentation, letterbox, loaders."""

from __future__ import annotations

from yolo9kit.data.augment import Hyp
from yolo9kit.data.dataset import YOLODataset, check, rect_batch_shapes
from yolo9kit.data.images import letterbox
from yolo9kit.data.labels import DataError, DatasetReport, Problem
from yolo9kit.data.loader import YOLOLoader, create_dataloader, preprocess_images, set_mosaic
from yolo9kit.data.shapes import coco_to_yolo, make_shapes
from yolo9kit.data.sources import DataConfig, label_path, load_data_config

__all__ = ["DataConfig", "DataError", "DatasetReport", "Hyp", "Problem", "YOLODataset", "YOLOLoader", "check",
           "coco_to_yolo", "create_dataloader", "label_path", "letterbox", "load_data_config", "make_shapes",
           "preprocess_images", "rect_batch_shapes", "set_mosaic"]
