"""Non-maximum suppression on the decoded head tensor, capture-safe: ultralytics' `non_max_suppression` (best class
per box, multi_label=False) with torchvision's greedy `nms`, in three launches and no host synchronisation.

For preds (N, 4 + nc + E, A), boxes (cx, cy, w, h), per image:
  conf_a = max_c score[c, a], cls_a = first argmax; candidate iff conf_a > conf_thres and class_mask[cls_a]
  order  = candidates by conf descending, ties by anchor index (torchvision's stable sort of the filtered boxes),
           cut to the first max_nms
  greedy = walk `order`; keep a box unless IoU(kept box, box) > iou_thres for a kept box, the first max_det kept
IoU is torchvision's, operation for operation, on xyxy = (cx ∓ w/2, cy ∓ h/2) shifted by cls·7680 (ultralytics'
max_wh; 0 when agnostic) so that boxes of different classes never overlap: inter = max(0, Δx)·max(0, Δy),
IoU = inter / (area_kept + area − inter), area = (x2 − x1)(y2 − y1). Output rows [x1, y1, x2, y2, conf, cls,
extras...] in that order. Follows ultralytics/utils/nms.py and torchvision/csrc/ops/cpu/nms_kernel.cpp.

Launches: (1) best class per anchor → best_score (−inf: not a candidate) and best_class; (2) a rank sort, each
candidate's rank = #{candidates before it} counted over all anchors, scattered to order[rank]; (3) one program
per image runs the greedy pass over `order` in chunks (see _greedy_nms_kernel). With a single class (pose, and
many custom detectors) there is no best class to find: launch (1) is skipped and the other two read the class's
scores straight from preds, applying the confidence threshold and class filter as they load them. The engine's
head decode (or its score convs) writes launch (1)'s output itself, in place of the scores, for any number of
classes (BestClassTargets, `best_ready`): NMS is then two launches and no score row of preds is written or read.
Thresholds and limits are read from device tensors, so a captured graph follows changes to them without re-capture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import triton
import triton.language as tl

from yolojet.kernels.boxes import map_box_columns
from yolojet.kernels.views import check_view

_MAX_WH = tl.constexpr(7680.0)  # ultralytics' per-class box offset for class-aware NMS
_BLOCK_A = 128
_BLOCK_C = 32
# The rank pass is latency-bound at batch 1: the few programs that hold candidates walk every anchor, so they
# take few, wide steps (5 over yolo11n's 8400 anchors, 11 over OBB's 21504) on narrow rows (8 × 2048 compares,
# 64 per thread with 8 warps); the many programs without a candidate return after one load.
_BLOCK_I = 8
_BLOCK_J = 2048
_CHUNK = 64
_BLOCK_E = 16
_BLOCK_COUNT = 4096  # the candidate count walks all anchors in one program: few steps
# Past a few images the rank pass's programs are mostly ones without a candidate, each a launch of 8 warps that loads 8
# scores and ends: 50,400 of them took 49 us of a batch of 64 (yolo11n at 640x480, H200). Large batches give a
# program groups of blocks, looked at once; small ones keep a block a program, for the latency of a few images.
_RANK_GROUP = 8
_RANK_GROUP_FROM = 8  # images


def rank_group(batch: int) -> int:
    """Blocks of anchors a rank program covers for a batch of `batch` images."""
    return _RANK_GROUP if batch >= _RANK_GROUP_FROM else 1


@triton.jit
def fold_best_class(best, best_cls, s, c, NC, AXIS: tl.constexpr):
    """A chunk of class scores `s` (classes `c` along AXIS, −inf past NC) folded into each anchor's running best
    score and class: the first maximum, as torch's max returns it."""
    top = tl.max(s, AXIS)
    if AXIS == 0:
        first = tl.min(tl.where(s == top[None, :], c[:, None], NC), 0)
    else:
        first = tl.min(tl.where(s == top[:, None], c[None, :], NC), 1)
    # Strictly greater: on a tie the earlier chunk's class stays.
    better = top > best
    return tl.where(better, top, best), tl.where(better, first, best_cls)


@triton.jit
def store_best_class(
    score_ptr, class_ptr, offsets, ok, best, best_cls, thresholds_ptr, class_mask_ptr, HAS_CLASS_MASK: tl.constexpr
):
    """The best-class pass's output for anchors at `offsets`: the best score, −inf where it is not above the
    confidence threshold or its class is filtered out, and the class."""
    keep = best > tl.load(thresholds_ptr)
    if HAS_CLASS_MASK:
        keep &= tl.load(class_mask_ptr + best_cls, mask=ok, other=0) != 0
    tl.store(score_ptr + offsets, tl.where(keep, best, float("-inf")), mask=ok)
    tl.store(class_ptr + offsets, best_cls, mask=ok)


