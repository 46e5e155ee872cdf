"""yolo9kit: train YOLOv9 on one GPU and understand its memory and speed. The core's public names are here; the
extras (tuning, loggers, the runs table, ONNX export, the GPU check, claims) are in ``yolo9kit.extras``."""

from yolo9kit.config import LoaderConfig, LossConfig, NMSConfig, SaveConfig, StepConfig, TrainConfig
from yolo9kit.data import create_dataloader, make_shapes
from yolo9kit.env import environment_report as checks
from yolo9kit.loss import DetectionLoss
from yolo9kit.models import DualOutput, create_model, fuse, list_models, model_table, to_deploy
from yolo9kit.models.checkpoint import read_checkpoint, save_checkpoint
from yolo9kit.prediction import predict
from yolo9kit.train.fit import fit
from yolo9kit.validate import compare_heads, evaluate

__version__ = "0.1.0"

__all__ = [
    "DetectionLoss", "DualOutput", "LoaderConfig", "LossConfig", "NMSConfig", "SaveConfig",
    "StepConfig", "TrainConfig", "__version__", "checks", "compare_heads", "create_dataloader", "create_model",
    "evaluate", "fit", "fuse", "list_models", "make_shapes", "model_table", "predict", "read_checkpoint",
    "save_checkpoint", "to_deploy",
]
