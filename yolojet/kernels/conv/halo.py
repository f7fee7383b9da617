"""`_conv_halo_kernel`: a stride-1 k x k conv of few input channels whose program reads its input tile and the tile's
halo once and takes every tap from it.

The gathering GEMM reads a pixel's channels once for each of the k·k taps that use it: for C3k2's 3x3 convs of 8
and 16 channels at 160x160 and batch 64 that is ~470 MB through L2 for 52 MB of input, at 0.47-0.50 TB/s (bench/
NOTES.md, "Where batch 64's network time is"). Here a program's output tile of TILE_H x TILE_W pixels loads its
(TILE_H + k - 1) x (TILE_W + k - 1) input pixels once, as rows of a register tile, and each tap's A operand is a
gather of that tile's rows (`tl.gather`, through shared memory), then one tensor-core dot of the tap's channels.
"""

import triton
import triton.language as tl

from yolojet.kernels.conv.epilogue import _epilogue
from yolojet.kernels.pdl import wait_for_previous_kernel


@triton.jit
def _conv_halo_kernel(
    out_ptr,
    stride_on,
    stride_oh,
    stride_ow,
    x_ptr,
    stride_xn,
    stride_xh,
    stride_xw,
    w_ptr,
    bias_ptr,
    res_ptr,
    stride_rn,
    stride_rh,
    stride_rw,
    H,
    W,
    OH,
    OW,
    C_out,
    pad_y,
    pad_x,
    C_IN: tl.constexpr,
    KH: tl.constexpr,
    KW: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    TILE_H: tl.constexpr,
    TILE_W: tl.constexpr,
    HALO_ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr,
):
    """out = act(conv2d(x, w, stride 1, padding (pad_y, pad_x)) + bias) (+ residual) for one TILE_H x TILE_W tile of
    one image's output and BLOCK_N of its channels. HALO_ROWS: (TILE_H + KH - 1) * (TILE_W + KW - 1) rounded up to a
    power of two (the register tile's rows; those past the halo are masked); BLOCK_C: C_IN rounded up to a power of
    two of at least 16 (the dot's K; the padding channels load as zeros)."""
    HALO_W: tl.constexpr = TILE_W + KW - 1
    HALO_H: tl.constexpr = TILE_H + KH - 1
    pid = tl.program_id(0)
    tiles_x = tl.cdiv(OW, TILE_W)
    tiles_y = tl.cdiv(OH, TILE_H)
    blocks_n = tl.cdiv(C_out, BLOCK_N)
    pid_n = pid % blocks_n
    tile = pid // blocks_n
    img = (tile // (tiles_x * tiles_y)).to(tl.int64)
    ty0 = (tile // tiles_x) % tiles_y * TILE_H
    tx0 = tile % tiles_x * TILE_W

    # The input tile with its halo: row q of the register tile is input pixel (ty0 - pad_y + q // HALO_W,
    # tx0 - pad_x + q % HALO_W); outside the image (the padding) and past the halo, zeros.
    q = tl.arange(0, HALO_ROWS)
    iy = ty0 - pad_y + q // HALO_W
    ix = tx0 - pad_x + q % HALO_W
    inside = (q < HALO_H * HALO_W) & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
    channels = tl.arange(0, BLOCK_C)
    pixels = x_ptr + img * stride_xn + iy.to(tl.int64) * stride_xh + ix.to(tl.int64) * stride_xw
    wait_for_previous_kernel(PDL)
    halo = tl.load(pixels[:, None] + channels[None, :], mask=inside[:, None] & (channels < C_IN)[None, :], other=0.0)

    # Output pixel p of the tile reads halo row (p // TILE_W + ky) * HALO_W + p % TILE_W + kx for tap (ky, kx).
    p = tl.arange(0, TILE_H * TILE_W)
    first_row = (p // TILE_W) * HALO_W + p % TILE_W
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < C_out
    w_cols = w_ptr + offs_n[None, :] * (KH * KW * C_IN) + channels[:, None]
    w_mask = (channels < C_IN)[:, None] & n_mask[None, :]
    acc = tl.zeros((TILE_H * TILE_W, BLOCK_N), dtype=tl.float32)
    for ky in tl.static_range(KH):
        for kx in tl.static_range(KW):
            rows = first_row + ky * HALO_W + kx
            a = tl.gather(halo, tl.broadcast_to(rows[:, None], (TILE_H * TILE_W, BLOCK_C)), axis=0)
            w = tl.load(w_cols + (ky * KW + kx) * C_IN, mask=w_mask, other=0.0)
            acc = tl.dot(a, w, acc, input_precision="ieee")  # fp32 mode exact (no TF32)

    oy = ty0 + p // TILE_W
    ox = tx0 + p % TILE_W
    mask = ((oy < OH) & (ox < OW))[:, None] & n_mask[None, :]
    _epilogue(acc, mask, offs_n, n_mask, img, oy, ox, bias_ptr, res_ptr, stride_rn, stride_rh, stride_rw, out_ptr,
              stride_on, stride_oh, stride_ow, ACTIVATION, HAS_RESIDUAL)  # fmt: skip
