"""A throughput model: how long one optimizer step of ``batch_size x accumulate`` images takes.

``step_s = accumulate * (micro_overhead_s + batch_size * per_image_s) + optimizer_overhead_s``

* ``per_image_s = base_s * (H200 bandwidth / GPU bandwidth) + s_per_gflop * training GFLOPs per image *
  (H200 fp16 TFLOPs / GPU fp16 TFLOPs)``: a memory-bound part and a compute-bound part.
* the overheads are launch and Python costs of a micro-step (forward + loss + backward of ~1,000
  modules) and of the optimizer + EMA update; they depend on the host more than on the GPU.

The constants are fitted to the official YOLOv9 step measured on an H200 (AMP fp16, 640): the
per-image slopes between batch 32 and 64 of yolov9-t/s/c (1.75 / 3.06 / 8.4 ms) against 3x their
forward GFLOPs give 1.58 ms + 0.0095 ms/GFLOP (about 105 TFLOP/s effective, 11 % of peak); batch 8
steps (207-283 ms) and 8 x 8 accumulation (1,872 ms for yolov9-s) give ~0.20 s per micro-step and
~0.056 s per optimizer step. It is the official step, not the kit's (whose EMA and optimizer use
foreach kernels), so the overheads are on the slow side until a measured calibration replaces them.
fp32 (amp off) doubles the per-image time (official yolov9-s: 4.6 vs 2.3 ms per image).
"""

from __future__ import annotations

from dataclasses import dataclass

from yolo9kit.memory.gpus import GPUSpec

_REF_BANDWIDTH_GBS = 4800.0  # H200
_REF_TFLOPS = 989.0  # H200 dense fp16


@dataclass(frozen=True)
class ThroughputModel:
    base_s: float = 1.58e-3
    s_per_gflop: float = 9.5e-6
    micro_overhead_s: float = 0.20
    optimizer_overhead_s: float = 0.056
    fp32_factor: float = 2.0

    def per_image_s(self, gpu: GPUSpec, train_gflops_per_image: float, amp: str) -> float:
        t = self.base_s * _REF_BANDWIDTH_GBS / gpu.bandwidth_gbs \
            + self.s_per_gflop * train_gflops_per_image * _REF_TFLOPS / gpu.tflops_fp16
        return t * (self.fp32_factor if amp == "off" else 1.0)

    def step_s(self, gpu: GPUSpec, batch_size: int, accumulate: int, train_gflops_per_image: float,
               amp: str) -> float:
        per_image = self.per_image_s(gpu, train_gflops_per_image, amp)
        return accumulate * (self.micro_overhead_s + batch_size * per_image) + self.optimizer_overhead_s
