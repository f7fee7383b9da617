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
    p = pixels.long()
    rows = p[:, x0] * wx0[None, :, None] + p[:, x1] * wx1[None, :, None]
    value = ((rows[y0] >> 4) * wy0[:, None, None] >> 16) + ((rows[y1] >> 4) * wy1[:, None, None] >> 16)
    return ((value + 2) >> 2).clamp(0, 255).to(torch.uint8)


def rgb_pixels(frame: Frame) -> torch.Tensor:
    """The frame as uint8 (H, W, 3) RGB."""
    pixels = frame.pixels
    if pixels.shape[2] == 1:
        return pixels.expand(-1, -1, 3)
    pixels = pixels[..., :3]
    return pixels.flip(-1) if frame.bgr else pixels


def letterbox(frame: Frame, target_hw: tuple[int, int]) -> tuple[torch.Tensor, Letterbox]:
    """(3, H, W) float32 in [0, 1] on the frame's device, and where the image went."""
    box = Letterbox.fit(frame.shape, target_hw)
    pixels = rgb_pixels(frame)
    if (box.new_h, box.new_w) != frame.shape:
        pixels = cv2_resize_linear(pixels, box.new_h, box.new_w)
    out = torch.full((3, *target_hw), 114.0, device=pixels.device)
    out[:, box.pad_top : box.pad_top + box.new_h, box.pad_left : box.pad_left + box.new_w] = pixels.permute(2, 0, 1)
    return out / 255, box


def xywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    xy, wh = boxes[..., :2], boxes[..., 2:4] / 2
    return torch.cat([xy - wh, xy + wh], -1)


def non_max_suppression(
    preds: torch.Tensor,
    nc: int,
    conf: float,
    iou: float,
    max_det: int,
    max_nms: int = 30000,
    agnostic: bool = False,
    classes: list[int] | None = None,
) -> list[torch.Tensor]:
    """(N, 4 + nc + E, A) decoded head → per image (k, 6 + E) rows [x1, y1, x2, y2, conf, cls, extras]."""
    from torchvision.ops import nms

    max_wh = 7680  # ultralytics' class offset: boxes of different classes never overlap
    results = []
    for pred in preds.transpose(1, 2):
        scores, labels = pred[:, 4 : 4 + nc].max(1)
        keep = scores > conf
        if classes is not None:
            keep &= torch.isin(labels, torch.tensor(classes, device=labels.device))
        rows = torch.cat([xywh_to_xyxy(pred[:, :4]), scores[:, None], labels[:, None].float(), pred[:, 4 + nc :]], 1)
        rows = rows[keep]
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
