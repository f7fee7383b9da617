"""YOLO26's one-to-one selection (ultralytics' `Detect.postprocess` with `get_topk_index`), capture-safe.

For preds (N, 4 + nc + E, A), per image, with k = min(max_det, A):
  anchors = the k anchors of highest best-class score, best first
  pairs   = the k (anchor, class) pairs of highest score among those anchors × every class, best first
  rows    = [box (4 channels as decoded), score, class, extras...] of each pair, (N, k, 6 + E) float32
Ties are broken by position (anchor index, then the pair's flat index anchor position · nc + class), where
torch's topk leaves their order open.

Launches: (1) and (2) are NMS's best class per anchor and rank sort (`rank_candidates`, every anchor a
candidate), which put all anchors in order; (3) one program per image reads the k-th anchor's best score T.
The k anchors' own best pairs already score at least T, so every selected pair scores at least T: the
program gathers only the pairs at or above T (usually a few hundred of k · nc), ranks them and writes the
first k rows. Rows past the anchors with a score (only NaN scores have none) are written as zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yolojet.kernels.elementwise import check_view
from yolojet.kernels.nms import NmsScratch, check_scratch_and_class_mask, rank_candidates

_BLOCK_PAIRS = 8192  # (anchor, class) pairs a gathering step tests: 32 a thread with 8 warps
_BLOCK_COUNT = 4096
_BLOCK_I = 32
_BLOCK_J = 1024
_BLOCK_E = 16


@triton.jit
def _one_to_one_rows_kernel(
    out_ptr,
    so_n,
    so_r,
    preds_ptr,
    sp_n,
    sp_c,
    score_ptr,
    ss_n,
    order_ptr,
    pair_score_ptr,
    pair_index_ptr,
    A,
    NC,
    EXTRA,
    K,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_A: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    order_row = order_ptr + n * A
    score_row = score_ptr + n * ss_n
    preds_img = preds_ptr + n * sp_n
    out_img = out_ptr + n * so_n
    # Anchors with a score: all of them, unless a score is NaN (no candidate for the rank sort, as for NMS).
    seen = tl.zeros([BLOCK_A], tl.int32)
    for a0 in range(0, A, BLOCK_A):
        a = a0 + tl.arange(0, BLOCK_A)
        seen += (tl.load(score_row + a, mask=a < A, other=float("-inf")) > float("-inf")).to(tl.int32)
    k = tl.minimum(tl.sum(seen, 0), K)
    last = tl.where(k > 0, tl.load(order_row + tl.maximum(k - 1, 0)), 0)  # order holds only k valid entries
    threshold = tl.load(score_row + last)

    # Gather the pairs scoring at least the threshold, in any order: the rank below is a total order.
    pairs = pair_score_ptr + n * K * NC
    pair_index = pair_index_ptr + n * K * NC
    count = 0
    for p0 in range(0, k, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        p_ok = p < k
        anchor = tl.load(order_row + p, mask=p_ok, other=0)
        for c0 in range(0, NC, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            ok = p_ok[:, None] & (c < NC)[None, :]
            s = tl.load(preds_img + (4 + c)[None, :] * sp_c + anchor[:, None], mask=ok, other=float("-inf"))
            keep = tl.reshape(ok & (s >= threshold), [BLOCK_P * BLOCK_C])
            flat = tl.reshape(p[:, None] * NC + c[None, :], [BLOCK_P * BLOCK_C])
            slot = count + tl.cumsum(keep.to(tl.int32), 0) - 1
            tl.store(pairs + slot, tl.reshape(s, [BLOCK_P * BLOCK_C]), mask=keep)
            tl.store(pair_index + slot, flat, mask=keep)
            count += tl.sum(keep.to(tl.int32), 0)
    # The ranks below read these pairs back from other threads of the program: make the stores visible.
    tl.debug_barrier()

    for i0 in range(0, count, BLOCK_I):
        i = i0 + tl.arange(0, BLOCK_I)
        i_ok = i < count
        s_i = tl.load(pairs + i, mask=i_ok, other=float("-inf"))
        f_i = tl.load(pair_index + i, mask=i_ok, other=0)
        rank = tl.zeros([BLOCK_I], tl.int32)
        for j0 in range(0, count, BLOCK_J):
            j = j0 + tl.arange(0, BLOCK_J)
            j_ok = j < count
            s_j = tl.load(pairs + j, mask=j_ok, other=float("-inf"))
            f_j = tl.load(pair_index + j, mask=j_ok, other=0)
            before = (s_j[None, :] > s_i[:, None]) | ((s_j[None, :] == s_i[:, None]) & (f_j[None, :] < f_i[:, None]))
            rank += tl.sum((before & j_ok[None, :]).to(tl.int32), 1)
        write = i_ok & (rank < k)
        anchor = tl.load(order_row + f_i // NC, mask=write, other=0)
        dst = out_img + rank.to(tl.int64) * so_r
        for ch in tl.static_range(4):
            tl.store(dst + ch, tl.load(preds_img + ch * sp_c + anchor, mask=write, other=0.0), mask=write)
        tl.store(dst + 4, s_i, mask=write)
        tl.store(dst + 5, (f_i % NC).to(tl.float32), mask=write)
        for e0 in range(0, EXTRA, BLOCK_E):
            e = e0 + tl.arange(0, BLOCK_E)
            ok = write[:, None] & (e < EXTRA)[None, :]
            value = tl.load(preds_img + (4 + NC + e)[None, :] * sp_c + anchor[:, None], mask=ok, other=0.0)
            tl.store(dst[:, None] + 6 + e[None, :], value, mask=ok)

    # Rows with no scored anchor behind them (NaN scores only): zeros, never stale memory.
    for r0 in range(k, K, BLOCK_I):
        r = r0 + tl.arange(0, BLOCK_I)
        cols = tl.arange(0, BLOCK_E)
        for e0 in range(0, 6 + EXTRA, BLOCK_E):
            ok = (r < K)[:, None] & (e0 + cols < 6 + EXTRA)[None, :]
            tl.store(out_img + r[:, None].to(tl.int64) * so_r + e0 + cols[None, :], 0.0, mask=ok)


class OneToOneScratch:
    """Scratch of `one_to_one_select` for up to `batch` images: NMS's best score, class and order per anchor, and
    room for every (anchor, class) pair of the k selected anchors. Any prior content is overwritten."""

    def __init__(self, batch: int, anchors: int, nc: int, k: int, device: torch.device | str) -> None:
        self.ranking = NmsScratch.allocate(batch, anchors, device)
        self.pair_scores = torch.empty(batch, k * nc, dtype=torch.float32, device=device)
        self.pair_index = torch.empty(batch, k * nc, dtype=torch.int32, device=device)
        # conf −inf: every anchor with a score is a candidate of the rank sort
        self.thresholds = torch.tensor([float("-inf"), 0.0], dtype=torch.float32, device=device)


def one_to_one_select(out: torch.Tensor, preds: torch.Tensor, *, nc: int, scratch: OneToOneScratch) -> None:
    """The one-to-one selection of every image of `preds` (N, 4 + nc + E, A) float32, anchors contiguous, into
    `out` (N, k, 6 + E) float32 with k = min(max_det, A): rows [box (preds' 4 box channels), score, class,
    extras...], best first. `scratch` as OneToOneScratch(at least N, A, nc, k) makes it."""
    if preds.dim() != 3 or preds.shape[1] < 4 + nc or nc < 1:
        raise ValueError(f"topk: preds shape {tuple(preds.shape)} does not hold 4 boxes + {nc} classes")
    batch, channels, anchors = preds.shape
    extra = channels - 4 - nc
    device = preds.device
    check_view("topk preds", preds, (batch, channels, anchors), torch.float32)
    check_view("topk out", out, (batch, None, 6 + extra), torch.float32, device)
    k = out.shape[1]
    if not 1 <= k <= anchors:
        raise ValueError(f"topk out: {k} rows, expected 1..{anchors} (min(max_det, anchors))")
    ranking = scratch.ranking.first(batch)
    check_scratch_and_class_mask("topk", ranking, None, nc, (batch, anchors), device)
    for name, t, dtype in (("pair_scores", scratch.pair_scores, torch.float32),
                           ("pair_index", scratch.pair_index, torch.int32)):  # fmt: skip
        if (
            t.dtype != dtype
            or t.device != device
            or not t.is_contiguous()
            or t.shape[0] < batch
            or t.shape[1] != k * nc
        ):
            raise ValueError(f"topk scratch.{name}: expected contiguous {dtype} ({batch}+, {k * nc}) on {device}, "
                             f"got {tuple(t.shape)} {t.dtype} on {t.device}")  # fmt: skip

    scores, _ = rank_candidates(ranking, preds, nc, scratch.thresholds, None, raw_scores=nc == 1)
    block_c = min(128, triton.next_power_of_2(nc))
    _one_to_one_rows_kernel[(batch,)](
        out, out.stride(0), out.stride(1),
        preds, preds.stride(0), preds.stride(1),
        scores, scores.stride(0), ranking.order,
        scratch.pair_scores, scratch.pair_index,
        anchors, nc, extra, k,
        BLOCK_P=max(1, _BLOCK_PAIRS // block_c), BLOCK_C=block_c, BLOCK_A=_BLOCK_COUNT,
        BLOCK_I=_BLOCK_I, BLOCK_J=_BLOCK_J, BLOCK_E=_BLOCK_E,
        num_warps=8,
    )  # fmt: skip
