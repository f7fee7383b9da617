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

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from yolojet.errors import RecordsError

if TYPE_CHECKING:
    from yolojet.tasks import Results

COORD = 2
SCORE = 5


def _round(values: Any, decimals: int) -> list:
    if len(values) == 0:  # most replies have no rotated boxes or keypoints; numpy's round trip costs ~10 us
        return []
    return np.asarray(values, np.float64).round(decimals).tolist()


# A box's corners to COORD decimals and its confidence to SCORE, in one array operation: numpy's round is this
# (multiply by 10**decimals, round half to even, divide), so the values are np.round's bit for bit.
_BOX_SCALE = np.array([10.0**COORD] * 4 + [10.0**SCORE])


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
    # Whole arrays rounded and made lists at once, then the dicts made from them: the same values as rounding each
    # row (np.round works element by element), without a numpy call or a round() a detection (about 4 us a box
    # before, most of a record).
    detections: list[dict[str, Any]] = []
    if result.obb is not None:
        obb = result.obb
        xywhr = np.asarray(obb.xywhr, np.float64)
        boxes = [c + r for c, r in zip(_round(xywhr[:, :4], COORD), _round(xywhr[:, 4:], 5), strict=True)]
        for head, box in zip(_heads(names, obb.cls, obb.conf), boxes, strict=True):
            head["rotated_box"] = box
            detections.append(head)
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
        rows = np.asarray(b.data, np.float64)
        rounded = (np.rint(rows[:, :5] * _BOX_SCALE) / _BOX_SCALE).tolist() if len(rows) else []
        for i, (c, row) in enumerate(zip(rows[:, 5].astype(np.int64).tolist(), rounded, strict=True)):
            head = {"class": c, "name": names.get(c, str(c)), "confidence": row[4], "box": row[:4]}
            if rles is not None:
                head["mask"] = rles[i]
            if points is not None:
                head["keypoints"] = points[i]
            detections.append(head)
    record["detections"] = detections
    return record


def _heads(names: dict[int, str], classes: Any, confidences: Any) -> list[dict[str, Any]]:
    """Each detection's class, class name and confidence (rounded to SCORE decimals), as the record's first keys."""
    ids = np.asarray(classes).astype(np.int64).tolist()
    scores = _round(np.asarray(confidences).reshape(-1), SCORE)
    return [{"class": c, "name": names.get(c, str(c)), "confidence": s} for c, s in zip(ids, scores, strict=True)]


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
    # Each kind of coordinate gathered over the reply and rounded at once, as from_results does; what a detection
    # holds follows from the task (the server fills `rotated_box` for OBB, `box` otherwise, keypoints for pose, masks
    # for segment), so each is read only where the task has it (every field read makes a wrapper: 31 -> 19 us for
    # ten boxes on the 2-core machine).
    found = list(reply.detections)
    scores = _round([d.confidence for d in found], SCORE)  # rounded as from_results rounds them
    detections = [
        {"class": d.class_id, "name": d.class_name, "confidence": score} for d, score in zip(found, scores, strict=True)
    ]
    task = reply.task
    if task == "obb":
        turned = [d.rotated_box for d in found]
        corners = _round([[t.cx, t.cy, t.width, t.height] for t in turned], COORD)
        angles = _round([[t.angle] for t in turned], 5)
        for out, c, a in zip(detections, corners, angles, strict=True):
            out["rotated_box"] = c + a
    else:
        plain = [d.box for d in found]
        for out, box in zip(detections, _round([[b.x1, b.y1, b.x2, b.y2] for b in plain], COORD), strict=True):
            out["box"] = box
    if task == "segment":
        for out, d in zip(detections, found, strict=True):
            if d.HasField("mask"):
                mask = d.mask
                out["mask"] = {"size": [mask.height, mask.width], "counts": mask.counts}
    if task == "pose":
        points = [(k.x, k.y, k.visibility) for d in found for k in d.keypoints]
        xy, visible = _round([p[:2] for p in points], COORD), _round([p[2:] for p in points], SCORE)
        point_at = 0
        for out, d in zip(detections, found, strict=True):
            if count := len(d.keypoints):
                end = point_at + count
                out["keypoints"] = [p + v for p, v in zip(xy[point_at:end], visible[point_at:end], strict=True)]
                point_at = end
    record["detections"] = detections
    return record


def iter_records(path: Path, start: int = 0, end: int | None = None) -> Iterator[dict]:
    """The records of a JSON-lines output one at a time, read in blocks, so that a million of them are never in memory
    at once; a last line cut short by a killed run is left out. `start`, `end`: the lines that begin in this range of
    bytes only (`start` at a line's beginning), one share of the file for one of several workers."""
    with open(path, "rb", buffering=1 << 20) as f:
        f.seek(start)
        at = start
        for line in f:
            if (end is not None and at >= end) or not line.endswith(b"\n"):
                return
            if line.strip():
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    raise RecordsError(f"{path}: the line at byte {at} is not JSON ({e})") from e
                if not isinstance(record, dict) or not isinstance(record.get("path"), str):
                    raise RecordsError(f"{path}: the line at byte {at} is not a record (no path)")
                yield record
            at += len(line)


def byte_shares(path: Path, count: int) -> list[tuple[int, int]]:
    """The file cut into `count` ranges of bytes at line beginnings, about equal (fewer where it has fewer bytes)."""
    size = path.stat().st_size if path.is_file() else 0
    bounds = [0]
    if size:
        with open(path, "rb") as f:
            for k in range(1, count):
                f.seek(max(bounds[-1], size * k // count - 1))
                f.readline()  # to the beginning of the line after the one holding that byte
                if f.tell() > bounds[-1] and f.tell() < size:
                    bounds.append(f.tell())
    return list(zip(bounds, [*bounds[1:], size], strict=True))


def count_records(path: Path) -> int:
    """How many whole lines a JSON-lines output holds (the total of a progress bar over it)."""
    count = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            count += block.count(b"\n")
    return count


def repair_records(path: Path) -> None:
    """Cut a last line that a killed run left unfinished off the file, so that appending goes on from a whole line."""
    with open(path, "r+b") as f:
        end = size = f.seek(0, os.SEEK_END)
        while end > 0:  # back to the last newline, a block at a time
            f.seek(max(0, end - (1 << 16)))
            block = f.read(end - max(0, end - (1 << 16)))
            at = block.rfind(b"\n")
            if at != -1:
                end = end - len(block) + at + 1
                break
            end -= len(block)
        if end != size:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
