"""Head decode: raw per-level head maps (NHWC views) → ultralytics' (N, 4 + nc + extra, A) float32 tensor.

One launch writes every pyramid level's anchors (up to four levels per launch). Per anchor a at grid cell
(x, y) of a level with stride s, anchor centre (x + 0.5, y + 0.5):
  distances l, t, r, b = Σ_i i·softmax(box[side·R : side·R + R])_i   (DFL, R = reg_max; raw values if R = 1)
  boxes   = (cx, cy, w, h)·s  or  (x1, y1, x2, y2)·s  from the anchor ± distances, or for OBB the rotated
            centre ((r − l)/2, (b − t)/2) rotated by θ plus the anchor, and (l + r, t + b), all ·s
  scores  = sigmoid(cls)
  extras  = mask coefficients as they are; OBB angle θ = (sigmoid(raw) − 1/4)·π or raw; pose keypoints
            x = (2k + cx − 1/2)·s (v8) or (k + cx)·s (v26), likewise y, visibility sigmoid
Follows ultralytics' Detect/_inference, dist2bbox, dist2rbox and kpts_decode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from yolojet.kernels.activations import logistic
from yolojet.kernels.launch import network_launcher
from yolojet.kernels.nms import BestClassTargets, fold_best_class, store_best_class
from yolojet.kernels.pdl import wait_for_previous_kernel

DETECT, SEGMENT, OBB, POSE = 0, 1, 2, 3
TASK_CODES = {"detect": DETECT, "segment": SEGMENT, "obb": OBB, "pose": POSE}
_OBB = tl.constexpr(OBB)
_POSE = tl.constexpr(POSE)
# A level's `folded` bits: its score conv wrote its part of NMS's best-class pass (kernels/conv/scores.py), its box
# conv its boxes (kernels/conv/boxes.py), its extra conv its mask coefficients or keypoints (kernels/conv/extras.py).
SCORES_FOLDED, BOXES_FOLDED, EXTRAS_FOLDED = 1, 2, 4
_SCORES_FOLDED = tl.constexpr(SCORES_FOLDED)
_BOXES_FOLDED = tl.constexpr(BOXES_FOLDED)
_EXTRAS_FOLDED = tl.constexpr(EXTRAS_FOLDED)
# A program: 32 anchors by chunks of 32 classes, on Triton's default 4 warps. On an H100 at batch 64 the decode with
# NMS's best-class pass took 142 us for 640x640 (150 with 64 anchors, 148 with 64 on 8 warps, 174 with 32 on 8) and
# 110 for 640x480 (112, 110, 115): bench/NOTES.md, "The decode's tile timed".
_BLOCK_A = 32
_BLOCK_C = 32
# Ultralytics heads have 3 levels, P2 and P6 variants 4; more would take a second launch.
MAX_LEVELS_PER_LAUNCH = 4


@triton.jit
def _side_distance(box_ptr, pix, side: tl.constexpr, a_ok, REG_MAX: tl.constexpr, R_PAD: tl.constexpr):
    """Expected bin of one box side's distribution (the DFL), or the raw distance when REG_MAX == 1."""
    if REG_MAX == 1:
        return tl.load(box_ptr + pix + side, mask=a_ok, other=0.0).to(tl.float32)
    bins = tl.arange(0, R_PAD)
    ok = a_ok[:, None] & (bins < REG_MAX)[None, :]
    logits = tl.load(box_ptr + pix[:, None] + side * REG_MAX + bins[None, :], mask=ok, other=0.0)
    # A large finite floor rather than -inf: rows past the last anchor must not produce inf - inf.
    logits = tl.where(ok, logits.to(tl.float32), -1e30)
    peak = tl.max(logits, axis=1)
    weights = tl.where(ok, tl.exp(logits - peak[:, None]), 0.0)
    return tl.sum(weights * bins.to(tl.float32)[None, :], axis=1) / tl.maximum(tl.sum(weights, axis=1), 1e-30)


@triton.jit
def _anchor_box(ax, ay, left, top, right, bottom, stride, XYWH: tl.constexpr):
    """An anchor's axis-aligned box from its side distances, in input pixels: (cx, cy, w, h) with XYWH, else (x1, y1,
    x2, y2) (ultralytics' dist2bbox). The box convs that decode their own boxes call it too (kernels/conv/boxes.py)."""
    if XYWH:
        b0 = (ax + (right - left) / 2) * stride
        b1 = (ay + (bottom - top) / 2) * stride
        b2 = (left + right) * stride
        b3 = (top + bottom) * stride
    else:
        b0 = (ax - left) * stride
        b1 = (ay - top) * stride
        b2 = (ax + right) * stride
        b3 = (ay + bottom) * stride
    return b0, b1, b2, b3


