"""The evaluator on hand-made cases whose answers are worked out by hand (COCO's 101-point interpolated AP)."""

from __future__ import annotations

import pytest

from yolojet.eval.coco import evaluate


def ground_truth(boxes_per_image: dict[int, list[tuple[list[float], int]]]) -> dict:
    images = [{"id": i, "file_name": f"{i}.jpg", "width": 640, "height": 480} for i in boxes_per_image]
    annotations = []
    for image_id, boxes in boxes_per_image.items():
        for box, crowd in boxes:
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": 1, "bbox": box,
                                "area": box[2] * box[3], "iscrowd": crowd})  # fmt: skip
    return {"images": images, "annotations": annotations, "categories": [{"id": 1, "name": "thing"}]}


def det(image_id: int, box: list[float], score: float) -> dict:
    return {"image_id": image_id, "category_id": 1, "bbox": box, "score": score}


BOX_A, BOX_B = [10.0, 20.0, 100.0, 80.0], [300.0, 200.0, 60.0, 120.0]


def test_perfect_detections_score_one():
    gt = ground_truth({1: [(BOX_A, 0)], 2: [(BOX_B, 0)]})
    scores = evaluate(gt, [det(1, BOX_A, 0.9), det(2, BOX_B, 0.8)])
    assert scores.map50_95 == pytest.approx(1.0) and scores.map50 == pytest.approx(1.0)
    assert scores.per_class_ap == {1: pytest.approx(1.0)}


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
