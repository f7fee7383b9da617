"""Pre- and post-processing with torch ops: the CPU fallback, and the truth the pipeline kernels are held to.

Each function follows ultralytics' predict path: LetterBox (auto=False, centred, grey 114, cv2
INTER_LINEAR), `non_max_suppression` (multi_label=False), the end-to-end head's confidence filter,
and `scale_boxes` + `clip_boxes` back to the original image.
"""

from __future__ import annotations

import torch

from yolojet.geometry import Letterbox
from yolojet.images import Frame


def _cv2_taps(src: int, dst: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """cv2.resize INTER_LINEAR taps and 11-bit weights along one axis (the letterbox kernel computes the same)."""
    # The source coordinate in double, then float, exactly as cv2 computes it: float32 arithmetic here
    # moves some taps by one step of rounding and the pixel by one grey level.
    f = ((torch.arange(dst, device=device, dtype=torch.float64) + 0.5) * (src / dst) - 0.5).float()
    i = torch.floor(f)
    frac = f - i
    i = i.long()
    frac = torch.where(i < 0, 0.0, frac)
    i = i.clamp_min(0)
    frac = torch.where(i >= src - 1, 0.0, frac)
    i = i.clamp_max(src - 1)
    w0 = torch.round((1.0 - frac) * 2048.0).long()  # half to even, as cv2's cvRound
    return i, (i + 1).clamp_max(src - 1), w0, 2048 - w0


def cv2_resize_linear(pixels: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """uint8 (H, W, C) resized like cv2.resize(INTER_LINEAR), with cv2's fixed-point arithmetic."""
    y0, y1, wy0, wy1 = _cv2_taps(pixels.shape[0], height, pixels.device)
    x0, x1, wx0, wx1 = _cv2_taps(pixels.shape[1], width, pixels.device)
    # Columns gathered before widening to int64: a 20000x20000 photo would otherwise take 9.6 GB here.
    rows = pixels[:, x0].long() * wx0[None, :, None] + pixels[:, x1].long() * wx1[None, :, None]
    value = ((rows[y0] >> 4) * wy0[:, None, None] >> 16) + ((rows[y1] >> 4) * wy1[:, None, None] >> 16)
    return ((value + 2) >> 2).clamp(0, 255).to(torch.uint8)


def rgb_pixels(pixels: torch.Tensor, bgr: bool) -> torch.Tensor:
    """A frame's uint8 (H, W, C) pixels (grey, BGR or RGB, alpha last) as (H, W, 3) RGB."""
    if pixels.shape[2] == 1:
        return pixels.expand(-1, -1, 3)
    pixels = pixels[..., :3]
    return pixels.flip(-1) if bgr else pixels


def letterbox(
    frame: Frame, target_hw: tuple[int, int], placement: Letterbox | None = None
) -> tuple[torch.Tensor, Letterbox]:
    """(3, H, W) float32 in [0, 1] on the frame's device, and how boxes map back (ultralytics' scale_boxes: the
    placement fitted to the input's size). `placement`: where the image goes (default: that same fit; for a
    rectangle, `geometry.rect_letterbox`'s, as ultralytics' LetterBox places it)."""
    fitted = Letterbox.fit(frame.shape, target_hw)
    box = placement if placement is not None else fitted
    pixels = frame.pixels
    if (box.new_h, box.new_w) != frame.shape:  # resized first: the channel flip then copies the small image only
        pixels = cv2_resize_linear(pixels, box.new_h, box.new_w)
    pixels = rgb_pixels(pixels, frame.bgr)
    out = torch.full((3, *target_hw), 114.0, device=pixels.device)
    out[:, box.pad_top : box.pad_top + box.new_h, box.pad_left : box.pad_left + box.new_w] = pixels.permute(2, 0, 1)
    return out / 255, fitted


def xywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    xy, wh = boxes[..., :2], boxes[..., 2:4] / 2
    return torch.cat([xy - wh, xy + wh], -1)


def candidates(
    pred: torch.Tensor, nc: int, conf: float, classes: list[int] | None = None, multi_label: bool = False
) -> torch.Tensor:
    """One image's (A, 4 + nc + E) decoded anchors → rows [box (as given), conf, cls, extras] of the anchors scoring
    over `conf`: each anchor's best class, or with `multi_label` (ultralytics' validators) one row for every class
    over `conf`, anchor by anchor, classes in order (a single class has one label either way)."""
    boxes, scores, extras = pred[:, :4], pred[:, 4 : 4 + nc], pred[:, 4 + nc :]
    if multi_label and nc > 1:
        anchor, label = torch.where(scores > conf)
        rows = torch.cat([boxes[anchor], scores[anchor, label, None], label[:, None].to(pred.dtype), extras[anchor]], 1)
    else:
        best, label = scores.max(1)
        rows = torch.cat([boxes, best[:, None], label[:, None].to(pred.dtype), extras], 1)[best > conf]
    if classes is not None:
        rows = rows[torch.isin(rows[:, 5].long(), torch.tensor(classes, device=rows.device))]
    return rows


def non_max_suppression(
    preds: torch.Tensor,
    nc: int,
    conf: float,
    iou: float,
    max_det: int,
    max_nms: int = 30000,
    agnostic: bool = False,
    classes: list[int] | None = None,
    multi_label: bool = False,
) -> list[torch.Tensor]:
    """(N, 4 + nc + E, A) decoded head → per image (k, 6 + E) rows [x1, y1, x2, y2, conf, cls, extras]."""
    from torchvision.ops import nms

    max_wh = 7680  # ultralytics' class offset: boxes of different classes never overlap
    results = []
    for pred in preds.transpose(1, 2):
        rows = candidates(pred, nc, conf, classes, multi_label)
        rows[:, :4] = xywh_to_xyxy(rows[:, :4])
        if len(rows) > max_nms:
            rows = rows[rows[:, 4].argsort(descending=True)[:max_nms]]
        offsets = rows[:, 5:6] * (0 if agnostic else max_wh)
        chosen = nms(rows[:, :4] + offsets, rows[:, 4], iou)[:max_det]
        results.append(rows[chosen])
    return results


def select_end2end(
    preds: torch.Tensor, conf: float, max_det: int, classes: list[int] | None = None
) -> list[torch.Tensor]:
    """The one-to-one head's (N, K, 6 + E) rows, already ranked: keep those over `conf`, as ultralytics does."""
    results = []
    for pred in preds:
        keep = pred[:, 4] > conf
        if classes is not None:
            keep &= torch.isin(pred[:, 5].long(), torch.tensor(classes, device=pred.device))
        results.append(pred[keep][:max_det])
    return results


def scale_boxes(rows: torch.Tensor, box: Letterbox) -> torch.Tensor:
    """Rows' xyxy from model-input pixels to original-image pixels, clipped to the image (in place)."""
    pad_x, pad_y, gain_x, gain_y, w0, h0 = box.box_params()
    rows[:, [0, 2]] = ((rows[:, [0, 2]] - pad_x) / gain_x).clamp(0, w0)
    rows[:, [1, 3]] = ((rows[:, [1, 3]] - pad_y) / gain_y).clamp(0, h0)
    return rows
