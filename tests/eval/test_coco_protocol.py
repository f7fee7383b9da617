"""The evaluator on hand-made cases whose answers are worked out by hand (COCO's 101-point interpolated AP)."""

from __future__ import annotations

import numpy as np
import pytest

from yolojet.eval.coco import evaluate


def ground_truth(boxes_per_image: dict[int, list[tuple[list[float], int]]]) -> dict:
    images = [{"id": i, "file_name": f"{i}.jpg", "width": 640, "height": 480} for i in boxes_per_image]
    annotations = []
    for image_id, boxes in boxes_per_image.items():
        for box, crowd in boxes:
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": 1,
                    "bbox": box,
                    "area": box[2] * box[3],
                    "iscrowd": crowd,
                }
            )
    return {"images": images, "annotations": annotations, "categories": [{"id": 1, "name": "thing"}]}


def det(image_id: int, box: list[float], score: float) -> dict:
    return {"image_id": image_id, "category_id": 1, "bbox": box, "score": score}


BOX_A, BOX_B = [10.0, 20.0, 100.0, 80.0], [300.0, 200.0, 60.0, 120.0]


def test_perfect_detections_score_one():
    gt = ground_truth({1: [(BOX_A, 0)], 2: [(BOX_B, 0)]})
    scores = evaluate(gt, [det(1, BOX_A, 0.9), det(2, BOX_B, 0.8)])
    assert scores.map50_95 == pytest.approx(1.0) and scores.map50 == pytest.approx(1.0)
    assert scores.per_class_ap == {1: pytest.approx(1.0)}


def test_per_class_ap_covers_only_the_classes_the_ground_truth_has():
    """A class with no annotation has nothing to score: it is left out, not reported as AP 0 (which would pull
    down any mean taken over the per-class values)."""
    gt = ground_truth({1: [(BOX_A, 0)]})
    gt["categories"].append({"id": 2, "name": "never labelled"})
    scores = evaluate(gt, [det(1, BOX_A, 0.9), {"image_id": 1, "category_id": 2, "bbox": BOX_B, "score": 0.5}])
    assert scores.per_class_ap == {1: pytest.approx(1.0)}
    assert evaluate(gt, []).per_class_ap == {1: 0.0}


def test_duplicate_detection_is_a_false_positive():
    """Ranked: TP (0.9), duplicate of it (0.8, FP), TP (0.7). Precision is 1 up to recall 0.5 and 2/3 after:
    AP = (51·1 + 50·2/3) / 101 at every IoU threshold."""
    gt = ground_truth({1: [(BOX_A, 0)], 2: [(BOX_B, 0)]})
    scores = evaluate(gt, [det(1, BOX_A, 0.9), det(1, BOX_A, 0.8), det(2, BOX_B, 0.7)])
    assert scores.map50_95 == pytest.approx((51 + 50 * 2 / 3) / 101, abs=1e-6)


def test_detection_on_a_crowd_region_is_ignored():
    gt = ground_truth({1: [(BOX_A, 0), (BOX_B, 1)]})
    scores = evaluate(gt, [det(1, BOX_B, 0.95), det(1, BOX_A, 0.9)])
    assert scores.map50_95 == pytest.approx(1.0)


def test_empty_images_and_no_predictions():
    gt = ground_truth({1: [(BOX_A, 0)], 2: []})
    assert evaluate(gt, [det(1, BOX_A, 0.9)]).map50_95 == pytest.approx(1.0)
    # A detection on the empty image ranks first and is a false positive: precision 1/2 at full recall.
    assert evaluate(gt, [det(2, BOX_B, 0.95), det(1, BOX_A, 0.9)]).map50_95 == pytest.approx(0.5, abs=1e-6)
    assert evaluate(gt, []).map50_95 == 0.0


def test_localisation_error_costs_the_strict_thresholds():
    """A box with IoU 0.8 counts at thresholds 0.50..0.80 (7 of 10): mAP50-95 = 0.7, mAP50 = 1."""
    x, y, w, h = BOX_A
    shifted = [x, y, w * 0.8, h]  # IoU with BOX_A = 0.8
    scores = evaluate(ground_truth({1: [(BOX_A, 0)]}), [det(1, shifted, 0.9)])
    assert scores.map50 == pytest.approx(1.0)
    assert scores.map50_95 == pytest.approx(0.7, abs=1e-6)


