"""`box_conv_decode`: a detection head's last box conv (1x1) with the decode of its level's boxes as its epilogue.

The box branch ends in a 1x1 conv whose map (4 sides x reg_max bins a pixel) the head's decode reads back only to
turn it into a box: the expected bin of each side's softmax (DFL), then the anchor's box in input pixels. This kernel
computes the conv's outputs for a block of pixels and all its channels in registers, rounds them as the conv's store
would, and writes the level's four box rows of the decode's output itself, as kernels/decode.py would: the box map is
neither written nor read. At batch 64 of yolo11n's 640x480 rectangle that map is 52 MB; where the score convs fold
their part too (kernels/conv/scores.py) a detector's decode has nothing left to do and does not launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yolojet.kernels.activations import ACTIVATIONS
from yolojet.kernels.conv.epilogue import _head_conv_outputs
from yolojet.kernels.decode import _anchor_box
from yolojet.kernels.launch import network_launcher
from yolojet.kernels.views import check_decoded_rows, check_head_conv

# A program's pixels; its columns are the conv's every output (4 sides x reg_max bins), so that one program sees
# each of its anchors' four distributions whole.
_BLOCK_M = 64
_BLOCK_K = 64
MOST_BOX_CHANNELS = 128


@triton.jit
def _side_sum(values, side, s: tl.constexpr):
    """Σ over the columns of box side `s` of each row."""
    return tl.sum(tl.where(side[None, :] == s, values, 0.0), axis=1)


@triton.jit
def _side_max(values, side, s: tl.constexpr):
    """The largest of box side `s`'s columns of each row."""
    return tl.max(tl.where(side[None, :] == s, values, -1e30), axis=1)


@triton.jit
def _box_conv_kernel(
    x_ptr,
    stride_xn,
    stride_xh,
    stride_xw,
    w_ptr,
    bias_ptr,
    out_ptr,
    so_n,
    so_c,
    anchor_offset,
    stride,
    H,
    W,
    C_in,
    M,
    ACTIVATION: tl.constexpr,
    REG_MAX: tl.constexpr,
    XYWH: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """For BLOCK_M pixels p of the (N, H, W) map: raw[p, c] = act(bias[c] + Σ_k x[p, k] · w[c, k]) rounded to x's
    dtype as the conv's output would be; each side's distance the expected bin of softmax(raw[p, side·R : side·R + R])
    (raw[p, side] when R = 1); the box from anchor (x + 0.5, y + 0.5) ± the distances, times `stride`, stored in rows
    0-3 of out at anchor `anchor_offset` + y·W + x of the image."""
    raw, m_mask, img, oy, ox, offs_n, n_mask = _head_conv_outputs(
        x_ptr, stride_xn, stride_xh, stride_xw, w_ptr, bias_ptr, H, W, C_in, 4 * REG_MAX, M,
        ACTIVATION, BLOCK_M, BLOCK_N, BLOCK_K, PDL,
    )  # fmt: skip
    # Columns past the conv's outputs belong to no side.
    side = tl.where(n_mask, offs_n // REG_MAX, 4)
    if REG_MAX == 1:
        left = _side_sum(raw, side, 0)
        top = _side_sum(raw, side, 1)
        right = _side_sum(raw, side, 2)
        bottom = _side_sum(raw, side, 3)
    else:
        # One exponential a column: each column less its own side's peak (kernels/decode.py's _side_distance).
        p0, p1, p2, p3 = (
            _side_max(raw, side, 0),
            _side_max(raw, side, 1),
            _side_max(raw, side, 2),
            _side_max(raw, side, 3),
        )
        s = side[None, :]
        peak = tl.where(s == 0, p0[:, None], tl.where(s == 1, p1[:, None], tl.where(s == 2, p2[:, None], p3[:, None])))
        weights = tl.where(n_mask[None, :], tl.exp(raw - peak), 0.0)
        bins = (offs_n % REG_MAX).to(tl.float32)[None, :]
        left = _side_sum(weights * bins, side, 0) / tl.maximum(_side_sum(weights, side, 0), 1e-30)
        top = _side_sum(weights * bins, side, 1) / tl.maximum(_side_sum(weights, side, 1), 1e-30)
        right = _side_sum(weights * bins, side, 2) / tl.maximum(_side_sum(weights, side, 2), 1e-30)
        bottom = _side_sum(weights * bins, side, 3) / tl.maximum(_side_sum(weights, side, 3), 1e-30)
    b0, b1, b2, b3 = _anchor_box(
        ox.to(tl.float32) + 0.5, oy.to(tl.float32) + 0.5, left, top, right, bottom, stride, XYWH
    )
    out_col = out_ptr + img.to(tl.int64) * so_n + anchor_offset + (oy * W + ox)
    tl.store(out_col, b0, mask=m_mask)
    tl.store(out_col + so_c, b1, mask=m_mask)
    tl.store(out_col + 2 * so_c, b2, mask=m_mask)
    tl.store(out_col + 3 * so_c, b3, mask=m_mask)


def box_conv_decode(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    out: torch.Tensor,
    *,
    anchor_offset: int,
    stride: float,
    reg_max: int,
    xywh: bool,
    activation: str = "identity",
    pdl: bool = False,
    compile_only: bool = False,
) -> None:
    """One level's decoded boxes of a 1x1 box conv, written into rows 0-3 of the decode's output without the conv's
    map being stored.

    x: (N, H, W, C_in) NHWC view with unit channel stride (fp16 or fp32); weight: contiguous (4·reg_max, 1, 1, C_in)
    of x's dtype, the sides' bins in ultralytics' order (left, top, right, bottom); bias: contiguous float32
    (4·reg_max,); out: the decode's (N, 4 + ..., A) float32 output with contiguous anchors, whose anchors
    `anchor_offset` + y·W + x are this level's. Boxes are (cx, cy, w, h) with `xywh`, else (x1, y1, x2, y2), in
    input pixels of a level of stride `stride`: as kernels/decode.py writes them.
    """
    if reg_max < 1 or (reg_max > 1 and reg_max & (reg_max - 1)) or 4 * reg_max > MOST_BOX_CHANNELS:
        raise ValueError(f"box conv: reg_max must be 1 or a power of two up to {MOST_BOX_CHANNELS // 4}, got {reg_max}")
    check_decoded_rows("box conv", out, x, 0, 4)
    c_out = 4 * reg_max
    batch, height, width, c_in = check_head_conv(
        "box conv", x, weight, bias, c_out, activation, anchor_offset, out.shape[2]
    )
    m = batch * height * width
    if m == 0:
        return
    network_launcher(_box_conv_kernel, (triton.cdiv(m, _BLOCK_M),), pdl, compile_only)(
        x, *x.stride()[:3], weight, bias, out, out.stride(0), out.stride(1), anchor_offset, float(stride),
        height, width, c_in, m,
        ACTIVATION=ACTIVATIONS[activation], REG_MAX=reg_max, XYWH=xywh, BLOCK_M=_BLOCK_M,
        BLOCK_N=max(16, triton.next_power_of_2(c_out)), BLOCK_K=_BLOCK_K, num_warps=4, num_stages=3,
    )  # fmt: skip
