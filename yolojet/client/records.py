"""The JSON line `yolojet label` writes for one image, made alike from a server's reply and from local `Results`:

    {"path": ..., "width": W, "height": H, "model": ..., "model_version": ..., "task": ...,
     "detections": [{"class": c, "name": ..., "confidence": s, "box": [x1, y1, x2, y2],
                     "mask": {"size": [h, w], "counts": RLE},        (segment)
                     "keypoints": [[x, y, v], ...],                   (pose)
                     "rotated_box": [cx, cy, w, h, angle]}, ...],     (OBB, instead of "box")
     "top5": [{"class": c, "name": ..., "confidence": s}, ...]}       (classify, instead of "detections")

Coordinates in original image pixels, rounded to 0.01 px, confidences to 1e-5, angles to 1e-5 rad.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from yolojet.tasks import Results

COORD = 2
SCORE = 5


def _round(values: Any, decimals: int) -> list:
    if len(values) == 0:  # most replies have no rotated boxes or keypoints; numpy's round trip costs ~10 us
        return []
    return np.round(np.asarray(values, np.float64), decimals).tolist()


def from_results(path: str, result: Results, model: str, version: str, task: str) -> dict:
    record: dict[str, Any] = {
        "path": path,
        "width": result.orig_shape[1],
        "height": result.orig_shape[0],
        "model": model,
        "model_version": version,
        "task": task,
    }
    names = result.names
    if result.probs is not None:
        record["top5"] = [_head(names, c, p) for c, p in zip(result.probs.top5, result.probs.top5conf, strict=True)]
        return record
    # Whole arrays rounded at once, then lists walked: the same values as rounding each row (np.round works element by
    # element), without a numpy call an instance (about 25 us a box before).
    detections = []
    if result.obb is not None:
        obb = result.obb
        xywhr = np.asarray(obb.xywhr, np.float64)
        boxes = [c + r for c, r in zip(_round(xywhr[:, :4], COORD), _round(xywhr[:, 4:], 5), strict=True)]
        for box, conf, cls in zip(boxes, _floats(obb.conf), _floats(obb.cls), strict=True):
            detections.append({**_head(names, cls, conf), "rotated_box": box})
    elif result.boxes is not None:
        b = result.boxes
        rles = result.masks.to_rle() if result.masks is not None else None
        points = None
        if result.keypoints is not None:
            data = np.asarray(result.keypoints.data, np.float64)
            xy, visible = _round(data[..., :2], COORD), _round(data[..., 2:], SCORE)
            # x, y and visibility: 1 for a model that predicts none, as the server's replies say it
            points = [
                [p + (v or [1.0]) for p, v in zip(pp, vv, strict=True)] for pp, vv in zip(xy, visible, strict=True)
            ]
        rows = zip(_round(b.xyxy, COORD), _floats(b.conf), _floats(b.cls), strict=True)
        for i, (box, conf, cls) in enumerate(rows):
            d = {**_head(names, cls, conf), "box": box}
            if rles is not None:
                d["mask"] = rles[i]
            if points is not None:
                d["keypoints"] = points[i]
            detections.append(d)
    record["detections"] = detections
    return record


def _floats(values: Any) -> list[float]:
    return np.asarray(values).tolist()


def _head(names: dict[int, str], cls: Any, conf: Any) -> dict:
    c = int(cls)
    return {"class": c, "name": names.get(c, str(c)), "confidence": round(float(conf), SCORE)}


def from_reply(path: str, reply: Any) -> dict:
    """A yolojet.v1.InferReply as the same record."""
    record: dict[str, Any] = {
        "path": path,
        "width": reply.width,
        "height": reply.height,
        "model": reply.model,
        "model_version": reply.model_version,
        "task": reply.task,
    }
    if reply.task == "classify":
        record["top5"] = [
            {"class": c.class_id, "name": c.class_name, "confidence": round(c.confidence, SCORE)} for c in reply.top5
        ]
        return record
    # Each kind of coordinate gathered over the reply and rounded at once, as from_results does.
    found = list(reply.detections)
    rotated = [d.HasField("rotated_box") for d in found]
    boxes = _round(
        [[d.box.x1, d.box.y1, d.box.x2, d.box.y2] for d, r in zip(found, rotated, strict=True) if not r], COORD
    )
    turned = [d.rotated_box for d, r in zip(found, rotated, strict=True) if r]
    rotated_boxes = [
        c + a
        for c, a in zip(
            _round([[t.cx, t.cy, t.width, t.height] for t in turned], COORD),
            _round([[t.angle] for t in turned], 5),
            strict=True,
        )
    ]
    points = [(k.x, k.y, k.visibility) for d in found for k in d.keypoints]
    xy, visible = _round([p[:2] for p in points], COORD), _round([p[2:] for p in points], SCORE)
    plain, turned_at, point_at = iter(boxes), iter(rotated_boxes), 0
    detections = []
    for d, r in zip(found, rotated, strict=True):
        out: dict[str, Any] = {"class": d.class_id, "name": d.class_name, "confidence": round(d.confidence, SCORE)}
        if r:
            out["rotated_box"] = next(turned_at)
        else:
            out["box"] = next(plain)
        if d.HasField("mask"):
            out["mask"] = {"size": [d.mask.height, d.mask.width], "counts": d.mask.counts}
        if count := len(d.keypoints):
            end = point_at + count
            out["keypoints"] = [p + v for p, v in zip(xy[point_at:end], visible[point_at:end], strict=True)]
            point_at = end
        detections.append(out)
    record["detections"] = detections
    return record


def read_records(path: Path, repair: bool = False) -> list[dict]:
    """The records of a JSON-lines output. A last line cut short by a killed run is dropped, and with `repair` cut
    off the file, so that appending goes on from a whole line."""
    if not path.exists():
        return []
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    if repair and len(whole) != len(data):
        with open(path, "r+b") as f:
            f.truncate(len(whole))
            f.flush()
            os.fsync(f.fileno())
    return [json.loads(line) for line in whole.decode("utf-8").splitlines() if line.strip()]