@triton.jit
def _keypoint_values(value, ch, ax, ay, stride, KPT_DIM: tl.constexpr, KPT_V26: tl.constexpr):
    """Keypoint channels `ch` (columns) of anchors (ax, ay) (rows) decoded: x = (2k + ax - 1/2)·s (v8) or (k + ax)·s
    (v26), likewise y, the visibility's logistic (ultralytics' kpts_decode). The extra convs that decode their own
    keypoints call it too (kernels/conv/extras.py)."""
    part = (ch % KPT_DIM)[None, :]
    scale = 1.0 if KPT_V26 else 2.0
    shift = 0.0 if KPT_V26 else 0.5
    kx = (value * scale + ax[:, None] - shift) * stride
    ky = (value * scale + ay[:, None] - shift) * stride
    return tl.where(part == 0, kx, tl.where(part == 1, ky, logistic(value)))


@triton.jit
def _angle(raw, ANGLE_SIGMOID: tl.constexpr):
    if ANGLE_SIGMOID:
        return (logistic(raw) - 0.25) * 3.141592653589793
    return raw


@triton.jit
def _decode_level(
    out_ptr,
    so_n,
    so_c,
    n,
    block,
    box_ptr,
    sb_n,
    sb_h,
    sb_w,
    cls_ptr,
    sc_n,
    sc_h,
    sc_w,
    ext_ptr,
    se_n,
    se_h,
    se_w,
    H,
    W,
    anchor_offset,
    stride,
    folded,
    NC,
    EXTRA,
    NC_MAP,
    EXTRA_MAP,
    REG_MAX: tl.constexpr,
    R_PAD: tl.constexpr,
    TASK: tl.constexpr,
    XYWH: tl.constexpr,
    ANGLE_SIGMOID: tl.constexpr,
    KPT_DIM: tl.constexpr,
    KPT_V26: tl.constexpr,
    BLOCK_A: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr,
    best_ptr,
    best_class_ptr,
    best_row,
    thresholds_ptr,
    class_mask_ptr,
    BEST: tl.constexpr,
    HAS_CLASS_MASK: tl.constexpr,
    STORE_SCORES: tl.constexpr,
):
    """BLOCK_A anchors of one level, starting at the level's anchor `block`·BLOCK_A.

    NC_MAP and EXTRA_MAP are the channels the score and extra maps hold, NC and EXTRA the ones decoded: maps
    widened to a multiple of 16 (plan.widened) are loaded whole, so that Triton sees aligned rows and a mask
    constant over 16 channels and loads 16-byte vectors, and the padding is never stored.

    With BEST, the anchors' best class and score also go to NMS's best-class scratch (rows of `best_row` anchors),
    from the scores as stored: NMS then skips a pass that reads every score back (kernels/nms.py). Without
    STORE_SCORES (only with BEST) the scores themselves are not stored, and a level's `folded` bits (only then) say
    what its convs wrote themselves: with SCORES_FOLDED its pass (its scores are not read and its best-class rows not
    written), with BOXES_FOLDED its boxes (its box map is not read and its box rows not written), with EXTRAS_FOLDED
    its extras (likewise)."""
    idx = block * BLOCK_A + tl.arange(0, BLOCK_A)
    a_ok = idx < H * W
    gy = idx // W
    gx = idx % W
    ax = gx.to(tl.float32) + 0.5
    ay = gy.to(tl.float32) + 0.5
    out_col = out_ptr + n * so_n + anchor_offset + idx
    wait_for_previous_kernel(PDL)

    ext_pix = n * se_n + gy * se_h + gx * se_w
    # A level whose box conv decoded its boxes (kernels/conv/boxes.py): its box map is never read.
    if (folded & _BOXES_FOLDED) == 0:
        box_pix = n * sb_n + gy * sb_h + gx * sb_w
        left = _side_distance(box_ptr, box_pix, 0, a_ok, REG_MAX, R_PAD)
        top = _side_distance(box_ptr, box_pix, 1, a_ok, REG_MAX, R_PAD)
        right = _side_distance(box_ptr, box_pix, 2, a_ok, REG_MAX, R_PAD)
        bottom = _side_distance(box_ptr, box_pix, 3, a_ok, REG_MAX, R_PAD)
        if TASK == _OBB:
            theta = _angle(tl.load(ext_ptr + ext_pix, mask=a_ok, other=0.0).to(tl.float32), ANGLE_SIGMOID)
            cos = tl.cos(theta)
            sin = tl.sin(theta)
            xf = (right - left) / 2
            yf = (bottom - top) / 2
            b0 = (xf * cos - yf * sin + ax) * stride
            b1 = (xf * sin + yf * cos + ay) * stride
            b2 = (left + right) * stride
            b3 = (top + bottom) * stride
        else:
            b0, b1, b2, b3 = _anchor_box(ax, ay, left, top, right, bottom, stride, XYWH)
        tl.store(out_col, b0, mask=a_ok)
        tl.store(out_col + so_c, b1, mask=a_ok)
        tl.store(out_col + 2 * so_c, b2, mask=a_ok)
        tl.store(out_col + 3 * so_c, b3, mask=a_ok)

    cls_pix = n * sc_n + gy * sc_h + gx * sc_w
    if BEST:
        best = tl.full([BLOCK_A], float("-inf"), tl.float32)
        best_class = tl.zeros([BLOCK_A], tl.int32)
    # A folded level's score conv wrote its best-class pass (kernels/conv/scores.py): its scores are never read.
    for c0 in range(0, tl.where((folded & _SCORES_FOLDED) != 0, 0, NC), BLOCK_C):
        ch = c0 + tl.arange(0, BLOCK_C)
        loaded = a_ok[:, None] & (ch < NC_MAP)[None, :]
        logits = tl.load(cls_ptr + cls_pix[:, None] + ch[None, :], mask=loaded, other=0.0).to(tl.float32)
        decoded = loaded & (ch < NC)[None, :]
        scores = logistic(logits)
        if STORE_SCORES:
            tl.store(out_col[:, None] + (4 + ch)[None, :] * so_c, scores, mask=decoded)
        if BEST:
            best, best_class = fold_best_class(best, best_class, tl.where(decoded, scores, float("-inf")), ch, NC, 1)
    if BEST:
        offsets = n * best_row + anchor_offset + idx
        ours = a_ok & ((folded & _SCORES_FOLDED) == 0)
        store_best_class(
            best_ptr, best_class_ptr, offsets, ours, best, best_class, thresholds_ptr, class_mask_ptr, HAS_CLASS_MASK
        )

    # A folded level's extra conv wrote its rows (kernels/conv/extras.py): its extra map is never read.
    for c0 in range(0, tl.where((folded & _EXTRAS_FOLDED) != 0, 0, EXTRA), BLOCK_C):
        ch = c0 + tl.arange(0, BLOCK_C)
        loaded = a_ok[:, None] & (ch < EXTRA_MAP)[None, :]
        value = tl.load(ext_ptr + ext_pix[:, None] + ch[None, :], mask=loaded, other=0.0).to(tl.float32)
        if TASK == _OBB:
            value = _angle(value, ANGLE_SIGMOID)
        elif TASK == _POSE:
            value = _keypoint_values(value, ch, ax, ay, stride, KPT_DIM, KPT_V26)
        tl.store(out_col[:, None] + (4 + NC + ch)[None, :] * so_c, value, mask=loaded & (ch < EXTRA)[None, :])


