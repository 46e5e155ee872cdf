"""predict runs the deployed model (auxiliary branch dropped, Conv+BN fused) by default: same detections,
built once per weights version, the caller's model untouched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from yolo9kit.config import NMSConfig
from yolo9kit.models import create_model
from yolo9kit.models.deploy import deploy_for_inference
from yolo9kit.models.heads import DualOutput
from yolo9kit.prediction import predict


def _model():
    torch.manual_seed(0)
    model = create_model("yolov9-t", num_classes=3).eval()
    head = model.head
    for conv in (*head.cv3, *head.cv5):  # make class scores high enough to give detections
        torch.nn.init.constant_(conv[-1].bias, 2.0)
    return model


def test_deployed_prediction_equals_plain_prediction(tmp_path):
    """The shipped shapes model on shapes images: real, distinct scores (an untrained model's tied scores
    let NMS keep any of the tied boxes). The deployed copy also runs channels_last on the CPU."""
    from yolo9kit import create_model
    from yolo9kit.data import load_data_config, make_shapes

    model = create_model("yolov9-t-shapes")
    data = make_shapes(tmp_path / "shapes", n_train=1, n_val=2, imgsz=160, num_classes=3, seed=1)
    for image in load_data_config(data).images("val"):
        plain = predict(model, image, imgsz=160, deploy=False, device="cpu", half=False)[0]
        fast = predict(model, image, imgsz=160, deploy=True, device="cpu", half=False)[0]
        assert len(plain.boxes) >= 3 and len(plain.boxes) == len(fast.boxes)
        np.testing.assert_allclose(fast.scores, plain.scores, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(fast.boxes, plain.boxes, atol=1.0)  # boxes are rounded to whole pixels
        assert fast.classes.tolist() == plain.classes.tolist()
    assert model.is_dual and any(k.startswith("model.22.") for k in model.state_dict())  # caller's model intact


def test_bf16_maps_decode_in_fp32():
    """bf16 keeps 8 significant bits: decoded in bf16, a box edge between 512 and 1024 px would move by up to 2 px."""
    head = create_model("yolov9-t-shapes").eval().head
    g = torch.Generator().manual_seed(0)
    maps = [torch.randn(1, head.no, 640 // s, 640 // s, generator=g).mul(3).to(torch.bfloat16) for s in (8, 16, 32)]
    with torch.no_grad():
        bf16 = head.decode(DualOutput(maps, maps)).main
        fp32 = head.decode(DualOutput(maps, [m.float() for m in maps])).main
    assert bf16.dtype == torch.float32 and torch.equal(bf16, fp32) and fp32[:, :4].max() > 512


def test_bf16_prediction_finds_what_fp32_finds(tmp_path):
    """``half="bf16"`` (the CPU's "auto" where bf16 is in hardware) on the shipped model's images: the same
    detections as FP32, boxes within a pixel (mAP on its validation set: benchmarks/bf16_boxes.py)."""
    from yolo9kit.data import load_data_config, make_shapes

    model = create_model("yolov9-t-shapes")
    data = make_shapes(tmp_path / "shapes", n_train=1, n_val=2, imgsz=160, num_classes=3, seed=1)
    for image in load_data_config(data).images("val"):
        fp32, bf16 = (predict(model, image, imgsz=160, device="cpu", half=half)[0] for half in (False, "bf16"))
        assert len(fp32.boxes) >= 3 and bf16.classes.tolist() == fp32.classes.tolist()
        np.testing.assert_allclose(bf16.boxes, fp32.boxes, atol=1.0)  # whole pixels
        np.testing.assert_allclose(bf16.scores, fp32.scores, atol=0.01)


def test_deployed_model_is_cached_until_the_weights_change():
    model = _model()
    first = deploy_for_inference(model)
    assert deploy_for_inference(model) is first
    assert not first.is_dual  # the auxiliary branch is gone
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # an in-place update, as an optimizer step
    assert deploy_for_inference(model) is not first
    assert deploy_for_inference(model, head="aux") is not deploy_for_inference(model)


def test_batched_prediction_equals_one_image_at_a_time(tmp_path):
    """batch_size > 1 letterboxes to the full size; on square images that is what batch 1 does too, so the
    detections are the same. A corrupt file inside a batch is skipped with its reason, the rest kept."""
    import cv2

    model = _model()
    rng = np.random.default_rng(1)
    for i in range(4):
        cv2.imwrite(str(tmp_path / f"im{i}.png"), rng.integers(0, 255, (128, 128, 3), dtype=np.uint8))
    (tmp_path / "im1b.png").write_bytes(b"not an image")
    one = predict(model, tmp_path, imgsz=128, nms=NMSConfig(conf=0.5), device="cpu")
    three = predict(model, tmp_path, imgsz=128, nms=NMSConfig(conf=0.5), device="cpu", batch_size=3)
    assert [r.path for r in three] == [r.path for r in one] and len(three) == 4
    assert [Path(p).name for p, _ in three.skipped] == ["im1b.png"] and "decode" in three.skipped[0][1]
    for a, b in zip(one, three):
        assert len(a.boxes) == len(b.boxes) > 0
        np.testing.assert_allclose(b.scores, a.scores, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(b.boxes, a.boxes, atol=1.0)
    assert list(three.speed.columns) == ["path", "load_ms", "preprocess_ms", "inference_ms", "nms_ms"]
