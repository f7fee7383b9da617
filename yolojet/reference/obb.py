"""Oriented boxes: the OBB head's output to rows [cx, cy, w, h, angle, conf, cls] in original-image pixels.

Follows ultralytics' OBBPredictor (`postprocess` → `non_max_suppression(rotated=True)` → `construct_result`):

- one-to-many head (N, 4 + nc + 1, A), boxes (cx, cy, w, h) in input pixels, sigmoid scores, the angle in
  radians last: best class per anchor over `conf`, optional class filter, the `max_nms` best, then Fast-NMS
  (arXiv 1904.02689) on probabilistic IoU (`batch_probiou`, arXiv 2106.06072), classes kept apart by a
  7680-pixel offset of the centre unless `agnostic`, the first `max_det` kept boxes in descending score;
- one-to-one head (N, K, 7) rows [cx, cy, w, h, score, cls, angle], already ranked: the rows over `conf`
  (and of `classes`), the first `max_det`;
- then the centre moves back by the letterbox padding, and centre and size are divided by the letterbox gain
  (x by the horizontal one, y by the vertical one). Nothing is clipped, and the angle is passed through as
  the head predicted it (ultralytics no longer regularizes predictions to [0, π/2): width may be the short
  side).

Fast-NMS differs from greedy NMS: a box is dropped when any higher-scoring box overlaps it beyond `iou`, even
one that was itself dropped. This is what ultralytics does for oriented boxes, so it is what we do.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from yolojet.errors import EngineConfigError
from yolojet.reference.heads import check_options, head_output
from yolojet.reference.pipeline import Letterbox, candidates, select_end2end

MAX_WH = 7680  # ultralytics' class offset: boxes of different classes never overlap
MAX_NMS = 30000  # ultralytics' cap on the boxes that go into NMS


def _covariance(boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(a, b, c) of the Gaussian of each xywhr box: covariance [[a, c], [c, b]], each (n, 1)."""
    gbbs = torch.cat((boxes[:, 2:4].pow(2) / 12, boxes[:, 4:]), dim=-1)
    a, b, c = gbbs.split(1, dim=-1)
    cos, sin = c.cos(), c.sin()
    cos2, sin2 = cos.pow(2), sin.pow(2)
    return a * cos2 + b * sin2, a * sin2 + b * cos2, (a - b) * cos * sin