@triton.jit
def _decode_kernel(
    out_ptr,
    so_n,
    so_c,
    # Level 0..3: its maps (pointer and N/H/W strides), grid size, first anchor, stride, its `folded` bits, and the
    # end of its range of program ids. Levels past LEVELS are never read (the launcher repeats level 0 there).
    box0, sb0_n, sb0_h, sb0_w, cls0, sc0_n, sc0_h, sc0_w, ext0, se0_n, se0_h, se0_w, H0, W0, off0, stride0, fold0,
    end0,
    box1, sb1_n, sb1_h, sb1_w, cls1, sc1_n, sc1_h, sc1_w, ext1, se1_n, se1_h, se1_w, H1, W1, off1, stride1, fold1,
    end1,
    box2, sb2_n, sb2_h, sb2_w, cls2, sc2_n, sc2_h, sc2_w, ext2, se2_n, se2_h, se2_w, H2, W2, off2, stride2, fold2,
    end2,
    box3, sb3_n, sb3_h, sb3_w, cls3, sc3_n, sc3_h, sc3_w, ext3, se3_n, se3_h, se3_w, H3, W3, off3, stride3, fold3,
    NC,
    EXTRA,
    NC_MAP,
    EXTRA_MAP,
    LEVELS: tl.constexpr,
    REG_MAX: tl.constexpr,
    R_PAD: tl.constexpr,
    TASK: tl.constexpr,
    XYWH: tl.constexpr,
    ANGLE_SIGMOID: tl.constexpr,
    KPT_DIM: tl.constexpr,
    KPT_V26: tl.constexpr,
    BLOCK_A: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr,
    # NMS's best-class scratch (rows of best_row anchors) and what that pass reads; any valid pointers without BEST.
    best_ptr, best_class_ptr, best_row, thresholds_ptr, class_mask_ptr,
    BEST: tl.constexpr,
    HAS_CLASS_MASK: tl.constexpr,
    STORE_SCORES: tl.constexpr,
):  # fmt: skip
    # Every level in one launch: program ids are dealt out level by level (each level starts a fresh block), so a
    # program decodes anchors of exactly one level and the head costs one launch instead of one per level.
    pid = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    if pid < end0:
        _decode_level(
            out_ptr, so_n, so_c, n, pid,
            box0, sb0_n, sb0_h, sb0_w, cls0, sc0_n, sc0_h, sc0_w, ext0, se0_n, se0_h, se0_w, H0, W0, off0, stride0,
            fold0, NC, EXTRA, NC_MAP, EXTRA_MAP,
            REG_MAX, R_PAD, TASK, XYWH, ANGLE_SIGMOID, KPT_DIM, KPT_V26, BLOCK_A, BLOCK_C, PDL,
            best_ptr, best_class_ptr, best_row, thresholds_ptr, class_mask_ptr, BEST, HAS_CLASS_MASK, STORE_SCORES,
        )  # fmt: skip
    elif LEVELS > 1:
        if pid < end1:
            _decode_level(
                out_ptr, so_n, so_c, n, pid - end0,
                box1, sb1_n, sb1_h, sb1_w, cls1, sc1_n, sc1_h, sc1_w, ext1, se1_n, se1_h, se1_w, H1, W1, off1, stride1,
                fold1, NC, EXTRA, NC_MAP, EXTRA_MAP,
                REG_MAX, R_PAD, TASK, XYWH, ANGLE_SIGMOID, KPT_DIM, KPT_V26, BLOCK_A, BLOCK_C, PDL,
                best_ptr, best_class_ptr, best_row, thresholds_ptr, class_mask_ptr, BEST, HAS_CLASS_MASK, STORE_SCORES,
            )  # fmt: skip
        elif LEVELS > 2:
            if pid < end2:
                _decode_level(
                    out_ptr, so_n, so_c, n, pid - end1,
                    box2, sb2_n, sb2_h, sb2_w, cls2, sc2_n, sc2_h, sc2_w, ext2, se2_n, se2_h, se2_w, H2, W2, off2,
                    stride2, fold2, NC, EXTRA, NC_MAP, EXTRA_MAP,
                    REG_MAX, R_PAD, TASK, XYWH, ANGLE_SIGMOID, KPT_DIM, KPT_V26, BLOCK_A, BLOCK_C, PDL,
                    best_ptr, best_class_ptr, best_row, thresholds_ptr, class_mask_ptr, BEST, HAS_CLASS_MASK,
                    STORE_SCORES,
                )  # fmt: skip
            elif LEVELS > 3:
                _decode_level(
                    out_ptr, so_n, so_c, n, pid - end2,
                    box3, sb3_n, sb3_h, sb3_w, cls3, sc3_n, sc3_h, sc3_w, ext3, se3_n, se3_h, se3_w, H3, W3, off3,
                    stride3, fold3, NC, EXTRA, NC_MAP, EXTRA_MAP,
                    REG_MAX, R_PAD, TASK, XYWH, ANGLE_SIGMOID, KPT_DIM, KPT_V26, BLOCK_A, BLOCK_C, PDL,
                    best_ptr, best_class_ptr, best_row, thresholds_ptr, class_mask_ptr, BEST, HAS_CLASS_MASK,
                    STORE_SCORES,
                )  # fmt: skip


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class DecodeSpec:
    """The head's static description, from the IR decode node's attributes."""

    task: str
    nc: int
    reg_max: int
    strides: tuple[int, ...]
    xywh: bool = True
    angle_sigmoid: bool = True
    kpt_dim: int = 3
    kpt_v26: bool = False
    extra: int = 0  # channels after the classes: mask coefficients, the angle, or keypoints × kpt_dim

    @classmethod
    def from_attrs(cls, attrs: dict) -> DecodeSpec:
        kpt_shape = attrs.get("kpt_shape") or (0, 3)
        return cls(
            task=attrs["task"],
            nc=attrs["nc"],
            reg_max=attrs["reg_max"],
            strides=tuple(attrs["strides"]),
            xywh=attrs.get("box_format", "xywh") == "xywh",
            angle_sigmoid=attrs.get("angle", "sigmoid") == "sigmoid",
            kpt_dim=int(kpt_shape[1]),
            kpt_v26=attrs.get("kpt_offset") == "v26",
            extra=int(attrs.get("extra_channels", 0)),
        )


