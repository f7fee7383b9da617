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
    ar100: float
    per_class_ap: dict[int, float] = field(default_factory=dict)  # category id -> AP50-95 (area all, 100 dets)

    def to_json(self) -> dict[str, Any]:
        return {"mAP50-95": self.map50_95, "mAP50": self.map50, "mAP75": self.map75, "AR100": self.ar100,
                "per_class_AP50-95": {str(k): v for k, v in self.per_class_ap.items()}}  # fmt: skip


def evaluate(ground_truth: dict[str, Any], predictions: list[dict[str, Any]], iou_type: str = "bbox") -> CocoScores:
    """Score COCO results (dicts with image_id, category_id, score and bbox / segmentation / keypoints)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet):
        gt = COCO()
        gt.dataset = copy.deepcopy(ground_truth)
        gt.createIndex()
        if not predictions:
            return CocoScores(0.0, 0.0, 0.0, 0.0, {int(c): 0.0 for c in gt.getCatIds()})
        dt = gt.loadRes(copy.deepcopy(predictions))
        scorer = COCOeval(gt, dt, iou_type)
        scorer.evaluate()
        scorer.accumulate()
        scorer.summarize()
    stats = scorer.stats
    precision = scorer.eval["precision"]  # [iou thresholds, recall points, categories, area ranges, max dets]
    per_class = {}
    for k, cat in enumerate(scorer.params.catIds):
        values = precision[:, :, k, 0, -1]
        values = values[values > -1]
        per_class[int(cat)] = float(values.mean()) if values.size else 0.0
    return CocoScores(float(stats[0]), float(stats[1]), float(stats[2]), float(stats[8]), per_class)


def box_predictions(image_id: int, xyxy: np.ndarray, conf: np.ndarray, categories: list[int]) -> list[dict[str, Any]]:
    """COCO detection results for one image: boxes as [x, y, w, h] in original pixels."""
    return [
        {"image_id": image_id, "category_id": int(cat), "score": round(float(s), 5),
         "bbox": [round(float(x1), 3), round(float(y1), 3), round(float(x2 - x1), 3), round(float(y2 - y1), 3)]}
        for (x1, y1, x2, y2), s, cat in zip(xyxy, conf, categories, strict=True)
    ]  # fmt: skip
