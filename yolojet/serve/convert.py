"""Results as the service's protobuf messages."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from yolojet.serve.models import ServedModel
from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb
from yolojet.tasks import Results


def reply(result: Results, model: ServedModel, request_id: str, timings: pb.Timings) -> pb.InferReply:
    """One image's results: detections (boxes, rotated boxes, keypoints, COCO RLE masks) or the top-5 classes."""
    meta = model.meta
    out = pb.InferReply(
        id=request_id,
        model=model.name,
        model_version=model.version,
        width=result.orig_shape[1],
        height=result.orig_shape[0],
        task=meta.task,
        timings=timings,
    )
    names = result.names

    def detection(conf: float, cls: float) -> pb.Detection:
        c = int(cls)
        return out.detections.add(confidence=float(conf), class_id=c, class_name=names.get(c, str(c)))

    if result.probs is not None:
        for c, p in zip(result.probs.top5, result.probs.top5conf, strict=True):
            out.top5.add(class_id=int(c), class_name=names.get(int(c), str(int(c))), confidence=float(p))
        return out
    if result.obb is not None:
        obb = result.obb
        for (cx, cy, w, h, angle), conf, cls in zip(
            _listed(obb.xywhr), _listed(obb.conf), _listed(obb.cls), strict=True
        ):
            r = detection(conf, cls).rotated_box
            r.cx, r.cy, r.width, r.height, r.angle = cx, cy, w, h, angle
        return out
    if result.boxes is None:
        return out
    rles = result.masks.to_rle() if result.masks is not None else None
    boxes = result.boxes
    points = _listed(result.keypoints.data) if result.keypoints is not None else None
    for i, ((x1, y1, x2, y2), conf, cls) in enumerate(
        zip(_listed(boxes.xyxy), _listed(boxes.conf), _listed(boxes.cls), strict=True)
    ):
        d = detection(conf, cls)
        box = d.box  # set in place: a Box made apart and copied in took a third longer a reply
        box.x1, box.y1, box.x2, box.y2 = x1, y1, x2, y2
        if points is not None:
            for point in points[i]:
                d.keypoints.add(x=point[0], y=point[1], visibility=point[2] if len(point) > 2 else 1.0)
        if rles is not None:
            h, w = rles[i]["size"]
            mask = d.mask
            mask.height, mask.width, mask.counts = h, w, rles[i]["counts"]
    return out


def _listed(values: Any) -> list:
    """An array as Python numbers: protobuf takes them several times faster than numpy scalars, one at a time."""
    return np.asarray(values).tolist()


def model_info(model: ServedModel) -> pb.ModelInfo:
    meta = model.meta
    h, w = meta.imgsz
    return pb.ModelInfo(
        name=model.name,
        version=model.version,
        task=meta.task,
        max_batch=model.max_batch,
        height=h,
        width=w,
        class_names=[meta.names[i] for i in sorted(meta.names)],
        backend=model.card.backend,
        decoder=model.card.decoder,
        keypoint_shape=list(meta.kpt_shape or ()),
    )


def status_details(
    code: grpc.StatusCode, message: str, reason: str, retry_after_s: float | None, model: str
) -> tuple[tuple[str, str | bytes], ...]:
    """A refusal's status as gRPC's rich error model carries it: google.rpc.Status with an ErrorInfo (why, for which
    model) and, where the same request may pass later, a RetryInfo (when), as trailing metadata for the call's abort."""
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="yolojet", metadata={"model": model}))
    details = [info]
    if retry_after_s is not None:
        retry_info, retry = error_details_pb2.RetryInfo(), any_pb2.Any()
        retry_info.retry_delay.FromNanoseconds(max(0, round(retry_after_s * 1e9)))
        retry.Pack(retry_info)
        details.append(retry)
    status = status_pb2.Status(code=code.value[0], message=message, details=details)
    return tuple(rpc_status.to_status(status).trailing_metadata)
