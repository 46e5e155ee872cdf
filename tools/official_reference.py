"""Write the official YOLOv9 reference outputs that the parity tests compare against.

    python tools/official_reference.py --official PATH/TO/yolov9 --out tests/fixtures/official

Runs a checkout of the official code (github.com/WongKinYiu/yolov9; the committed references come from
commit 5b1ea9a) on the CPU in float32, on one thread, with fixed seeds. The checkout is put on ``sys.path``
and its functions are called; none of its code is copied here. Its imports need packages the kit does not
(scipy, seaborn, tensorboard, setuptools<81 for ``pkg_resources``): install them outside the kit's
environment, for example ``pip install --target DIR scipy seaborn tensorboard "setuptools<81"``, and run
with ``PYTHONPATH=DIR``.

What it writes (docs/parity.md and the README.md of the output folder describe every key):

- ``{model}.parity.pt`` for the ten models: a small input, the model's outputs in eval mode (decoded, per
  head) and in training mode (raw maps), the official loss (``utils/loss_tal_dual.py`` for yolov9,
  ``utils/loss_tal.py`` for gelan) with its items and gradient norms, per-layer statistics, the state_dict
  layout and a fingerprint of the seed-0 initial weights. No weights are stored: both sides fill the
  state_dict with ``tests/parity_weights.py``.
- ``ops.parity.pt``: official NMS, letterbox, ``process_batch`` and ``ap_per_class`` on small inputs.
- ``train_dual.flags.json``: the long flags of the official ``train_dual.py`` and their defaults, read
  from its argparse parser.
- official checkpoints of narrow (quarter-width, 3-class) yolov9-t and gelan-t: release format (made by
  the official ``strip_optimizer``) and training format (as ``train_dual.py`` saves it), plus
  ``checkpoints.parity.pt`` with what the official ``attempt_load`` computes from each.

The output is byte-stable from run to run: fixed seeds, one thread, deterministic algorithms, plain
tensors and containers, a fixed date in the training checkpoint, paths relative to the checkout.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the weight rule the tests use
sys.path.insert(0, str(Path(__file__).resolve().parent))

from parity_weights import parity_state_dict  # noqa: E402

MODELS = [f"{family}-{size}" for family in ("yolov9", "gelan") for size in "tsmce"]
# two landscape 32x64 images (a rectangular batch as in official validation, where height and width differ
# and a swapped axis shows), 80 classes as the released models: 150-350 kB per model
BATCH, HEIGHT, WIDTH, NUM_CLASSES = 2, 32, 64, 80


def _deterministic(seed: int = 0) -> None:
    """Same numbers on every run: one thread (the reduction order of a multi-threaded conv depends on the
    thread count), deterministic kernels, every RNG seeded."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def import_official(root: Path) -> None:
    """Put the checkout first on ``sys.path`` (its packages are the top-level ``models`` and ``utils``)."""
    if not (root / "models" / "yolo.py").is_file() or not (root / "train_dual.py").is_file():
        raise SystemExit(f"{root}: not a checkout of WongKinYiu/yolov9 (models/yolo.py or train_dual.py missing)")
    for knob in ("YOLOM", "YOLOA", "YOLOB"):  # the official assigner reads these; the defaults are the recipe
        os.environ.pop(knob, None)
    if not hasattr(np, "trapz"):  # removed in numpy 2.4; the official compute_ap calls it
        np.trapz = np.trapezoid  # the same function under its new name
    sys.path.insert(0, str(root))
    try:
        import models.yolo  # noqa: F401
        import train_dual  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"importing the official code from {root} failed ({e}); it needs seaborn, tensorboard "
                         "and setuptools<81 (pkg_resources): pip install --target DIR seaborn tensorboard "
                         "'setuptools<81' and run with PYTHONPATH=DIR (docs/parity.md)") from e


