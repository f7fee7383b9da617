"""ultralytics' OBB metric (its `OBBValidator`): rotated boxes matched by probiou, AP per class by 101-point
interpolation, mAP50 and mAP50-95 over the classes present in the ground truth.

Per image, each prediction is a true positive at IoU threshold t (0.50, 0.55, …, 0.95) when it is the one
matched to a ground-truth box of its class with probiou ≥ t; matches are one-to-one, best IoU first (as
`BaseValidator.match_predictions`). Per class, predictions of all images ranked by confidence give the
precision/recall curve; its AP is the area under the precision envelope sampled at 101 recall points
(`compute_ap`, method "interp"). Ground truth comes as DOTA-style four-point polygons, turned into the
minimum-area rotated rectangle (cv2.minAreaRect does this in ultralytics; probiou depends only on the
rectangle, not on how its angle is written).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from yolojet.reference.obb import batch_probiou

IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)


@dataclass
class ObbScores:
    map50_95: float
    map50: float
    map75: float
    per_class_ap: dict[int, float] = field(default_factory=dict)  # category id -> AP50-95

    def to_json(self) -> dict[str, Any]:
        return {
            "mAP50-95": self.map50_95,
            "mAP50": self.map50,
            "mAP75": self.map75,
            "per_class_AP50-95": {str(k): v for k, v in self.per_class_ap.items()},
        }


def quad_to_xywhr(quads: np.ndarray) -> np.ndarray:
    """(N, 4, 2) corner points → (N, 5) [cx, cy, w, h, angle in radians] of each one's minimum-area rectangle
    (rotating calipers over the convex hull: the best rectangle has a side on a hull edge)."""
    boxes = []
    for points in np.asarray(quads, dtype=np.float64).reshape(-1, 4, 2):
        hull = _convex_hull(points)
        best = None
        for i in range(len(hull)):
            edge = hull[(i + 1) % len(hull)] - hull[i]
            length = float(np.hypot(*edge))
            if length == 0:
                continue
            u = edge / length
            v = np.array([-u[1], u[0]])
            along, across = hull @ u, hull @ v
            w, h = along.max() - along.min(), across.max() - across.min()
            if best is None or w * h < best[0]:
                centre = u * (along.max() + along.min()) / 2 + v * (across.max() + across.min()) / 2
                best = (w * h, [centre[0], centre[1], w, h, float(np.arctan2(u[1], u[0]))])
        if best is None:  # all four points coincide
            best = (0.0, [*points[0], 0.0, 0.0, 0.0])
        boxes.append(best[1])
    return np.asarray(boxes, dtype=np.float64).reshape(-1, 5)


def _convex_hull(points: np.ndarray) -> np.ndarray:
    """Andrew's monotone chain; counter-clockwise, no repeated points."""
    unique = sorted({(float(x), float(y)) for x, y in points})
    if len(unique) <= 2:
        return np.asarray(unique)

    def cross(o, a, b) -> float:
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    lower: list[tuple[float, float]] = []
    upper: list[tuple[float, float]] = []
    for p in unique:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    for p in reversed(unique):
        while len(upper) >= 2 and cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    return np.asarray(lower[:-1] + upper[:-1])


def match_predictions(pred_classes: np.ndarray, true_classes: np.ndarray, iou: np.ndarray) -> np.ndarray:
    """(n_pred, 10) bool: true positives per IoU threshold; `iou` is (n_true, n_pred)."""
    correct = np.zeros((len(pred_classes), len(IOU_THRESHOLDS)), dtype=bool)
    iou = iou * (true_classes[:, None] == pred_classes[None, :])
    for k, threshold in enumerate(IOU_THRESHOLDS):
        matches = np.array(np.nonzero(iou >= threshold)).T
        if matches.shape[0]:
            if matches.shape[0] > 1:
                matches = matches[iou[matches[:, 0], matches[:, 1]].argsort()[::-1]]
                matches = matches[np.unique(matches[:, 1], return_index=True)[1]]
                matches = matches[np.unique(matches[:, 0], return_index=True)[1]]
            correct[matches[:, 1].astype(int), k] = True
    return correct


def _interpolated_ap(recall: np.ndarray, precision: np.ndarray) -> float:
    # Precision falls to 0 right after the last recall reached (ultralytics' sentinels), not at recall 1.
    mrec = np.concatenate(([0.0], recall, [recall[-1] if len(recall) else 1.0], [1.0]))
    mpre = np.concatenate(([1.0], precision, [0.0], [0.0]))
    mpre = np.flip(np.maximum.accumulate(np.flip(mpre)))
    x = np.linspace(0, 1, 101)
    y = np.interp(x, mrec, mpre)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))  # the trapezoid rule


def ap_per_class(tp: np.ndarray, conf: np.ndarray, pred_cls: np.ndarray, target_cls: np.ndarray) -> dict:
    """{class: (10,) AP per IoU threshold} for every class present in the ground truth."""
    order = np.argsort(-conf, kind="stable")
    tp, pred_cls = tp[order], pred_cls[order]
    classes, counts = np.unique(target_cls, return_counts=True)
    result = {}
    for c, n_true in zip(classes.tolist(), counts.tolist(), strict=True):
        mine = pred_cls == c
        if not mine.any():
            result[c] = np.zeros(tp.shape[1])
            continue
        tpc = tp[mine].cumsum(0)
        fpc = (1 - tp[mine]).cumsum(0)
        recall = tpc / (n_true + 1e-16)
        precision = tpc / (tpc + fpc)
        result[c] = np.array([_interpolated_ap(recall[:, k], precision[:, k]) for k in range(tp.shape[1])])
    return result


def evaluate_obb(truth: dict[int, tuple[np.ndarray, np.ndarray]], found: dict[int, tuple]) -> ObbScores:
    """Score rotated boxes. truth: image id -> ((n, 5) xywhr, (n,) category ids); found: image id ->
    ((m, 5) xywhr, (m,) confidence, (m,) category ids). Pixels of the original images."""
    tps, confs, pred_classes, true_classes = [], [], [], []
    for image_id, (boxes, classes) in truth.items():
        pred_boxes, conf, pred_cls = found.get(image_id, (np.zeros((0, 5)), np.zeros(0), np.zeros(0)))
        true_classes.append(np.asarray(classes, dtype=np.int64))
        if len(pred_boxes) == 0:
            continue
        if len(boxes):
            iou = batch_probiou(
                torch.as_tensor(boxes, dtype=torch.float64), torch.as_tensor(pred_boxes, dtype=torch.float64)
            ).numpy()
            tps.append(match_predictions(np.asarray(pred_cls), np.asarray(classes), iou))
        else:
            tps.append(np.zeros((len(pred_boxes), len(IOU_THRESHOLDS)), dtype=bool))
        confs.append(np.asarray(conf, dtype=np.float64))
        pred_classes.append(np.asarray(pred_cls, dtype=np.int64))
    targets = np.concatenate(true_classes) if true_classes else np.zeros(0, np.int64)
    if not tps or targets.size == 0:
        return ObbScores(0.0, 0.0, 0.0, {int(c): 0.0 for c in np.unique(targets)})
    ap = ap_per_class(
        np.concatenate(tps).astype(np.float64), np.concatenate(confs), np.concatenate(pred_classes), targets
    )
    table = np.stack(list(ap.values()))
    return ObbScores(
        float(table.mean()),
        float(table[:, 0].mean()),
        float(table[:, 5].mean()),
        {int(c): float(v.mean()) for c, v in ap.items()},
    )