def decode_heads(
    out: torch.Tensor,
    boxes: list[torch.Tensor],
    scores: list[torch.Tensor],
    extras: list[torch.Tensor] | None,
    spec: DecodeSpec,
    *,
    best: BestClassTargets | None = None,
    folded_scores: frozenset[int] = frozenset(),
    folded_boxes: frozenset[int] = frozenset(),
    folded_extras: frozenset[int] = frozenset(),
    pdl: bool = False,
    compile_only: bool = False,
) -> None:
    """Decode every level into `out` (N, 4 + nc + spec.extra, A), float32, anchors contiguous.

    boxes[i]: (N, H_i, W_i, 4·reg_max), scores[i]: (N, H_i, W_i, nc), extras[i]: (N, H_i, W_i, spec.extra) NHWC
    views with unit channel stride, levels in ultralytics' order (P3 first); extras None when spec.extra is 0.
    A score or extra map may instead be widened to the next multiple of 16 channels (the plan's widened
    rows), the same on every level: the padding is read with the real channels and never stored.
    `best`: also write NMS's best-class pass's output there, (N, A) (kernels/nms.py), and the class scores into
    `out` only where it says to store them. Only with a `best` that stores no scores: `folded_scores`, the levels
    whose score conv wrote their part of the pass itself (kernels/conv/scores.py), whose score maps are then never
    read; `folded_boxes`, the levels whose box conv wrote their boxes (kernels/conv/boxes.py; not OBB, whose boxes
    need the angle), whose box maps are then never read; `folded_extras`, the levels whose extra conv wrote their
    mask coefficients or keypoints (kernels/conv/extras.py; not OBB's angles, which its boxes need), whose extra maps
    are then never read. Where every level is folded every way, nothing is left to do and nothing launches.
    `compile_only`: compile this launch's kernel without launching it.
    """
    if spec.task not in TASK_CODES:
        raise ValueError(f"decode: unknown task {spec.task!r}")
    if spec.task == "pose" and spec.extra % spec.kpt_dim:
        raise ValueError(f"decode: {spec.extra} keypoint channels are not whole keypoints of {spec.kpt_dim} values")
    extras = extras or None
    levels = len(boxes)
    if len(scores) != levels or len(spec.strides) != levels or (extras is not None and len(extras) != levels):
        raise ValueError(f"decode: {levels} box maps, {len(scores)} score maps, {len(spec.strides)} strides")
    if (extras is not None) != (spec.extra > 0):
        raise ValueError(
            f"decode: {spec.task} head with {spec.extra} extra channels, given {len(extras or [])} extra maps"
        )
    batch = boxes[0].shape[0]
    anchors = sum(b.shape[1] * b.shape[2] for b in boxes)
    expected = (batch, 4 + spec.nc + spec.extra, anchors)
    if tuple(out.shape) != expected or out.dtype != torch.float32 or out.stride(2) != 1:
        raise ValueError(f"decode: out must be float32 {expected} with contiguous anchors, got {tuple(out.shape)}")
    if best is not None:
        best.check("decode", spec.nc, (batch, anchors), out.device)
    folded = folded_scores | folded_boxes | folded_extras
    if folded and (best is None or best.store_scores or not folded <= set(range(levels))):
        raise ValueError(
            f"decode: levels {sorted(folded)} folded need best-class targets that store no scores, and levels of the "
            f"{levels}"
        )
    if (folded_boxes or folded_extras) and spec.task == "obb":
        raise ValueError("decode: an OBB head's boxes need its angles; neither its box nor its angle convs can fold")
    if folded_extras and spec.extra == 0:
        raise ValueError(f"decode: levels {sorted(folded_extras)} of a {spec.task} head without extras folded")
    # (maps, channels decoded, whether the maps may be widened)
    kinds = {
        "box": (boxes, 4 * spec.reg_max, False),
        "score": (scores, spec.nc, True),
        "extra": (extras or [], spec.extra, True),
    }
    level_args = []
    offset = 0
    for i in range(levels):
        for name, (maps, channels, widens) in kinds.items():
            if not maps:
                continue
            t = maps[i]
            widths = {channels, _round_up(channels, 16)} if widens else {channels}
            same = t.shape[3] == maps[0].shape[3]
            if t.shape[:3] != boxes[i].shape[:3] or t.stride(3) != 1 or t.shape[3] not in widths or not same:
                raise ValueError(
                    f"decode: level {i} {name} map has shape {tuple(t.shape)} / strides {t.stride()}, "
                    f"expected {' or '.join(map(str, sorted(widths)))} channels like level 0"
                )
        box, cls = boxes[i], scores[i]
        ext = extras[i] if extras else box
        _, h, w, _ = box.shape
        views = (box, *box.stride()[:3], cls, *cls.stride()[:3], ext, *ext.stride()[:3])
        bits = (
            (SCORES_FOLDED if i in folded_scores else 0)
            | (BOXES_FOLDED if i in folded_boxes else 0)
            | (EXTRAS_FOLDED if i in folded_extras else 0)
        )
        level_args.append((*views, h, w, offset, float(spec.strides[i]), bits))
        offset += h * w
    every = set(range(levels))
    if folded_scores == folded_boxes == every and (spec.extra == 0 or folded_extras == every):
        return
    map_widths = (spec.extra, scores[0].shape[3], extras[0].shape[3] if extras else 0)
    for first in range(0, levels, MAX_LEVELS_PER_LAUNCH):
        launched = level_args[first : first + MAX_LEVELS_PER_LAUNCH]
        _launch(out, launched, batch, spec, map_widths, best, pdl, compile_only)


