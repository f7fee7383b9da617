"""Elementwise kernels on NHWC channel-slice views: add, nearest upsample and copy.

All three are one gather kernel: out[n, y, x, c] = x[n, y // f, x // f, c] (+ b[n, y, x, c]), with f = 1 for add and
copy. The views may be channel slices of wider buffers (any N/H/W strides, channel stride 1). The view checks,
tile choice and pixel-index helpers here are shared by the other direct NHWC kernels (dwconv, pool, attention,
classify).
"""

from __future__ import annotations

from typing import Protocol

import torch
import triton
import triton.language as tl

from yolojet.kernels.launch import launcher
from yolojet.kernels.pdl import launch_options, wait_for_previous_kernel


class _Tile(Protocol):
    """A tuning tile: its block sizes (read by name) and its warps."""

    @property
    def num_warps(self) -> int: ...


def check_tile(tile: _Tile, blocks: tuple[str, ...], minimum: int = 1) -> None:
    """A tuning tile's block sizes are powers of two (tl.arange's) of at least `minimum` (16 where they are a
    tl.dot side), and its warps a power of two up to 16."""
    kind = type(tile).__name__
    for name in blocks:
        value = getattr(tile, name)
        if value < minimum or value & (value - 1):
            floor = f" >= {minimum}" if minimum > 1 else ""
            raise ValueError(f"{kind}.{name} must be a power of two{floor}, got {value}")
    if tile.num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"{kind}.num_warps must be a power of two up to 16, got {tile.num_warps}")


def check_view(
    name: str,
    t: torch.Tensor,
    shape: tuple[int | None, ...],
    dtype: torch.dtype | None = None,
    device: torch.device | None = None,
) -> None:
    """Raise ValueError unless `t` matches `shape` (None matches any size), `dtype` and `device` (None: any) and
    has a unit last-dimension stride (channels contiguous)."""
    if t.dim() != len(shape) or any(e is not None and e != s for s, e in zip(t.shape, shape, strict=True)):
        expected = ", ".join("?" if e is None else str(e) for e in shape)
        raise ValueError(f"{name}: shape {tuple(t.shape)}, expected ({expected})")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name}: dtype {t.dtype}, expected {dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: device {t.device}, expected {device}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name}: last-dimension stride {t.stride(-1)}, expected 1 (contiguous)")


def nhwc_blocks(channels: int, tile: int = 2048) -> tuple[int, int]:
    """(BLOCK_P, BLOCK_C) for a pixel × channel tile of `tile` elements with up to 64 contiguous channels.

    2048 elements (16 a thread at 4 warps) measured best or near-best on an H200 for the single-pass kernels.
    """
    block_c = min(64, triton.next_power_of_2(channels))
    return tile // block_c, block_c


@triton.jit
def pixel_coords(pix, H, W):
    """(n, y, x) of flat pixel indices pix = (n·H + y)·W + x.

    int32: pixel counts stay far below 2**31 and int64 division costs several times more; element offsets, which
    can pass 2**31, go through nhwc_offsets.
    """
    x = pix % W
    t = pix // W
    return t // H, t % H, x


@triton.jit
def nhwc_offsets(n, y, x, s_n, s_h, s_w):
    """int64 element offsets of pixels (n, y, x) in an NHWC view with strides (s_n, s_h, s_w, 1)."""
    return n.to(tl.int64) * s_n + y.to(tl.int64) * s_h + x.to(tl.int64) * s_w


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
    launcher(_gather_add_kernel, grid, compile_only)(
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
        PDL=pdl,
        **launch_options(pdl),
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
