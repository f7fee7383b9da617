"""YOLO26's one-to-one (end-to-end) selection on the decoded head tensor: the reference executor's `topk`
(ultralytics' postprocess of the one-to-one head), capture-safe, in five launches (four for one class).

For preds (N, 4 + nc + E, A), anchors contiguous, per image, with k = min(max_det, A):
  best    = each anchor's best class score
  anchors = the k anchors of highest best score
  pairs   = those anchors' k·nc (anchor, class) scores
  out     = the k highest pairs by score, descending, as rows [box (4), score, class, extras (E)]: (N, k, 6 + E)

Launches, spread over many programs where the work is reading and so that every pass reads contiguous memory:
  (1) grid (A / 128, N): best[n, a] = max over classes, each class row's 128 anchors read coalesced. Skipped for
      one class, whose row of preds is the best score.
  (2) grid (N,): t = the k-th largest best score, then the anchors above it, and those equal to it in index order
      until there are k, written to anchors[n].
  (3) grid (k / 16, N): each kept anchor's column of preds copied into rows: its class scores to
      pairs[n, j·nc : (j + 1)·nc], its box and extras to rows[n, j]. A column's values lie A floats apart, a
      memory sector each: they are read once, by many programs at a time, and never again scattered.
  (4) grid (N,): the k-th largest of pairs[n] and the k pairs kept (their positions to chosen[n]). The search
      starts at t: each kept anchor's best pair is at least t, so at least k pairs are, and for independent
      scores barely more (307 of 24,000 for 80 classes at 640 pixels).
  (5) grid (k / 32, N): each kept pair ranked among the k by counting those before it, and its output row written
      from pairs and rows (contiguous: the box and extras of a row are one run of 4 + E floats).
An earlier design, one program an image, read every pair score straight from preds, a scattered load each, in
five passes: 0.35 ms at batch 1 on an H200 against 0.15 ms for the torch ops (bench/NOTES.md).

The k-th largest of a row (launches 2 and 4) is found on the scores' bits: a float32's bits, the negative ones'
magnitude bits flipped (`_order_key`), order as int32 as the floats do, so the threshold is an integer found by
bisection, each step counting the keys at or above its midpoint in one pass over the row (chunks of up to 4,096
keys, from L1 or L2: 8,400 or 24,000 keys an image). Once at most 256 keys lie between the bounds (8 to 11 steps
for 8,400 sigmoid scores, 2 to 5 for the pairs above t), they are copied to `spill` and the threshold is read off
them: the largest with at least k − (keys above the bounds) of them at or above it, one 256 × 256 comparison in
place of about 20 more steps, each ending in a reduction across the program.

Ties: torch.topk's order among equal scores is unspecified. Keys equal to a threshold are taken in index order
and equal scores are ranked by pair position (anchors kept above t before those at t, each in index order; an
anchor's classes in order), so the result is deterministic and its scores are torch's exactly; with distinct
scores its rows are torch's too. One-to-one rows are never compared with a confidence here: `boxes.select_rows`
does that later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import triton
import triton.language as tl

from yolojet.kernels.launch import network_launcher
from yolojet.kernels.pdl import wait_for_previous_kernel
from yolojet.kernels.views import check_view

_INT_MIN = tl.constexpr(-(2**31))
_INT_MAX = tl.constexpr(2**31 - 1)
_INT64_MIN = tl.constexpr(-(2**63))
# Launch (1): 128 anchors (a 512-byte run of each class row) by 16 classes a step; 80 classes are 5 steps.
_BEST_BLOCK_A = 128
_BEST_BLOCK_C = 16
# Launches (2) and (4): passes over a row in chunks of up to 4,096 keys (8 a thread at 16 warps); the
# threshold read off directly once at most _SMALL keys are undecided.
_CHUNK = 4096
_SMALL = 256
# Launch (3): 16 kept anchors a program (19 programs an image for k = 300), 64 channels a step.
_GATHER_BLOCK_J = 16
_GATHER_BLOCK_C = 64
# Launch (5): 32 kept pairs a program, each ranked against all k, 128 at a time, and their rows written 16
# columns a step.
_RANK_BLOCK_R = 32
_RANK_BLOCK_J = 128
_OUT_BLOCK_W = 16


@triton.jit
def _order_key(value):
    """An int32 that orders as the float32 `value` does: non-negative floats' bits already do; a negative
    float's magnitude bits are flipped, so that a larger magnitude gives a smaller key (NaN aside)."""
    bits = value.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _load_keys(row_ptr, i, L):
    ok = i < L
    return ok, _order_key(tl.load(row_ptr + i, mask=ok, other=0.0))


