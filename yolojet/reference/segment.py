"""Segment: the segment head's outputs to boxes [x1, y1, x2, y2, conf, cls] and instance masks in original pixels.

Follows ultralytics' SegmentationPredictor (`postprocess` → `non_max_suppression` → `construct_result`) and the mask
helpers of `ultralytics.utils.ops`:

- one-to-many head (N, 4 + nc + nm, A), boxes (cx, cy, w, h) in input pixels, sigmoid scores, nm mask coefficients:
  torch_pipeline.non_max_suppression, which carries the coefficients along; one-to-one head (N, K, 6 + nm) ranked
  rows [x1, y1, x2, y2, score, cls, coefficients]: the rows over `conf`. proto is (N, nm, H/4, W/4).
- retina_masks=False (ultralytics' default, `process_mask(..., upsample=True)`): mask logits = coefficients @ proto,
  bilinearly upsampled to the input size, > 0, cropped to the box in input pixels; then the boxes go back to the
  original image (scale_boxes). ultralytics keeps these input-sized masks; here they are then taken to the original
  image the way ultralytics does it when it draws them (`scale_masks(masks[None].float(), orig_shape)[0] > 0.5`):
  the letterboxed content is cut out, bilinearly resized to (h0, w0) and thresholded at 0.5.
- retina_masks=True (`process_mask_native`): the boxes go back to the original image first; the logits at proto
  resolution are upsampled by the smallest factor f of 1, 2, 4 that puts the letterbox padding on whole pixels,
  their content cut out and bilinearly resized to (h0, w0) (`scale_masks`), > 0, and cropped to the box in
  original pixels.
- in both, an instance whose mask is empty (before the move to the original image, as ultralytics filters) is
  dropped.

Crops follow `crop_mask`: pixel column c is inside the box when x1 ≤ c < x2 (rows alike), so a box predicted
inverted (x2 < x1) has an empty mask and is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from yolojet.errors import EngineConfigError
from yolojet.reference.pipeline import Letterbox, non_max_suppression, scale_boxes, select_end2end

# Bound on the float pixels one upsampling step holds at once (ultralytics uses the same budget natively).
_PIXEL_BUDGET = 16_000_000


def crop_masks(masks: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """Zero (n, h, w) masks outside their (n, 4) xyxy boxes, in place: column c is kept when x1 ≤ c < x2."""
    _, h, w = masks.shape
    boxes = boxes.to(device=masks.device, dtype=torch.float32)
    x1, y1, x2, y2 = boxes[:, :, None].unbind(1)  # each (n, 1)
    cols = torch.arange(w, device=masks.device, dtype=torch.float32)[None, None, :]
    rows = torch.arange(h, device=masks.device, dtype=torch.float32)[None, :, None]
    masks *= (cols >= x1[:, None]) & (cols < x2[:, None])
    masks *= (rows >= y1[:, None]) & (rows < y2[:, None])
    return masks


def _resize_content(
    masks: torch.Tensor, top: int, left: int, height: int, width: int, shape: tuple[int, int]
) -> torch.Tensor:
    """(1, n, H, W) float masks: the [top, top + height) × [left, left + width) window bilinearly resized to shape."""
    if masks.shape[2:] == shape:
        return masks
    return F.interpolate(masks[..., top : top + height, left : left + width].float(), shape, mode="bilinear")


def _scale_masks_window(in_hw: tuple[int, int], shape: tuple[int, int]) -> tuple[int, int, int, int]:
    """ultralytics' scale_masks window (top, left, height, width) of an (h0, w0) image letterboxed into in_hw."""
    (im1_h, im1_w), (im0_h, im0_w) = in_hw, shape
    gain = min(im1_h / im0_h, im1_w / im0_w)
    height, width = max(round(im0_h * gain), 1), max(round(im0_w * gain), 1)
    top, left = round((im1_h - height) / 2 - 0.1), round((im1_w - width) / 2 - 0.1)
    return top, left, height, width


