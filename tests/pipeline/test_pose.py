"""Pose: our post-processing on the reference executor's raw output against ultralytics' predict.

Models have random weights with BatchNorm statistics measured on the shipped photos (`support.calibrated_model`),
exported and predicted at 640 on a square input (predict(rect=False)). conf is chosen per model to give several
instances per model while staying clear of ties: 0.005 for yolo11n/yolo26n-pose (80 classes, a few dozen
instances on bus.jpg and a few on astronaut); 0.02 for yolov8n-pose (1 class), whose scores at 0.005 sit on a
plateau of ~400 near-equal candidates per photo where NMS would only test tie order, and for the custom 2-class
model, whose two class scores come within 1e-6 of each other below 0.02 (the class would then be a coin toss
between two float32 computations; at 0.02 the closest pair is 3e-3 apart).

A match is: boxes matched one-to-one by `support.match_detections` (same count, same class, IoU ≥ 0.99,
|Δconf| ≤ 0.01), and for each matched pair every keypoint within 1 px in the original image and its visibility
within 0.01.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from support import calibrated_model, detection_pairs, letterboxed, match_detections, real_photos, ultralytics_results

import yolojet
from yolojet.errors import EngineConfigError
from yolojet.geometry import Letterbox
from yolojet.reference.pose import pose_postprocess
from yolojet.tasks.pose import Keypoints

IMGSZ = 640


def pairs(ours: torch.Tensor, theirs: torch.Tensor) -> list[int]:
    """For each ultralytics box, the index of our box `match_detections` pairs it with (all are matched)."""
    return [j for j, _ in detection_pairs(ours, theirs)]


def compare_with_ultralytics(model, cfg: str, model_dir, end2end: bool, conf: float) -> dict[str, float]:
    """Run export → reference → our post-processing and ultralytics' predict on the photos; assert they match."""
    reference = yolojet.load_reference(model_dir)
    meta = reference.meta
    assert meta.task == "pose" and meta.end2end == end2end
    assert meta.kpt_shape == tuple(model.model[-1].kpt_shape)
    photos = real_photos()
    x, boxes = letterboxed(photos, IMGSZ)
    ours = pose_postprocess(
        reference(x), boxes, nc=meta.nc, kpt_shape=meta.kpt_shape, conf=conf, iou=0.7, max_det=300, end2end=end2end
    )
    expected = ultralytics_results(model, cfg, list(photos.values()), IMGSZ, end2end, conf)
    stats = {"instances": 0, "xy": 0.0, "visibility": 0.0}
    for (name, image), (rows, keypoints), result in zip(photos.items(), ours, expected, strict=True):
        theirs = result.boxes.data
        assert rows.shape == (len(rows), 6) and keypoints.shape == (len(rows), *meta.kpt_shape)
        problems = match_detections(rows, theirs)
        assert not problems, f"{cfg} on {name}: {problems[:3]}"
        if not len(theirs):
            continue
        mine = keypoints[pairs(rows, theirs)]
        their_kpts = result.keypoints.data
        stats["xy"] = max(stats["xy"], float((mine[..., :2] - their_kpts[..., :2]).abs().max()))
        assert stats["xy"] <= 1.0, f"{cfg} on {name}: keypoints {stats['xy']:.3f} px apart"
        if meta.kpt_shape[1] == 3:
            stats["visibility"] = max(stats["visibility"], float((mine[..., 2] - their_kpts[..., 2]).abs().max()))
            assert stats["visibility"] <= 0.01, f"{cfg} on {name}: visibility differs by {stats['visibility']:.4f}"
        # Keypoints are clipped to the image, as ultralytics' scale_coords does.
        h0, w0 = image.shape[:2]
        assert (keypoints[..., 0] >= 0).all() and (keypoints[..., 0] <= w0).all()
        assert (keypoints[..., 1] >= 0).all() and (keypoints[..., 1] <= h0).all()
        result_keypoints = Keypoints(keypoints.numpy(), (h0, w0))
        assert len(result_keypoints) == len(rows)
        assert (result_keypoints.conf is None) == (meta.kpt_shape[1] == 2)
        stats["instances"] += len(theirs)
    assert stats["instances"] >= 5, "the comparison needs detections to mean something"
    return stats


