"""A depthwise conv and the 1x1 conv reading it in one launch: a depthwise separable conv, the depthwise map never
written to memory.

The detect heads of YOLO11 and YOLO26 classify through two such pairs a level (DWConv 3x3 -> Conv 1x1, twice). As
two launches the depthwise map is written and read back (80 channels at 80x80 and batch 64: 65 MB each way) and,
at batch 1, each launch holds its place in the chain of dependent launches. Here a program owns block_m output
pixels and block_n output channels, and walks the hidden channels block_k at a time: it computes the depthwise
conv of that channel block on its pixels (taps times channel runs, fp32 on the CUDA cores, then bias and
activation), rounds it to the activation dtype as the arena would hold it, and multiplies it into the 1x1 conv's
accumulator on the tensor cores; the 1x1 conv's epilogue (bias, activation, residual) is the convs' shared one.
Unlike a pair of 3x3 convs nothing is recomputed but where block_n does not cover every output channel (each
output-channel block computes the depthwise conv of its pixels again).

With a second 1x1 conv (`pointwise2`: the heads' last conv of a class branch, DWConv -> Conv 1x1 -> Conv2d 1x1) the
program holds every channel of the first 1x1 conv's output (at most `MAX_THEN_1X1_CHANNELS`), applies its bias and
activation, rounds it to the activation dtype and multiplies it by the second conv's weights: three launches in one,
two maps never written.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from yolojet.kernels.activations import ACTIVATIONS, apply_activation
from yolojet.kernels.conv.epilogue import MAX_THEN_1X1_CHANNELS, _epilogue, _output_pixels, _then_1x1_epilogue
from yolojet.kernels.launch import network_launcher
from yolojet.kernels.pdl import wait_for_previous_kernel
from yolojet.kernels.views import check_tile, check_view, check_weight_and_bias
from yolojet.options import interpreting

# (block_m, block_k, num_warps) timed for a separable conv, block_n covering the output channels up to
# _WIDEST_N: more pixels a program at high resolution, fewer at low (80x80: 100 / 50 / 200 programs a batch-1 image).
# Compiled for sm_90 with 80 or 128 output channels (`bench/fused_conv_registers.py`, Triton 3.8): 142, 180 and 188
# registers a thread, no spills; the 128-pixel tile at 4 warps spills, and 32-deep steps take 233 registers or more.
_SEPARABLE_TILES = ((64, 16, 8), (128, 16, 8), (32, 16, 4))
_WIDEST_N = 128
# Under the interpreter, which pays per program and per operation: few programs, wide blocks.
_INTERPRETER_TILE = (512, 64)


@dataclass(frozen=True)
class SeparableTile:
    """Output pixels (block_m) and channels (block_n) a program owns, the hidden channels a step (block_k) and its
    warps."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int

    def __post_init__(self) -> None:
        check_tile(self, ("block_m", "block_n", "block_k"), minimum=16)


def separable_tile_set_id() -> str:
    """A short digest of the tiles offered, for tuning results to be timed again when it changes."""
    return hashlib.sha1(repr((_SEPARABLE_TILES, _WIDEST_N)).encode()).hexdigest()[:8]


def _block_n(c_out: int) -> int:
    return min(_WIDEST_N, max(16, triton.next_power_of_2(c_out)))


def _block_k(channels: int, widest: int) -> int:
    """The widest power of two up to `widest` dividing the hidden channels (80: 16), else `widest`: no step half
    empty."""
    exact = channels & -channels
    return max(16, min(widest, exact)) if exact >= 16 else min(widest, max(16, triton.next_power_of_2(channels)))


def default_separable_tile(c_mid: int, c_out: int) -> SeparableTile:
    """The untimed tile: the first offered on a GPU; under the interpreter few, wide programs."""
    if interpreting():
        block_m, block_k = _INTERPRETER_TILE
        return SeparableTile(block_m, _block_n(c_out), _block_k(c_mid, block_k), 4)
    block_m, block_k, warps = _SEPARABLE_TILES[0]
    return SeparableTile(block_m, _block_n(c_out), _block_k(c_mid, block_k), warps)


def separable_candidate_tiles(c_mid: int, c_out: int, dtype: torch.dtype = torch.float16) -> list[SeparableTile]:
    """Tiles worth timing; fp32 and the interpreter take the default only (as the convs' tiles)."""
    if dtype == torch.float32 or interpreting():
        return [default_separable_tile(c_mid, c_out)]
    return list(dict.fromkeys(SeparableTile(m, _block_n(c_out), _block_k(c_mid, k), w) for m, k, w in _SEPARABLE_TILES))