def _chunks(count: int, pixels_each: int) -> list[slice]:
    step = max(1, _PIXEL_BUDGET // max(pixels_each, 1))
    return [slice(i, min(i + step, count)) for i in range(0, count, step)]


def masks_upsampled(
    proto: torch.Tensor, coefs: torch.Tensor, xyxy: torch.Tensor, input_hw: tuple[int, int], box: Letterbox
) -> tuple[torch.Tensor, torch.Tensor]:
    """retina_masks=False: (keep (k,) bool, masks (kept, h0, w0) bool) from (nm, mh, mw) proto, (k, nm)
    coefficients and (k, 4) boxes in input pixels. `keep` marks the instances whose input-sized mask is not empty."""
    nm, mh, mw = proto.shape
    logits = (coefs.float() @ proto.float().reshape(nm, -1)).reshape(-1, mh, mw)
    keep = torch.zeros(len(logits), dtype=torch.bool, device=logits.device)
    kept = []
    for part in _chunks(len(logits), input_hw[0] * input_hw[1] + box.orig_h * box.orig_w):
        masks = F.interpolate(logits[None, part], input_hw, mode="bilinear")[0]
        masks = crop_masks(masks.gt(0).to(torch.uint8), xyxy[part])
        nonempty = masks.flatten(1).amax(1) > 0
        keep[part] = nonempty
        masks = masks[nonempty]
        if len(masks):
            window = (box.pad_top, box.pad_left, box.new_h, box.new_w)
            kept.append(_resize_content(masks[None], *window, (box.orig_h, box.orig_w))[0] > 0.5)
    if not kept:
        return keep, torch.zeros((0, box.orig_h, box.orig_w), dtype=torch.bool, device=logits.device)
    return keep, torch.cat(kept)


def masks_native(
    proto: torch.Tensor, coefs: torch.Tensor, xyxy: torch.Tensor, shape: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """retina_masks=True: (keep (k,) bool, masks (kept, h0, w0) bool) from (nm, mh, mw) proto, (k, nm) coefficients
    and (k, 4) boxes in original pixels, as ultralytics' process_mask_native."""
    nm, mh, mw = proto.shape
    h, w = shape
    logits = (coefs.float() @ proto.float().reshape(nm, -1)).reshape(1, -1, mh, mw)
    gain = min(4 * mh / h, 4 * mw / w)
    pad = (4 * mh - max(round(h * gain), 1)) | (4 * mw - max(round(w * gain), 1))  # the input's letterbox padding
    f = 4 // math.gcd(4, pad | pad // 2)  # smallest upsampling (1, 2 or 4) that puts that padding on whole pixels
    window = _scale_masks_window((f * mh, f * mw), shape)
    keep = torch.zeros(logits.shape[1], dtype=torch.bool, device=logits.device)
    kept = []
    for part in _chunks(logits.shape[1], h * w + f * f * mh * mw):
        chunk = logits[:, part]
        if f > 1:
            chunk = F.interpolate(chunk, scale_factor=f, mode="bilinear")
        masks = crop_masks(_resize_content(chunk, *window, shape)[0].gt(0).to(torch.uint8), xyxy[part])
        nonempty = masks.flatten(1).amax(1) > 0
        keep[part] = nonempty
        kept.append(masks[nonempty].bool())
    if not kept:
        return keep, torch.zeros((0, h, w), dtype=torch.bool, device=logits.device)
    return keep, torch.cat(kept)


def _check_inputs(
    preds: torch.Tensor,
    proto: torch.Tensor,
    boxes: Sequence[Letterbox],
    input_hw: tuple[int, int],
    nc: int,
    end2end: bool,
) -> None:
    if not isinstance(preds, torch.Tensor) or preds.ndim != 3:
        shape = tuple(preds.shape) if isinstance(preds, torch.Tensor) else type(preds).__name__
        raise EngineConfigError(f"preds: expected a 3-d head output tensor, got {shape}")
    if not isinstance(proto, torch.Tensor) or proto.ndim != 4:
        shape = tuple(proto.shape) if isinstance(proto, torch.Tensor) else type(proto).__name__
        raise EngineConfigError(f"proto: expected (N, nm, H/4, W/4) mask prototypes, got {shape}")
    if preds.shape[0] != proto.shape[0]:
        raise EngineConfigError(
            f"preds {tuple(preds.shape)} and proto {tuple(proto.shape)}: batch sizes {preds.shape[0]} and "
            f"{proto.shape[0]} differ"
        )
    if len(boxes) != preds.shape[0]:
        raise EngineConfigError(f"{len(boxes)} letterboxes for a batch of {preds.shape[0]} predictions")
    if nc < 1:
        raise EngineConfigError(f"nc {nc}: a model has at least one class")
    nm = proto.shape[1]
    if end2end and preds.shape[2] != 6 + nm:
        raise EngineConfigError(
            f"preds {tuple(preds.shape)}: one-to-one rows with {nm} mask coefficients have 6 + {nm} = {6 + nm} "
            "values (exported with end2end=False?)"
        )
    if not end2end and preds.shape[1] != 4 + nc + nm:
        raise EngineConfigError(
            f"preds {tuple(preds.shape)}: a one-to-many output of {nc} classes and {nm} mask coefficients has "
            f"4 + {nc} + {nm} = {4 + nc + nm} channels (wrong nc, or an end2end output with end2end=False?)"
        )
    if (4 * proto.shape[2], 4 * proto.shape[3]) != input_hw:
        raise EngineConfigError(
            f"proto {tuple(proto.shape)}: prototypes are a quarter of the input size, {input_hw} needs "
            f"{(input_hw[0] // 4, input_hw[1] // 4)}"
        )
    for box in boxes:
        if box.pad_top + box.new_h > input_hw[0] or box.pad_left + box.new_w > input_hw[1]:
            raise EngineConfigError(f"{box} does not fit an input of {input_hw}")


def segment_postprocess(
    preds: torch.Tensor,
    proto: torch.Tensor,
    boxes: Sequence[Letterbox],
    input_hw: int | Sequence[int],
    *,
    nc: int,
    conf: float,
    iou: float,
    max_det: int,
    classes: Sequence[int] | None = None,
    agnostic: bool = False,
    end2end: bool = False,
    retina_masks: bool = False,
    multi_label: bool = False,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per image, (rows, masks): (k, 6) float32 rows [x1, y1, x2, y2, conf, cls] in original-image pixels, best
    first, and (k, h0, w0) bool masks of the original image.

    `preds` is the segment head's first output: (N, 4 + nc + nm, A) for the one-to-many head, or (N, K, 6 + nm)
    ranked rows for YOLO26's one-to-one head (`end2end=True`; `iou` and `agnostic` then do nothing, as in
    ultralytics). `proto` is the (N, nm, H/4, W/4) second output, `boxes[i]` where image i sits in the (H, W)
    model input `input_hw`. Raises EngineConfigError (a ValueError) for outputs that do not fit together.
    """
    input_hw = (int(input_hw), int(input_hw)) if isinstance(input_hw, int) else (int(input_hw[0]), int(input_hw[1]))
    _check_inputs(preds, proto, boxes, input_hw, nc, end2end)
    if not 0 <= conf <= 1 or not 0 <= iou <= 1:
        raise EngineConfigError(f"conf {conf} and iou {iou} must lie in [0, 1]")
    if max_det < 1:
        raise EngineConfigError(f"max_det {max_det}: must be at least 1")
    if classes is not None and any(not 0 <= int(c) < nc for c in classes):
        raise EngineConfigError(f"classes {list(classes)}: class ids run from 0 to {nc - 1}")
    wanted = [int(c) for c in classes] if classes is not None else None
    if end2end:
        found = select_end2end(preds, conf, max_det, wanted)
    else:
        found = non_max_suppression(
            preds, nc, conf, iou, max_det, agnostic=agnostic, classes=wanted, multi_label=multi_label
        )
    results = []
    for rows, prototypes, box in zip(found, proto, boxes, strict=True):
        rows = rows.float().clone()
        shape = (box.orig_h, box.orig_w)
        if retina_masks:
            scale_boxes(rows, box)
            keep, masks = masks_native(prototypes, rows[:, 6:], rows[:, :4], shape)
        else:
            keep, masks = masks_upsampled(prototypes, rows[:, 6:], rows[:, :4], input_hw, box)
            scale_boxes(rows, box)
        results.append((rows[keep, :6], masks))
    return results
