"""What the core never imports (tests/test_layers.py): tuning, experiment loggers, the runs table, seed spreads, the
GPU self-check, ONNX export and its backends, claims. The core reaches them by the entry points of pyproject.toml."""

from yolo9kit.extras.claims import Claim, Verdict, judge
from yolo9kit.extras.experiments import SeedSpread, compare, fit_seeds, runs, runs_viewer
from yolo9kit.extras.gpu_check import checks
from yolo9kit.extras.onnx import ExportCheckError, ExportConfig, ExportReport, export
from yolo9kit.extras.tuning import TuneResult, tune

__all__ = ["Claim", "ExportCheckError", "ExportConfig", "ExportReport", "SeedSpread", "TuneResult", "Verdict", "checks",
           "compare", "export", "fit_seeds", "judge", "runs", "runs_viewer", "tune"]
