"""Level 3: images in, boxes out — the same detections as ultralytics' predict with the same weights.

Models have random weights with BatchNorm statistics measured on the shipped photos (see
`support.calibrated_model`), which keeps scores image-dependent; conf is set to 0.005 so that each
photo yields a few to a few dozen boxes. A match is: same count, and for every ultralytics box one
of ours with the same class, IoU ≥ 0.99 and |Δconf| ≤ 0.01.

ultralytics' predict letterboxes an image to the smallest stride-multiple rectangle that holds it (rect=True), and so
does an engine by default: each image is compared with plain predict() of that image alone, on the shipped photos of
five aspect ratios and on frames of extreme ones (10:1 and 1:10). An engine with rect=False letterboxes to its square
input, as predict(rect=False) does.
"""

from __future__ import annotations

import pytest
import torch
from support import calibrated_model, extreme_frames, match_detections, real_photos

import yolojet
from yolojet.engine.engine import Engine

CONF = 0.005


def ultralytics_predict(model, cfg: str, image, imgsz, end2end: bool, rect: bool = True, conf: float = CONF):
    from copy import deepcopy

    from ultralytics import YOLO

    wrapper = YOLO(cfg, verbose=False)
    wrapper.model = deepcopy(model)  # predict fuses the model it is given in place
    wrapper.model.end2end = end2end
    nms = False if end2end else None
    result = wrapper.predict(image, imgsz=imgsz, conf=conf, verbose=False, nms=nms, rect=rect)[0]
    return torch.cat([result.boxes.xyxy, result.boxes.conf[:, None], result.boxes.cls[:, None]], 1)


@pytest.mark.parametrize(
    ("cfg", "end2end"), [("yolov8n.yaml", None), ("yolo11n.yaml", None), ("yolo26n.yaml", None), ("yolo26n.yaml", True)]
)
def test_reference_backend_matches_ultralytics_predict(cfg, end2end, tmp_path):
    model = calibrated_model(cfg)
    model_dir = yolojet.export(model, out=tmp_path / "model", imgsz=640, end2end=end2end)
    engine = Engine.load(model_dir, device="cpu", backend="reference", max_batch=4)
    photos = {**real_photos(), **extreme_frames()}
    results = engine(list(photos.values()), conf=CONF)
    total = 0
    for (name, image), result in zip(photos.items(), results, strict=True):
        expected = ultralytics_predict(model, cfg, image, 640, bool(end2end))
        assert result.boxes.orig_shape == image.shape[:2]
        problems = match_detections(result.boxes.data, expected)
        assert not problems, f"{cfg} on {name}: {problems[:3]}"
        total += len(expected)
    assert total >= 10, "the comparison needs detections to mean something"


def test_square_letterbox_matches_predict_without_rect(tmp_path):
    model = calibrated_model("yolo11n.yaml")
    model_dir = yolojet.export(model, out=tmp_path / "model", imgsz=640)
    engine = Engine.load(model_dir, device="cpu", backend="reference", rect=False)
    image = real_photos()["bus.jpg"]
    expected = ultralytics_predict(model, "yolo11n.yaml", image, 640, False, rect=False)
    problems = match_detections(engine(image, conf=CONF)[0].boxes.data, expected)
    assert not problems, problems[:3]
    assert len(expected) >= 3
    assert engine.shapes() == [(640, 640)]


def test_rectangular_engine_matches_default_predict(tmp_path):
    """bus.jpg is 1080x810: predict's own rectangle is 640x480, so an engine built for 640x480 must agree."""
    model = calibrated_model("yolo11n.yaml")
    model_dir = yolojet.export(model, out=tmp_path / "model", imgsz=(640, 480))
    engine = Engine.load(model_dir, device="cpu", backend="reference")
    image = real_photos()["bus.jpg"]
    expected = ultralytics_predict(model, "yolo11n.yaml", image, 640, False, rect=True)
    problems = match_detections(engine(image, conf=CONF)[0].boxes.data, expected)
    assert not problems, problems[:3]
    assert len(expected) >= 3


@pytest.mark.parametrize(("cfg", "end2end"), [("yolov8n.yaml", None), ("yolo11n.yaml", None), ("yolo26n.yaml", True)])
def test_triton_pipeline_matches_ultralytics_predict(cfg, end2end, tmp_path):
    """The whole path on our kernels (preprocess, network of each image's rectangle, decode, NMS or top-k selection,
    box mapping): on the GPU at 640, or under Triton's interpreter at 160 to keep the CPU run short. fp32, so that
    boxes scoring right at the threshold cannot flip (fp16 accuracy is checked on raw outputs elsewhere)."""
    imgsz, conf = (640, CONF) if torch.cuda.is_available() else (160, 0.0002)
    model = calibrated_model(cfg, imgsz)
    model_dir = yolojet.export(model, out=tmp_path / "model", imgsz=imgsz, end2end=end2end)
    engine = Engine.load(model_dir, backend="triton", half=False, max_batch=2, tune=False)
    photos = {k: v for k, v in real_photos().items() if k in ("bus.jpg", "zidane.jpg")} | extreme_frames()
    results = engine(list(photos.values()), conf=conf)
    assert len(engine.shapes()) == 1 + len(photos), engine.shapes()  # a network for each photo's own rectangle
    total = 0
    for (name, image), result in zip(photos.items(), results, strict=True):
        expected = ultralytics_predict(model, cfg, image, imgsz, bool(end2end), conf=conf)
        problems = match_detections(result.boxes.data, expected)
        assert not problems, f"{cfg} on {name}: {problems[:3]}"
        total += len(expected)
    assert total >= 3