@pytest.mark.parametrize(
    ("cfg", "end2end", "conf"),
    [
        ("yolov8n-pose.yaml", None, 0.02),
        ("yolo11n-pose.yaml", None, 0.005),
        ("yolo26n-pose.yaml", None, 0.005),
        ("yolo26n-pose.yaml", True, 0.005),
    ],
)
def test_pose_matches_ultralytics_predict(cfg, end2end, conf, tmp_path):
    model = calibrated_model(cfg, IMGSZ)
    model_dir = yolojet.export(model, out=tmp_path / "model", imgsz=IMGSZ, end2end=end2end)
    compare_with_ultralytics(model, cfg, model_dir, bool(end2end), conf)


def test_custom_keypoint_shape_runs_through(tmp_path):
    """A yolo11n-pose with 2 classes and 5 keypoints of (x, y) only: export, reference, post-processing."""
    import yaml
    from ultralytics.nn.tasks import yaml_model_load

    cfg_dict = yaml_model_load("yolo11n-pose.yaml")
    cfg_dict.update(kpt_shape=[5, 2], nc=2)
    cfg_dict.pop("yaml_file", None)
    cfg = tmp_path / "yolo11n-pose-k5.yaml"  # the name carries the scale, "n"
    cfg.write_text(yaml.safe_dump(cfg_dict))
    model = calibrated_model(str(cfg), IMGSZ)
    assert tuple(model.model[-1].kpt_shape) == (5, 2) and len(model.names) == 2
    model_dir = yolojet.export(model, out=tmp_path / "model", imgsz=IMGSZ)
    stats = compare_with_ultralytics(model, str(cfg), model_dir, False, 0.02)
    assert stats["visibility"] == 0.0


# -- seeded synthetic heads: NMS, options, clipping and the one-to-one path against ultralytics' functions ---------


