"""What the lean BatchNorm+SiLU keeps for backward, against the plain modules, on the CPU.

    python benchmarks/lean_memory.py [--models yolov9-t yolov9-s yolov9-c] [--imgsz 256] [--batch 2]

For each model: one training forward + DetectionLoss + backward in fp32 with ``set_lean`` off and on, from
the same weights and batch. Prints the bytes of the distinct storages autograd saved for backward
(``torch.autograd.graph.saved_tensors_hooks``), their ratio, and how far the loss, the BatchNorm buffers
and the gradients moved (largest difference relative to the global gradient norm).
"""

from __future__ import annotations

import argparse
import copy

import torch

from yolo9kit.loss import DetectionLoss
from yolo9kit.models import create_model
from yolo9kit.models.layers import set_lean


def one_pass(model, x, targets):
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _ = DetectionLoss(model)(model(x), targets)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    buffers = torch.cat([b.float().flatten() for b in model.buffers()])
    return loss.detach(), grads, buffers, sum(storages.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["yolov9-t", "yolov9-s", "yolov9-c"])
    p.add_argument("--imgsz", type=int, default=256)
    p.add_argument("--batch", type=int, default=2)
    args = p.parse_args()
    targets = torch.tensor([[i, i % 4, 0.5, 0.5, 0.3, 0.4] for i in range(args.batch)])
    print("| model | modules switched | saved MiB plain | saved MiB lean | ratio | loss diff | buffer diff | "
          "grad diff / grad norm |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models:
        torch.manual_seed(0)
        base = create_model(name, num_classes=4).train()
        x = torch.rand(args.batch, 3, args.imgsz, args.imgsz)
        runs = {}
        for lean in (False, True):
            model = copy.deepcopy(base)
            count = set_lean(model, lean)
            runs[lean] = one_pass(model, x, targets)
        (l0, g0, b0, s0), (l1, g1, b1, s1) = runs[False], runs[True]
        print(f"| {name} | {count} | {s0 / 2**20:.1f} | {s1 / 2**20:.1f} | {s1 / s0:.3f} | "
              f"{(l1 - l0).abs().item():.1e} | {(b1 - b0).abs().max().item():.1e} | "
              f"{((g1 - g0).abs().max() / g0.norm()).item():.1e} |", flush=True)


if __name__ == "__main__":
    main()
