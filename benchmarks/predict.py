"""Per-stage inference timings (ms per image, batch 1), yolo9kit against the official detect path.

    python benchmarks/predict.py --models yolov9-t gelan-t --imgsz 640 --images 50 [--device cuda]
    python benchmarks/predict.py --official /path/to/yolov9-checkout   # adds the official pipeline
    python benchmarks/predict.py --onnxruntime   # adds predict(..., backend="onnxruntime") rows on the CPU
    python benchmarks/predict.py --openvino      # adds predict(..., backend="openvino") rows on the CPU

For each model: ``yolo9kit.predict`` (on the CPU with its default ``half="auto"``, bf16 where the processor
computes it, and with ``half=False``, FP32) on N synthetic BGR images (1080x810, like the official sample
photo) or on ``--source``, after one warm-up call; stages are load (read + letterbox, not in the
official Speed line), pre-process (to tensor, /255), inference (forward) and NMS, synchronised on CUDA.
``--fuse`` times the Conv+BN-fused model, as the official loader does.

With ``--official PATH`` the same run also times the official code: its ``models.yolo.DetectionModel``
built from its yaml, given the same weights (state_dict keys are identical), fused and put in eval
mode as its checkpoint loader does, then per image its letterbox, the same pre-processing, the forward
(``pred[0][1]`` for dual heads as detect_dual.py, ``pred[0]`` for GELAN as detect.py) and its
``non_max_suppression``. The checkout is imported, not copied (see ``official_shim.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

STAGES = ("load_ms", "preprocess_ms", "inference_ms", "nms_ms")


def synthetic_images(n: int, height: int = 1080, width: int = 810, seed: int = 0) -> list[np.ndarray]:
    """Smooth random BGR images (noise would make NMS see no structure either way)."""
    import cv2

    rng = np.random.default_rng(seed)
    return [cv2.resize(rng.integers(0, 255, (12, 9, 3), dtype=np.uint8), (width, height),
                       interpolation=cv2.INTER_CUBIC) for _ in range(n)]


def time_kit(model, images, imgsz: int, device: str, half: bool | str, backend: str = "torch") -> dict[str, float]:
    from yolo9kit.prediction import predict

    options = {"device": device, "half": half} if backend == "torch" else {"backend": backend}
    predict(model, images[:1], imgsz=imgsz, **options)  # warm-up (allocations, cuDNN plans)
    results = predict(model, images, imgsz=imgsz, **options)
    return {stage: float(results.speed[stage].mean()) for stage in STAGES} | {
        "detections": sum(len(r) for r in results)}


def official_model(root: Path, name: str, state_dict: dict, device: str):
    from models.yolo import DetectionModel as OfficialModel  # from the checkout on sys.path

    cfg = root / "models" / "detect" / f"{name}.yaml"
    model = OfficialModel(str(cfg), ch=3, nc=80)
    model.load_state_dict(state_dict, strict=True)
    return model.float().fuse().eval().to(device)  # as attempt_load: fp32, fused, eval


@torch.no_grad()
def time_official(model, images, imgsz: int, device: str, half: bool, dual: bool) -> dict[str, float]:
    from utils.augmentations import letterbox as official_letterbox
    from utils.general import non_max_suppression as official_nms

    dev = torch.device(device)
    model = model.half() if half else model

    def sync() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter()

    times = {stage: [] for stage in STAGES}
    detections = 0
    for index, image in enumerate([images[0], *images]):
        t0 = time.perf_counter()
        im = official_letterbox(image, imgsz, stride=32, auto=True)[0]
        im = np.ascontiguousarray(im.transpose((2, 0, 1))[::-1])
        t1 = sync()
        x = torch.from_numpy(im).to(dev)
        x = (x.half() if half else x.float()) / 255
        x = x[None]
        t2 = sync()
        pred = model(x)
        pred = pred[0][1] if dual else pred[0]
        t3 = sync()
        det = official_nms(pred, 0.25, 0.45, None, False, max_det=1000)
        t4 = sync()
        if index == 0:
            continue  # warm-up image
        detections += sum(len(d) for d in det)
        for stage, value in zip(STAGES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            times[stage].append(value * 1e3)
    return {stage: statistics.fmean(v) for stage, v in times.items()} | {"detections": detections}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["yolov9-t", "gelan-t"])
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--images", type=int, default=20, help="number of synthetic images (default 20)")
    parser.add_argument("--source", default=None, help="image folder instead of synthetic images")
    parser.add_argument("--device", nargs="+", default=None, help="devices (default: cpu, and cuda when available)")
    parser.add_argument("--half", action="store_true", help="FP16 (CUDA only)")
    parser.add_argument("--fuse", action="store_true", help="time the Conv+BN-fused kit model")
    parser.add_argument("--official", default=None, help="checkout of WongKinYiu/yolov9 to time side by side")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--openvino", action="store_true",
                        help="also time predict(..., backend='openvino') on the CPU (the openvino extra)")
    parser.add_argument("--onnxruntime", action="store_true",
                        help="also time predict(..., backend='onnxruntime') on the CPU (one session per call: the "
                             "export is outside the timed stages; every image letterboxed to the full size)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    devices = args.device or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    if args.source:
        import cv2

        from yolo9kit.prediction import IMAGE_SUFFIXES

        files = sorted(p for p in Path(args.source).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        images = [cv2.imread(str(p)) for p in files[: args.images]]
    else:
        images = synthetic_images(args.images)
    if args.official:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from official_shim import import_official

        import_official(args.official)

    from yolo9kit.models import create_model
    from yolo9kit.models.deploy import resolve_half

    rows = []
    for name in args.models:
        torch.manual_seed(0)
        kit = create_model(name).eval()
        weights = {k: v.clone() for k, v in kit.state_dict().items()}  # the official model gets the same
        if args.fuse:
            kit = kit.fuse()
        for device in devices:
            half = args.half and device.startswith("cuda")
            for setting in (["auto", False] if device == "cpu" else [half]):  # the CPU's default, then FP32
                dtype = resolve_half(setting, torch.device(device), cpu_bf16=True)
                label = f"yolo9kit {setting} ({str(dtype)[6:]})"
                rows.append({"impl": label + (" fused" if args.fuse else ""), "model": name, "device": device,
                             **time_kit(kit, images, args.imgsz, device, setting)})
            for backend in ("onnxruntime", "openvino"):
                if getattr(args, backend) and device == "cpu":
                    rows.append({"impl": f"yolo9kit {backend}", "model": name, "device": device,
                                 **time_kit(kit, images, args.imgsz, device, False, backend=backend)})
            if args.official:
                reference = official_model(Path(args.official), name, weights, device)
                rows.append({"impl": "official (fused)", "model": name, "device": device,
                             **time_official(reference, images, args.imgsz, device, half, kit.is_dual)})
    header = f"{'impl':28s} {'model':10s} {'device':7s} " + " ".join(f"{s[:-3]:>11s}" for s in STAGES) + "  dets"
    print(f"ms per image, batch 1, {len(images)} images, imgsz {args.imgsz}, torch threads {torch.get_num_threads()}")
    print(header)
    for r in rows:
        print(f"{r['impl']:28s} {r['model']:10s} {r['device']:7s} " + " ".join(f"{r[s]:11.1f}" for s in STAGES)
              + f"  {r['detections']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