@triton.jit
def _best_class_kernel(
    score_ptr,
    class_ptr,
    preds_ptr,
    sp_n,
    sp_c,
    thresholds_ptr,
    class_mask_ptr,
    A,
    NC,
    HAS_CLASS_MASK: tl.constexpr,
    BLOCK_A: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    n = tl.program_id(1).to(tl.int64)
    a = tl.program_id(0) * BLOCK_A + tl.arange(0, BLOCK_A)
    a_ok = a < A
    best = tl.full([BLOCK_A], float("-inf"), tl.float32)
    best_cls = tl.zeros([BLOCK_A], tl.int32)
    for c0 in range(0, NC, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        ok = (c < NC)[:, None] & a_ok[None, :]
        s = tl.load(preds_ptr + n * sp_n + (4 + c)[:, None] * sp_c + a[None, :], mask=ok, other=float("-inf"))
        best, best_cls = fold_best_class(best, best_cls, s, c, NC, 0)
    store_best_class(
        score_ptr, class_ptr, n * A + a, a_ok, best, best_cls, thresholds_ptr, class_mask_ptr, HAS_CLASS_MASK
    )


@triton.jit
def _score_floor(thresholds_ptr, class_mask_ptr, RAW_SCORES: tl.constexpr, HAS_CLASS_MASK: tl.constexpr):
    """Scores at or below this are not candidates: −inf for best_class's scores, which already hold −inf there;
    for a single class's raw scores the confidence threshold, or +inf when the class filter leaves that class out."""
    if RAW_SCORES:
        floor = tl.load(thresholds_ptr)
        if HAS_CLASS_MASK:
            floor = tl.where(tl.load(class_mask_ptr) != 0, floor, float("inf"))
    else:
        floor = float("-inf")
    return floor


@triton.jit
def _candidate_scores(score_row, a, A, floor):
    """The scores of anchors `a` as candidates, −inf where not one (as best_class's test, strictly above the
    floor; a NaN score is no candidate)."""
    s = tl.load(score_row + a, mask=a < A, other=float("-inf"))
    return tl.where(s > floor, s, float("-inf"))


@triton.jit
def _rank_kernel(
    order_ptr,
    score_ptr,
    ss_n,
    thresholds_ptr,
    class_mask_ptr,
    A,
    RAW_SCORES: tl.constexpr,
    HAS_CLASS_MASK: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
    GROUP: tl.constexpr,
):
    """order[rank_i] = i, rank_i = #{j : s_j > s_i or (s_j = s_i and j < i)}: a total order, so the ranks of
    the candidates are exactly 0 … count − 1. Non-candidates hold −inf and never count before a candidate.

    A program ranks GROUP blocks of BLOCK_I anchors, one after another, after one look at all of them: a group
    without a candidate (the usual case at conf 0.25) ends there."""
    n = tl.program_id(1).to(tl.int64)
    score_row = score_ptr + n * ss_n
    floor = _score_floor(thresholds_ptr, class_mask_ptr, RAW_SCORES, HAS_CLASS_MASK)
    first = tl.program_id(0) * GROUP
    if GROUP > 1:
        group = _candidate_scores(score_row, first * BLOCK_I + tl.arange(0, GROUP * BLOCK_I), A, floor)
        any_in_group = tl.max(group, 0) > float("-inf")
    else:
        any_in_group = True
    if any_in_group:
        for block in range(first, first + GROUP):
            i = block * BLOCK_I + tl.arange(0, BLOCK_I)
            s_i = _candidate_scores(score_row, i, A, floor)
            is_cand = s_i > float("-inf")
            # Skipping blocks and tiles without candidates makes the usual sparse case nearly free.
            if tl.max(is_cand.to(tl.int32), 0) > 0:
                rank = tl.zeros([BLOCK_I], tl.int32)
                for j0 in range(0, A, BLOCK_J):
                    j = j0 + tl.arange(0, BLOCK_J)
                    s_j = _candidate_scores(score_row, j, A, floor)
                    if tl.max(s_j, 0) > float("-inf"):
                        tied_earlier = (s_j[None, :] == s_i[:, None]) & (j[None, :] < i[:, None])
                        before = (s_j[None, :] > s_i[:, None]) | tied_earlier
                        rank += tl.sum(before.to(tl.int32), 1)
                tl.store(order_ptr + n * A + rank, i, mask=is_cand)


@triton.jit
def _shifted(x1, y1, x2, y2, cls, class_offset):
    """ultralytics' class separation (boxes + cls·max_wh) and torchvision's areas of the shifted boxes."""
    shift = cls * class_offset
    x1 = x1 + shift
    y1 = y1 + shift
    x2 = x2 + shift
    y2 = y2 + shift
    return x1, y1, x2, y2, (x2 - x1) * (y2 - y1)


@triton.jit
def _suppresses(ax1, ay1, ax2, ay2, a_area, bx1, by1, bx2, by2, b_area, iou_thres):
    """torchvision's test IoU(a, b) > iou_thres, same operations in the same order. The division rounds to
    nearest (Triton's `/` is approximate on NVIDIA); 0/0 for two empty boxes is NaN, which suppresses nothing."""
    w = tl.maximum(tl.minimum(ax2, bx2) - tl.maximum(ax1, bx1), 0.0)
    h = tl.maximum(tl.minimum(ay2, by2) - tl.maximum(ay1, by1), 0.0)
    inter = w * h
    return tl.math.div_rn(inter, a_area + b_area - inter) > iou_thres


@triton.jit
def _greedy_nms_kernel(
    out_ptr,
    so_n,
    so_r,
    count_ptr,
    preds_ptr,
    sp_n,
    sp_c,
    score_ptr,
    ss_n,
    class_ptr,
    order_ptr,
    thresholds_ptr,
    class_mask_ptr,
    limits_ptr,
    A,
    NC,
    EXTRA,
    CAPACITY,
    params_ptr,
    RAW_SCORES: tl.constexpr,
    HAS_CLASS_MASK: tl.constexpr,
    MAP_BOXES: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_A: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """Greedy NMS of one image over `order`, CHUNK candidates at a time.

    A chunk's candidates are first tested against every box kept so far (the rows already written to `out`,
    CHUNK rows a tile). The survivors then suppress each other in order: alive = base ∧ ¬∃ earlier alive k
    overlapping, iterated from alive = base until nothing changes. Position m is final after m + 1 rounds, and
    the fixed point is unique (induction over m), so this is exactly the sequential greedy result in a few
    rounds. Survivors are appended with a cumsum; the walk stops once max_det boxes are kept, which leaves
    torchvision's keep[:max_det] unchanged because kept boxes come out in walk order. With MAP_BOXES the kept rows'
    boxes then go to original pixels (boxes.py's scale_boxes, params at `params_ptr`): only once the walk, which
    reads kept boxes back in input pixels, is over.
    """
    n = tl.program_id(0).to(tl.int64)
    row = n * A
    iou_thres = tl.load(thresholds_ptr + 1)
    max_det = tl.minimum(tl.maximum(tl.load(limits_ptr), 0), CAPACITY)  # a bad limit must not write past `out`
    max_nms = tl.load(limits_ptr + 1)
    class_offset = tl.where(tl.load(limits_ptr + 2) != 0, 0.0, _MAX_WH)

    score_row = score_ptr + n * ss_n
    floor = _score_floor(thresholds_ptr, class_mask_ptr, RAW_SCORES, HAS_CLASS_MASK)
    seen = tl.zeros([BLOCK_A], tl.int32)
    for a0 in range(0, A, BLOCK_A):
        seen += (_candidate_scores(score_row, a0 + tl.arange(0, BLOCK_A), A, floor) > float("-inf")).to(tl.int32)
    todo = tl.minimum(tl.sum(seen, 0), max_nms)

    lane = tl.arange(0, CHUNK)
    earlier = lane[:, None] < lane[None, :]
    out_img = out_ptr + n * so_n
    box_img = preds_ptr + n * sp_n
    kept = 0
    start = 0
    while (start < todo) & (kept < max_det):
        r = start + lane
        base = r < todo
        idx = tl.load(order_ptr + row + r, mask=base, other=0)
        cx = tl.load(box_img + idx, mask=base, other=0.0)
        cy = tl.load(box_img + sp_c + idx, mask=base, other=0.0)
        half_w = tl.load(box_img + 2 * sp_c + idx, mask=base, other=0.0) * 0.5
        half_h = tl.load(box_img + 3 * sp_c + idx, mask=base, other=0.0) * 0.5
        x1 = cx - half_w
        y1 = cy - half_h
        x2 = cx + half_w
        y2 = cy + half_h
        conf = tl.load(score_row + idx, mask=base, other=0.0)
        if RAW_SCORES:
            cls = tl.zeros([CHUNK], tl.float32)
        else:
            cls = tl.load(class_ptr + row + idx, mask=base, other=0).to(tl.float32)
        bx1, by1, bx2, by2, b_area = _shifted(x1, y1, x2, y2, cls, class_offset)

        for k0 in range(0, kept, CHUNK):
            k = k0 + lane
            k_ok = k < kept
            kept_row = out_img + k * so_r
            kx1 = tl.load(kept_row, mask=k_ok, other=0.0)
            ky1 = tl.load(kept_row + 1, mask=k_ok, other=0.0)
            kx2 = tl.load(kept_row + 2, mask=k_ok, other=0.0)
            ky2 = tl.load(kept_row + 3, mask=k_ok, other=0.0)
            kc = tl.load(kept_row + 5, mask=k_ok, other=0.0)
            kx1, ky1, kx2, ky2, k_area = _shifted(kx1, ky1, kx2, ky2, kc, class_offset)
            hit = _suppresses(
                kx1[None, :], ky1[None, :], kx2[None, :], ky2[None, :], k_area[None, :],
                bx1[:, None], by1[:, None], bx2[:, None], by2[:, None], b_area[:, None], iou_thres,
            ) & k_ok[None, :]  # fmt: skip
            base &= tl.sum(hit.to(tl.int32), 1) == 0

        beats = earlier & _suppresses(
            bx1[:, None], by1[:, None], bx2[:, None], by2[:, None], b_area[:, None],
            bx1[None, :], by1[None, :], bx2[None, :], by2[None, :], b_area[None, :], iou_thres,
        )  # fmt: skip
        alive = base
        changed = 1
        while changed > 0:
            beaten = tl.sum((beats & alive[:, None]).to(tl.int32), 0) > 0
            update = base & ~beaten
            changed = tl.sum((update != alive).to(tl.int32), 0)
            alive = update

        pos = kept + tl.cumsum(alive.to(tl.int32), 0) - 1
        write = alive & (pos < max_det)
        dst = out_img + pos * so_r
        tl.store(dst, x1, mask=write)
        tl.store(dst + 1, y1, mask=write)
        tl.store(dst + 2, x2, mask=write)
        tl.store(dst + 3, y2, mask=write)
        tl.store(dst + 4, conf, mask=write)
        tl.store(dst + 5, cls, mask=write)
        for e0 in range(0, EXTRA, BLOCK_E):
            e = e0 + tl.arange(0, BLOCK_E)
            ok = write[:, None] & (e < EXTRA)[None, :]
            value = tl.load(box_img + (4 + NC + e)[None, :] * sp_c + idx[:, None], mask=ok)
            tl.store(dst[:, None] + 6 + e[None, :], value, mask=ok)
        kept = tl.minimum(kept + tl.sum(alive.to(tl.int32), 0), max_det)
        # The next chunk reads these rows back from other threads of the program: make the stores visible.
        tl.debug_barrier()
        start += CHUNK
    if MAP_BOXES:
        p = params_ptr + n * 6
        pad_x, pad_y = tl.load(p), tl.load(p + 1)
        gain_x, gain_y = tl.load(p + 2), tl.load(p + 3)
        w0, h0 = tl.load(p + 4), tl.load(p + 5)
        for k0 in range(0, kept, CHUNK):
            k = k0 + lane
            map_box_columns(out_img + k * so_r, k < kept, pad_x, pad_y, gain_x, gain_y, w0, h0)
    tl.store(count_ptr + n, kept)


@dataclass(frozen=True)
class NmsScratch:
    """Scratch of non_max_suppression, each (N, A) and contiguous; any prior content is overwritten.

    best_score: float32, the best class score, −inf where not a candidate; best_class: int32, its class;
    order: int32, candidate anchors by descending score (the first `count` entries are meaningful).
    """

    best_score: torch.Tensor
    best_class: torch.Tensor
    order: torch.Tensor
    dtypes: ClassVar[dict[str, torch.dtype]] = {
        "best_score": torch.float32,
        "best_class": torch.int32,
        "order": torch.int32,
    }

    @classmethod
    def allocate(cls, batch: int, anchors: int, device: torch.device | str) -> NmsScratch:
        shape = (batch, anchors)
        return cls(
            torch.empty(shape, dtype=torch.float32, device=device),
            torch.empty(shape, dtype=torch.int32, device=device),
            torch.empty(shape, dtype=torch.int32, device=device),
        )

    def first(self, batch: int) -> NmsScratch:
        """The scratch of the first `batch` images (contiguous views), for a run on fewer than allocated."""
        return NmsScratch(self.best_score[:batch], self.best_class[:batch], self.order[:batch])


@dataclass(frozen=True)
class BestClassTargets:
    """Where a launch that already holds every anchor's class scores writes the best-class pass's output, so that
    NMS skips that pass (`best_ready`): the head's decode does, while the scores are still in its registers.
    best_score and best_class: NmsScratch's (N, A) tensors for the N images the launch decodes; thresholds and
    class_mask: what NMS then reads (class_mask None: every class kept). store_scores False: the launch leaves its
    output's class-score rows unwritten, for an NMS that reads this pass instead (at batch 64 of yolo11n's 640x480
    rectangle those rows are 129 MB of float32 nobody reads)."""

    best_score: torch.Tensor
    best_class: torch.Tensor
    thresholds: torch.Tensor
    class_mask: torch.Tensor | None
    store_scores: bool = True

    def check(self, label: str, nc: int, shape: tuple[int, int], device: torch.device) -> None:
        for name in ("best_score", "best_class"):
            _check_scratch_tensor(f"{label} {name}", getattr(self, name), shape, NmsScratch.dtypes[name], device)
        check_view(f"{label} thresholds", self.thresholds, (2,), torch.float32, device)
        _check_class_mask(label, self.class_mask, nc, device)


def best_class_pass(nc: int, rotated: bool) -> bool:
    """Whether NMS of `nc` classes runs the best-class pass: a single class's scores are read as they are, except by
    rotated NMS, whose fast pass reads best_class."""
    return rotated or nc > 1


def check_scratch_and_class_mask(
    label: str,
    scratch: NmsScratch,
    class_mask: torch.Tensor | None,
    nc: int,
    shape: tuple[int, int],
    device: torch.device,
) -> None:
    """Every (N, A) tensor of `scratch` (this module's or rotated NMS's, which adds fields) contiguous with its
    dtype on `device`; class_mask None or (nc,) uint8/bool there."""
    for name, dtype in scratch.dtypes.items():
        _check_scratch_tensor(f"{label} scratch.{name}", getattr(scratch, name), shape, dtype, device)
    _check_class_mask(label, class_mask, nc, device)


def _check_scratch_tensor(
    label: str, t: torch.Tensor, shape: tuple[int, int], dtype: torch.dtype, device: torch.device
) -> None:
    check_view(label, t, shape, dtype, device)
    if not t.is_contiguous():
        raise ValueError(f"{label}: strides {t.stride()}, expected contiguous")


def _check_class_mask(label: str, class_mask: torch.Tensor | None, nc: int, device: torch.device) -> None:
    if class_mask is not None:
        if class_mask.dtype not in (torch.uint8, torch.bool):
            raise ValueError(f"{label} class_mask: dtype {class_mask.dtype}, expected torch.uint8 or torch.bool")
        check_view(f"{label} class_mask", class_mask, (nc,), None, device)


def rank_candidates(
    scratch: NmsScratch,
    preds: torch.Tensor,
    nc: int,
    thresholds: torch.Tensor,
    class_mask: torch.Tensor | None,
    *,
    raw_scores: bool,
    best_ready: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launches (1) and (2): candidates in scratch.order by descending score. Returns the (N, A) scores the later
    passes read (best_score, or with `raw_scores` the single class's row of preds) and the class-mask tensor
    to pass them (any valid pointer when there is no class filter). `best_ready`: scratch.best_score and best_class
    already hold launch (1)'s output for these thresholds and class mask (written by the decode: BestClassTargets),
    so (1) is not launched."""
    batch, _, anchors = preds.shape
    mask = thresholds if class_mask is None else class_mask.view(torch.uint8)  # unused when HAS_CLASS_MASK is false
    if raw_scores:
        scores = preds[:, 4]  # the class's scores, thresholded where they are read
    else:
        scores = scratch.best_score
    if not raw_scores and not best_ready:
        _best_class_kernel[(triton.cdiv(anchors, _BLOCK_A), batch)](
            scratch.best_score, scratch.best_class,
            preds, preds.stride(0), preds.stride(1),
            thresholds, mask,
            anchors, nc,
            HAS_CLASS_MASK=class_mask is not None,
            BLOCK_A=_BLOCK_A,
            BLOCK_C=_BLOCK_C,
        )  # fmt: skip
    group = rank_group(batch)
    _rank_kernel[(triton.cdiv(triton.cdiv(anchors, _BLOCK_I), group), batch)](
        scratch.order, scores, scores.stride(0), thresholds, mask, anchors,
        RAW_SCORES=raw_scores, HAS_CLASS_MASK=raw_scores and class_mask is not None, BLOCK_I=_BLOCK_I,
        BLOCK_J=_BLOCK_J, GROUP=group, num_warps=8,
    )  # fmt: skip
    return scores, mask


def non_max_suppression(
    out: torch.Tensor,
    count: torch.Tensor,
    preds: torch.Tensor,
    *,
    nc: int,
    thresholds: torch.Tensor,
    limits: torch.Tensor,
    class_mask: torch.Tensor | None,
    scratch: NmsScratch,
    best_ready: bool = False,
    box_params: torch.Tensor | None = None,
) -> None:
    """NMS of every image of `preds` (N, 4 + nc + E, A) float32, anchors contiguous, into `out` (N, capacity,
    6 + E) float32 rows [x1, y1, x2, y2, conf, cls, extras...] and `count` (N,) int32; rows past the count
    are left untouched.

    thresholds: float32 [conf_thres, iou_thres]; limits: int32 [max_det, max_nms, agnostic (0/1)], max_det
    clamped to [0, capacity]; class_mask: (nc,) uint8/bool, 1 keeps a class, None keeps all. All three are read
    on the device at run time. The IoU test is in float32 where torchvision compares with the float64
    threshold: they differ only for an IoU equal to float32(iou_thres) when that rounded up, so write
    iou_thres rounded down to float32 for an exact match. `best_ready`: the decode wrote scratch.best_score and
    best_class (BestClassTargets with these thresholds and class mask); NMS then takes two launches, not three.
    `box_params`: (N, 6) float32 [pad_x, pad_y, gain_x, gain_y, w0, h0] an image, contiguous: the kept boxes are then
    mapped to original pixels and clipped as boxes.py's scale_boxes does, in the greedy pass's launch.
    """
    if preds.dim() != 3 or preds.shape[1] < 4 + nc or nc < 1:
        raise ValueError(f"nms: preds shape {tuple(preds.shape)} does not hold 4 boxes + {nc} classes")
    batch, channels, anchors = preds.shape
    extra = channels - 4 - nc
    device = preds.device
    check_view("nms preds", preds, (batch, channels, anchors), torch.float32)
    check_view("nms out", out, (batch, None, 6 + extra), torch.float32, device)
    check_view("nms count", count, (batch,), torch.int32, device)
    check_view("nms thresholds", thresholds, (2,), torch.float32, device)
    check_view("nms limits", limits, (3,), torch.int32, device)
    check_scratch_and_class_mask("nms", scratch, class_mask, nc, (batch, anchors), device)
    if box_params is not None:
        check_view("nms box_params", box_params, (batch, 6), torch.float32, device)
        if not box_params.is_contiguous():
            raise ValueError("nms box_params: expected a contiguous (N, 6) tensor")

    # A pass written before NMS is read for any number of classes; without one a single class's row is read as it is.
    raw_scores = not best_ready and not best_class_pass(nc, rotated=False)
    scores, mask = rank_candidates(
        scratch, preds, nc, thresholds, class_mask, raw_scores=raw_scores, best_ready=best_ready
    )
    _greedy_nms_kernel[(batch,)](
        out, out.stride(0), out.stride(1),
        count,
        preds, preds.stride(0), preds.stride(1),
        scores, scores.stride(0), scratch.best_class, scratch.order,
        thresholds, mask, limits,
        anchors, nc, extra, out.shape[1],
        box_params if box_params is not None else thresholds,  # never read without MAP_BOXES
        RAW_SCORES=raw_scores,
        HAS_CLASS_MASK=raw_scores and class_mask is not None,  # best_class applied it otherwise
        MAP_BOXES=box_params is not None,
        CHUNK=_CHUNK,
        BLOCK_A=_BLOCK_COUNT,
        BLOCK_E=_BLOCK_E,
        num_warps=8,  # 64×64 pair tiles: 4 warps spill on sm_90
        enable_fp_fusion=False,  # a fused multiply-add would round the IoU differently from torchvision
    )  # fmt: skip