@triton.jit
def _count_at_least(row_ptr, L, value, CHUNK: tl.constexpr):
    """#{i < L : key(row[i]) >= value}, in one pass."""
    count = tl.zeros([CHUNK], tl.int32)
    for i0 in range(0, L, CHUNK):
        ok, key = _load_keys(row_ptr, i0 + tl.arange(0, CHUNK), L)
        count += (ok & (key >= value)).to(tl.int32)
    return tl.sum(count, 0)


@triton.jit
def _search_bounds(row_ptr, L, floor, HAS_FLOOR: tl.constexpr, CHUNK: tl.constexpr):
    """(lo, #{key >= lo}, hi) in one pass: hi the largest key; lo the floor given, else the smallest key."""
    largest = tl.full([CHUNK], _INT_MIN, tl.int32)
    smallest = tl.full([CHUNK], _INT_MAX, tl.int32)
    at_floor = tl.zeros([CHUNK], tl.int32)
    for i0 in range(0, L, CHUNK):
        ok, key = _load_keys(row_ptr, i0 + tl.arange(0, CHUNK), L)
        largest = tl.maximum(largest, tl.where(ok, key, _INT_MIN))
        if HAS_FLOOR:
            at_floor += (ok & (key >= floor)).to(tl.int32)
        else:
            smallest = tl.minimum(smallest, tl.where(ok, key, _INT_MAX))
    if HAS_FLOOR:
        lo = floor
        count_lo = tl.sum(at_floor, 0)
    else:
        lo = tl.min(smallest, 0)
        count_lo = L + 0 * lo
    return lo, count_lo, tl.max(largest, 0)


@triton.jit
def _threshold_among_undecided(
    row_ptr, L, k, lo, hi, count_above_hi, spill_ptr, CHUNK: tl.constexpr, SMALL: tl.constexpr, SUB: tl.constexpr
):
    """(t, #{key > t}) from the keys in [lo, hi], at most SMALL of them, which hold the k-th largest key t.

    They are copied to spill; t is the largest of them with at least k − count_above_hi keys at or above it
    among them (every key above hi is above each of them, every key below lo below)."""
    count = 0
    for i0 in range(0, L, CHUNK):
        i = i0 + tl.arange(0, CHUNK)
        ok, key = _load_keys(row_ptr, i, L)
        undecided = ok & (key >= lo) & (key <= hi)
        slot = count + tl.cumsum(undecided.to(tl.int32), 0) - 1
        tl.store(spill_ptr + slot, key, mask=undecided & (slot < SMALL))
        count += tl.sum(undecided.to(tl.int32), 0)
    # The spilled keys are read back by other threads of the program.
    tl.debug_barrier()
    i = tl.arange(0, SMALL)
    i_ok = i < count
    key_i = tl.load(spill_ptr + i, mask=i_ok, other=_INT_MIN)
    at_least = tl.zeros([SMALL], tl.int32)
    for j0 in range(0, count, SUB):
        j = j0 + tl.arange(0, SUB)
        j_ok = j < count
        key_j = tl.load(spill_ptr + j, mask=j_ok, other=_INT_MIN)
        at_least += tl.sum(((key_j[None, :] >= key_i[:, None]) & j_ok[None, :]).to(tl.int32), 1)
    need = k - count_above_hi
    t = tl.max(tl.where(i_ok & (at_least >= need), key_i, _INT_MIN), 0)
    return t, count_above_hi + tl.sum((i_ok & (key_i > t)).to(tl.int32), 0)


