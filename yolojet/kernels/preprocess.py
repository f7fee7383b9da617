"""Predict pre-processing: letterbox, BGR → RGB and /255 of one uint8 frame into one NHWC batch slot, in one pass.

Follows ultralytics' LetterBox (auto=False, center=True, scaleup=True, padding value 114) as used by predict:
  r = min(H/h0, W/w0);  new_w, new_h = max(round(w0·r), 1), max(round(h0·r), 1)
  top, left = round((H − new_h)/2 − 0.1), round((W − new_w)/2 − 0.1)     (Python's round: half to even)
  out[y, x, c] = resize(frame)[y − top, x − left, src(c)] / 255 inside the placed image, 114/255 outside
where resize is cv2.resize(INTER_LINEAR): source coordinate s = (d + 0.5)·(h0/new_h) − 0.5 per axis, clamped to
the image (cv2 replicates the edge), bilinear between the two neighbours with cv2's 11-bit fixed-point weights and
rounding (source coordinates in double, weights rounded half to even, the vertical pass of its vectorised loop).
At scale 1 the weights are exactly (2048, 0), so an unresized axis is a copy, as in LetterBox. The result equals
cv2's bit for bit when the image is shrunk (checked on random crops of real photos); when it is enlarged, a few
percent of pixels differ by one grey level.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from yolojet.kernels.elementwise import check_view

_BLOCK_P = 512  # pixels a program: 2048 (pixel, channel) elements, the tile size of the other NHWC kernels


@dataclass(frozen=True)
class Letterbox:
    """Placement of the resized frame in the model input: scaled by `gain` to new_h × new_w, top-left at
    (pad_top, pad_left). ultralytics' scale_boxes maps boxes back with these (per-axis gains new_h/h0, new_w/w0)."""

    gain: float
    pad_top: int
    pad_left: int
    new_h: int
    new_w: int


def letterbox_params(orig_hw: tuple[int, int], target_hw: tuple[int, int]) -> Letterbox:
    """ultralytics LetterBox.get_params (auto=False, center=True, scaleup=True) for a (h0, w0) frame and an (H, W)
    model input."""
    (h0, w0), (h, w) = orig_hw, target_hw
    if min(h0, w0, h, w) < 1:
        raise ValueError(f"letterbox: sizes must be positive, got frame {orig_hw} and target {target_hw}")
    r = min(h / h0, w / w0)
    new_h, new_w = max(round(h0 * r), 1), max(round(w0 * r), 1)
    return Letterbox(r, round((h - new_h) / 2 - 0.1), round((w - new_w) / 2 - 0.1), new_h, new_w)


@triton.jit
def _cv2_taps(d, size, resized):
    """cv2.resize INTER_LINEAR source taps and 11-bit weights along one axis for destination indices d.

    The source coordinate is computed in double and rounded to float, as cv2 does (launched without FMA
    contraction, which cv2's build does not use either): float32 arithmetic moves some taps by a rounding step.
    """
    scale = size.to(tl.float64) / resized.to(tl.float64)
    f = ((d.to(tl.float64) + 0.5) * scale - 0.5).to(tl.float32)
    i = tl.floor(f)
    frac = f - i
    i = i.to(tl.int32)
    frac = tl.where(i < 0, 0.0, frac)
    i = tl.maximum(i, 0)
    frac = tl.where(i >= size - 1, 0.0, frac)  # cv2 replicates the last row or column
    i = tl.minimum(i, size - 1)
    scaled = (1.0 - frac) * 2048.0
    w0 = tl.floor(scaled + 0.5)
    w0 = tl.where((w0 - scaled == 0.5) & (w0 % 2 != 0), w0 - 1, w0).to(tl.int32)  # half to even, as cvRound
    return i, tl.minimum(i + 1, size - 1), w0, 2048 - w0