# -- masks (iou_type "segm") and keypoints (OKS) ------------------------------------------------------------------

THRESHOLDS = [0.5 + 0.05 * i for i in range(10)]


def fraction_of_thresholds(value: float) -> float:
    """AP of a single object found once with IoU (or OKS) `value`: 1 at each threshold it reaches, 0 above."""
    assert all(abs(value - t) > 1e-6 for t in THRESHOLDS), "too close to a threshold to be a fair known answer"
    return sum(value >= t for t in THRESHOLDS) / len(THRESHOLDS)


def test_masks_scored_by_mask_iou():
    """A mask prediction scores by its mask, not its box: the same box with a mask of known IoU counts at the
    thresholds that IoU reaches. The prediction's RLE comes from yolojet's encoder."""
    from pycocotools import mask as mask_utils

    from yolojet.eval.coco import attach_masks
    from yolojet.tasks.segment import Masks

    polygon = [20.0, 10.0, 120.0, 10.0, 120.0, 70.0, 20.0, 70.0]
    gt = ground_truth({1: [([20.0, 10.0, 100.0, 60.0], 0)]})
    gt["annotations"][0]["segmentation"] = [polygon]
    truth = mask_utils.decode(mask_utils.frPyObjects([polygon], 480, 640)[0]).astype(bool)
    shifted = np.roll(truth, 23, axis=1)
    iou = float((truth & shifted).sum() / (truth | shifted).sum())
    for predicted, expected in ((truth, 1.0), (shifted, fraction_of_thresholds(iou))):
        found = [det(1, [20.0, 10.0, 100.0, 60.0], 0.9)]
        attach_masks(found, Masks(predicted[None]).to_rle())
        assert evaluate(gt, found, "segm").map50_95 == pytest.approx(expected, abs=1e-6)
        assert evaluate(gt, found, "bbox").map50_95 == pytest.approx(1.0)  # the box is exact either way


def oks(truth: np.ndarray, predicted: np.ndarray, area: float, sigmas: np.ndarray) -> float:
    """COCO's object keypoint similarity, written from its definition."""
    variances = (2 * sigmas) ** 2
    d2 = ((truth - predicted) ** 2).sum(1)
    return float(np.mean(np.exp(-d2 / variances / (area + np.spacing(1)) / 2)))


@pytest.mark.parametrize("k", [17, 5])
def test_keypoints_scored_by_oks(k):
    """Perfect keypoints score 1; displaced ones score at the OKS thresholds their similarity reaches. COCO's 17
    person keypoints use pycocotools' sigmas, other shapes 1/K each (as ultralytics)."""
    from pycocotools.cocoeval import Params

    from yolojet.eval.coco import attach_keypoints, keypoint_sigmas

    rng = np.random.default_rng(k)
    box = [100.0, 50.0, 200.0, 300.0]
    points = np.stack([rng.uniform(110, 290, k), rng.uniform(60, 340, k)], 1)
    gt = ground_truth({1: [(box, 0)]})
    annotation = gt["annotations"][0]
    annotation.update(keypoints=[v for x, y in points for v in (x, y, 2)], num_keypoints=k)
    sigmas = keypoint_sigmas(k)
    used = Params(iouType="keypoints").kpt_oks_sigmas if sigmas is None else sigmas
    displaced = points + rng.normal(0, 6.0, points.shape)
    similarity = oks(points, displaced, annotation["area"], used)
    for predicted, expected in ((points, 1.0), (displaced, fraction_of_thresholds(similarity))):
        found = [det(1, box, 0.9)]
        attach_keypoints(found, np.concatenate([predicted, np.full((k, 1), 0.8)], 1)[None])
        scores = evaluate(gt, found, "keypoints", sigmas)
        assert scores.map50_95 == pytest.approx(expected, abs=1e-6)
        assert scores.to_json()["AR20"] == pytest.approx(expected, abs=1e-6)


def test_unknown_iou_type_is_an_error():
    with pytest.raises(ValueError, match="iou_type"):
        evaluate(ground_truth({1: []}), [], "polygon")
