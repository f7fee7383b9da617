"""Two 3x3 convs in one launch: conv -> conv (+ residual), stride 1, padding 1, the hidden map kept on chip.

A bottleneck's pair (C3k's, C2f's and the detect head's box branch) at low resolution is two launches of a few
microseconds each, and at batch 1 a launch's place in the chain of dependent launches costs about as much as its
work. `conv_pair_nhwc` runs both: a program owns a tile_h x tile_w patch of one image's output pixels and every
channel. Phase 1 computes the hidden map on the patch grown by a 1-pixel ring (the halo, which neighbouring programs
compute again), zeroes it outside the image (the second conv's zero padding), and stores it in the activation dtype
to the program's own slot of a scratch buffer, as the two-launch path would store it in the arena; a barrier across
the program's threads; phase 2 reads the slot at the nine tap shifts and runs the second conv, ending in the convs'
shared epilogue (bias, activation, residual). The hidden map is never written to the arena.

With a 1x1 conv after the pair (`weight3`: the heads' box, mask-coefficient and keypoint branches end 3x3 -> 3x3 ->
1x1) the program, which holds every output channel of the second conv, applies its bias and activation, rounds it to
the activation dtype and multiplies it by the 1x1 conv's weights: three launches in one.

Every channel of the hidden map lives in one program, so the kernel takes pairs of at most `MAX_PAIR_CHANNELS`
hidden and output channels; the recomputed ring grows the first conv's work by (tile_h + 2)(tile_w + 2) /
(tile_h tile_w), so it pays only where launches, not work, dominate (engine/lowering.py uses it below a pixel count).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from yolojet.kernels.activations import ACTIVATIONS, apply_activation
from yolojet.kernels.conv.epilogue import MAX_THEN_1X1_CHANNELS, _epilogue, _then_1x1_epilogue
from yolojet.kernels.launch import network_launcher
from yolojet.kernels.pdl import wait_for_previous_kernel
from yolojet.kernels.views import check_view, check_weight_and_bias
from yolojet.options import interpreting

# Hidden and output channels one program holds. Compiled for sm_90 (`bench/fused_conv_registers.py`, Triton 3.8) with
# every tile offered: 64 channels take 86-112 registers a thread, 128 take 156-162, neither spills; 256 would double
# the accumulators again.
MAX_PAIR_CHANNELS = 128
# (tile_h, tile_w, num_warps) timed for a pair: 4x8 (32 output pixels, 60 of the first conv's), and two smaller
# patches that launch two and four times the programs for a small map (20x20 at batch 1: 15, 30, 60 programs).
_PAIR_TILES = ((4, 8, 4), (2, 8, 4), (2, 4, 4))
_MIN_DOT = 16  # tl.dot's smallest side
# Under the interpreter, which pays per program and per operation: one program a map up to this side.
_INTERPRETER_SIDE = 16


@dataclass(frozen=True)
class ConvPairTile:
    """The output patch a program owns (tile_h x tile_w pixels, any sizes) and its warps."""

    tile_h: int
    tile_w: int
    num_warps: int

    def __post_init__(self) -> None:
        if self.tile_h < 1 or self.tile_w < 1:
            raise ValueError(f"ConvPairTile: tile sides must be >= 1, got {self.tile_h} x {self.tile_w}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"ConvPairTile.num_warps must be a power of two up to 16, got {self.num_warps}")


def conv_pair_tile_set_id() -> str:
    """A short digest of the tiles offered, for tuning results to be timed again when it changes."""
    return hashlib.sha1(repr((_PAIR_TILES, MAX_PAIR_CHANNELS)).encode()).hexdigest()[:8]


def default_conv_pair_tile(height: int, width: int) -> ConvPairTile:
    """The untimed tile: 4x8 on a GPU; under the interpreter one program a map (up to 16 x 16)."""
    if interpreting():
        return ConvPairTile(min(height, _INTERPRETER_SIDE), min(width, _INTERPRETER_SIDE), 4)
    return ConvPairTile(*_PAIR_TILES[0])


def conv_pair_candidate_tiles(height: int, width: int, dtype: torch.dtype = torch.float16) -> list[ConvPairTile]:
    """Tiles worth timing; fp32 takes the default only (as the convs' tiles)."""
    if dtype == torch.float32 or interpreting():
        return [default_conv_pair_tile(height, width)]
    return [ConvPairTile(*tile) for tile in _PAIR_TILES]


def _block(value: int) -> int:
    return max(_MIN_DOT, triton.next_power_of_2(value))


@dataclass(frozen=True)
class _PairBlocks:
    """What a tile means for one map: programs, the padded pixel rows of the two phases, and a program's slot."""

    programs: int
    tiles_y: int
    tiles_x: int
    block_p: int  # the patch and its ring, padded to a power of two
    block_q: int  # the patch
    block_mid: int
    block_n: int

    @classmethod
    def of(cls, tile: ConvPairTile, batch: int, height: int, width: int, c_mid: int, c_out: int) -> _PairBlocks:
        tiles_y, tiles_x = triton.cdiv(height, tile.tile_h), triton.cdiv(width, tile.tile_w)
        return cls(
            batch * tiles_y * tiles_x,
            tiles_y,
            tiles_x,
            _block((tile.tile_h + 2) * (tile.tile_w + 2)),
            _block(tile.tile_h * tile.tile_w),
            _block(c_mid),
            _block(c_out),
        )

    @property
    def slot(self) -> int:
        return self.block_p * self.block_mid


def conv_pair_scratch_elements(tile: ConvPairTile, batch: int, height: int, width: int, c_mid: int, c_out: int) -> int:
    """Scratch elements (of the activation dtype) a launch with `tile` needs: a hidden patch a program."""
    blocks = _PairBlocks.of(tile, batch, height, width, c_mid, c_out)
    return blocks.programs * blocks.slot


def pair_fits(c_mid: int, c_out: int) -> bool:
    """Whether the kernel takes a pair of these hidden and output channel counts."""
    return c_mid <= MAX_PAIR_CHANNELS and c_out <= MAX_PAIR_CHANNELS


@triton.jit
def _conv_pair_kernel(
    out_ptr, stride_on, stride_oh, stride_ow,
    x_ptr, stride_xn, stride_xh, stride_xw,
    res_ptr, stride_rn, stride_rh, stride_rw,
    w1_ptr, b1_ptr, w2_ptr, b2_ptr, w3_ptr, b3_ptr, scratch_ptr,
    H, W, C_in, C_mid, C_out, C_out3, tiles_y, tiles_x,
    ACT1: tl.constexpr, ACT2: tl.constexpr, ACT3: tl.constexpr, HAS_RESIDUAL: tl.constexpr, THIRD_1X1: tl.constexpr,
    TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_MID: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_N3: tl.constexpr, BLOCK_K1: tl.constexpr,
    BLOCK_K2: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    per_image = tiles_y * tiles_x
    img = (pid // per_image).to(tl.int64)
    t = pid % per_image
    ty0 = (t // tiles_x) * TILE_H
    tx0 = (t % tiles_x) * TILE_W
    PW: tl.constexpr = TILE_W + 2
    # Phase 1: the hidden map on the patch and its 1-pixel ring.
    p = tl.arange(0, BLOCK_P)
    p_ok = p < (TILE_H + 2) * PW
    by = ty0 - 1 + p // PW
    bx = tx0 - 1 + p % PW
    inside = p_ok & (by >= 0) & (by < H) & (bx >= 0) & (bx < W)
    mid = tl.arange(0, BLOCK_MID)
    mid_ok = mid < C_mid
    offs_k = tl.arange(0, BLOCK_K1)
    x_img = x_ptr + img * stride_xn
    wait_for_previous_kernel(PDL)
    acc = tl.zeros((BLOCK_P, BLOCK_MID), dtype=tl.float32)
    k_blocks = tl.cdiv(C_in, BLOCK_K1)
    for it in range(9 * k_blocks):
        tap = it // k_blocks
        k0 = (it - tap * k_blocks) * BLOCK_K1
        iy = by - 1 + tap // 3
        ix = bx - 1 + tap % 3
        ok = inside & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
        k_ok = offs_k < C_in - k0
        rows = x_img + iy.to(tl.int64) * stride_xh + ix.to(tl.int64) * stride_xw
        a = tl.load(rows[:, None] + (k0 + offs_k)[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w1_ptr + mid[None, :] * (9 * C_in) + (tap * C_in + k0 + offs_k)[:, None],
                    mask=k_ok[:, None] & mid_ok[None, :], other=0.0)  # fmt: skip
        # "ieee" keeps fp32 exact (no TF32), as the convs' kernels; Triton ignores it for fp16 operands.
        acc = tl.dot(a, b, acc, input_precision="ieee")
    bias1 = tl.load(b1_ptr + mid, mask=mid_ok, other=0.0)
    hidden = apply_activation(acc + bias1[None, :], ACT1)
    hidden = tl.where(inside[:, None] & mid_ok[None, :], hidden, 0.0)  # the second conv's zero padding
    slot = scratch_ptr + pid.to(tl.int64) * (BLOCK_P * BLOCK_MID)
    tl.store(slot + p[:, None] * BLOCK_MID + mid[None, :], hidden.to(scratch_ptr.dtype.element_ty))
    tl.debug_barrier()  # every thread's part of the slot is written before any thread reads it
    # Phase 2: the second conv on the patch, reading the slot at the taps' shifts.
    q = tl.arange(0, BLOCK_Q)
    qy = q // TILE_W
    qx = q % TILE_W
    oy = ty0 + qy
    ox = tx0 + qx
    q_ok = (q < TILE_H * TILE_W) & (oy < H) & (ox < W)
    offs_n = tl.arange(0, BLOCK_N)
    n_ok = offs_n < C_out
    offs_k = tl.arange(0, BLOCK_K2)
    acc2 = tl.zeros((BLOCK_Q, BLOCK_N), dtype=tl.float32)
    for tap in tl.static_range(9):
        prow = (qy + tap // 3) * PW + (qx + tap % 3)
        for k0 in range(0, C_mid, BLOCK_K2):
            k_ok = offs_k < C_mid - k0
            a = tl.load(slot + prow[:, None] * BLOCK_MID + (k0 + offs_k)[None, :],
                        mask=q_ok[:, None] & k_ok[None, :], other=0.0)  # fmt: skip
            b = tl.load(w2_ptr + offs_n[None, :] * (9 * C_mid) + (tap * C_mid + k0 + offs_k)[:, None],
                        mask=k_ok[:, None] & n_ok[None, :], other=0.0)  # fmt: skip
            acc2 = tl.dot(a, b, acc2, input_precision="ieee")
    if THIRD_1X1:  # the second conv's whole output on the patch through the 1x1 conv
        _then_1x1_epilogue(acc2, q_ok, offs_n, n_ok, b2_ptr, ACT2, w3_ptr, C_out, b3_ptr, C_out3, img, oy, ox, res_ptr,
                           stride_rn, stride_rh, stride_rw, out_ptr, stride_on, stride_oh, stride_ow, ACT3,
                           HAS_RESIDUAL, BLOCK_N3)  # fmt: skip
    else:
        _epilogue(acc2, q_ok[:, None] & n_ok[None, :], offs_n, n_ok, img, oy, ox, b2_ptr, res_ptr, stride_rn,
                  stride_rh, stride_rw, out_ptr, stride_on, stride_oh, stride_ow, ACT2, HAS_RESIDUAL)  # fmt: skip


def conv_pair_nhwc(
    out: torch.Tensor,
    x: torch.Tensor,
    weight1: torch.Tensor,
    bias1: torch.Tensor,
    weight2: torch.Tensor,
    bias2: torch.Tensor,
    *,
    scratch: torch.Tensor,
    activation1: str = "silu",
    activation2: str = "silu",
    weight3: torch.Tensor | None = None,
    bias3: torch.Tensor | None = None,
    activation3: str = "identity",
    residual: torch.Tensor | None = None,
    tile: ConvPairTile | None = None,
    pdl: bool = False,
    compile_only: bool = False,
) -> None:
    """out = act2(conv3x3(act1(conv3x3(x, weight1) + bias1), weight2) + bias2) (+ residual), both convs stride 1
    and padding 1, written in place; the hidden map passes through `scratch`, never through memory of the caller's.
    With `weight3` (C_out3, 1, 1, C_out) a 1x1 conv follows on the pair's result (rounded to x's dtype, without the
    residual): out = act3(conv1x1(..., weight3) + bias3) (+ residual), C_out3 at most MAX_THEN_1X1_CHANNELS.

    x: (N, H, W, C_in) fp16/fp32 view with unit channel stride; out and residual: (N, H, W, C_out) views of x's
    dtype; weight1 (C_mid, 3, 3, C_in) and weight2 (C_out, 3, 3, C_mid) contiguous of x's dtype, C_mid and C_out at
    most MAX_PAIR_CHANNELS; biases fp32; scratch: contiguous, x's dtype, at least `conv_pair_scratch_elements`
    elements for the tile, used by no other launch that may run at the same time. out must not overlap x or the
    residual (other programs still read them while one writes its patch)."""
    if x.dim() != 4 or x.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"x must be a 4-D NHWC float16/float32 tensor, got {x.dtype} {tuple(x.shape)}")
    batch, height, width, c_in = x.shape
    check_view("x", x, (batch, height, width, c_in))
    c_mid, c_out = weight1.shape[0], weight2.shape[0]
    check_weight_and_bias(("weight1", "bias1"), weight1, bias1, (c_mid, 3, 3, c_in), x.dtype, x.device)
    check_weight_and_bias(("weight2", "bias2"), weight2, bias2, (c_out, 3, 3, c_mid), x.dtype, x.device)
    c_final = c_out if weight3 is None else weight3.shape[0]
    if weight3 is not None:
        check_weight_and_bias(("weight3", "bias3"), weight3, bias3, (c_final, 1, 1, c_out), x.dtype, x.device)
    check_view("out", out, (batch, height, width, c_final), x.dtype, x.device)
    if residual is not None:
        check_view("residual", residual, (batch, height, width, c_final), x.dtype, x.device)
    if not pair_fits(c_mid, c_out):
        raise ValueError(f"a conv pair holds at most {MAX_PAIR_CHANNELS} hidden and output channels, got {c_mid} and "
                         f"{c_out}")  # fmt: skip
    if weight3 is not None and max(c_out, c_final) > MAX_THEN_1X1_CHANNELS:
        raise ValueError(f"a 1x1 conv after the pair takes at most {MAX_THEN_1X1_CHANNELS} channels each side, got "
                         f"{c_out} -> {c_final}")  # fmt: skip
    for name, activation in (("activation1", activation1), ("activation2", activation2), ("activation3", activation3)):
        if activation not in ACTIVATIONS:
            raise ValueError(f"{name} must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    tile = tile or default_conv_pair_tile(height, width)
    blocks = _PairBlocks.of(tile, batch, height, width, c_mid, c_out)
    need = blocks.programs * blocks.slot
    if scratch.dtype != x.dtype or scratch.device != x.device or not scratch.is_contiguous() or scratch.numel() < need:
        raise ValueError(f"scratch must be contiguous {x.dtype} on {x.device} with >= {need} elements for tile {tile}, "
                         f"got {scratch.dtype} {tuple(scratch.shape)} on {scratch.device}")  # fmt: skip
    if blocks.programs == 0 or c_final == 0:
        return
    res = out if residual is None else residual  # never read without HAS_RESIDUAL
    third, third_bias = (weight2, bias2) if weight3 is None else (weight3, bias3)  # never read without THIRD_1X1
    network_launcher(_conv_pair_kernel, (blocks.programs,), pdl, compile_only)(
        out, *out.stride()[:3], x, *x.stride()[:3], res, *res.stride()[:3], weight1, bias1, weight2, bias2, third,
        third_bias, scratch, height, width, c_in, c_mid, c_out, c_final, blocks.tiles_y, blocks.tiles_x,
        ACT1=ACTIVATIONS[activation1], ACT2=ACTIVATIONS[activation2], ACT3=ACTIVATIONS[activation3],
        HAS_RESIDUAL=residual is not None, THIRD_1X1=weight3 is not None, TILE_H=tile.tile_h, TILE_W=tile.tile_w,
        BLOCK_P=blocks.block_p, BLOCK_Q=blocks.block_q, BLOCK_MID=blocks.block_mid, BLOCK_N=blocks.block_n,
        BLOCK_N3=_block(c_final), BLOCK_K1=min(64, _block(c_in)), BLOCK_K2=min(64, _block(c_mid)),
        num_warps=tile.num_warps,
    )  # fmt: skip
