"""The segment, pose and OBB heads on our kernels (inside the captured path) against the reference backend's
torch post-processing, which the task tests hold to ultralytics. One square input (rect=False): one network a
model under the interpreter; the rectangles' heads are test_rect_letterbox's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import calibrated_model, match_detections, real_photos

import yolojet
from yolojet.engine.engine import Engine


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


@pytest.mark.parametrize(("cfg", "end2end"), [("yolov8n-seg.yaml", None), ("yolo26n-seg.yaml", True)])
def test_kernel_path_matches_torch_path(cfg, end2end, tmp_path):
    imgsz, conf = (640, 0.01) if torch.cuda.is_available() else (128, 0.0003)
    model_dir = yolojet.export(calibrated_model(cfg, imgsz), out=tmp_path / "m", imgsz=imgsz, end2end=end2end)
    kernels = Engine.load(model_dir, backend="triton", half=False, max_batch=2, tune=False, rect=False)
    torch_path = Engine.load(model_dir, device="cpu", backend="reference", max_batch=2, rect=False)
    photos = [real_photos()["bus.jpg"], real_photos()["zidane.jpg"]]
    ours, expected = kernels(photos, conf=conf), torch_path(photos, conf=conf)
    instances = 0
    for got, want in zip(ours, expected, strict=True):
        assert not match_detections(got.boxes.data, want.boxes.data)
        assert got.masks.data.shape == want.masks.data.shape
        assert got.masks.data.shape[1:] == want.orig_shape
        for a, b in zip(got.masks.data, want.masks.data, strict=True):
            assert mask_iou(a, b) >= 0.99 or np.logical_xor(a, b).sum() <= 2
        instances += len(got)
    assert instances >= 2


def kernel_and_torch_results(cfg, end2end, tmp_path, conf_cpu):
    imgsz, conf = (640, 0.01) if torch.cuda.is_available() else (128, conf_cpu)
    model_dir = yolojet.export(calibrated_model(cfg, imgsz), out=tmp_path / "m", imgsz=imgsz, end2end=end2end)
    kernels = Engine.load(model_dir, backend="triton", half=False, max_batch=2, tune=False, rect=False)
    torch_path = Engine.load(model_dir, device="cpu", backend="reference", max_batch=2, rect=False)
    photos = [real_photos()["bus.jpg"], real_photos()["zidane.jpg"]]
    return kernels(photos, conf=conf), torch_path(photos, conf=conf)


@pytest.mark.parametrize(("cfg", "end2end"), [("yolo11n-pose.yaml", None), ("yolo26n-pose.yaml", True)])
def test_pose_kernel_path_matches_torch_path(cfg, end2end, tmp_path):
    ours, expected = kernel_and_torch_results(cfg, end2end, tmp_path, 0.0003)
    instances = 0
    for got, want in zip(ours, expected, strict=True):
        assert not match_detections(got.boxes.data, want.boxes.data)
        np.testing.assert_allclose(got.keypoints.data, want.keypoints.data, atol=0.05)
        instances += len(got)
    assert instances >= 2


@pytest.mark.parametrize(("cfg", "end2end"), [("yolo11n-obb.yaml", None), ("yolo26n-obb.yaml", True)])
def test_obb_kernel_path_matches_torch_path(cfg, end2end, tmp_path):
    ours, expected = kernel_and_torch_results(cfg, end2end, tmp_path, 0.0003)
    instances = 0
    for got, want in zip(ours, expected, strict=True):
        assert got.obb.data.shape == want.obb.data.shape
        np.testing.assert_allclose(got.obb.data, want.obb.data, atol=0.05, rtol=1e-4)
        instances += len(got)
    assert instances >= 2