@triton.jit
def _letterbox_kernel(
    out_ptr,
    so_h,
    so_w,
    frame_ptr,
    sf_h,
    sf_w,
    H,
    W,
    H0,
    W0,
    pad_top,
    pad_left,
    new_h,
    new_w,
    C_IN: tl.constexpr,
    BGR: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    ch = tl.arange(0, 4)  # R, G, B and a masked lane: tensor dimensions must be powers of two
    c_ok = ch < 3
    p_ok = pix < H * W
    y = pix // W
    x = pix % W
    dy = y - pad_top
    dx = x - pad_left
    inside = p_ok & (dy >= 0) & (dy < new_h) & (dx >= 0) & (dx < new_w)

    y0, y1, wy0, wy1 = _cv2_taps(dy, H0, new_h)
    x0, x1, wx0, wx1 = _cv2_taps(dx, W0, new_w)
    row0 = y0.to(tl.int64) * sf_h
    row1 = y1.to(tl.int64) * sf_h
    col0 = (x0.to(tl.int64) * sf_w)[:, None]
    col1 = (x1.to(tl.int64) * sf_w)[:, None]

    if C_IN == 1:
        src_ch = ch * 0  # grey: every output channel reads the one input channel
    elif BGR:
        src_ch = 2 - ch
    else:
        src_ch = ch  # RGB(A): alpha, channel 3, is never read
    m = inside[:, None] & c_ok[None, :]
    base0 = frame_ptr + row0[:, None] + src_ch[None, :]
    base1 = frame_ptr + row1[:, None] + src_ch[None, :]
    p00 = tl.load(base0 + col0, mask=m, other=0).to(tl.int32)
    p01 = tl.load(base0 + col1, mask=m, other=0).to(tl.int32)
    p10 = tl.load(base1 + col0, mask=m, other=0).to(tl.int32)
    p11 = tl.load(base1 + col1, mask=m, other=0).to(tl.int32)
    # cv2's fixed-point arithmetic (11-bit weights; the vertical pass drops 4 bits, weighs, drops 16, then
    # rounds the last 2), so resized pixels equal cv2.resize's bit for bit wherever its SIMD path runs.
    upper = p00 * wx0[:, None] + p01 * wx1[:, None]
    lower = p10 * wx0[:, None] + p11 * wx1[:, None]
    pixel = (((upper >> 4) * wy0[:, None]) >> 16) + (((lower >> 4) * wy1[:, None]) >> 16)
    pixel = tl.minimum(tl.maximum((pixel + 2) >> 2, 0), 255).to(tl.float32)
    v = tl.where(m, pixel, 114.0) / 255.0  # 114: LetterBox's padding grey

    o_off = y.to(tl.int64) * so_h + x.to(tl.int64) * so_w
    tl.store(out_ptr + o_off[:, None] + ch[None, :], v.to(out_ptr.dtype.element_ty), mask=p_ok[:, None] & c_ok[None, :])


def preprocess_letterbox(
    out: torch.Tensor, frame: torch.Tensor, *, bgr: bool, params: Letterbox | None = None
) -> Letterbox:
    """Letterbox a uint8 (h0, w0, C) frame into `out`, an (H, W, 3) fp16/fp32 view (one NHWC batch slot, channel
    stride 1), as RGB/255; returns the placement (default letterbox_params((h0, w0), (H, W))).

    C = 1: grey, replicated to RGB; C = 3: BGR (bgr=True) or RGB; C = 4: BGRA or RGBA, alpha dropped. The frame
    may be a crop view (any row and pixel strides, channel stride 1) on out's device.
    """
    check_view("out", out, (None, None, 3))
    if out.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"out: dtype {out.dtype}, expected torch.float16 or torch.float32")
    if frame.dim() == 3 and frame.shape[2] == 1:
        frame = frame[..., 0, None]  # a lone channel's stride is meaningless (numpy's [..., None] makes it 0)
    check_view("frame", frame, (None, None, None), torch.uint8, out.device)
    h0, w0, c = frame.shape
    if h0 == 0 or w0 == 0:
        raise ValueError(f"frame: empty, shape {tuple(frame.shape)}")
    if c not in (1, 3, 4):
        raise ValueError(f"frame: {c} channels, expected 1 (grey), 3 (BGR/RGB) or 4 (BGRA/RGBA)")
    h, w = out.shape[:2]
    lb = letterbox_params((h0, w0), (h, w)) if params is None else params
    if not (0 <= lb.pad_top <= h - lb.new_h and 0 <= lb.pad_left <= w - lb.new_w and min(lb.new_h, lb.new_w) >= 1):
        raise ValueError(f"params: {lb} does not place the frame inside the {h}×{w} output")
    _letterbox_kernel[(triton.cdiv(h * w, _BLOCK_P),)](
        out,
        *out.stride()[:2],
        frame,
        *frame.stride()[:2],
        h,
        w,
        h0,
        w0,
        lb.pad_top,
        lb.pad_left,
        lb.new_h,
        lb.new_w,
        C_IN=c,
        BGR=bgr,
        BLOCK_P=_BLOCK_P,
        enable_fp_fusion=False,
    )
    return lb
