"""The OBB metric against ultralytics' own pieces (probiou, `match_predictions`, `ap_per_class`) on random
scenes, the rectangle fit against cv2.minAreaRect, and `yolojet val` of an OBB model on DOTA-style labels
whose ground truth is ultralytics' own rotated boxes with the same weights."""

from __future__ import annotations

import types

import cv2
import numpy as np
import pytest
import torch
from support import calibrated_model, real_photos

import yolojet
from yolojet.engine.engine import Engine
from yolojet.errors import DatasetError
from yolojet.eval.datasets import load_dataset
from yolojet.eval.obb import evaluate_obb, quad_to_xywhr
from yolojet.eval.val import validate
from yolojet.reference.obb import batch_probiou


def random_rboxes(rng, n: int) -> np.ndarray:
    return np.stack(
        [
            rng.uniform(50, 590, n),
            rng.uniform(50, 430, n),
            rng.uniform(10, 120, n),
            rng.uniform(10, 120, n),
            rng.uniform(-np.pi / 2, np.pi / 2, n),
        ],
        1,
    )


def corners(rboxes: np.ndarray) -> np.ndarray:
    return np.stack([cv2.boxPoints(((b[0], b[1]), (b[2], b[3]), np.degrees(b[4]))) for b in rboxes]).astype(np.float64)


def test_rectangle_fit_equals_min_area_rect():
    rng = np.random.default_rng(0)
    quads = corners(random_rboxes(rng, 50)) + rng.normal(0, 1.5, (50, 4, 2))  # labelled quads are not exact
    ours = quad_to_xywhr(quads)
    theirs = []
    for quad in quads.astype(np.float32):
        (cx, cy), (w, h), angle = cv2.minAreaRect(quad)
        theirs.append([cx, cy, w, h, np.radians(angle)])
    theirs = np.array(theirs)
    # The same area as OpenCV's, and each rectangle encloses its quad: a minimum-area enclosing rectangle. (Where
    # two sides give rectangles of all but equal area, float32 OpenCV and float64 here may pick different ones.)
    np.testing.assert_allclose(ours[:, 2] * ours[:, 3], theirs[:, 2] * theirs[:, 3], rtol=1e-4)
    for (cx, cy, w, h, angle), quad in zip(ours, quads, strict=True):
        u, v = np.array([np.cos(angle), np.sin(angle)]), np.array([-np.sin(angle), np.cos(angle)])
        offsets = quad - [cx, cy]
        assert np.all(np.abs(offsets @ u) <= w / 2 + 1e-6) and np.all(np.abs(offsets @ v) <= h / 2 + 1e-6)
    same = batch_probiou(torch.from_numpy(ours), torch.from_numpy(theirs)).diagonal()
    # probiou of a box with itself is 0.99955 (its epsilons); most pairs are the very same rectangle
    assert float(same.median()) >= 0.9995