@triton.jit
def _kth_largest(
    row_ptr,
    L,
    k,
    floor,
    spill_ptr,
    HAS_FLOOR: tl.constexpr,
    CHUNK: tl.constexpr,
    SMALL: tl.constexpr,
    SUB: tl.constexpr,
):
    """(t, #{key > t}): t the k-th largest key of row[:L], 1 <= k <= L. With HAS_FLOOR, `floor` is a key of the
    row with at least k keys at or above it, where the search starts.

    Bisection on [lo, hi] keeping #{key >= lo} >= k > #{key > hi} (count_lo, count_hi), until lo = hi or at most
    SMALL keys lie in between (then _threshold_among_undecided)."""
    lo, count_lo, hi = _search_bounds(row_ptr, L, floor, HAS_FLOOR, CHUNK)
    count_hi = 0 * count_lo  # nothing above the largest key
    if count_lo == k:
        # lo is a key of the row (the smallest, or the floor) and exactly k are at or above it: t = lo. Bisection
        # would narrow down to it one step at a time (one class: the pairs are exactly the kept anchors').
        count_hi = _count_at_least(row_ptr, L, lo + 1, CHUNK)
        hi = lo
    while (lo < hi) & (count_lo - count_hi > SMALL):
        mid = ((lo.to(tl.int64) + hi.to(tl.int64) + 1) >> 1).to(tl.int32)  # in (lo, hi]; int64: no overflow
        count_mid = _count_at_least(row_ptr, L, mid, CHUNK)
        up = count_mid >= k
        lo = tl.where(up, mid, lo)
        count_lo = tl.where(up, count_mid, count_lo)
        hi = tl.where(up, hi, mid - 1)
        count_hi = tl.where(up, count_hi, count_mid)
    t = lo
    above = count_hi
    if lo < hi:
        t, above = _threshold_among_undecided(row_ptr, L, k, lo, hi, count_hi, spill_ptr, CHUNK, SMALL, SUB)
    return t, above


@triton.jit
def _write_top(dst_ptr, row_ptr, L, k, t, above, CHUNK: tl.constexpr):
    """dst[:k] = the positions of the k largest keys of row[:L] given t (the k-th largest) and above = #{key > t}:
    those above t in index order, then those equal to t in index order until k."""
    taken_above = 0
    taken_equal = 0
    for i0 in range(0, L, CHUNK):
        i = i0 + tl.arange(0, CHUNK)
        ok, key = _load_keys(row_ptr, i, L)
        is_above = ok & (key > t)
        is_equal = ok & (key == t)
        # Both running counts in one scan: above in the low 16 bits, equal in the high (CHUNK <= 2**16).
        both = is_above.to(tl.int32) + (is_equal.to(tl.int32) << 16)
        prefix = tl.cumsum(both, 0)
        equal_slot = above + taken_equal + (prefix >> 16) - 1
        slot = tl.where(is_above, taken_above + (prefix & 0xFFFF) - 1, equal_slot)
        tl.store(dst_ptr + slot, i, mask=is_above | (is_equal & (equal_slot < k)))
        total = tl.sum(both, 0)
        taken_above += total & 0xFFFF
        taken_equal += total >> 16


