"""YOLO-format data sets: synthetic shapes, reading and checking, augmentation, letterbox, loaders."""

from __future__ import annotations

from yolo9kit.data.augment import Hyp
from yolo9kit.data.check import check
from yolo9kit.data.coco import coco_to_yolo
from yolo9kit.data.dataset import YOLODataset, rect_batch_shapes
from yolo9kit.data.guard import DataError
from yolo9kit.data.letterbox import letterbox
from yolo9kit.data.loader import YOLOLoader, create_dataloader, preprocess_images, set_mosaic
from yolo9kit.data.report import DatasetReport, Problem
from yolo9kit.data.shapes import make_shapes
from yolo9kit.data.sources import DataConfig, label_path, load_data_config

__all__ = ["DataConfig", "DataError", "DatasetReport", "Hyp", "Problem", "YOLODataset", "YOLOLoader", "check",
           "coco_to_yolo", "create_dataloader", "label_path", "letterbox", "load_data_config", "make_shapes",
           "preprocess_images", "rect_batch_shapes", "set_mosaic"]
