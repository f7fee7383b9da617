"""Oriented boxes: our OBB post-processing on the reference executor's raw output against ultralytics' predict.

Models have random weights with BatchNorm statistics measured on the shipped photos (`support.calibrated_model`).
OBB models default to imgsz 1024; we export and predict at 640 to keep the CPU run short (the post-processing
does not depend on the input size beyond the letterbox, which the synthetic tests below vary). conf is 0.005:
it gives a few dozen boxes on bus.jpg and a few on astronaut (none on the other photos, whose emptiness is
compared too), and NMS drops some of the candidates.

A match is: the same count, and for every ultralytics box one of ours with the same class, rotated IoU ≥ 0.99
and |Δconf| ≤ 0.01. The rotated IoU is the exact polygon IoU of the two rectangles (Sutherland–Hodgman clipping
in float64, `support.rotated_iou`), independent of the probabilistic IoU that the NMS uses.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from support import calibrated_model, letterboxed, match_rotated, real_photos, rotated_iou, ultralytics_results

import yolojet
from yolojet.errors import EngineConfigError
from yolojet.geometry import Letterbox
from yolojet.reference.obb import batch_probiou, obb_postprocess
from yolojet.tasks.obb import OBB

IMGSZ = 640  # OBB's default is 1024; 640 keeps the test fast
CONF = 0.005


def test_polygon_iou_helper():
    """The IoU the comparison relies on, on cases with known answers."""
    square = np.array([0.0, 0.0, 2.0, 2.0, 0.0])
    assert rotated_iou(square, square) == pytest.approx(1.0)
    assert rotated_iou(square, np.array([1.0, 0.0, 2.0, 2.0, 0.0])) == pytest.approx(2 / 6)
    assert rotated_iou(square, np.array([0.0, 0.0, 2.0, 2.0, np.pi / 2])) == pytest.approx(1.0)
    # A square turned 45° over itself: the intersection is a regular octagon of area 8(√2 − 1).
    octagon = 8 * (np.sqrt(2) - 1)
    assert rotated_iou(square, np.array([0.0, 0.0, 2.0, 2.0, np.pi / 4])) == pytest.approx(octagon / (8 - octagon))
    assert rotated_iou(square, np.array([5.0, 0.0, 2.0, 2.0, 0.3])) == 0.0


# -- against ultralytics' predict ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("cfg", "end2end"),
    [("yolov8n-obb.yaml", None), ("yolo11n-obb.yaml", None), ("yolo26n-obb.yaml", None), ("yolo26n-obb.yaml", True)],
)
def test_obb_matches_ultralytics_predict(cfg, end2end, tmp_path):
    model = calibrated_model(cfg, IMGSZ)
    model_dir = yolojet.export(model, out=tmp_path / "model", imgsz=IMGSZ, end2end=end2end)
    reference = yolojet.load_reference(model_dir)
    meta = reference.meta
    assert meta.task == "obb" and meta.end2end == bool(end2end)
    photos = real_photos()
    x, boxes = letterboxed(photos, IMGSZ)
    ours = obb_postprocess(reference(x), boxes, nc=meta.nc, conf=CONF, iou=0.7, max_det=300, end2end=meta.end2end)
    expected = ultralytics_results(model, cfg, list(photos.values()), IMGSZ, bool(end2end), CONF)
    total = 0
    for (name, image), rows, result in zip(photos.items(), ours, expected, strict=True):
        theirs = result.obb.data.numpy()
        assert rows.shape[1] == 7 and rows.dtype == torch.float32
        problems = match_rotated(rows.numpy(), theirs)
        assert not problems, f"{cfg} on {name}: {problems[:3]}"
        # Our result type gives the same corners, in the same order, as ultralytics' (up to the network's
        # float differences, a fraction of a pixel; the conversion itself is checked exactly below).
        obb = OBB(rows.numpy(), image.shape[:2])
        assert len(obb) == len(result.obb)
        if len(obb):
            order = [int(np.argmin(np.abs(obb.xywhr - row[:5]).sum(1))) for row in theirs]
            assert np.abs(obb.xyxyxyxy[order] - result.obb.xyxyxyxy.numpy()).max() < 1.0
            assert np.abs(obb.xyxy[order] - result.obb.xyxy.numpy()).max() < 1.0
        total += len(theirs)
    assert total >= 5, "the comparison needs detections to mean something"


# -- seeded synthetic heads: NMS, options and letterbox mapping against ultralytics' own functions --------


def synthetic_obb_head(seed: int, nc: int, anchors: int, imgsz: tuple[int, int]) -> torch.Tensor:
    """(2, 4 + nc + 1, A): boxes clustered around a few centres so that many overlap, scores spread over (0, 1)."""
    g = torch.Generator().manual_seed(seed)
    h, w = imgsz
    centres = torch.rand(2, 2, 8, generator=g) * torch.tensor([w, h]).view(1, 2, 1)
    pick = torch.randint(0, 8, (2, anchors), generator=g)
    xy = centres.gather(2, pick[:, None].expand(-1, 2, -1)) + torch.randn(2, 2, anchors, generator=g) * 6
    wh = torch.rand(2, 2, anchors, generator=g) * 120 + 4
    scores = torch.rand(2, nc, anchors, generator=g) ** 3
    angle = (torch.rand(2, 1, anchors, generator=g) - 0.25) * torch.pi
    return torch.cat([xy, wh, scores, angle], 1)


@pytest.mark.parametrize(
    ("seed", "options", "orig"),
    [
        (0, {}, [(480, 640), (1080, 810)]),
        (1, {"agnostic": True}, [(333, 500), (640, 640)]),
        (2, {"classes": [1, 3], "max_det": 7}, [(97, 1203), (720, 1280)]),
        (3, {"iou": 0.3}, [(1, 900), (900, 7)]),
    ],
)
def test_rotated_nms_and_scaling_match_ultralytics(seed, options, orig):
    from ultralytics.utils.metrics import batch_probiou as their_probiou
    from ultralytics.utils.nms import non_max_suppression
    from ultralytics.utils.ops import scale_boxes

    nc, imgsz = 4, (640, 640)
    preds = synthetic_obb_head(seed, nc, 2000, imgsz)
    conf, iou, max_det = 0.2, options.get("iou", 0.7), options.get("max_det", 300)
    classes, agnostic = options.get("classes"), options.get("agnostic", False)
    boxes = [Letterbox.fit(hw, imgsz) for hw in orig]
    ours = obb_postprocess(preds, boxes, nc=nc, conf=conf, iou=iou, max_det=max_det, classes=classes, agnostic=agnostic)
    theirs = non_max_suppression(
        preds.clone(), conf, iou, classes, agnostic, max_det=max_det, nc=nc, rotated=True, max_time_img=math.inf
    )
    for rows, pred, hw in zip(ours, theirs, orig, strict=True):
        rboxes = torch.cat([pred[:, :4], pred[:, -1:]], -1)
        rboxes[:, :4] = scale_boxes(imgsz, rboxes[:, :4], hw, xywh=True)
        expected = torch.cat([rboxes, pred[:, 4:6]], -1)  # OBBPredictor.construct_result
        assert rows.shape == expected.shape
        assert len(rows) >= 1
        torch.testing.assert_close(rows, expected, rtol=0, atol=1e-4)
        if classes is not None:
            assert set(rows[:, 6].tolist()) <= set(classes)
    # NMS really suppressed boxes, and our probiou is ultralytics' to the bit.
    candidates = int((preds[0, 4 : 4 + nc].amax(0) > conf).sum())
    assert len(ours[0]) < candidates
    sample = preds[0, [0, 1, 2, 3, -1], :300].T
    assert torch.equal(batch_probiou(sample, sample), their_probiou(sample, sample))


def test_end2end_rows_filtered_like_ultralytics():
    from ultralytics.utils.nms import non_max_suppression

    g = torch.Generator().manual_seed(3)
    rows = torch.cat(
        [
            torch.rand(2, 300, 2, generator=g) * 640,
            torch.rand(2, 300, 2, generator=g) * 100 + 1,
            torch.rand(2, 300, 1, generator=g).sort(1, descending=True).values,
            torch.randint(0, 5, (2, 300, 1), generator=g).float(),
            (torch.rand(2, 300, 1, generator=g) - 0.25) * torch.pi,
        ],
        -1,
    )
    boxes = [Letterbox.fit((427, 640), (640, 640)), Letterbox.fit((640, 360), (640, 640))]
    ours = obb_postprocess(rows, boxes, nc=5, conf=0.4, iou=0.7, max_det=50, classes=[0, 2], end2end=True)
    theirs = non_max_suppression(
        rows.clone(), 0.4, 0.7, [0, 2], max_det=50, nc=5, end2end=True, rotated=True, max_time_img=math.inf
    )
    for mine, pred, box in zip(ours, theirs, boxes, strict=True):
        assert len(mine) == len(pred) > 0
        torch.testing.assert_close(mine[:, [5, 6]], pred[:, [4, 5]])
        torch.testing.assert_close(mine[:, 4], pred[:, 6])
        torch.testing.assert_close(mine[:, 2] * box.new_w / box.orig_w, pred[:, 2])


def test_obb_corners_match_ultralytics():
    from ultralytics.engine.results import OBB as TheirOBB

    g = torch.Generator().manual_seed(5)
    data = torch.cat(
        [torch.rand(9, 4, generator=g) * 200, torch.randn(9, 1, generator=g) * 2, torch.rand(9, 2, generator=g)], 1
    )
    theirs, ours = TheirOBB(data, (300, 400)), OBB(data.numpy(), (300, 400))
    assert len(ours) == 9
    np.testing.assert_allclose(ours.xyxyxyxy, theirs.xyxyxyxy.numpy(), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(ours.xyxyxyxyn, theirs.xyxyxyxyn.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours.xyxy, theirs.xyxy.numpy(), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(ours.xywhr, theirs.xywhr.numpy())
    np.testing.assert_array_equal(ours.conf, theirs.conf.numpy())
    np.testing.assert_array_equal(ours.cls, theirs.cls.numpy())
    assert len(OBB(np.zeros((0, 7), np.float32), (10, 10)).xyxy) == 0
    with pytest.raises(ValueError, match="expected"):
        OBB(np.zeros((3, 6), np.float32), (10, 10))


def test_obb_postprocess_rejects_mismatched_inputs():
    preds = torch.zeros(1, 4 + 3 + 1, 100)
    box = [Letterbox.fit((480, 640), (640, 640))]
    with pytest.raises(EngineConfigError, match="4 \\+ 5 \\+ 1"):
        obb_postprocess(preds, box, nc=5, conf=0.25, iou=0.7, max_det=300)
    with pytest.raises(EngineConfigError, match="rows of 7"):
        obb_postprocess(preds, box, nc=3, conf=0.25, iou=0.7, max_det=300, end2end=True)
    with pytest.raises(EngineConfigError, match="2 letterboxes"):
        obb_postprocess(preds, box * 2, nc=3, conf=0.25, iou=0.7, max_det=300)
    with pytest.raises(EngineConfigError, match="conf"):
        obb_postprocess(preds, box, nc=3, conf=1.5, iou=0.7, max_det=300)
    with pytest.raises(EngineConfigError, match="classes"):
        obb_postprocess(preds, box, nc=3, conf=0.25, iou=0.7, max_det=300, classes=[3])
    with pytest.raises(EngineConfigError, match="3-d"):
        obb_postprocess(preds[0], box, nc=3, conf=0.25, iou=0.7, max_det=300)
    assert [len(r) for r in obb_postprocess((preds,), box, nc=3, conf=0.25, iou=0.7, max_det=300)] == [0]
