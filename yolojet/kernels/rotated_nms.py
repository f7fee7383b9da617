"""Rotated NMS for OBB heads, capture-safe: ultralytics' `non_max_suppression(rotated=True)` (best class per box,
then `TorchNMS.fast_nms` with `batch_probiou`), in four launches and no host synchronisation; and the mapping of
its rows back to original-image pixels (`scale_rotated_boxes`, ultralytics' `scale_boxes(xywh=True)`).

For preds (N, 4 + nc + 1, A) float32, rows (cx, cy, w, h, scores..., angle), per image:
  conf_a, cls_a, candidates, order: exactly as kernels/nms.py (its kernels are reused): conf_a = max_c score,
          candidate iff conf_a > conf_thres and class_mask[cls_a]; `order` = candidates by conf descending, ties
          by anchor index, cut to the first max_nms
  box_r = (cx + cls·off, cy + cls·off, w, h, angle) of order[r], off = 7680 (0 when agnostic): ultralytics moves
          the centre, in float32, so that boxes of different classes are far apart (no explicit class test)
  Fast-NMS: r is kept iff no r' < r has probiou(box_r', box_r) > iou_thres — a box that was itself dropped
          still drops the boxes after it (arXiv 1904.02689); the first max_det kept, in order.
probiou is ultralytics.utils.metrics.batch_probiou (arXiv 2106.06072), operation for operation in float32, with
obb1 the higher-ranked box: per box a = w²/12, b = h²/12, covariance (A, B, C) = (a·cos² + b·sin²,
a·sin² + b·cos², (a − b)·cos·sin), P = clamp(A·B − C², 0); per pair, ΣA = A1 + A2 (likewise B, C), D = ΣA·ΣB − ΣC²,
  t1 = (ΣA·dy² + ΣB·dx²) / (D + eps) · 0.25,   dx = x1 − x2, dy = y1 − y2
  t2 = (ΣC·(x2 − x1)·dy) / (D + eps) · 0.5
  t3 = log(D / (4·sqrt(P1·P2) + eps) + eps) · 0.5
  bd = clamp(t1 + t2 + t3, eps, 100),  probiou = 1 − sqrt(1 − exp(−bd) + eps),  eps = 1e-7.
Divisions and square roots round to nearest and nothing is fused into a multiply-add, as in torch. On a GPU the
transcendentals are libdevice's (the CUDA math library torch's CUDA kernels call) and w²/12 is w²·fl(1/12), as
torch's CUDA division by a Python scalar computes it: the arithmetic of ultralytics running on the GPU. Under
the interpreter they are float64 results rounded to float32, which torch's CPU functions (SLEEF) match in most
cases: 86% of probiou values come out bit-identical to batch_probiou on the CPU, the rest within 3.4e-6
(cancellation in t1 + t2 + t3 amplifies an ulp of cos or sin), so a decision can differ only for a probiou that
close to iou_thres. Where scores tie, ultralytics' unstable argsort leaves the order (and so, for overlapping
tied boxes, the kept set) unspecified; ours ranks the lower anchor first.

Launches: (1) kernels/nms.py's best class per anchor; (2) its rank sort into `order`; (3) `_fast_nms_kernel`,
a grid over (blocks of order positions, images): each block tests its candidates against every earlier one, a
block of earlier candidates at a time, stopping once all of its own are dropped, and writes a flag per position;
(4) `_compact_kernel`, one program per image, appends the kept positions' rows in order until max_det.
Thresholds, limits and the class mask are read from device tensors, so a captured graph follows changes to them
without re-capture. Output rows [cx, cy, w, h, conf, cls, angle] in model-input pixels, as ultralytics'
non_max_suppression(rotated=True) returns them (yolojet/reference/obb.py `rotated_nms` is the torch
reference); `scale_rotated_boxes` then reorders them to obb.py's `scale_rboxes` layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from yolojet.kernels.nms import (
    _BLOCK_COUNT,
    _MAX_WH,
    NmsScratch,
    check_scratch_and_class_mask,
    rank_candidates,
)
from yolojet.kernels.views import check_view

_EPS = tl.constexpr(1e-7)  # batch_probiou's eps
_INV_12 = tl.constexpr(1.0 / 12.0)  # float32(1/12): torch's CUDA `x / 12` multiplies by it
# Fast-NMS tiles (candidates a program owns, earlier candidates it tests them against at a time): small on a GPU
# (a 64×32 pair tile is 8 pairs a thread at 8 warps: probiou keeps a dozen values a pair live), the largest under
# the interpreter, which runs programs one after another and pays per operation rather than per element.
_FAST_TILES = (64, 32)
_INTERPRETER_FAST_TILES = (256, 256)
_COMPACT = 128
_BLOCK_SCALE = 128


@dataclass(frozen=True)
class RotatedNmsScratch(NmsScratch):
    """NmsScratch (best_score, best_class, order: see kernels/nms.py) plus `suppressed`: (N, A) uint8, 1 where the
    candidate at that position of `order` is dropped. All (N, A) and contiguous; prior content is overwritten."""

    suppressed: torch.Tensor
    dtypes: ClassVar[dict[str, torch.dtype]] = {**NmsScratch.dtypes, "suppressed": torch.uint8}

    @classmethod
    def allocate(cls, batch: int, anchors: int, device: torch.device | str) -> RotatedNmsScratch:
        base = NmsScratch.allocate(batch, anchors, device)
        suppressed = torch.empty((batch, anchors), dtype=torch.uint8, device=device)
        return cls(base.best_score, base.best_class, base.order, suppressed)

    def first(self, batch: int) -> RotatedNmsScratch:
        """The scratch of the first `batch` images (contiguous views), for a run on fewer than allocated."""
        return RotatedNmsScratch(
            self.best_score[:batch], self.best_class[:batch], self.order[:batch], self.suppressed[:batch]
        )


@triton.jit
def _todo(score_ptr, row, A, max_nms, BLOCK: tl.constexpr):
    """min(#candidates, max_nms): the candidates are the scores above −inf (see nms.py's _best_class_kernel)."""
    seen = tl.zeros([BLOCK], tl.int32)
    for a0 in range(0, A, BLOCK):
        a = a0 + tl.arange(0, BLOCK)
        seen += (tl.load(score_ptr + row + a, mask=a < A, other=float("-inf")) > float("-inf")).to(tl.int32)
    return tl.minimum(tl.sum(seen, 0), max_nms)


@triton.jit
def _clamp_min(x, low):
    """torch's clamp(min=low): NaN stays NaN."""
    return tl.maximum(x, low, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _cos(x, LIBDEVICE: tl.constexpr):
    """torch's float32 cos: libdevice's (CUDA's cosf) on a GPU; under the interpreter the float64 result rounded,
    which is correctly rounded where torch's CPU kernels (SLEEF, 1 ulp) nearly always are and numpy's float32
    functions are often not. Likewise _sin, _exp, _log."""
    if LIBDEVICE:
        y = libdevice.cos(x)
    else:
        y = tl.cos(x.to(tl.float64)).to(tl.float32)
    return y


@triton.jit
def _sin(x, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        y = libdevice.sin(x)
    else:
        y = tl.sin(x.to(tl.float64)).to(tl.float32)
    return y


@triton.jit
def _exp(x, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        y = libdevice.exp(x)
    else:
        y = tl.exp(x.to(tl.float64)).to(tl.float32)
    return y


@triton.jit
def _log(x, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        y = libdevice.log(x)
    else:
        y = tl.log(x.to(tl.float64)).to(tl.float32)
    return y


@triton.jit
def _rbox(box_img, sp_c, idx, cls, ok, class_offset, NC, LIBDEVICE: tl.constexpr):
    """(x, y, A, B, C, P) of boxes order[r] = idx: the class-shifted centre, ultralytics' _get_covariance_matrix
    and the clamped determinant A·B − C² that batch_probiou's t3 takes."""
    x = tl.load(box_img + idx, mask=ok, other=0.0)
    y = tl.load(box_img + sp_c + idx, mask=ok, other=0.0)
    w = tl.load(box_img + 2 * sp_c + idx, mask=ok, other=0.0)
    h = tl.load(box_img + 3 * sp_c + idx, mask=ok, other=0.0)
    angle = tl.load(box_img + (4 + NC) * sp_c + idx, mask=ok, other=0.0)
    shift = cls * class_offset
    x = x + shift
    y = y + shift
    if LIBDEVICE:  # torch's CUDA division by a Python scalar multiplies by its float32 reciprocal
        a = w * w * _INV_12
        b = h * h * _INV_12
    else:
        a = tl.math.div_rn(w * w, tl.zeros_like(w) + 12.0)
        b = tl.math.div_rn(h * h, tl.zeros_like(h) + 12.0)
    cos = _cos(angle, LIBDEVICE)
    sin = _sin(angle, LIBDEVICE)
    cos2 = cos * cos
    sin2 = sin * sin
    ca = a * cos2 + b * sin2
    cb = a * sin2 + b * cos2
    cc = (a - b) * cos * sin
    return x, y, ca, cb, cc, _clamp_min(ca * cb - cc * cc, 0.0)


@triton.jit
def _probiou(x1, y1, a1, b1, c1, p1, x2, y2, a2, b2, c2, p2, LIBDEVICE: tl.constexpr):
    """batch_probiou(obb1, obb2) of broadcastable tiles, in its order of operations (see the module docstring)."""
    sa = a1 + a2
    sb = b1 + b2
    sc = c1 + c2
    dx = x1 - x2
    dy = y1 - y2
    det = sa * sb - sc * sc
    den = det + _EPS
    t1 = tl.math.div_rn(sa * (dy * dy) + sb * (dx * dx), den) * 0.25
    t2 = tl.math.div_rn(sc * (x2 - x1) * dy, den) * 0.5
    root = 4.0 * tl.sqrt_rn(p1 * p2) + _EPS
    ratio = tl.math.div_rn(det, root) + _EPS
    t3 = _log(ratio, LIBDEVICE) * 0.5
    bd = tl.minimum(_clamp_min(t1 + t2 + t3, _EPS), 100.0, propagate_nan=tl.PropagateNan.ALL)
    return 1.0 - tl.sqrt_rn(1.0 - _exp(-bd, LIBDEVICE) + _EPS)


@triton.jit
def _fast_nms_kernel(
    suppressed_ptr,
    preds_ptr,
    sp_n,
    sp_c,
    score_ptr,
    class_ptr,
    order_ptr,
    thresholds_ptr,
    limits_ptr,
    A,
    NC,
    LIBDEVICE: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_COUNT: tl.constexpr,
):
    """suppressed[n, r] = ∃ r' < r: probiou(box_r', box_r) > iou_thres, for the positions r of this program's block
    below todo = min(#candidates, max_nms); positions from todo on are left as they are."""
    n = tl.program_id(1).to(tl.int64)
    row = n * A
    i0 = tl.program_id(0) * BLOCK_I
    todo = _todo(score_ptr, row, A, tl.load(limits_ptr + 1), BLOCK_COUNT)
    if i0 < todo:
        iou_thres = tl.load(thresholds_ptr + 1)
        class_offset = tl.where(tl.load(limits_ptr + 2) != 0, 0.0, _MAX_WH)
        box_img = preds_ptr + n * sp_n
        i = i0 + tl.arange(0, BLOCK_I)
        i_ok = i < todo
        idx_i = tl.load(order_ptr + row + i, mask=i_ok, other=0)
        cls_i = tl.load(class_ptr + row + idx_i, mask=i_ok, other=0).to(tl.float32)
        xi, yi, ai, bi, ci, pi = _rbox(box_img, sp_c, idx_i, cls_i, i_ok, class_offset, NC, LIBDEVICE)
        alive = i_ok
        j_end = tl.minimum(i0 + BLOCK_I, todo)  # every earlier position of the block's candidates
        j0 = 0
        alive_count = tl.sum(alive.to(tl.int32), 0)
        while (j0 < j_end) & (alive_count > 0):  # stop once every candidate of the block is dropped
            j = j0 + tl.arange(0, BLOCK_J)
            j_ok = j < j_end
            idx_j = tl.load(order_ptr + row + j, mask=j_ok, other=0)
            cls_j = tl.load(class_ptr + row + idx_j, mask=j_ok, other=0).to(tl.float32)
            xj, yj, aj, bj, cj, pj = _rbox(box_img, sp_c, idx_j, cls_j, j_ok, class_offset, NC, LIBDEVICE)
            iou = _probiou(
                xj[None, :], yj[None, :], aj[None, :], bj[None, :], cj[None, :], pj[None, :],
                xi[:, None], yi[:, None], ai[:, None], bi[:, None], ci[:, None], pi[:, None],
                LIBDEVICE,
            )  # fmt: skip
            hit = (iou > iou_thres) & (j[None, :] < i[:, None]) & j_ok[None, :]
            alive &= tl.sum(hit.to(tl.int32), 1) == 0
            alive_count = tl.sum(alive.to(tl.int32), 0)
            j0 += BLOCK_J
        tl.store(suppressed_ptr + row + i, tl.where(alive, 0, 1).to(tl.uint8), mask=i_ok)


@triton.jit
def _compact_kernel(
    out_ptr,
    so_n,
    so_r,
    count_ptr,
    preds_ptr,
    sp_n,
    sp_c,
    score_ptr,
    class_ptr,
    order_ptr,
    suppressed_ptr,
    limits_ptr,
    A,
    NC,
    CAPACITY,
    CHUNK: tl.constexpr,
    BLOCK_COUNT: tl.constexpr,
):
    """out[n, k] = [cx, cy, w, h, conf, cls, angle] of the k-th kept position of `order`, k < count[n] =
    min(#kept, max_det); rows from the count on are left untouched."""
    n = tl.program_id(0).to(tl.int64)
    row = n * A
    max_det = tl.minimum(tl.maximum(tl.load(limits_ptr), 0), CAPACITY)  # a bad limit must not write past `out`
    todo = _todo(score_ptr, row, A, tl.load(limits_ptr + 1), BLOCK_COUNT)
    lane = tl.arange(0, CHUNK)
    out_img = out_ptr + n * so_n
    box_img = preds_ptr + n * sp_n
    kept = 0
    start = 0
    while (start < todo) & (kept < max_det):
        r = start + lane
        ok = r < todo
        keep = ok & (tl.load(suppressed_ptr + row + r, mask=ok, other=1) == 0)
        pos = kept + tl.cumsum(keep.to(tl.int32), 0) - 1
        write = keep & (pos < max_det)
        idx = tl.load(order_ptr + row + r, mask=write, other=0)
        dst = out_img + pos * so_r
        for ch in tl.static_range(4):
            tl.store(dst + ch, tl.load(box_img + ch * sp_c + idx, mask=write), mask=write)
        tl.store(dst + 4, tl.load(score_ptr + row + idx, mask=write), mask=write)
        tl.store(dst + 5, tl.load(class_ptr + row + idx, mask=write).to(tl.float32), mask=write)
        tl.store(dst + 6, tl.load(box_img + (4 + NC) * sp_c + idx, mask=write), mask=write)
        kept = tl.minimum(kept + tl.sum(keep.to(tl.int32), 0), max_det)
        start += CHUNK
    tl.store(count_ptr + n, kept)


def rotated_non_max_suppression(
    out: torch.Tensor,
    count: torch.Tensor,
    preds: torch.Tensor,
    *,
    nc: int,
    thresholds: torch.Tensor,
    limits: torch.Tensor,
    class_mask: torch.Tensor | None,
    scratch: RotatedNmsScratch,
    best_ready: bool = False,
) -> None:
    """Rotated NMS of every image of `preds` (N, 4 + nc + 1, A) float32 [cx, cy, w, h, scores..., angle], anchors
    contiguous, into `out` (N, capacity, 7) float32 rows [cx, cy, w, h, conf, cls, angle] (model-input pixels,
    best first) and `count` (N,) int32; rows past the count are left untouched.

    thresholds: float32 [conf_thres, iou_thres]; limits: int32 [max_det, max_nms, agnostic (0/1)], max_det
    clamped to [0, capacity]; class_mask: (nc,) uint8/bool, 1 keeps a class, None keeps all. All three are read
    on the device at run time, as by kernels/nms.py's non_max_suppression (whose kernels and scratch this shares:
    `scratch` is a RotatedNmsScratch of (N, A)). Equals yolojet.reference.obb.rotated_nms. `best_ready`: the decode
    wrote scratch.best_score and best_class (kernels/nms.py's BestClassTargets), so that pass is not launched.
    """
    if preds.dim() != 3 or nc < 1 or preds.shape[1] != 4 + nc + 1:
        raise ValueError(f"rotated nms: preds shape {tuple(preds.shape)}, expected (N, 4 + {nc} + 1, A)")
    if not isinstance(scratch, RotatedNmsScratch):
        raise ValueError(f"rotated nms scratch: a {type(scratch).__name__}, expected a RotatedNmsScratch")
    batch, channels, anchors = preds.shape
    device = preds.device
    check_view("rotated nms preds", preds, (batch, channels, anchors), torch.float32)
    check_view("rotated nms out", out, (batch, None, 7), torch.float32, device)
    check_view("rotated nms count", count, (batch,), torch.int32, device)
    check_view("rotated nms thresholds", thresholds, (2,), torch.float32, device)
    check_view("rotated nms limits", limits, (3,), torch.int32, device)
    check_scratch_and_class_mask("rotated nms", scratch, class_mask, nc, (batch, anchors), device)

    # The fast-NMS pass reads best_class, so a single class still takes the best-class pass.
    rank_candidates(scratch, preds, nc, thresholds, class_mask, raw_scores=False, best_ready=best_ready)
    block_i, block_j = _FAST_TILES if preds.is_cuda else _INTERPRETER_FAST_TILES
    _fast_nms_kernel[(triton.cdiv(anchors, block_i), batch)](
        scratch.suppressed,
        preds, preds.stride(0), preds.stride(1),
        scratch.best_score, scratch.best_class, scratch.order,
        thresholds, limits,
        anchors, nc,
        LIBDEVICE=preds.is_cuda,  # the interpreter has no libdevice
        BLOCK_I=block_i,
        BLOCK_J=block_j,
        BLOCK_COUNT=_BLOCK_COUNT,
        num_warps=8,
        enable_fp_fusion=False,  # a fused multiply-add would round probiou differently from torch
    )  # fmt: skip
    _compact_kernel[(batch,)](
        out, out.stride(0), out.stride(1),
        count,
        preds, preds.stride(0), preds.stride(1),
        scratch.best_score, scratch.best_class, scratch.order, scratch.suppressed,
        limits,
        anchors, nc, out.shape[1],
        CHUNK=_COMPACT,
        BLOCK_COUNT=_BLOCK_COUNT,
    )  # fmt: skip


@triton.jit
def _scale_rotated_boxes_kernel(rows_ptr, sr_n, sr_k, count_ptr, params_ptr, K, BLOCK_K: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    count = tl.minimum(tl.load(count_ptr + n), K)
    p = params_ptr + n * 6
    pad_x, pad_y = tl.load(p), tl.load(p + 1)
    gain_x, gain_y = tl.load(p + 2), tl.load(p + 3)
    for k0 in range(0, count, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        ok = k < count
        row = rows_ptr + n * sr_n + k * sr_k
        # Every column is read before any is written: the permutation happens in place.
        cx = tl.load(row, mask=ok, other=0.0)
        cy = tl.load(row + 1, mask=ok, other=0.0)
        w = tl.load(row + 2, mask=ok, other=0.0)
        h = tl.load(row + 3, mask=ok, other=0.0)
        conf = tl.load(row + 4, mask=ok, other=0.0)
        cls = tl.load(row + 5, mask=ok, other=0.0)
        angle = tl.load(row + 6, mask=ok, other=0.0)
        tl.store(row, tl.math.div_rn(cx - pad_x, gain_x), mask=ok)
        tl.store(row + 1, tl.math.div_rn(cy - pad_y, gain_y), mask=ok)
        tl.store(row + 2, tl.math.div_rn(w, gain_x), mask=ok)
        tl.store(row + 3, tl.math.div_rn(h, gain_y), mask=ok)
        tl.store(row + 4, angle, mask=ok)
        tl.store(row + 5, conf, mask=ok)
        tl.store(row + 6, cls, mask=ok)


def scale_rotated_boxes(rows: torch.Tensor, count: torch.Tensor, params: torch.Tensor) -> None:
    """In place, rows[n, :count[n]] from rotated_non_max_suppression's [cx, cy, w, h, conf, cls, angle] in
    model-input pixels to obb.py's `scale_rboxes` layout [cx, cy, w, h, angle, conf, cls] in original pixels:

      cx ← (cx − pad_x) / gain_x,  cy ← (cy − pad_y) / gain_y,  w ← w / gain_x,  h ← h / gain_y

    ultralytics' scale_boxes(xywh=True) as OBBPredictor.construct_result uses it; nothing is clipped and the angle
    passes through. rows: (N, K, 7) float32 (any row strides); count: (N,) int32, clamped to K; params: (N, 6)
    float32 [pad_x, pad_y, gain_x, gain_y, w0, h0] (Letterbox.box_params), contiguous. Rows from the count on are
    left untouched. Lives here rather than in keypoints.py because it owns this module's row layout.
    """
    check_view("scale_rotated_boxes rows", rows, (None, None, 7), torch.float32)
    n, k, _ = rows.shape
    check_view("scale_rotated_boxes count", count, (n,), torch.int32, rows.device)
    check_view("scale_rotated_boxes params", params, (n, 6), torch.float32, rows.device)
    if not params.is_contiguous():
        raise ValueError("scale_rotated_boxes params: expected a contiguous (N, 6) tensor")
    _scale_rotated_boxes_kernel[(n,)](rows, rows.stride(0), rows.stride(1), count, params, k, BLOCK_K=_BLOCK_SCALE)