def official_commit(root: Path, given: str | None) -> str | None:
    """The commit given on the command line, else the checkout's ``git rev-parse HEAD``, else None."""
    if given:
        return given
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def parity_input(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(image uint8 (BATCH, 3, HEIGHT, WIDTH), targets (N, 6) rows image, class, x, y, w, h normalised)."""
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (BATCH, 3, HEIGHT, WIDTH), generator=g, dtype=torch.uint8)
    rows = []
    for i in range(BATCH):
        n = 3 + i  # 3 and 4 objects: both images have targets, in different numbers
        cls = torch.randint(0, NUM_CLASSES, (n, 1), generator=g).float()
        centre = torch.rand(n, 2, generator=g) * 0.6 + 0.2
        size = torch.rand(n, 2, generator=g) * 0.4 + 0.1
        rows.append(torch.cat([torch.full((n, 1), float(i)), cls, centre, size], 1))
    return image, torch.cat(rows)


def load_hyp(root: Path) -> dict:
    import yaml

    hyp = yaml.safe_load((root / "data" / "hyps" / "hyp.scratch-high.yaml").read_text())
    hyp["label_smoothing"] = 0.0  # train_dual.py sets it from --label-smoothing (default 0.0)
    return hyp


def _layout_and_init(state: dict) -> tuple[list, torch.Tensor]:
    """(state_dict layout [(key, shape)], (K, 2) float64 sum and abs sum of each float entry, in order)."""
    layout = [(sys.intern(k), tuple(v.shape)) for k, v in state.items()]  # interned: pickled once per file
    stats = [(float(v.double().sum()), float(v.double().abs().sum())) for v in state.values() if v.is_floating_point()]
    return layout, torch.tensor(stats, dtype=torch.float64)


def _layer_stats(model, x: torch.Tensor) -> dict:
    """Per layer index: shape, sum and abs sum of its output (eval mode), to find the first layer that differs."""
    stats = {}

    def hook(module, _inputs, output):
        if isinstance(output, torch.Tensor):
            stats[module.i] = {"shape": tuple(output.shape), "sum": float(output.double().sum()),
                               "abs_sum": float(output.double().abs().sum())}

    handles = [m.register_forward_hook(hook) for m in model.model]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return stats


def model_case(root: Path, name: str, image: torch.Tensor, targets: torch.Tensor, hyp: dict) -> dict:
    """Everything the parity tests compare for one model (official ``models/yolo.py DetectionModel``)."""
    from models.yolo import DetectionModel

    _deterministic(0)
    model = DetectionModel(str(root / "models" / "detect" / f"{name}.yaml"))  # nc 80, as released
    layout, init = _layout_and_init(model.state_dict())  # the official seed-0 initialisation
    model.load_state_dict(parity_state_dict(model.state_dict()), strict=True)
    x = image.float() / 255  # as the official dataloader feeds the model
    dual = name.startswith("yolov9")

    model.eval()
    layer_stats = _layer_stats(model, x)
    with torch.no_grad():
        decoded = model(x)[0]  # eval returns (decoded, raw maps); decoded is [aux, main] for the dual head
    eval_out = [t.clone() for t in decoded] if dual else [decoded.clone()]

    # training mode in float64: batch statistics over the few values of the coarsest level (4 per channel
    # at 32x64) turn float32 rounding into differences of 1e-4..1e-1 between thread counts or machines;
    # in float64 the same amplification stays below 1e-9, so the references hold everywhere
    model.double().train()
    model.hyp = hyp
    if dual:
        from utils.loss_tal_dual import ComputeLoss
    else:
        from utils.loss_tal import ComputeLoss
    out = model(x.double())  # training mode: [aux maps, main maps] (yolov9) or the three maps (gelan)
    loss, items = ComputeLoss(model)(out, targets)
    loss.backward()
    grad_norms = {sys.intern(n): float(p.grad.norm()) for n, p in model.named_parameters() if p.grad is not None}
    train_out = [[m.detach().float() for m in head] for head in out] if dual else [m.detach().float() for m in out]
    return {
        "name": name, "nc": NUM_CLASSES, "params": sum(p.numel() for p in model.parameters()),
        "stride": model.stride.float().clone(), "image": image, "targets": targets,
        "layout": layout, "init": init,
        "eval_out": eval_out, "eval_layer_stats": layer_stats, "train_out": train_out,
        "loss": loss.detach().reshape(()).clone(), "loss_items": items.detach().clone(),  # float64
        "grad_norm": float(np.sqrt(sum(v * v for v in grad_norms.values()))), "grad_norms": grad_norms,
    }


def train_dual_flags(root: Path, commit: str | None) -> dict:
    """The long options of the official ``train_dual.py`` and their defaults, read from the parser its
    ``parse_opt`` builds (``parse_known_args`` is intercepted to keep the parser and parse no arguments)."""
    import train_dual

    captured = {}
    original = argparse.ArgumentParser.parse_known_args

    def capture(self, args=None, namespace=None):
        captured["parser"] = self
        return original(self, [], namespace)

    argparse.ArgumentParser.parse_known_args = capture
    try:
        train_dual.parse_opt(known=True)
    finally:
        argparse.ArgumentParser.parse_known_args = original
    flags, defaults = [], {}
    for action in captured["parser"]._actions:
        if isinstance(action, argparse._HelpAction):  # argparse's own --help, not a flag of the script
            continue
        for option in action.option_strings:
            if option.startswith("--"):
                flags.append(option)
                defaults[option] = _json_default(action.default, root)
    return {"script": "train_dual.py", "commit": commit, "flags": sorted(flags),
            "defaults": dict(sorted(defaults.items()))}


def _json_default(value, root: Path):
    """A default as JSON: paths relative to the checkout (the official ROOT depends on the working folder)."""
    if isinstance(value, Path):
        return relative_to_checkout(value, root).as_posix()
    if isinstance(value, (list, tuple)):
        return [_json_default(v, root) for v in value]
    return value


def relative_to_checkout(path: Path, root: Path) -> Path:
    full = (Path.cwd() / path).resolve()
    try:
        return full.relative_to(root.resolve())
    except ValueError:
        return Path(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--official", type=Path, required=True, help="checkout of WongKinYiu/yolov9")
    parser.add_argument("--out", type=Path, required=True, help="folder to write (tests/fixtures/official)")
    parser.add_argument("--commit", default=None,
                        help="official commit to record (default: git rev-parse HEAD of the checkout, else none)")
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS, help="models to write")
    args = parser.parse_args(argv)
    root = args.official.resolve()
    import_official(root)
    commit = official_commit(root, args.commit)
    args.out.mkdir(parents=True, exist_ok=True)

    import official_reference_cases as cases

    hyp = load_hyp(root)
    image, targets = parity_input()
    written = []
    for name in args.models:
        record = model_case(root, name, image, targets, hyp)
        record["commit"] = commit
        written.append(cases.save(record, args.out / f"{name}.parity.pt"))
    _deterministic(0)
    written.append(cases.save({"commit": commit, **cases.ops_cases()}, args.out / "ops.parity.pt"))
    written.append(cases.save_json(train_dual_flags(root, commit), args.out / "train_dual.flags.json"))
    written += cases.checkpoint_cases(root, args.out, image, hyp, commit, train_dual_opt(root))
    for path in written:
        print(f"{path.stat().st_size / 1e3:9.1f} kB  {path}")


def train_dual_opt(root: Path) -> dict:
    """``vars(opt)`` of the official ``train_dual.py`` with no arguments: what a training checkpoint stores
    under ``opt`` (paths made relative to the checkout)."""
    import train_dual

    saved = sys.argv
    sys.argv = ["train_dual.py"]
    try:
        opt = vars(train_dual.parse_opt(known=True))
    finally:
        sys.argv = saved
    return {k: relative_to_checkout(v, root) if isinstance(v, Path) else v for k, v in opt.items()}


if __name__ == "__main__":
    main()
