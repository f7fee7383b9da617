"""What the NHWC kernels share: the checks of the views and tiles they are given (a head fold's conv among them), the
pixel × channel tile of the single-pass kernels, and the pixel-index helpers their Triton code calls.
"""

from __future__ import annotations

from typing import Protocol

import torch
import triton
import triton.language as tl

from yolojet.kernels.activations import ACTIVATIONS


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


def check_decoded_rows(label: str, out: torch.Tensor, x: torch.Tensor, first_row: int, rows: int) -> None:
    """What a head fold that decodes (kernels/conv/boxes.py, extras.py) writes into, checked: the decode's (N, C, A)
    float32 output with contiguous anchors, for x's N images on x's device, holding rows `first_row` .. `first_row` +
    `rows`."""
    if out.dim() != 3 or out.dtype != torch.float32 or out.stride(2) != 1 or out.shape[0] != len(x):
        raise ValueError(
            f"{label}: out must be the decode's float32 ({len(x)}, C, A) output with contiguous anchors, got "
            f"{tuple(out.shape)} {out.dtype}"
        )
    if not 0 <= first_row <= out.shape[1] - rows:
        raise ValueError(f"{label}: rows {first_row}..{first_row + rows} are not rows of {out.shape[1]}")
    if out.device != x.device:
        raise ValueError(f"{label}: out is on {out.device}, x on {x.device}")


def check_head_conv(
    label: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    c_out: int,
    activation: str,
    anchor_offset: int,
    anchors: int,
) -> tuple[int, int, int, int]:
    """What a head fold's 1x1 conv (kernels/conv/scores.py, boxes.py, extras.py) is given, checked: x an NHWC fp16
    or fp32 view with unit channel stride; weight contiguous (c_out, 1, 1, C_in) of x's dtype; bias contiguous float32
    (c_out,); an activation by name; the map's anchors, `anchor_offset` + y·W + x, within a row of `anchors`. x's (N,
    H, W, C_in)."""
    if x.dim() != 4 or x.stride(3) != 1 or x.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"{label}: x must be a 4-D NHWC fp16 or fp32 view with unit channel stride, got {x.shape}")
    batch, height, width, c_in = x.shape
    if tuple(weight.shape) != (c_out, 1, 1, c_in) or not weight.is_contiguous() or weight.dtype != x.dtype:
        raise ValueError(
            f"{label}: weight must be a contiguous ({c_out}, 1, 1, {c_in}) {x.dtype} tensor, got "
            f"{tuple(weight.shape)} {weight.dtype}"
        )
    if tuple(bias.shape) != (c_out,) or bias.dtype != torch.float32 or bias.stride(0) != 1:
        raise ValueError(f"{label}: bias must be contiguous float32 of shape ({c_out},)")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{label}: activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if anchor_offset < 0 or anchor_offset + height * width > anchors:
        raise ValueError(
            f"{label}: anchors {anchor_offset}..{anchor_offset + height * width} past the {anchors} of a row"
        )
    return batch, height, width, c_in


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
