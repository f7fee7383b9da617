"""The attention core of ultralytics' PSA `Attention` block on tensor cores, flash-attention style.

Each program owns BLOCK_M query tokens of one (batch, head) and streams the keys and values in BLOCK_N-token
blocks with an online softmax, so the T×T score matrix never leaves registers. Tokens are the pixels of an NHWC
feature map (t = y·W + x), read through the views' own strides, so q, k and v can be channel slices of the qkv
conv's output buffer and out a channel slice of the next layer's input.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from yolojet.kernels.launch import network_launcher
from yolojet.kernels.pdl import wait_for_previous_kernel
from yolojet.kernels.views import check_tile, check_view, nhwc_offsets


@dataclass(frozen=True)
class AttentionTile:
    """Query tokens a program owns (block_m), key/value tokens it takes a step (block_n), and its warps."""

    block_m: int
    block_n: int
    num_warps: int

    def __post_init__(self) -> None:
        check_tile(self, ("block_m", "block_n"), minimum=16)  # both are tl.dot sides


# Tiles worth timing at YOLO's PSA sizes (a 20x20 map: 400 tokens, 1-8 heads): the default walks the keys 64 at a
# time over 7 dependent steps with few programs; the other takes them all in one step (512: the scores of 16 query
# rows fit a thread's registers) with 50 programs. On an H200 it won at batch 1 and the default at batch 64; tiles
# taking the keys in 2 or 4 steps, or with 32 query rows, won no layer (bench/NOTES.md), and every candidate costs
# start-up time.
_TILES = (AttentionTile(64, 64, 4), AttentionTile(16, 512, 8))


def attention_tile_set_id() -> str:
    """A short digest of the candidate tiles, for tuning results to be timed again when the offer changes."""
    return hashlib.sha1(repr(_TILES).encode()).hexdigest()[:8]


def _fitted(tile: AttentionTile, tokens: int) -> AttentionTile:
    """The tile with its blocks cut to the token count (down to 16)."""
    whole = max(16, triton.next_power_of_2(tokens))
    return AttentionTile(min(tile.block_m, whole), min(tile.block_n, whole), tile.num_warps)


def attention_candidate_tiles(tokens: int, dtype: torch.dtype = torch.float16) -> list[AttentionTile]:
    """Tiles worth timing for attention over `tokens` tokens; fp32 operands take the default only."""
    if dtype == torch.float32:
        return [default_attention_tile(tokens, dtype)]
    tiles = []
    for tile in _TILES:
        fitted = _fitted(tile, tokens)
        if fitted not in tiles:
            tiles.append(fitted)
    return tiles


@functools.cache
def default_attention_tile(tokens: int, dtype: torch.dtype = torch.float16) -> AttentionTile:
    """The untimed choice. fp32 ("ieee", no tensor cores) runs 1.5x faster with half the query rows."""
    block_n = min(64, max(16, triton.next_power_of_2(tokens)))
    return AttentionTile(min(32 if dtype == torch.float32 else 64, block_n), block_n, 4)


@triton.jit
def _token_offsets(t, W, s_n, s_h, s_w, n):
    """Element offsets of tokens t = y·W + x of image n in an NHWC view with strides (s_n, s_h, s_w, 1)."""
    return nhwc_offsets(n, t // W, t % W, s_n, s_h, s_w)


@triton.jit
def _psa_attention_kernel(
    out_ptr,
    so_n,
    so_h,
    so_w,
    q_ptr,
    sq_n,
    sq_h,
    sq_w,
    k_ptr,
    sk_n,
    sk_h,
    sk_w,
    v_ptr,
    sv_n,
    sv_h,
    sv_w,
    W,
    T,
    NUM_HEADS,
    qk_scale,
    KD: tl.constexpr,
    HD: tl.constexpr,
    BLOCK_KD: tl.constexpr,
    BLOCK_HD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    n = tl.program_id(1) // NUM_HEADS
    head = tl.program_id(1) % NUM_HEADS
    i = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    i_ok = i < T
    ck = tl.arange(0, BLOCK_KD)
    cv = tl.arange(0, BLOCK_HD)
    ck_ok = ck < KD
    cv_ok = cv < HD
    # Padded key/head channels load as 0, which adds nothing to either product.
    q_off = _token_offsets(i, W, sq_n, sq_h, sq_w, n) + head * KD
    wait_for_previous_kernel(PDL)
    q = tl.load(q_ptr + q_off[:, None] + ck[None, :], mask=i_ok[:, None] & ck_ok[None, :], other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)  # running row max of the log2-domain scores
    l_i = tl.zeros((BLOCK_M,), tl.float32)  # running softmax denominator, relative to m_i
    acc = tl.zeros((BLOCK_M, BLOCK_HD), tl.float32)
    for j0 in range(0, T, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        j_ok = j < T
        k_off = _token_offsets(j, W, sk_n, sk_h, sk_w, n) + head * KD
        kt = tl.load(k_ptr + k_off[None, :] + ck[:, None], mask=ck_ok[:, None] & j_ok[None, :], other=0.0)
        # input_precision="ieee" keeps fp32 mode exact (no TF32); Triton ignores it for fp16 operands.
        s = tl.dot(q, kt, input_precision="ieee") * qk_scale  # scale·log2(e) folded in: exp2 below is exp
        s = tl.where(j_ok[None, :], s, float("-inf"))
        # The first block always holds a real key, so m_new is finite and exp2(-inf - m_new) = 0 is safe.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_off = _token_offsets(j, W, sv_n, sv_h, sv_w, n) + head * HD
        v = tl.load(v_ptr + v_off[:, None] + cv[None, :], mask=j_ok[:, None] & cv_ok[None, :], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
        m_i = m_new
    o_off = _token_offsets(i, W, so_n, so_h, so_w, n) + head * HD
    out = acc / l_i[:, None]
    tl.store(
        out_ptr + o_off[:, None] + cv[None, :], out.to(out_ptr.dtype.element_ty), mask=i_ok[:, None] & cv_ok[None, :]
    )


def psa_attention(
    out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_heads: int,
    scale: float,
    tile: AttentionTile | None = None,
    pdl: bool = False,
    compile_only: bool = False,
) -> None:
    """Multi-head softmax attention over the H·W pixels of each image, written in place.

    With T = H·W tokens (t = y·W + x), for batch n, head h, token i and d < hd:
        out[n, i, h·hd + d] = sum_j softmax_j(scale · sum_c q[n, i, h·kd + c] · k[n, j, h·kd + c]) · v[n, j, h·hd + d]
    which is ultralytics' `(v @ ((q * scale).transpose(-2, -1) @ k).softmax(-1).transpose(-2, -1))` for
    q, k viewed (B, nh, kd, T) and v (B, nh, hd, T); each head's channels are contiguous (head h of q holds
    channels h·kd ... h·kd + kd − 1). q, k: (N, H, W, nh·kd) views; v, out: (N, H, W, nh·hd) views; one dtype,
    any N/H/W strides, unit channel stride. fp32 accumulation; fp32 operands multiply exactly (no TF32).
    `tile` picks the blocking (`default_attention_tile` when None); `compile_only` compiles without launching.
    ultralytics' qkv conv interleaves channels per head ([q_h | k_h | v_h] for each h); reorder its output
    channels to [q | k | v] when packing weights, and q, k, v become three consecutive slices of its output.
    """
    check_view("q", q, (None,) * 4)
    n, h, w, qc = q.shape
    if not isinstance(num_heads, int) or num_heads < 1 or qc % num_heads:
        raise ValueError(f"num_heads: expected a positive int dividing q's {qc} channels, got {num_heads!r}")
    check_view("k", k, q.shape, q.dtype, q.device)
    check_view("v", v, (n, h, w, None), q.dtype, q.device)
    if v.shape[3] % num_heads:
        raise ValueError(f"v: {v.shape[3]} channels do not split into num_heads={num_heads} heads")
    check_view("out", out, v.shape, q.dtype, q.device)
    kd, hd, t = qc // num_heads, v.shape[3] // num_heads, h * w
    tile = tile or default_attention_tile(t, q.dtype)
    grid = (triton.cdiv(t, tile.block_m), n * num_heads)
    kernel = network_launcher(_psa_attention_kernel, grid, pdl, compile_only)
    kernel(
        out,
        *out.stride()[:3],
        q,
        *q.stride()[:3],
        k,
        *k.stride()[:3],
        v,
        *v.stride()[:3],
        w,
        t,
        num_heads,
        scale * math.log2(math.e),
        KD=kd,
        HD=hd,
        BLOCK_KD=max(16, triton.next_power_of_2(kd)),
        BLOCK_HD=max(16, triton.next_power_of_2(hd)),
        BLOCK_M=tile.block_m,
        BLOCK_N=tile.block_n,
        num_warps=tile.num_warps,
    )