def synthetic_pose_head(seed: int, nc: int, kpt_shape: tuple[int, int], anchors: int) -> torch.Tensor:
    """(2, 4 + nc + nk, A): overlapping boxes, spread scores, keypoints reaching past the image on every side."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(2, 2, 6, generator=g) * 640
    pick = torch.randint(0, 6, (2, anchors), generator=g)
    xy = centres.gather(2, pick[:, None].expand(-1, 2, -1)) + torch.randn(2, 2, anchors, generator=g) * 5
    wh = torch.rand(2, 2, anchors, generator=g) * 150 + 4
    scores = torch.rand(2, nc, anchors, generator=g) ** 3
    n, d = kpt_shape
    kpts = torch.rand(2, n, d, anchors, generator=g) * 800 - 80
    if d == 3:
        kpts[:, :, 2] = torch.rand(2, n, anchors, generator=g)
    return torch.cat([xy, wh, scores, kpts.view(2, n * d, anchors)], 1)


@pytest.mark.parametrize(
    ("seed", "kpt_shape", "options", "orig"),
    [
        (0, (17, 3), {}, [(480, 640), (1080, 810)]),
        (1, (17, 3), {"agnostic": True, "max_det": 5}, [(333, 500), (640, 640)]),
        (2, (5, 2), {"classes": [0, 2]}, [(97, 1203), (720, 1280)]),
        (3, (1, 3), {"iou": 0.3}, [(1, 900), (900, 7)]),
    ],
)
def test_nms_and_keypoint_scaling_match_ultralytics(seed, kpt_shape, options, orig):
    from ultralytics.utils.nms import non_max_suppression
    from ultralytics.utils.ops import scale_boxes, scale_coords

    nc, imgsz = 3, (640, 640)
    preds = synthetic_pose_head(seed, nc, kpt_shape, 1500)
    conf, iou, max_det = 0.2, options.get("iou", 0.7), options.get("max_det", 300)
    classes, agnostic = options.get("classes"), options.get("agnostic", False)
    boxes = [Letterbox.fit(hw, imgsz) for hw in orig]
    ours = pose_postprocess(
        preds,
        boxes,
        nc=nc,
        kpt_shape=kpt_shape,
        conf=conf,
        iou=iou,
        max_det=max_det,
        classes=classes,
        agnostic=agnostic,
    )
    theirs = non_max_suppression(
        preds.clone(), conf, iou, classes, agnostic, max_det=max_det, nc=nc, max_time_img=math.inf
    )
    clipped = 0
    for (rows, keypoints), pred, hw in zip(ours, theirs, orig, strict=True):
        # PosePredictor.construct_result
        their_rows = pred[:, :6].clone()
        their_rows[:, :4] = scale_boxes(imgsz, their_rows[:, :4], hw)
        their_kpts = scale_coords(imgsz, pred[:, 6:].clone().view(len(pred), *kpt_shape), hw)
        assert len(rows) >= 1 and rows.shape == their_rows.shape and keypoints.shape == their_kpts.shape
        torch.testing.assert_close(rows, their_rows, rtol=0, atol=1e-4)
        torch.testing.assert_close(keypoints, their_kpts, rtol=0, atol=1e-4)
        clipped += int(((keypoints[..., 0] == 0) | (keypoints[..., 0] == hw[1])).sum())
        if classes is not None:
            assert set(rows[:, 5].tolist()) <= set(classes)
    assert clipped > 0, "some keypoints should have been clipped to the image border"


def test_end2end_rows_filtered_like_ultralytics():
    from ultralytics.utils.nms import non_max_suppression
    from ultralytics.utils.ops import scale_coords

    g = torch.Generator().manual_seed(7)
    xy = torch.rand(2, 300, 2, generator=g) * 600
    rows = torch.cat(
        [
            xy,
            xy + torch.rand(2, 300, 2, generator=g) * 100,
            torch.rand(2, 300, 1, generator=g).sort(1, descending=True).values,
            torch.randint(0, 4, (2, 300, 1), generator=g).float(),
            torch.rand(2, 300, 17 * 3, generator=g) * 700 - 30,
        ],
        -1,
    )
    boxes = [Letterbox.fit((427, 640), (640, 640)), Letterbox.fit((640, 360), (640, 640))]
    ours = pose_postprocess(
        rows, boxes, nc=4, kpt_shape=(17, 3), conf=0.3, iou=0.7, max_det=40, classes=[1, 3], end2end=True
    )
    theirs = non_max_suppression(rows.clone(), 0.3, 0.7, [1, 3], max_det=40, nc=4, end2end=True, max_time_img=math.inf)
    for (mine, keypoints), pred, box in zip(ours, theirs, boxes, strict=True):
        assert len(mine) == len(pred) > 0
        torch.testing.assert_close(mine[:, 4:], pred[:, 4:6])
        hw = (box.orig_h, box.orig_w)
        torch.testing.assert_close(keypoints, scale_coords((640, 640), pred[:, 6:].reshape(-1, 17, 3), hw))


def test_keypoints_match_ultralytics():
    from ultralytics.engine.results import Keypoints as TheirKeypoints

    g = torch.Generator().manual_seed(9)
    for dims in (2, 3):
        data = torch.rand(4, 6, dims, generator=g) * 300
        ours, theirs = Keypoints(data.numpy(), (300, 400)), TheirKeypoints(data, (300, 400))
        assert len(ours) == 4
        np.testing.assert_array_equal(ours.xy, theirs.xy.numpy())
        np.testing.assert_allclose(ours.xyn, theirs.xyn.numpy(), rtol=1e-6)
        if dims == 3:
            np.testing.assert_array_equal(ours.conf, theirs.conf.numpy())
        else:
            assert ours.conf is None and theirs.conf is None
    with pytest.raises(ValueError, match="expected"):
        Keypoints(np.zeros((3, 4), np.float32), (10, 10))


def test_pose_postprocess_rejects_mismatched_inputs():
    preds = torch.zeros(1, 4 + 1 + 51, 100)
    box = [Letterbox.fit((480, 640), (640, 640))]
    options = {"conf": 0.25, "iou": 0.7, "max_det": 300}
    with pytest.raises(EngineConfigError, match="4 \\+ 1 \\+ 15"):
        pose_postprocess(preds, box, nc=1, kpt_shape=(5, 3), **options)
    with pytest.raises(EngineConfigError, match="kpt_shape"):
        pose_postprocess(preds, box, nc=1, kpt_shape=(17, 4), **options)
    with pytest.raises(EngineConfigError, match="rows of 6 \\+ 51"):
        pose_postprocess(preds, box, nc=1, kpt_shape=(17, 3), end2end=True, **options)
    with pytest.raises(EngineConfigError, match="2 letterboxes"):
        pose_postprocess(preds, box * 2, nc=1, kpt_shape=(17, 3), **options)
    with pytest.raises(EngineConfigError, match="max_det"):
        pose_postprocess(preds, box, nc=1, kpt_shape=(17, 3), conf=0.25, iou=0.7, max_det=0)
    ((rows, keypoints),) = pose_postprocess((preds,), box, nc=1, kpt_shape=(17, 3), **options)
    assert rows.shape == (0, 6) and keypoints.shape == (0, 17, 3)
