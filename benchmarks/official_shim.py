"""Import a checkout of the official YOLOv9 repository inside a benchmark process, for side-by-side
timing. Nothing of it is copied: the benchmark imports the user's checkout at run time.

The official code imports a few packages at module level that a current stack lacks or does not need
for timing (``pkg_resources`` is gone from recent setuptools; ``IPython``, ``requests``, ``seaborn`` and ``thop``
are only used for notebooks, downloads, plots and FLOP counts), and calls ``numpy.trapz``, removed in numpy 2.4.
``import_official`` installs minimal stand-ins for those before importing, and only in this process.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path


def import_official(path: str | Path) -> None:
    """Put an official checkout on ``sys.path`` so that ``import models.yolo`` etc. work.

    Raises:
        FileNotFoundError: the folder does not look like a checkout of WongKinYiu/yolov9.
    """
    root = Path(path).resolve()
    if not (root / "models" / "yolo.py").is_file() or not (root / "utils" / "loss_tal_dual.py").is_file():
        raise FileNotFoundError(f"{root} is not a checkout of the official YOLOv9 repository "
                                "(expected models/yolo.py and utils/loss_tal_dual.py)")
    for name in ("pkg_resources", "IPython", "requests", "seaborn", "thop"):
        try:
            __import__(name)
        except ImportError:
            stand_in = types.ModuleType(name)
            if name == "pkg_resources":
                from packaging.version import parse as parse_version

                stand_in.parse_version = parse_version
                stand_in.require = lambda *args, **kwargs: None
            if name == "IPython":
                stand_in.display = types.SimpleNamespace(display=lambda *args, **kwargs: None)
            sys.modules[name] = stand_in
    import numpy as np

    if not hasattr(np, "trapz"):
        np.trapz = np.trapezoid
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