@triton.jit
def _best_score_kernel(
    best_ptr,
    preds_ptr,
    sp_n,
    sp_c,
    A,
    NC,
    BLOCK_A: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr,
):
    n = tl.program_id(1).to(tl.int64)
    a = tl.program_id(0) * BLOCK_A + tl.arange(0, BLOCK_A)
    a_ok = a < A
    scores = preds_ptr + n * sp_n + 4 * sp_c
    wait_for_previous_kernel(PDL)
    best = tl.full([BLOCK_A], float("-inf"), tl.float32)
    for c0 in range(0, NC, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        ok = (c < NC)[:, None] & a_ok[None, :]
        s = tl.load(scores + c[:, None] * sp_c + a[None, :], mask=ok, other=float("-inf"))
        best = tl.maximum(best, tl.max(s, 0))
    tl.store(best_ptr + n * A + a, best, mask=a_ok)


@triton.jit
def _select_anchors_kernel(
    anchors_ptr,
    threshold_ptr,
    score_ptr,
    ss_n,
    spill_ptr,
    A,
    K,
    CHUNK: tl.constexpr,
    SMALL: tl.constexpr,
    SUB: tl.constexpr,
    PDL: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    row = score_ptr + n * ss_n
    wait_for_previous_kernel(PDL)
    t, above = _kth_largest(row, A, K, 0, spill_ptr + n * SMALL, False, CHUNK, SMALL, SUB)
    _write_top(anchors_ptr + n * K, row, A, K, t, above, CHUNK)
    tl.store(threshold_ptr + n, t)


@triton.jit
def _gather_kernel(
    rows_ptr,
    pairs_ptr,
    anchors_ptr,
    preds_ptr,
    sp_n,
    sp_c,
    K,
    C,
    NC,
    W,
    BLOCK_J: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr,
):
    """Kept anchor j's column of preds: channels 4 .. 4 + NC to pairs[n, j·NC ...], the others to rows[n, j] as
    the output row will hold them (box in 0..3, extras from 6; 4 and 5, score and class, left for launch 4)."""
    n = tl.program_id(1).to(tl.int64)
    j = tl.program_id(0) * BLOCK_J + tl.arange(0, BLOCK_J)
    j_ok = j < K
    wait_for_previous_kernel(PDL)
    column = preds_ptr + n * sp_n + tl.load(anchors_ptr + n * K + j, mask=j_ok, other=0)
    row = rows_ptr + (n * K + j) * W
    pair = pairs_ptr + (n * K + j) * NC - 4
    for c0 in range(0, C, BLOCK_C):
        ch = c0 + tl.arange(0, BLOCK_C)
        ok = j_ok[:, None] & (ch < C)[None, :]
        value = tl.load(column[:, None] + (ch * sp_c)[None, :], mask=ok)
        is_score = ((ch >= 4) & (ch < 4 + NC))[None, :]
        tl.store(pair[:, None] + ch[None, :], value, mask=ok & is_score)
        to = tl.where(ch < 4, ch, ch + 2 - NC)
        tl.store(row[:, None] + to[None, :], value, mask=ok & ~is_score)


@triton.jit
def _select_pairs_kernel(
    chosen_ptr,
    pairs_ptr,
    threshold_ptr,
    spill_ptr,
    K,
    NC,
    CHUNK: tl.constexpr,
    SMALL: tl.constexpr,
    SUB: tl.constexpr,
    PDL: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    L = K * NC
    pairs = pairs_ptr + n * L
    wait_for_previous_kernel(PDL)
    floor = tl.load(threshold_ptr + n)  # the k-th best anchor score: at least k pairs are at or above it
    t, above = _kth_largest(pairs, L, K, floor, spill_ptr + n * SMALL, True, CHUNK, SMALL, SUB)
    _write_top(chosen_ptr + n * K, pairs, L, K, t, above, CHUNK)


@triton.jit
def _write_rows_kernel(
    out_ptr,
    so_n,
    so_k,
    pairs_ptr,
    rows_ptr,
    chosen_ptr,
    K,
    NC,
    W,
    BLOCK_R: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_W: tl.constexpr,
    PDL: tl.constexpr,
):
    """BLOCK_R kept pairs ranked among all K (by score descending, then by their order in `chosen`, which is
    pair-position order among equal scores) and written to their output rows."""
    n = tl.program_id(1).to(tl.int64)
    i = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    i_ok = i < K
    pairs = pairs_ptr + n * K * NC
    chosen = chosen_ptr + n * K
    wait_for_previous_kernel(PDL)
    p = tl.load(chosen + i, mask=i_ok, other=0)
    score = tl.load(pairs + p, mask=i_ok, other=0.0)
    key_i = _order_key(score)
    rank = tl.zeros([BLOCK_R], tl.int32)
    for j0 in range(0, K, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        j_ok = j < K
        key_j = _order_key(tl.load(pairs + tl.load(chosen + j, mask=j_ok, other=0), mask=j_ok, other=0.0))
        before = (key_j[None, :] > key_i[:, None]) | ((key_j[None, :] == key_i[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((before & j_ok[None, :]).to(tl.int32), 1)

    cls = (p % NC).to(tl.float32)
    src = rows_ptr + (n * K + p // NC) * W
    dst = out_ptr + n * so_n + rank * so_k
    for w0 in range(0, W, BLOCK_W):
        w = (w0 + tl.arange(0, BLOCK_W))[None, :]
        ok = i_ok[:, None] & (w < W)
        value = tl.load(src[:, None] + w, mask=ok & ((w < 4) | (w >= 6)), other=0.0)
        value = tl.where(w == 4, score[:, None], tl.where(w == 5, cls[:, None], value))
        tl.store(dst[:, None] + w, value, mask=ok)


@dataclass(frozen=True)
class OneToOneScratch:
    """Scratch of select_one_to_one for N images, A anchors, nc classes, E extras and k = min(max_det, A), each
    contiguous; any prior content is overwritten.

    best (N, A) float32: each anchor's best class score (N, 0 for one class, whose scores are read from preds);
    anchors (N, k) int32: the kept anchors; threshold (N,) int32: the k-th best anchor score's key; pairs
    (N, k·nc) float32: the kept anchors' class scores; rows (N, k, 6 + E) float32: their boxes and extras;
    chosen (N, k) int32: the kept pairs' positions in pairs; spill (N, 256) int32: undecided keys.
    """

    best: torch.Tensor
    anchors: torch.Tensor
    threshold: torch.Tensor
    pairs: torch.Tensor
    rows: torch.Tensor
    chosen: torch.Tensor
    spill: torch.Tensor
    dtypes: ClassVar[dict[str, torch.dtype]] = {
        "best": torch.float32,
        "anchors": torch.int32,
        "threshold": torch.int32,
        "pairs": torch.float32,
        "rows": torch.float32,
        "chosen": torch.int32,
        "spill": torch.int32,
    }

    @staticmethod
    def shapes(batch: int, anchors: int, nc: int, extra: int, max_det: int) -> dict[str, tuple[int, ...]]:
        k = min(max_det, anchors)
        return {
            "best": (batch, anchors if nc > 1 else 0),
            "anchors": (batch, k),
            "threshold": (batch,),
            "pairs": (batch, k * nc),
            "rows": (batch, k, 6 + extra),
            "chosen": (batch, k),
            "spill": (batch, _SMALL),
        }

    @classmethod
    def allocate(
        cls, batch: int, anchors: int, nc: int, extra: int, max_det: int, device: torch.device | str
    ) -> OneToOneScratch:
        shapes = cls.shapes(batch, anchors, nc, extra, max_det)
        tensors = {name: torch.empty(shape, dtype=cls.dtypes[name], device=device) for name, shape in shapes.items()}
        return cls(**tensors)


def _selection_blocks(length: int) -> dict[str, int]:
    """The blocking of a selection launch over rows of `length` keys: 8 keys a thread per chunk, and the
    undecided keys compared SUB at a time, 16 comparisons a thread (SMALL × SUB over 32 · num_warps threads)."""
    chunk = min(_CHUNK, max(triton.next_power_of_2(length), _SMALL))
    warps = max(4, chunk // 256)
    return {"CHUNK": chunk, "SMALL": _SMALL, "SUB": 2 * warps, "num_warps": warps}


def select_one_to_one(
    out: torch.Tensor,
    preds: torch.Tensor,
    *,
    nc: int,
    max_det: int,
    scratch: OneToOneScratch,
    pdl: bool = False,
    compile_only: bool = False,
) -> None:
    """out[n] = the k = min(max_det, A) best (anchor, class) pairs of preds[n] among its k best anchors, by score
    descending, as rows [box (4), score, class, extras (E)]: the reference executor's `topk`.

    preds: (N, 4 + nc + E, A) float32, anchors contiguous; out: (N, k, 6 + E) float32, rows contiguous;
    scratch: `OneToOneScratch.allocate(N, A, nc, E, max_det)`. `compile_only`: compile the launches' kernels
    without launching them.
    """
    if preds.dim() != 3 or nc < 1 or preds.shape[1] < 4 + nc:
        raise ValueError(f"one-to-one: preds shape {tuple(preds.shape)} does not hold 4 boxes + {nc} classes")
    if max_det < 1:
        raise ValueError(f"one-to-one: max_det {max_det}, expected at least 1")
    batch, channels, anchors = preds.shape
    extra = channels - 4 - nc
    k = min(max_det, anchors)
    device = preds.device
    check_view("one-to-one preds", preds, (batch, channels, anchors), torch.float32)
    check_view("one-to-one out", out, (batch, k, 6 + extra), torch.float32, device)
    for name, shape in OneToOneScratch.shapes(batch, anchors, nc, extra, max_det).items():
        t = getattr(scratch, name)
        check_view(f"one-to-one scratch.{name}", t, shape, OneToOneScratch.dtypes[name], device)
        if not t.is_contiguous():
            raise ValueError(f"one-to-one scratch.{name}: strides {t.stride()}, expected contiguous")

    sp_n, sp_c = preds.stride(0), preds.stride(1)
    if nc == 1:
        scores = preds[:, 4]  # one class: its row is each anchor's best score
    else:
        scores = scratch.best
        network_launcher(_best_score_kernel, (triton.cdiv(anchors, _BEST_BLOCK_A), batch), pdl, compile_only)(
            scratch.best, preds, sp_n, sp_c, anchors, nc, BLOCK_A=_BEST_BLOCK_A, BLOCK_C=_BEST_BLOCK_C
        )
    network_launcher(_select_anchors_kernel, (batch,), pdl, compile_only)(
        scratch.anchors, scratch.threshold, scores, scores.stride(0), scratch.spill, anchors, k,
        **_selection_blocks(anchors),
    )  # fmt: skip
    network_launcher(_gather_kernel, (triton.cdiv(k, _GATHER_BLOCK_J), batch), pdl, compile_only)(
        scratch.rows, scratch.pairs, scratch.anchors, preds, sp_n, sp_c, k, channels, nc, 6 + extra,
        BLOCK_J=_GATHER_BLOCK_J, BLOCK_C=_GATHER_BLOCK_C,
    )  # fmt: skip
    network_launcher(_select_pairs_kernel, (batch,), pdl, compile_only)(
        scratch.chosen, scratch.pairs, scratch.threshold, scratch.spill, k, nc, **_selection_blocks(k * nc)
    )
    network_launcher(_write_rows_kernel, (triton.cdiv(k, _RANK_BLOCK_R), batch), pdl, compile_only)(
        out, out.stride(0), out.stride(1), scratch.pairs, scratch.rows, scratch.chosen, k, nc, 6 + extra,
        BLOCK_R=_RANK_BLOCK_R, BLOCK_J=_RANK_BLOCK_J, BLOCK_W=_OUT_BLOCK_W,
    )  # fmt: skip