def batch_probiou(obb1: torch.Tensor, obb2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Probabilistic IoU (1 − Hellinger distance of the boxes' Gaussians) of (n, 5) and (m, 5) xywhr boxes → (n, m).

    The same formula and order of operations as ultralytics.utils.metrics.batch_probiou, so NMS decisions agree.
    """
    x1, y1 = obb1[..., :2].split(1, dim=-1)
    x2, y2 = (x.squeeze(-1)[None] for x in obb2[..., :2].split(1, dim=-1))
    a1, b1, c1 = _covariance(obb1)
    a2, b2, c2 = (x.squeeze(-1)[None] for x in _covariance(obb2))
    t1 = (
        ((a1 + a2) * (y1 - y2).pow(2) + (b1 + b2) * (x1 - x2).pow(2)) / ((a1 + a2) * (b1 + b2) - (c1 + c2).pow(2) + eps)
    ) * 0.25
    t2 = (((c1 + c2) * (x2 - x1) * (y1 - y2)) / ((a1 + a2) * (b1 + b2) - (c1 + c2).pow(2) + eps)) * 0.5
    t3 = (
        ((a1 + a2) * (b1 + b2) - (c1 + c2).pow(2))
        / (4 * ((a1 * b1 - c1.pow(2)).clamp_(0) * (a2 * b2 - c2.pow(2)).clamp_(0)).sqrt() + eps)
        + eps
    ).log() * 0.5
    bd = (t1 + t2 + t3).clamp(eps, 100.0)
    hd = (1.0 - (-bd).exp() + eps).sqrt()
    return 1 - hd


def rotated_fast_nms(boxes: torch.Tensor, scores: torch.Tensor, iou: float) -> torch.Tensor:
    """Indices of the (n, 5) xywhr boxes Fast-NMS keeps, in descending score (ultralytics' TorchNMS.fast_nms)."""
    if boxes.numel() == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    order = torch.argsort(scores, descending=True)
    boxes = boxes[order]
    overlaps = batch_probiou(boxes, boxes).triu_(diagonal=1)
    keep = torch.nonzero((overlaps > iou).sum(0) <= 0).squeeze_(-1)
    return order[keep]


def rotated_nms(
    preds: torch.Tensor,
    nc: int,
    conf: float,
    iou: float,
    max_det: int,
    classes: Sequence[int] | None = None,
    agnostic: bool = False,
    max_nms: int = MAX_NMS,
    multi_label: bool = False,
) -> list[torch.Tensor]:
    """(N, 4 + nc + 1, A) one-to-many OBB output → per image (k, 7) rows [cx, cy, w, h, conf, cls, angle] in input
    pixels, as ultralytics' non_max_suppression(rotated=True) returns them (`multi_label`: as its validator calls
    it)."""
    wanted = [int(c) for c in classes] if classes is not None else None
    results = []
    for pred in preds.transpose(1, 2):
        rows = candidates(pred, nc, conf, wanted, multi_label)
        if len(rows) > max_nms:
            rows = rows[rows[:, 4].argsort(descending=True)[:max_nms]]
        offset = rows[:, 5:6] * (0 if agnostic else MAX_WH)
        rboxes = torch.cat([rows[:, :2] + offset, rows[:, 2:4], rows[:, -1:]], 1)
        results.append(rows[rotated_fast_nms(rboxes, rows[:, 4], iou)[:max_det]])
    return results


def scale_rboxes(rows: torch.Tensor, box: Letterbox) -> torch.Tensor:
    """(k, 7) rows [cx, cy, w, h, conf, cls, angle] in input pixels → [cx, cy, w, h, angle, conf, cls] in original ones.

    ultralytics' scale_boxes(xywh=True): the padding comes off the centre, gains divide centre and size; no clipping.
    """
    pad_x, pad_y, gain_x, gain_y, _, _ = box.box_params()
    out = torch.cat([rows[:, :4], rows[:, 6:7], rows[:, 4:6]], 1)
    out[:, 0] = (out[:, 0] - pad_x) / gain_x
    out[:, 1] = (out[:, 1] - pad_y) / gain_y
    out[:, 2] = out[:, 2] / gain_x
    out[:, 3] = out[:, 3] / gain_y
    return out


def obb_postprocess(
    preds: torch.Tensor | Sequence[torch.Tensor],
    boxes: Sequence[Letterbox],
    *,
    nc: int,
    conf: float,
    iou: float,
    max_det: int,
    classes: Sequence[int] | None = None,
    agnostic: bool = False,
    end2end: bool = False,
    multi_label: bool = False,
) -> list[torch.Tensor]:
    """Per image, (k, 7) float rows [cx, cy, w, h, angle, conf, cls] in original-image pixels, best first.

    `preds` is the OBB head's first output: (N, 4 + nc + 1, A) for the one-to-many head, or (N, K, 7) ranked
    rows [cx, cy, w, h, score, cls, angle] for YOLO26's one-to-one head (`end2end=True`; `iou` and `agnostic`
    then do nothing, as in ultralytics). `boxes[i]` says where image i sits in the model input.
    """
    preds = head_output(preds)
    check_options(conf, iou, max_det, classes, nc)
    if len(boxes) != preds.shape[0]:
        raise EngineConfigError(f"{len(boxes)} letterboxes for a batch of {preds.shape[0]} predictions")
    if end2end:
        if preds.shape[2] != 7:
            raise EngineConfigError(
                f"preds {tuple(preds.shape)}: a one-to-one OBB output has rows of 7 "
                "[cx, cy, w, h, score, cls, angle] (was the model exported with end2end=False?)"
            )
        found = select_end2end(preds, conf, max_det, list(classes) if classes is not None else None)
    else:
        if preds.shape[1] != 4 + nc + 1:
            raise EngineConfigError(
                f"preds {tuple(preds.shape)}: a one-to-many OBB output of {nc} classes has 4 + {nc} + 1 = "
                f"{4 + nc + 1} channels (wrong nc, or an end2end output with end2end=False?)"
            )
        found = rotated_nms(preds, nc, conf, iou, max_det, classes, agnostic, multi_label=multi_label)
    return [scale_rboxes(rows.float(), box) for rows, box in zip(found, boxes, strict=True)]
