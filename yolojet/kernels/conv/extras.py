"""`extra_conv_decode`: a segment or pose head's last extra conv (1x1) with the decode of its level's extras as its
epilogue.

A segment head's mask-coefficient branch and a pose head's keypoint branch each end in a 1x1 conv whose map the
head's decode reads back only to copy it into the decode's output (mask coefficients) or to place it on the anchor's
grid first (keypoints, kernels/decode.py's `_keypoint_values`). This kernel computes the conv's outputs for a block
of pixels and all its channels in registers, rounds them as the conv's store would, and writes the level's extra rows
of the decode's output itself: the extra map is neither written nor read. At batch 64 of the 640x640 square that map
is 34 MB for a segment head's 32 coefficients and 55 MB (widened to 64 channels: 69 MB) for a pose head's 17
keypoints; where the box and score convs fold too, such a head's decode has nothing left and does not launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yolojet.kernels.activations import ACTIVATIONS
from yolojet.kernels.conv.epilogue import _head_conv_outputs
from yolojet.kernels.decode import _keypoint_values
from yolojet.kernels.launch import network_launcher
from yolojet.kernels.views import check_decoded_rows, check_head_conv

# A program's pixels; its columns are every output of the conv (the extras, and any padding to 16).
_BLOCK_M = 64
_BLOCK_K = 64
MOST_EXTRA_CHANNELS = 128


@triton.jit
def _extra_conv_kernel(
    x_ptr,
    stride_xn,
    stride_xh,
    stride_xw,
    w_ptr,
    bias_ptr,
    out_ptr,
    so_n,
    so_c,
    first_row,
    anchor_offset,
    stride,
    H,
    W,
    C_in,
    C_out,
    EXTRA,
    M,
    ACTIVATION: tl.constexpr,
    KEYPOINTS: tl.constexpr,
    KPT_DIM: tl.constexpr,
    KPT_V26: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """For BLOCK_M pixels p of the (N, H, W) map: raw[p, c] = act(bias[c] + Σ_k x[p, k] · w[c, k]) rounded to x's
    dtype as the conv's output would be; with KEYPOINTS each column decoded as a keypoint's x, y or visibility on
    anchor (x + 0.5, y + 0.5) of a level of stride `stride`; the first EXTRA columns stored in rows `first_row` + c of
    out at anchor `anchor_offset` + y·W + x of the image."""
    raw, m_mask, img, oy, ox, offs_n, _ = _head_conv_outputs(
        x_ptr, stride_xn, stride_xh, stride_xw, w_ptr, bias_ptr, H, W, C_in, C_out, M,
        ACTIVATION, BLOCK_M, BLOCK_N, BLOCK_K, PDL,
    )  # fmt: skip
    if KEYPOINTS:
        raw = _keypoint_values(raw, offs_n, ox.to(tl.float32) + 0.5, oy.to(tl.float32) + 0.5, stride, KPT_DIM, KPT_V26)
    out_col = out_ptr + img.to(tl.int64) * so_n + anchor_offset + (oy * W + ox)
    stored = m_mask[:, None] & (offs_n < EXTRA)[None, :]
    tl.store(out_col[:, None] + (first_row + offs_n)[None, :] * so_c, raw, mask=stored)


def extra_conv_decode(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    out: torch.Tensor,
    *,
    first_row: int,
    extra: int,
    anchor_offset: int,
    stride: float,
    keypoint_dim: int | None = None,
    keypoints_v26: bool = False,
    activation: str = "identity",
    pdl: bool = False,
    compile_only: bool = False,
) -> None:
    """One level's extras of a 1x1 extra conv, written into rows `first_row` .. `first_row` + `extra` of the decode's
    output without the conv's map being stored.

    x: (N, H, W, C_in) NHWC view with unit channel stride (fp16 or fp32); weight: contiguous (C_out, 1, 1, C_in) of
    x's dtype, C_out >= extra (the extras first, then any padding) and at most MOST_EXTRA_CHANNELS; bias: contiguous
    float32 (C_out,); out: the decode's (N, 4 + nc + extra, A) float32 output with contiguous anchors, whose anchors
    `anchor_offset` + y·W + x are this level's. Mask coefficients are stored as they are; with `keypoint_dim` (2 or
    3), keypoints decoded as kernels/decode.py does, on the anchors of a level of stride `stride` (ultralytics' v8
    offsets, or v26's with `keypoints_v26`).
    """
    c_out = weight.shape[0]
    if not 1 <= extra <= c_out <= MOST_EXTRA_CHANNELS:
        raise ValueError(f"extra conv: {extra} extras of {c_out} outputs; at most {MOST_EXTRA_CHANNELS} outputs")
    if keypoint_dim is not None and (keypoint_dim not in (2, 3) or extra % keypoint_dim):
        raise ValueError(f"extra conv: {extra} keypoint channels are not whole keypoints of {keypoint_dim} values")
    if first_row < 4:
        raise ValueError(f"extra conv: row {first_row} is a box row; the extras follow the boxes and classes")
    check_decoded_rows("extra conv", out, x, first_row, extra)
    batch, height, width, c_in = check_head_conv(
        "extra conv", x, weight, bias, c_out, activation, anchor_offset, out.shape[2]
    )
    m = batch * height * width
    if m == 0:
        return
    network_launcher(_extra_conv_kernel, (triton.cdiv(m, _BLOCK_M),), pdl, compile_only)(
        x, *x.stride()[:3], weight, bias, out, out.stride(0), out.stride(1), first_row, anchor_offset, float(stride),
        height, width, c_in, c_out, extra, m,
        ACTIVATION=ACTIVATIONS[activation], KEYPOINTS=keypoint_dim is not None, KPT_DIM=keypoint_dim or 3,
        KPT_V26=keypoints_v26, BLOCK_M=_BLOCK_M, BLOCK_N=max(16, triton.next_power_of_2(c_out)), BLOCK_K=_BLOCK_K,
        num_warps=4, num_stages=3,
    )  # fmt: skip
