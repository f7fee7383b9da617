"""The COCO protocol through pycocotools: one-to-one matching at IoU 0.50:0.05:0.95, crowd regions ignored."""

from __future__ import annotations

import contextlib
import copy
import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class CocoScores:
    map50_95: float
    map50: float
    map75: float
    ar100: float  # average recall at `max_dets` detections an image
    per_class_ap: dict[int, float] = field(default_factory=dict)  # category id -> AP50-95 (area all)
    max_dets: int = 100  # pycocotools' last maxDets: 100 for boxes and masks, 20 for keypoints

    def to_json(self) -> dict[str, Any]:
        return {
            "mAP50-95": self.map50_95,
            "mAP50": self.map50,
            "mAP75": self.map75,
            f"AR{self.max_dets}": self.ar100,
            "per_class_AP50-95": {str(k): v for k, v in self.per_class_ap.items()},
        }


def keypoint_sigmas(keypoints: int) -> np.ndarray | None:
    """OKS sigmas: pycocotools' own for COCO's 17 person keypoints (None: leave them), else 1/K each, as
    ultralytics scores custom keypoint shapes."""
    return None if keypoints == 17 else np.full(keypoints, 1.0 / keypoints)


def evaluate(
    ground_truth: dict[str, Any],
    predictions: list[dict[str, Any]],
    iou_type: str = "bbox",
    sigmas: np.ndarray | None = None,
) -> CocoScores:
    """Score COCO results (dicts with image_id, category_id, score and bbox / segmentation / keypoints).

    iou_type "bbox" and "segm" report AP at IoU 0.50:0.05:0.95 and AR at 100 detections; "keypoints"
    reports OKS AP at the same thresholds and AR at pycocotools' 20 detections, with `sigmas` replacing
    the COCO person sigmas when given."""
    if iou_type not in ("bbox", "segm", "keypoints"):
        raise ValueError(f"iou_type {iou_type!r}: expected 'bbox', 'segm' or 'keypoints'")
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet):
        gt = COCO()
        gt.dataset = copy.deepcopy(ground_truth)
        gt.createIndex()
        max_dets = 20 if iou_type == "keypoints" else 100
        # Per-class AP only for classes the ground truth has: for the others there is nothing to score.
        labelled = [int(c) for c in gt.getCatIds() if gt.getAnnIds(catIds=[c])]
        if not predictions:
            return CocoScores(0.0, 0.0, 0.0, 0.0, dict.fromkeys(labelled, 0.0), max_dets)
        dt = gt.loadRes(copy.deepcopy(predictions))
        scorer = COCOeval(gt, dt, iou_type)
        if sigmas is not None:
            scorer.params.kpt_oks_sigmas = np.asarray(sigmas, dtype=np.float64)
        scorer.evaluate()
        scorer.accumulate()
        scorer.summarize()
    stats = scorer.stats
    precision = scorer.eval["precision"]  # [iou thresholds, recall points, categories, area ranges, max dets]
    per_class = {}
    for k, cat in enumerate(scorer.params.catIds):
        if int(cat) not in labelled:
            continue
        values = precision[:, :, k, 0, -1]
        values = values[values > -1]
        per_class[int(cat)] = float(values.mean()) if values.size else 0.0
    recall = stats[5] if iou_type == "keypoints" else stats[8]  # summarize's layout differs for keypoints
    return CocoScores(float(stats[0]), float(stats[1]), float(stats[2]), float(recall), per_class, max_dets)


def box_predictions(image_id: int, xyxy: np.ndarray, conf: np.ndarray, categories: list[int]) -> list[dict[str, Any]]:
    """COCO detection results for one image: boxes as [x, y, w, h] in original pixels."""
    return [
        {
            "image_id": image_id,
            "category_id": int(cat),
            "score": round(float(s), 5),
            "bbox": [round(float(x1), 3), round(float(y1), 3), round(float(x2 - x1), 3), round(float(y2 - y1), 3)],
        }
        for (x1, y1, x2, y2), s, cat in zip(xyxy, conf, categories, strict=True)
    ]


def attach_masks(predictions: list[dict[str, Any]], rles: list[dict[str, Any]]) -> None:
    """Add each detection's mask (COCO RLE, original pixels) as its "segmentation", in order."""
    for prediction, rle in zip(predictions, rles, strict=True):
        prediction["segmentation"] = rle


def attach_keypoints(predictions: list[dict[str, Any]], keypoints: np.ndarray) -> None:
    """Add each detection's keypoints (K, 2 or 3; x, y[, confidence] in original pixels) as COCO's flat
    [x, y, v] list, the confidence as v (1 where the model has none), as ultralytics writes them."""
    for prediction, points in zip(predictions, keypoints, strict=True):
        points = np.asarray(points, dtype=np.float64)
        visibility = points[:, 2] if points.shape[1] == 3 else np.ones(len(points))
        flat = np.stack([points[:, 0], points[:, 1], visibility], 1).reshape(-1)
        prediction["keypoints"] = [round(float(v), 3) for v in flat]
