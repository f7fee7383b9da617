"""Elementwise kernels on NHWC channel-slice views: add, nearest upsample and copy.

All three are one gather kernel: out[n, y, x, c] = x[n, y // f, x // f, c] (+ b[n, y, x, c]), with f = 1 for add and
copy. The views may be channel slices of wider buffers (any N/H/W strides, channel stride 1).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yolojet.kernels.launch import network_launcher
from yolojet.kernels.pdl import wait_for_previous_kernel
from yolojet.kernels.views import check_view, nhwc_blocks, nhwc_offsets, pixel_coords


@triton.jit
def _gather_add_kernel(
    out_ptr,
    so_n,
    so_h,
    so_w,
    x_ptr,
    sx_n,
    sx_h,
    sx_w,
    b_ptr,
    sb_n,
    sb_h,
    sb_w,
    OH,
    OW,
    C,
    P,
    FACTOR: tl.constexpr,
    HAS_B: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr,
):
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    n, oh, ow = pixel_coords(pix, OH, OW)
    mask = (pix < P)[:, None] & (ch < C)[None, :]
    x_off = nhwc_offsets(n, oh // FACTOR, ow // FACTOR, sx_n, sx_h, sx_w)
    wait_for_previous_kernel(PDL)
    y = tl.load(x_ptr + x_off[:, None] + ch[None, :], mask=mask)
    if HAS_B:
        b = tl.load(b_ptr + nhwc_offsets(n, oh, ow, sb_n, sb_h, sb_w)[:, None] + ch[None, :], mask=mask)
        y = y.to(tl.float32) + b.to(tl.float32)
    o_off = nhwc_offsets(n, oh, ow, so_n, so_h, so_w)
    tl.store(out_ptr + o_off[:, None] + ch[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(
    out: torch.Tensor, x: torch.Tensor, b: torch.Tensor | None, factor: int, pdl: bool, compile_only: bool
) -> None:
    n, oh, ow, c = out.shape
    block_p, block_c = nhwc_blocks(c)
    grid = (triton.cdiv(n * oh * ow, block_p), triton.cdiv(c, block_c))
    bb = out if b is None else b  # unused when HAS_B is false; any valid pointer will do
    network_launcher(_gather_add_kernel, grid, pdl, compile_only)(
        out,
        *out.stride()[:3],
        x,
        *x.stride()[:3],
        bb,
        *bb.stride()[:3],
        oh,
        ow,
        c,
        n * oh * ow,
        FACTOR=factor,
        HAS_B=b is not None,
        BLOCK_P=block_p,
        BLOCK_C=block_c,
    )


def add_nhwc(
    out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, pdl: bool = False, compile_only: bool = False
) -> None:
    """out = a + b (computed in fp32, stored in out's dtype); all three (N, H, W, C) views of one dtype.
    `compile_only`: compile this launch's kernel without launching it."""
    check_view("a", a, (None,) * 4)
    check_view("b", b, a.shape, a.dtype, a.device)
    check_view("out", out, a.shape, a.dtype, a.device)
    _launch(out, a, b, 1, pdl, compile_only)


def upsample_nearest_nhwc(
    out: torch.Tensor, x: torch.Tensor, factor: int, *, pdl: bool = False, compile_only: bool = False
) -> None:
    """out[n, y, x, c] = x[n, y // factor, x // factor, c]; out is (N, H*factor, W*factor, C).
    `compile_only`: compile this launch's kernel without launching it."""
    check_view("x", x, (None,) * 4)
    if not isinstance(factor, int) or factor < 1:
        raise ValueError(f"factor: expected a positive int, got {factor!r}")
    n, h, w, c = x.shape
    check_view("out", out, (n, h * factor, w * factor, c), x.dtype, x.device)
    _launch(out, x, None, factor, pdl, compile_only)


def copy_nhwc(out: torch.Tensor, x: torch.Tensor, *, pdl: bool = False, compile_only: bool = False) -> None:
    """out[...] = x[...] for two (N, H, W, C) views of one shape and dtype (e.g. into a concat buffer's slice).
    `compile_only`: compile this launch's kernel without launching it."""
    check_view("x", x, (None,) * 4)
    check_view("out", out, x.shape, x.dtype, x.device)
    _launch(out, x, None, 1, pdl, compile_only)
