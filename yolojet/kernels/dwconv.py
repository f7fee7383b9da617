"""Depthwise 2-D convolution (groups == C_in == C_out) on NHWC channel-slice views, as direct kernels.

A depthwise conv has kh·kw multiply-adds per output element and no reduction over channels, so a GEMM would
be all padding; each program instead owns a (pixel block, channel block) tile, loads one contiguous channel
run per tap and pixel, and keeps the fp32 accumulator in registers. Bias, activation and residual are fused.
A second kernel, for 3x3 stride-1 convs, walks a band of output rows so that each input row is loaded once.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from yolojet.kernels.activations import ACTIVATIONS, apply_activation
from yolojet.kernels.launch import network_launcher
from yolojet.kernels.pdl import wait_for_previous_kernel
from yolojet.kernels.views import check_tile, check_view, nhwc_blocks, nhwc_offsets, pixel_coords


@dataclass(frozen=True)
class DwConvTile:
    """Output pixels (block_p) and channels (block_c) a program owns, and its warps. With `rows`, a 3x3 stride-1
    conv's program owns block_p pixels of `rows` consecutive output rows instead and walks down them (see
    _dwconv3x3_rows_kernel)."""

    block_p: int
    block_c: int
    num_warps: int
    rows: int = 0

    def __post_init__(self) -> None:
        check_tile(self, ("block_p", "block_c"))
        if self.rows < 0:
            raise ValueError(f"DwConvTile.rows must be >= 0, got {self.rows}")


# Elements (pixels x channels) a program owns, with the warps that suit them: the default's, and twice that, which
# halves the border rows (the input rows its neighbours read too) each program reads again. 1,024-element tiles won
# no layer of yolo11m or yolo26n at batch 1 or 64 on an H200 (bench/NOTES.md), and every candidate costs start-up
# time.
_TILE_ELEMENTS = ((2048, 4), (4096, 8))
_WIDEST_CHANNEL_BLOCK = 128
# Row-walking tiles (pixels of a row, output rows, warps), with the default's channel block, offered to 3x3 stride-1
# convs from this many output pixels (batch 64; at batch 1 the flat tiles keep more programs in flight, and every
# candidate costs start-up time).
_ROW_TILES = ((16, 8, 4), (32, 8, 4))
_ROW_TILES_MIN_PIXELS = 1 << 16


def dwconv_tile_set_id() -> str:
    """A short digest of how candidate tiles are made, for tuning results to be timed again when it changes."""
    offer = (_TILE_ELEMENTS, _WIDEST_CHANNEL_BLOCK, _ROW_TILES, _ROW_TILES_MIN_PIXELS)
    return hashlib.sha1(repr(offer).encode()).hexdigest()[:8]


def _channel_blocks(channels: int) -> list[int]:
    """Channel runs worth a tile: the default's, the widest, and the widest power of two that divides the channels
    exactly (80 channels: five blocks of 16 instead of two of 64, one of them a quarter used)."""
    widest = min(_WIDEST_CHANNEL_BLOCK, triton.next_power_of_2(channels))
    exact = channels & -channels  # the largest power of two dividing it
    blocks = {default_dwconv_tile(channels).block_c, widest}
    if 16 <= exact < widest:
        blocks.add(exact)
    return sorted(blocks)


def dwconv_candidate_tiles(
    channels: int, dtype: torch.dtype = torch.float16, *, walks_rows: bool = False, pixels: int = 0
) -> list[DwConvTile]:
    """Tiles worth timing for a depthwise conv over `channels` channels; fp32 takes the default only.
    `walks_rows`: the conv is 3x3 with stride 1, so from _ROW_TILES_MIN_PIXELS output `pixels` on the row-walking
    tiles are offered too."""
    if dtype == torch.float32:
        return [default_dwconv_tile(channels)]
    tiles = [
        DwConvTile(max(1, elements // block_c), block_c, warps)
        for block_c in _channel_blocks(channels)
        for elements, warps in _TILE_ELEMENTS
    ]
    if walks_rows and pixels >= _ROW_TILES_MIN_PIXELS:
        block_c = default_dwconv_tile(channels).block_c
        tiles += [DwConvTile(width, block_c, warps, rows) for width, rows, warps in _ROW_TILES]
    return tiles


@functools.cache
def default_dwconv_tile(channels: int) -> DwConvTile:
    """The untimed choice: 2048-element tiles with up to 64 contiguous channels, 4 warps."""
    return DwConvTile(*nhwc_blocks(channels), 4)


@triton.jit
def _dwconv2d_kernel(
    out_ptr,
    so_n,
    so_h,
    so_w,
    x_ptr,
    sx_n,
    sx_h,
    sx_w,
    w_ptr,
    sw_i,
    sw_j,
    b_ptr,
    r_ptr,
    sr_n,
    sr_h,
    sr_w,
    H,
    W,
    C,
    OH,
    OW,
    P,
    KH: tl.constexpr,
    KW: tl.constexpr,
    STRIDE: tl.constexpr,
    PAD: tl.constexpr,
    ACT: tl.constexpr,
    HAS_RES: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr,
):
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    p_ok = pix < P
    c_ok = ch < C
    n, oh, ow = pixel_coords(pix, OH, OW)
    ih0 = oh * STRIDE - PAD
    iw0 = ow * STRIDE - PAD
    # Window-origin pointers once per pixel; each tap then only adds a scalar and tests four int32 bounds.
    x_base = x_ptr + nhwc_offsets(n, ih0, iw0, sx_n, sx_h, sx_w)
    wait_for_previous_kernel(PDL)
    acc = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    for i in tl.static_range(KH):
        for j in tl.static_range(KW):
            inside = p_ok & (ih0 >= -i) & (ih0 < H - i) & (iw0 >= -j) & (iw0 < W - j)  # zero padding outside
            xv = tl.load(
                x_base[:, None] + (i * sx_h + j * sx_w) + ch[None, :], mask=inside[:, None] & c_ok[None, :], other=0.0
            )
            wv = tl.load(w_ptr + (i * sw_i + j * sw_j) + ch, mask=c_ok, other=0.0)
            acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]
    acc = apply_activation(acc + tl.load(b_ptr + ch, mask=c_ok, other=0.0)[None, :], ACT)
    mask = p_ok[:, None] & c_ok[None, :]
    if HAS_RES:
        r_off = nhwc_offsets(n, oh, ow, sr_n, sr_h, sr_w)
        acc += tl.load(r_ptr + r_off[:, None] + ch[None, :], mask=mask, other=0.0).to(tl.float32)
    o_off = nhwc_offsets(n, oh, ow, so_n, so_h, so_w)
    tl.store(out_ptr + o_off[:, None] + ch[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _dwconv3x3_rows_kernel(
    out_ptr,
    so_n,
    so_h,
    so_w,
    x_ptr,
    sx_n,
    sx_h,
    sx_w,
    w_ptr,
    sw_i,
    sw_j,
    b_ptr,
    r_ptr,
    sr_n,
    sr_h,
    sr_w,
    H,
    W,
    C,
    OH,
    OW,
    PAD: tl.constexpr,
    ACT: tl.constexpr,
    HAS_RES: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_C: tl.constexpr,
    ROWS: tl.constexpr,
    PDL: tl.constexpr,
):
    """A 3x3 stride-1 depthwise conv whose program owns BLOCK_W pixels of ROWS consecutive output rows and walks
    down the input rows they read. Input row iy feeds output rows iy + PAD − 2, − 1 and − 0 (through kernel rows 2,
    1 and 0), so each input row is loaded once, as its three pixel shifts, and added into three running sums: the
    oldest is then complete and stored, and the other two move up. The flat kernel loads every input row three
    times, once for each output row that reads it."""
    tiles_x = tl.cdiv(OW, BLOCK_W)
    bands = tl.cdiv(OH, ROWS)
    pid = tl.program_id(0)
    n = pid // (bands * tiles_x)
    oy0 = (pid // tiles_x) % bands * ROWS
    ox = pid % tiles_x * BLOCK_W + tl.arange(0, BLOCK_W)
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = ch < C
    ix = ox - PAD
    # The three pixel shifts' bounds, and the taps' weights (w[ky, kx, c]), once per program.
    # Weights and bias are read before waiting for the previous kernel: no kernel writes them.
    left_ok = ((ix >= 0) & (ix < W))[:, None] & c_ok[None, :]
    mid_ok = ((ix + 1 >= 0) & (ix + 1 < W))[:, None] & c_ok[None, :]
    right_ok = ((ix + 2 >= 0) & (ix + 2 < W))[:, None] & c_ok[None, :]
    w_c = w_ptr + ch
    w00 = tl.load(w_c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    w01 = tl.load(w_c + sw_j, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    w02 = tl.load(w_c + 2 * sw_j, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    w10 = tl.load(w_c + sw_i, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    w11 = tl.load(w_c + sw_i + sw_j, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    w12 = tl.load(w_c + sw_i + 2 * sw_j, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    w20 = tl.load(w_c + 2 * sw_i, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    w21 = tl.load(w_c + 2 * sw_i + sw_j, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    w22 = tl.load(w_c + 2 * sw_i + 2 * sw_j, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    bias = tl.load(b_ptr + ch, mask=c_ok, other=0.0)[None, :]
    x_row0 = x_ptr + n.to(tl.int64) * sx_n + (ix.to(tl.int64) * sx_w)[:, None] + ch[None, :]
    out_cols = out_ptr + n.to(tl.int64) * so_n + (ox.to(tl.int64) * so_w)[:, None] + ch[None, :]
    res_cols = r_ptr + n.to(tl.int64) * sr_n + (ox.to(tl.int64) * sr_w)[:, None] + ch[None, :]
    col_ok = (ox < OW)[:, None] & c_ok[None, :]
    wait_for_previous_kernel(PDL)
    older = tl.zeros((BLOCK_W, BLOCK_C), tl.float32)  # output row iy + PAD − 2: kernel rows 0 and 1 added
    newer = tl.zeros((BLOCK_W, BLOCK_C), tl.float32)  # output row iy + PAD − 1: kernel row 0 added
    for step in range(ROWS + 2):
        iy = oy0 - PAD + step
        row_in = (iy >= 0) & (iy < H)
        row = x_row0 + iy.to(tl.int64) * sx_h
        left = tl.load(row, mask=left_ok & row_in, other=0.0).to(tl.float32)
        mid = tl.load(row + sx_w, mask=mid_ok & row_in, other=0.0).to(tl.float32)
        right = tl.load(row + 2 * sx_w, mask=right_ok & row_in, other=0.0).to(tl.float32)
        done = older + left * w20 + mid * w21 + right * w22
        oy = iy + PAD - 2
        y = apply_activation(done + bias, ACT)
        keep = col_ok & (step >= 2) & (oy < OH)
        if HAS_RES:
            y += tl.load(res_cols + oy.to(tl.int64) * sr_h, mask=keep, other=0.0).to(tl.float32)
        tl.store(out_cols + oy.to(tl.int64) * so_h, y.to(out_ptr.dtype.element_ty), mask=keep)
        older = newer + left * w10 + mid * w11 + right * w12
        newer = left * w00 + mid * w01 + right * w02


def dwconv2d_nhwc(
    out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    *,
    stride: int = 1,
    padding: int = 0,
    activation: str = "identity",
    residual: torch.Tensor | None = None,
    tile: DwConvTile | None = None,
    pdl: bool = False,
    compile_only: bool = False,
) -> None:
    """out = act(depthwise_conv2d(x, weight) + bias) (+ residual), written in place.

    out[n, oh, ow, c] = act(bias[c] + sum_{i, j} weight[i, j, c] · x[n, oh·stride − padding + i, ow·stride −
    padding + j, c]) + residual[n, oh, ow, c], with x zero outside the image and the residual added after the
    activation. x: (N, H, W, C) view; out, residual: (N, OH, OW, C) views of x's dtype (any N/H/W strides, unit
    channel stride); weight: (kh, kw, C) view with unit channel stride, of x's dtype or fp32 (a tap's weights for a
    run of channels are then one vector load, and fp32 ones need no conversion: the engine's are); bias: fp32 (C,).
    `tile` picks the blocking (`default_dwconv_tile` when None); `compile_only` compiles without launching.
    """
    check_view("x", x, (None,) * 4)
    n, h, w, c = x.shape
    check_view("weight", weight, (None, None, c), None, x.device)
    if weight.dtype not in (x.dtype, torch.float32):
        expected = "torch.float32" if x.dtype == torch.float32 else f"{x.dtype} (x's) or torch.float32"
        raise ValueError(f"weight: dtype {weight.dtype}, expected {expected}")
    check_view("bias", bias, (c,), torch.float32, x.device)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if not isinstance(stride, int) or stride < 1 or not isinstance(padding, int) or padding < 0:
        raise ValueError(f"stride/padding: expected ints >= 1 / >= 0, got {stride!r} / {padding!r}")
    kh, kw = weight.shape[:2]
    oh = (h + 2 * padding - kh) // stride + 1
    ow = (w + 2 * padding - kw) // stride + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"weight: {kh}x{kw} kernel does not fit the padded {h}x{w} input")
    check_view("out", out, (n, oh, ow, c), x.dtype, x.device)
    if residual is not None:
        check_view("residual", residual, (n, oh, ow, c), x.dtype, x.device)
    res = out if residual is None else residual  # never read without HAS_RES; any valid pointer will do
    tile = tile or default_dwconv_tile(c)
    if tile.rows:
        if (kh, kw, stride) != (3, 3, 1):
            raise ValueError(f"tile {tile} walks rows of a 3x3 stride-1 conv, got a {kh}x{kw} kernel, stride {stride}")
        grid = (n * triton.cdiv(oh, tile.rows) * triton.cdiv(ow, tile.block_p), triton.cdiv(c, tile.block_c))
        kernel = network_launcher(_dwconv3x3_rows_kernel, grid, pdl, compile_only)
        kernel(
            out, *out.stride()[:3], x, *x.stride()[:3], weight, *weight.stride()[:2], bias, res, *res.stride()[:3], h,
            w, c, oh, ow, PAD=padding, ACT=ACTIVATIONS[activation], HAS_RES=residual is not None, BLOCK_W=tile.block_p,
            BLOCK_C=tile.block_c, ROWS=tile.rows, num_warps=tile.num_warps,
        )  # fmt: skip
        return
    grid = (triton.cdiv(n * oh * ow, tile.block_p), triton.cdiv(c, tile.block_c))
    kernel = network_launcher(_dwconv2d_kernel, grid, pdl, compile_only)
    kernel(
        out,
        *out.stride()[:3],
        x,
        *x.stride()[:3],
        weight,
        *weight.stride()[:2],
        bias,
        res,
        *res.stride()[:3],
        h,
        w,
        c,
        oh,
        ow,
        n * oh * ow,
        KH=kh,
        KW=kw,
        STRIDE=stride,
        PAD=padding,
        ACT=ACTIVATIONS[activation],
        HAS_RES=residual is not None,
        BLOCK_P=tile.block_p,
        BLOCK_C=tile.block_c,
        num_warps=tile.num_warps,
    )
