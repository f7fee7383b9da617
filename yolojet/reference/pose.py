"""Pose: the pose head's output to boxes [x1, y1, x2, y2, conf, cls] and keypoints, in original-image pixels.

Follows ultralytics' PosePredictor (`postprocess` → `non_max_suppression` → `construct_result`):

- one-to-many head (N, 4 + nc + nk, A), boxes (cx, cy, w, h) in input pixels, sigmoid scores, then the decoded
  keypoints (x, y in input pixels and, when kpt_shape[1] == 3, the visibility sigmoid), nk = kpt_shape[0] ·
  kpt_shape[1]: torch_pipeline.non_max_suppression, which carries the keypoint channels along;
- one-to-one head (N, K, 6 + nk) ranked rows [x1, y1, x2, y2, score, cls, keypoints]: the rows over `conf`;
- boxes back to the original image with scale_boxes and clipped to it; keypoints with ultralytics'
  scale_coords: x and y lose the padding, are divided by the gain and are clipped to [0, w0] and [0, h0]
  (a keypoint predicted outside the image lands on its border); visibility is left as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from yolojet.errors import EngineConfigError
from yolojet.reference.heads import check_options, head_output
from yolojet.reference.pipeline import Letterbox, non_max_suppression, scale_boxes, select_end2end


def scale_keypoints(keypoints: torch.Tensor, box: Letterbox) -> torch.Tensor:
    """(k, nk, d) keypoints from model-input pixels to original-image pixels, clipped to the image (in place)."""
    pad_x, pad_y, gain_x, gain_y, w0, h0 = box.box_params()
    keypoints[..., 0] = ((keypoints[..., 0] - pad_x) / gain_x).clamp(0, w0)
    keypoints[..., 1] = ((keypoints[..., 1] - pad_y) / gain_y).clamp(0, h0)
    return keypoints


def _check_kpt_shape(kpt_shape: Sequence[int]) -> tuple[int, int]:
    if len(kpt_shape) != 2 or int(kpt_shape[0]) < 1 or int(kpt_shape[1]) not in (2, 3):
        raise EngineConfigError(
            f"kpt_shape {tuple(kpt_shape)}: expected (keypoints, 2 or 3): x, y and optionally a visibility"
        )
    return int(kpt_shape[0]), int(kpt_shape[1])


def pose_postprocess(
    preds: torch.Tensor | Sequence[torch.Tensor],
    boxes: Sequence[Letterbox],
    *,
    nc: int,
    kpt_shape: Sequence[int],
    conf: float,
    iou: float,
    max_det: int,
    classes: Sequence[int] | None = None,
    agnostic: bool = False,
    end2end: bool = False,
    multi_label: bool = False,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per image, (rows, keypoints): (k, 6) float rows [x1, y1, x2, y2, conf, cls] and (k, *kpt_shape) keypoints
    [x, y(, visibility)], both in original-image pixels, best first.

    `preds` is the pose head's first output: (N, 4 + nc + nk, A) for the one-to-many head, or (N, K, 6 + nk)
    ranked rows for YOLO26's one-to-one head (`end2end=True`; `iou` and `agnostic` then do nothing, as in
    ultralytics). `boxes[i]` says where image i sits in the model input.
    """
    preds = head_output(preds)
    check_options(conf, iou, max_det, classes, nc)
    count, dims = _check_kpt_shape(kpt_shape)
    nk = count * dims
    if len(boxes) != preds.shape[0]:
        raise EngineConfigError(f"{len(boxes)} letterboxes for a batch of {preds.shape[0]} predictions")
    wanted = [int(c) for c in classes] if classes is not None else None
    if end2end:
        if preds.shape[2] != 6 + nk:
            raise EngineConfigError(
                f"preds {tuple(preds.shape)}: a one-to-one pose output with kpt_shape {(count, dims)} has rows of "
                f"6 + {nk} = {6 + nk} (wrong kpt_shape, or exported with end2end=False?)"
            )
        found = select_end2end(preds, conf, max_det, wanted)
    else:
        if preds.shape[1] != 4 + nc + nk:
            raise EngineConfigError(
                f"preds {tuple(preds.shape)}: a one-to-many pose output of {nc} classes and kpt_shape "
                f"{(count, dims)} has 4 + {nc} + {nk} = {4 + nc + nk} channels (wrong nc or kpt_shape, or an "
                "end2end output with end2end=False?)"
            )
        found = non_max_suppression(
            preds, nc, conf, iou, max_det, agnostic=agnostic, classes=wanted, multi_label=multi_label
        )
    results = []
    for rows, box in zip(found, boxes, strict=True):
        rows = rows.float()
        keypoints = scale_keypoints(rows[:, 6:].reshape(len(rows), count, dims).clone(), box)
        results.append((scale_boxes(rows[:, :6].clone(), box), keypoints))
    return results
