"""Letterbox arithmetic shared by the torch reference and the GPU kernels: where an image goes in the model input.

Follows ultralytics' LetterBox (auto=False, center=True, scaleup=True) as its predict uses it:
  r = min(H/h0, W/w0);  new_w, new_h = max(round(w0·r), 1), max(round(h0·r), 1)
  top, left = round((H − new_h)/2 − 0.1), round((W − new_w)/2 − 0.1)     (Python's round: half to even)
and its `scale_boxes`, which maps boxes back with the per-axis gains new_w/w0, new_h/h0 and the integer pads.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Letterbox:
    """How an (h0, w0) image sits in the model input: resized to (new_h, new_w) at (pad_top, pad_left)."""

    orig_h: int
    orig_w: int
    new_h: int
    new_w: int
    pad_top: int
    pad_left: int

    @classmethod
    def fit(cls, orig_hw: tuple[int, int], target_hw: tuple[int, int]) -> Letterbox:
        """ultralytics LetterBox.get_params with auto=False, center=True, scaleup=True."""
        (h0, w0), (h, w) = orig_hw, target_hw
        return _fitted(int(h0), int(w0), int(h), int(w))

    def box_params(self) -> list[float]:
        """[pad_x, pad_y, gain_x, gain_y, w0, h0]: what mapping boxes back needs, as scale_boxes computes it."""
        gain_x, gain_y = self.new_w / self.orig_w, self.new_h / self.orig_h
        return [self.pad_left, self.pad_top, gain_x, gain_y, self.orig_w, self.orig_h]


@functools.lru_cache(maxsize=4096)
def _fitted(h0: int, w0: int, h: int, w: int) -> Letterbox:
    """`Letterbox.fit`, once a size: a batch of photos from one camera asks for the same few sizes, and working one
    out was about a third of staging a frame's table row."""
    if min(h0, w0, h, w) < 1:
        raise ValueError(f"letterbox: sizes must be positive, got frame {(h0, w0)} and target {(h, w)}")
    r = min(h / h0, w / w0)
    new_h, new_w = max(round(h0 * r), 1), max(round(w0 * r), 1)
    return Letterbox(h0, w0, new_h, new_w, round((h - new_h) / 2 - 0.1), round((w - new_w) / 2 - 0.1))


def rect_letterbox(orig_hw: tuple[int, int], imgsz: tuple[int, int], stride: int) -> tuple[tuple[int, int], Letterbox]:
    """ultralytics' predict letterbox of one image (LetterBox(imgsz, auto=True, stride), its `rect=True`): the
    smallest input of stride multiples that holds the image scaled to fit `imgsz`, e.g. 640x480 for a 4:3 photo at
    640, and where the image goes in it.

    The placement uses the scale fitted to `imgsz`, as LetterBox does; boxes map back with `Letterbox.fit(orig_hw,
    target).box_params()`, as ultralytics' scale_boxes recomputes the scale from the input's shape (the two differ by
    a pixel of resized size on under 1 % of image sizes, where ultralytics differs from itself the same way).
    """
    (h0, w0), (h, w) = orig_hw, imgsz
    return _rect_fitted(int(h0), int(w0), int(h), int(w), int(stride))


@functools.lru_cache(maxsize=4096)
def _rect_fitted(h0: int, w0: int, h: int, w: int, stride: int) -> tuple[tuple[int, int], Letterbox]:
    """`rect_letterbox`, once a size (as `_fitted`)."""
    if min(h0, w0) < 1:
        raise ValueError(f"letterbox: sizes must be positive, got frame {(h0, w0)}")
    r = min(h / h0, w / w0)
    new_h, new_w = max(round(h0 * r), 1), max(round(w0 * r), 1)
    pad_h, pad_w = (h - new_h) % stride, (w - new_w) % stride
    target = (new_h + pad_h, new_w + pad_w)
    return target, Letterbox(h0, w0, new_h, new_w, round(pad_h / 2 - 0.1), round(pad_w / 2 - 0.1))