@triton.jit
def _separable_conv_kernel(
    out_ptr, stride_on, stride_oh, stride_ow,
    x_ptr, stride_xn, stride_xh, stride_xw,
    res_ptr, stride_rn, stride_rh, stride_rw,
    dw_ptr, dw_bias_ptr, pw_ptr, pw_bias_ptr, pw2_ptr, pw2_bias_ptr,
    H, W, OH, OW, C_mid, C_out, C_out2, M,
    KH: tl.constexpr, KW: tl.constexpr, STRIDE: tl.constexpr, PAD: tl.constexpr,
    ACT1: tl.constexpr, ACT2: tl.constexpr, ACT3: tl.constexpr, HAS_RESIDUAL: tl.constexpr, SECOND_1X1: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_N2: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    img, oy, ox, iy0, ix0 = _output_pixels(offs_m, OH, OW, STRIDE, STRIDE, PAD, PAD)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < C_out
    offs_k = tl.arange(0, BLOCK_K)
    # Window-origin pointers once per pixel; each tap adds a scalar offset.
    x_rows = x_ptr + img * stride_xn + iy0.to(tl.int64) * stride_xh + ix0.to(tl.int64) * stride_xw
    wait_for_previous_kernel(PDL)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, C_mid, BLOCK_K):
        ch = k0 + offs_k
        k_ok = ch < C_mid
        hidden = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        for i in tl.static_range(KH):
            for j in tl.static_range(KW):
                inside = m_ok & (iy0 >= -i) & (iy0 < H - i) & (ix0 >= -j) & (ix0 < W - j)  # zero padding outside
                xv = tl.load(x_rows[:, None] + (i * stride_xh + j * stride_xw) + ch[None, :],
                             mask=inside[:, None] & k_ok[None, :], other=0.0)  # fmt: skip
                wv = tl.load(dw_ptr + ch * (KH * KW) + (i * KW + j), mask=k_ok, other=0.0)
                hidden += xv.to(tl.float32) * wv.to(tl.float32)[None, :]
        hidden = apply_activation(hidden + tl.load(dw_bias_ptr + ch, mask=k_ok, other=0.0)[None, :], ACT1)
        # The depthwise map in the activation dtype, as the arena would hold it between two launches.
        a = hidden.to(x_ptr.dtype.element_ty)
        b = tl.load(pw_ptr + offs_n[None, :] * C_mid + ch[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        # "ieee" keeps fp32 exact (no TF32), as the convs' kernels; Triton ignores it for fp16 operands.
        acc = tl.dot(a, b, acc, input_precision="ieee")
    if SECOND_1X1:  # the first 1x1 conv's whole output on this tile (one block of every channel) through the second
        _then_1x1_epilogue(acc, m_ok, offs_n, n_ok, pw_bias_ptr, ACT2, pw2_ptr, C_out, pw2_bias_ptr, C_out2, img, oy,
                           ox, res_ptr, stride_rn, stride_rh, stride_rw, out_ptr, stride_on, stride_oh, stride_ow,
                           ACT3, HAS_RESIDUAL, BLOCK_N2)  # fmt: skip
    else:
        _epilogue(acc, m_ok[:, None] & n_ok[None, :], offs_n, n_ok, img, oy, ox, pw_bias_ptr, res_ptr, stride_rn,
                  stride_rh, stride_rw, out_ptr, stride_on, stride_oh, stride_ow, ACT2, HAS_RESIDUAL)  # fmt: skip


def separable_conv_nhwc(
    out: torch.Tensor,
    x: torch.Tensor,
    depthwise: torch.Tensor,
    depthwise_bias: torch.Tensor,
    pointwise: torch.Tensor,
    pointwise_bias: torch.Tensor,
    *,
    stride: int = 1,
    padding: int = 1,
    activation1: str = "silu",
    activation2: str = "silu",
    pointwise2: torch.Tensor | None = None,
    pointwise2_bias: torch.Tensor | None = None,
    activation3: str = "identity",
    residual: torch.Tensor | None = None,
    tile: SeparableTile | None = None,
    pdl: bool = False,
    compile_only: bool = False,
) -> None:
    """out = act2(conv1x1(act1(depthwise_conv(x) + depthwise_bias), pointwise) + pointwise_bias) (+ residual),
    written in place; the depthwise map is rounded to x's dtype, as two launches would store it. With `pointwise2`
    that result (rounded likewise, without the residual) goes through a second 1x1 conv: out =
    act3(conv1x1(..., pointwise2) + pointwise2_bias) (+ residual).

    x: (N, H, W, C) fp16/fp32 view with unit channel stride; depthwise: contiguous (C, kh, kw) of x's dtype, square,
    with `stride` and `padding`; pointwise: contiguous (C_out, 1, 1, C) of x's dtype; pointwise2: contiguous
    (C_out2, 1, 1, C_out), C_out and C_out2 at most MAX_THEN_1X1_CHANNELS; biases fp32; out and residual: (N, OH, OW,
    C_out or C_out2) views of x's dtype. out must not overlap x (other programs still read it)."""
    if x.dim() != 4 or x.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"x must be a 4-D NHWC float16/float32 tensor, got {x.dtype} {tuple(x.shape)}")
    batch, height, width, channels = x.shape
    check_view("x", x, (batch, height, width, channels))
    if depthwise.dim() != 3 or depthwise.shape[1] != depthwise.shape[2]:
        raise ValueError(f"depthwise must be a square (C, k, k) kernel, got shape {tuple(depthwise.shape)}")
    kernel = depthwise.shape[1]
    c_out = pointwise.shape[0]
    names = ("depthwise", "depthwise_bias")
    check_weight_and_bias(names, depthwise, depthwise_bias, (channels, kernel, kernel), x.dtype, x.device)
    names = ("pointwise", "pointwise_bias")
    check_weight_and_bias(names, pointwise, pointwise_bias, (c_out, 1, 1, channels), x.dtype, x.device)
    c_final = c_out if pointwise2 is None else pointwise2.shape[0]
    if pointwise2 is not None:
        names = ("pointwise2", "pointwise2_bias")
        check_weight_and_bias(names, pointwise2, pointwise2_bias, (c_final, 1, 1, c_out), x.dtype, x.device)
        if max(c_out, c_final) > MAX_THEN_1X1_CHANNELS:
            raise ValueError(f"a second 1x1 conv needs at most {MAX_THEN_1X1_CHANNELS} channels out of each 1x1 conv, "
                             f"got {c_out} and {c_final}")  # fmt: skip
    if not (isinstance(stride, int) and stride >= 1 and isinstance(padding, int) and padding >= 0):
        raise ValueError(f"stride must be an int >= 1 and padding an int >= 0, got {stride!r} and {padding!r}")
    oh = (height + 2 * padding - kernel) // stride + 1
    ow = (width + 2 * padding - kernel) // stride + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"a {kernel}x{kernel} kernel does not fit the padded {height}x{width} input")
    check_view("out", out, (batch, oh, ow, c_final), x.dtype, x.device)
    if residual is not None:
        check_view("residual", residual, (batch, oh, ow, c_final), x.dtype, x.device)
    for name, activation in (("activation1", activation1), ("activation2", activation2), ("activation3", activation3)):
        if activation not in ACTIVATIONS:
            raise ValueError(f"{name} must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    tile = tile or default_separable_tile(channels, c_out)
    if pointwise2 is not None and tile.block_n < c_out:
        raise ValueError(f"tile {tile}: a second 1x1 conv needs block_n >= the first's {c_out} output channels")
    m = batch * oh * ow
    if m == 0 or c_final == 0:
        return
    grid = (triton.cdiv(m, tile.block_m), 1 if pointwise2 is not None else triton.cdiv(c_out, tile.block_n))
    res = out if residual is None else residual  # never read without HAS_RESIDUAL
    second, second_bias = (pointwise, pointwise_bias) if pointwise2 is None else (pointwise2, pointwise2_bias)
    network_launcher(_separable_conv_kernel, grid, pdl, compile_only)(
        out, *out.stride()[:3], x, *x.stride()[:3], res, *res.stride()[:3], depthwise, depthwise_bias, pointwise,
        pointwise_bias, second, second_bias, height, width, oh, ow, channels, c_out, c_final, m, KH=kernel, KW=kernel,
        STRIDE=stride, PAD=padding, ACT1=ACTIVATIONS[activation1], ACT2=ACTIVATIONS[activation2],
        ACT3=ACTIVATIONS[activation3], HAS_RESIDUAL=residual is not None, SECOND_1X1=pointwise2 is not None,
        BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_N2=_block_n(c_final), BLOCK_K=tile.block_k,
        num_warps=tile.num_warps,
    )  # fmt: skip