def ultralytics_obb_map(truth, found) -> tuple[float, float]:
    from ultralytics.engine.validator import BaseValidator
    from ultralytics.utils.metrics import ap_per_class
    from ultralytics.utils.metrics import batch_probiou as their_probiou

    holder = types.SimpleNamespace(iouv=torch.linspace(0.5, 0.95, 10))
    tps, confs, classes, targets = [], [], [], []
    for image_id, (boxes, cls) in truth.items():
        pred_boxes, conf, pred_cls = found[image_id]
        targets.append(cls)
        iou = their_probiou(torch.from_numpy(boxes), torch.from_numpy(pred_boxes))
        tp = BaseValidator.match_predictions(holder, torch.from_numpy(pred_cls), torch.from_numpy(cls), iou)
        tps.append(tp.numpy())
        confs.append(conf)
        classes.append(pred_cls)
    ap = ap_per_class(np.concatenate(tps), np.concatenate(confs), np.concatenate(classes), np.concatenate(targets))[5]
    return float(ap.mean()), float(ap[:, 0].mean())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metric_equals_ultralytics(seed):
    """Scenes of near-misses: predictions are jittered, duplicated, mislabelled and invented ground-truth boxes."""
    rng = np.random.default_rng(seed)
    truth, found = {}, {}
    for image_id in range(6):
        n = int(rng.integers(1, 9))
        boxes, cls = random_rboxes(rng, n), rng.integers(0, 3, n)
        truth[image_id] = (boxes, cls)
        noisy = boxes + rng.normal(0, 1, boxes.shape) * [3, 3, 4, 4, 0.05]
        extra = random_rboxes(rng, int(rng.integers(0, 4)))
        pred = np.concatenate([noisy, noisy[: n // 2], extra])
        pred_cls = np.concatenate([cls, cls[: n // 2], rng.integers(0, 3, len(extra))])
        flip = rng.random(len(pred_cls)) < 0.15
        pred_cls = np.where(flip, (pred_cls + 1) % 3, pred_cls)
        found[image_id] = (pred, rng.uniform(0.01, 1, len(pred)), pred_cls)
    ours = evaluate_obb(truth, found)
    theirs = ultralytics_obb_map(truth, found)
    assert 0.05 < ours.map50_95 < 0.95, "the scene should be neither trivial nor hopeless"
    assert (ours.map50_95, ours.map50) == pytest.approx(theirs, abs=1e-9)


def test_perfect_and_empty():
    rng = np.random.default_rng(3)
    boxes, cls = random_rboxes(rng, 4), np.array([0, 1, 1, 2])
    perfect = evaluate_obb({1: (boxes, cls)}, {1: (boxes, np.linspace(0.9, 0.6, 4), cls)})
    # ultralytics' interpolation drops precision to 0 at the last of the 101 recall points: perfect is 0.995.
    assert perfect.map50_95 == pytest.approx(0.995) and perfect.per_class_ap == pytest.approx(
        {0: 0.995, 1: 0.995, 2: 0.995}
    )
    assert evaluate_obb({1: (boxes, cls)}, {}).map50_95 == 0.0


def ultralytics_obb(model, image: np.ndarray, conf: float):
    from copy import deepcopy

    from ultralytics import YOLO

    wrapper = YOLO("yolo11n-obb.yaml", verbose=False)
    wrapper.model = deepcopy(model)
    return wrapper.predict(image, imgsz=640, conf=conf, verbose=False, rect=False)[0].cpu().obb


@pytest.fixture(scope="module")
def obb_dataset(tmp_path_factory):
    """DOTA-style labels (class x1 y1 ... x4 y4, normalized) under a dataset YAML: ultralytics' own rotated boxes
    that lie inside their image (labels must; random weights also predict boxes reaching outside)."""
    root = tmp_path_factory.mktemp("dota")
    (root / "images" / "val").mkdir(parents=True)
    (root / "labels" / "val").mkdir(parents=True)
    model = calibrated_model("yolo11n-obb.yaml", 640)
    objects = 0
    for name, bgr in real_photos().items():
        stem = name.split(".")[0]
        cv2.imwrite(str(root / "images" / "val" / f"{stem}.png"), bgr)
        obb = ultralytics_obb(model, bgr, 0.005)
        h, w = bgr.shape[:2]
        lines = []
        for quad, cls in zip(obb.xyxyxyxy.cpu().numpy(), obb.cls.cpu().numpy(), strict=True):
            normalized = (quad / [w, h]).reshape(-1)
            if normalized.min() >= 0 and normalized.max() <= 1:
                lines.append(" ".join([str(int(cls))] + [f"{v:.8f}" for v in normalized]))
        objects += len(lines)
        (root / "labels" / "val" / f"{stem}.txt").write_text("\n".join(lines))
    names = "\n".join(f"  {i}: {n}" for i, n in model.names.items())
    (root / "data.yaml").write_text(f"path: {root}\nval: images/val\nnames:\n{names}\n")
    assert objects >= 10, "the check needs objects to mean something"
    model_dir = yolojet.export(model, out=root / "model", imgsz=640)
    return root, model, Engine.load(model_dir, device="cpu", backend="reference", max_batch=5, rect=False)


def test_val_of_an_obb_model_scores_like_ultralytics_predictions(obb_dataset):
    """yolojet's rotated boxes through its predict path and ultralytics' own predict's, each at val's conf 0.001, score
    alike on the same labels (the validator's protocol: test_val_protocol)."""
    root, model, engine = obb_dataset
    dataset = load_dataset(root / "data.yaml")
    result = validate(engine, dataset, progress=False, protocol="predict")
    assert result.predictions and {"rbox", "poly", "score"} <= result.predictions[0].keys()
    to_category = {i: i for i in model.names}
    theirs = {}
    for image in dataset.images:
        obb = ultralytics_obb(model, cv2.imread(str(image.path)), 0.001)
        theirs[image.id] = (
            obb.xywhr.cpu().numpy().astype(np.float64),
            obb.conf.cpu().numpy().astype(np.float64),
            np.array([to_category[int(c)] for c in obb.cls.cpu()], dtype=np.int64),
        )
    from yolojet.eval.val import _obb_truth

    expected = evaluate_obb(_obb_truth(dataset), theirs)
    assert expected.map50 >= 0.5, "ultralytics' own boxes must find their labels"
    assert abs(result.scores.map50_95 - expected.map50_95) <= 0.005
    assert abs(result.scores.map50 - expected.map50) <= 0.005


def test_obb_model_needs_four_point_labels(obb_dataset, tmp_path):
    root, _, engine = obb_dataset
    dataset = load_dataset(root / "data.yaml")
    dataset.ground_truth["annotations"][0].pop("segmentation")
    with pytest.raises(DatasetError, match="not a four-point polygon"):
        validate(engine, dataset, progress=False)
