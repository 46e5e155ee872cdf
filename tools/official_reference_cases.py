"""The reference cases of ``tools/official_reference.py`` besides the models: NMS, letterbox, matching and
AP (``ops.parity.pt``) and official checkpoint files with what the official loader computes from them.

Every function here calls the official code (the checkout is on ``sys.path``); see the tool's docstring.
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from parity_weights import parity_state_dict

FIXED_DATE = "2024-01-01T00:00:00"  # train_dual.py stores datetime.now(); a fixed one keeps the file byte-stable
NARROW_CLASSES = {0: "circle", 1: "square", 2: "triangle"}  # a data yaml's names, as train_dual.py attaches them
NMS_CASES = {  # key -> official non_max_suppression keyword arguments
    "detect_0.25_0.45_1000": dict(conf_thres=0.25, iou_thres=0.45, max_det=1000),  # detect_dual.py defaults
    "val_0.001_0.7_multilabel_300": dict(conf_thres=0.001, iou_thres=0.7, multi_label=True, max_det=300),  # val
    "detect_agnostic": dict(conf_thres=0.25, iou_thres=0.45, max_det=1000, agnostic=True),
    "detect_classes_0_2": dict(conf_thres=0.25, iou_thres=0.45, max_det=1000, classes=[0, 2]),
}
LETTERBOX_CASES = [  # (image height, width), official letterbox keyword arguments
    ((40, 70), dict(new_shape=64)),  # auto: the smallest stride-multiple rectangle
    ((40, 70), dict(new_shape=48, auto=False)),  # shrink
    ((50, 25), dict(new_shape=(32, 48), auto=False, scaleFill=True)),
    ((20, 30), dict(new_shape=48, auto=False, scaleup=False)),
    ((23, 37), dict(new_shape=(64, 32), color=(0, 0, 0), auto=False)),  # portrait target, black padding
    ((37, 53), dict(new_shape=64, stride=16)),
]


def _compact(obj):
    """Tensors cloned (a view would store its whole base storage) and numpy arrays made tensors, so that a
    weights_only ``torch.load`` reads the file."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj)).clone()
    if isinstance(obj, dict):
        return {k: _compact(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_compact(v) for v in obj)
    return obj


def save(record: dict, path: Path) -> Path:
    torch.save(_compact(record), path)
    return path


def save_json(record: dict, path: Path) -> Path:
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


# ------------------------------------------------------------------------------------------------- ops

def _nms_input(seed: int = 1, batch: int = 2, nc: int = 6, anchors: int = 800) -> torch.Tensor:
    """(batch, 4 + nc, anchors) xywh boxes on a 640 image with overlapping neighbours, scores skewed low."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(batch, 2, anchors // 4, generator=g).repeat_interleave(4, 2) * 600 + 20
    xy = centres + torch.randn(batch, 2, anchors, generator=g) * 6  # clusters of four overlapping boxes
    wh = torch.rand(batch, 2, anchors, generator=g) * 80 + 8
    scores = torch.rand(batch, nc, anchors, generator=g) ** 3
    return torch.cat((xy, wh, scores), 1)


def _match_case(seed: int = 2) -> dict:
    """Official ``val_dual.py process_batch`` on 30 jittered detections of 10 labels, and ``ap_per_class``
    on its result."""
    from utils.metrics import ap_per_class
    from val_dual import process_batch

    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(10, 2, generator=g) * 400
    wh = torch.rand(10, 2, generator=g) * 100 + 20
    labels = torch.cat([torch.randint(0, 3, (10, 1), generator=g).float(), xy, xy + wh], 1)
    pick = torch.randint(0, 10, (30,), generator=g)
    boxes = labels[pick, 1:] + torch.randn(30, 4, generator=g) * 8
    other = torch.randint(0, 3, (30,), generator=g).float()
    cls = torch.where(torch.rand(30, generator=g) < 0.8, labels[pick, 0], other)  # a fifth may be mislabelled
    detections = torch.cat([boxes, torch.rand(30, 1, generator=g), cls[:, None]], 1)
    iouv = torch.linspace(0.5, 0.95, 10)
    correct = process_batch(detections, labels, iouv)
    ap = ap_per_class(correct.numpy(), detections[:, 4].numpy(), detections[:, 5].numpy(), labels[:, 0].numpy(),
                      names={i: str(i) for i in range(3)})  # val_dual.py passes the model's names dict
    return {"detections": detections, "labels": labels, "iouv": iouv, "correct": correct, "ap": _ap_dict(ap)}


def _ap_dict(result) -> dict:
    keys = ("tp_out", "fp_out", "p", "r", "f1", "ap", "unique_classes")
    return dict(zip(keys, (np.asarray(v) for v in result)))


def _ap_case(seed: int = 3, n: int = 400, nc: int = 5) -> dict:
    """Official ``utils/metrics.py ap_per_class`` on 400 detections whose IoU decides the flag at each of
    the ten thresholds (a true positive at 0.9 is one at 0.5)."""
    from utils.metrics import ap_per_class

    rng = np.random.default_rng(seed)
    iou = rng.random(n)
    tp = iou[:, None] >= np.linspace(0.5, 0.95, 10)[None]
    conf = rng.random(n)
    pred_cls = rng.integers(0, nc, n).astype(np.float64)
    target_cls = rng.integers(0, nc - 1, 120).astype(np.float64)  # the last class is never a label
    case = {"tp": tp, "conf": conf, "pred_cls": pred_cls, "target_cls": target_cls}
    names = {i: str(i) for i in range(nc)}
    return {**case, **_ap_dict(ap_per_class(tp, conf, pred_cls, target_cls, names=names))}


def ops_cases() -> dict:
    """NMS, letterbox, matching and AP cases with the official outputs."""
    from utils.augmentations import letterbox
    from utils.general import non_max_suppression

    prediction = _nms_input()
    nms = {"input": prediction, "cases": {}}
    for key, kwargs in NMS_CASES.items():
        nms["cases"][key] = {"kwargs": kwargs, "out": non_max_suppression(prediction.clone(), **kwargs)}
    rng = np.random.default_rng(4)
    boxes = []
    for (h, w), kwargs in LETTERBOX_CASES:
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        out, ratio, pad = letterbox(image.copy(), **kwargs)
        boxes.append({"input": image, "kwargs": kwargs, "out": out, "ratio": tuple(float(r) for r in ratio),
                      "pad": tuple(float(p) for p in pad)})
    return {"nms": nms, "letterbox": boxes, "match": _match_case(), "ap_per_class": _ap_case()}


# ----------------------------------------------------------------------------------------- checkpoints

# per official module: how many leading arguments are channel counts (divided by 8); RepNCSPELAN4's fourth
# argument is its depth (set to 1)
_CHANNEL_ARGS = {"Conv": 1, "AConv": 1, "ADown": 1, "ELAN1": 3, "RepNCSPELAN4": 3, "SPPELAN": 2}
_NO_CHANNELS = {"nn.Upsample", "Concat", "DDetect", "DualDDetect"}


def narrow_config(cfg: dict) -> dict:
    """An eighth-width, depth-1, 3-class copy of an official model yaml (yolov9-t, gelan-t): the official
    checkpoint files stay well under a megabyte. (The official parse_model still rounds each layer's output
    channels up to a multiple of 8; the head's box branch keeps its 64 channels.)"""
    cfg = copy.deepcopy(cfg)
    cfg["nc"] = len(NARROW_CLASSES)
    for row in cfg["backbone"] + cfg["head"]:
        module, args = row[2], row[3]
        if module in _CHANNEL_ARGS:
            for j in range(_CHANNEL_ARGS[module]):
                args[j] = max(args[j] // 8, 1)
            if module == "RepNCSPELAN4":
                args[3] = 1
        elif module not in _NO_CHANNELS:
            raise ValueError(f"narrow_config: no rule for module {module} (row {row})")
    return cfg


@contextlib.contextmanager
def full_torch_load():
    """The official code calls ``torch.load(path)`` on files that pickle its modules; torch >= 2.6 defaults
    to ``weights_only=True``, which refuses them. Only used on the files this tool has just written."""
    original = torch.load

    def load(*args, **kwargs):
        kwargs.setdefault("weights_only", False)
        return original(*args, **kwargs)

    torch.load = load
    try:
        yield
    finally:
        torch.load = original


def _narrow_targets(seed: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = 5
    image = torch.tensor([0, 0, 1, 1, 1], dtype=torch.float32)[:, None]
    cls = torch.randint(0, len(NARROW_CLASSES), (n, 1), generator=g).float()
    centre, size = torch.rand(n, 2, generator=g) * 0.6 + 0.2, torch.rand(n, 2, generator=g) * 0.4 + 0.1
    return torch.cat([image, cls, centre, size], 1)


def training_checkpoint(cfg_path: Path, x: torch.Tensor, hyp: dict, opt: dict, path: Path) -> Path:
    """A training-format checkpoint as ``train_dual.py`` saves it, after one official SGD step (gradients
    clipped to norm 10 as there) and EMA update."""
    from models.yolo import DetectionModel
    from utils.torch_utils import ModelEMA, de_parallel, smart_optimizer

    torch.manual_seed(0)
    model = DetectionModel(str(cfg_path))  # built from the file: the pickle keeps yaml_file as official ones do
    model.load_state_dict(parity_state_dict(model.state_dict()), strict=True)
    model.nc, model.hyp, model.names = len(NARROW_CLASSES), hyp, dict(NARROW_CLASSES)
    optimizer = smart_optimizer(model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"])
    ema = ModelEMA(model)
    if model.yaml["head"][-1][2] == "DualDDetect":
        from utils.loss_tal_dual import ComputeLoss
    else:
        from utils.loss_tal import ComputeLoss
    model.train()
    loss, _ = ComputeLoss(model)(model(x), _narrow_targets())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)  # as train_dual.py before each step
    optimizer.step()
    optimizer.zero_grad()
    ema.update(model)
    ckpt = {"epoch": 3, "best_fitness": np.array([0.1]), "model": copy.deepcopy(de_parallel(model)).half(),
            "ema": copy.deepcopy(ema.ema).half(), "updates": ema.updates, "optimizer": optimizer.state_dict(),
            "opt": opt, "git": None, "date": FIXED_DATE}
    torch.save(ckpt, path)
    return path


def _attempt_load_outputs(path: Path, x: torch.Tensor) -> dict:
    """What the official ``models/experimental.py attempt_load`` (EMA if present, fp32, fused, eval) computes."""
    from models.experimental import attempt_load

    with full_torch_load():
        model = attempt_load(str(path), device="cpu")
        raw = torch.load(path, map_location="cpu")
    with torch.no_grad():
        decoded = model(x)[0]
    return {"eval_out": list(decoded) if isinstance(decoded, (list, tuple)) else [decoded],
            "entry": "ema" if raw.get("ema") is not None else "model", "epoch": raw["epoch"],
            "nc": int(model.nc), "names": [model.names[k] for k in sorted(model.names)],
            "stride": model.stride.clone()}


def checkpoint_cases(root: Path, out: Path, image: torch.Tensor, hyp: dict, commit: str | None,
                     opt: dict) -> list[Path]:
    """Release files of narrow yolov9-t and gelan-t (official ``utils/general.py strip_optimizer`` of a
    training checkpoint), the gelan training checkpoint itself (the smaller one: a training file holds the
    model twice and the SGD momentum), and ``checkpoints.parity.pt``."""
    import yaml
    from utils.general import strip_optimizer

    x = image.float() / 255
    written, reference = [], {"commit": commit, "image": image}
    with tempfile.TemporaryDirectory() as tmp:
        for base in ("yolov9-t", "gelan-t"):
            name = f"{base}-narrow"
            cfg = narrow_config(yaml.safe_load((root / "models" / "detect" / f"{base}.yaml").read_text()))
            cfg_path = Path(tmp) / f"{name}.yaml"
            cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            train_path = training_checkpoint(cfg_path, x, hyp, opt, Path(tmp) / f"{name}.official-train.pt")
            release = out / f"{name}.official-release.pt"
            shutil.copyfile(train_path, Path(tmp) / "release.pt")
            with full_torch_load():
                strip_optimizer(str(Path(tmp) / "release.pt"))
            shutil.copyfile(Path(tmp) / "release.pt", release)
            written.append(release)
            reference[release.name] = _attempt_load_outputs(release, x)
            if base == "gelan-t":
                kept = out / train_path.name
                shutil.copyfile(train_path, kept)
                written.append(kept)
                reference[kept.name] = _attempt_load_outputs(kept, x)
    written.append(save(reference, out / "checkpoints.parity.pt"))
    return written