def _launch(
    out: torch.Tensor,
    level_args: list[tuple],
    batch: int,
    spec: DecodeSpec,
    widths: tuple[int, int, int],
    best: BestClassTargets | None,
    pdl: bool,
    compile_only: bool,
) -> None:
    extra, nc_map, extra_map = widths
    if best is None:
        best_args = [out, out, 0, out, out]  # never read
    else:
        mask = best.thresholds if best.class_mask is None else best.class_mask.view(torch.uint8)
        best_args = [best.best_score, best.best_class, best.best_score.shape[1], best.thresholds, mask]
    args = []
    end = 0
    for slot in range(MAX_LEVELS_PER_LAUNCH):
        level = level_args[min(slot, len(level_args) - 1)]  # unused slots repeat a real level: valid pointers
        h, w = level[12], level[13]
        end += triton.cdiv(h * w, _BLOCK_A) if slot < len(level_args) else 0
        args += [*level, end] if slot < MAX_LEVELS_PER_LAUNCH - 1 else list(level)
    network_launcher(_decode_kernel, (end, batch), pdl, compile_only)(
        out, out.stride(0), out.stride(1),
        *args,
        spec.nc, extra, nc_map, extra_map,
        LEVELS=len(level_args),
        REG_MAX=spec.reg_max,
        R_PAD=max(2, triton.next_power_of_2(spec.reg_max)),
        TASK=TASK_CODES[spec.task],
        XYWH=spec.xywh,
        ANGLE_SIGMOID=spec.angle_sigmoid,
        KPT_DIM=spec.kpt_dim,
        KPT_V26=spec.kpt_v26,
        BLOCK_A=_BLOCK_A,
        BLOCK_C=_BLOCK_C,
        best_ptr=best_args[0], best_class_ptr=best_args[1], best_row=best_args[2],
        thresholds_ptr=best_args[3], class_mask_ptr=best_args[4],
        BEST=best is not None,
        HAS_CLASS_MASK=best is not None and best.class_mask is not None,
        STORE_SCORES=best is None or best.store_scores,
    )  # fmt: skip
