"""`score_conv_best_class`: a detection head's last class-score conv (1x1) with NMS's best-class pass as its epilogue.

The score branch ends in a 1x1 conv whose map the head's decode reads back only to take each anchor's best class.
Where NMS reads that pass instead of the scores (kernels/nms.py, `BestClassTargets` with `store_scores=False`), this
kernel computes the conv's logits for a block of pixels and all its classes in registers, rounds them as the conv's
store would, and writes each anchor's best score (−inf unless it is a candidate) and first best class: the score map
is neither written nor read. At batch 64 of yolo11n's 640x480 rectangle that map is 64 MB.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yolojet.kernels.activations import ACTIVATIONS, logistic
from yolojet.kernels.conv.epilogue import _head_conv_outputs
from yolojet.kernels.launch import network_launcher
from yolojet.kernels.nms import BestClassTargets, fold_best_class, store_best_class
from yolojet.kernels.views import check_head_conv

# A program's pixels; its columns are every output of the conv (the classes, and any padding to 16), up to
# MOST_SCORE_CHANNELS, so that one program sees an anchor's every class.
_BLOCK_M = 64
_BLOCK_K = 64
MOST_SCORE_CHANNELS = 256


@triton.jit
def _score_conv_kernel(
    x_ptr,
    stride_xn,
    stride_xh,
    stride_xw,
    w_ptr,
    bias_ptr,
    best_ptr,
    best_class_ptr,
    best_row,
    anchor_offset,
    thresholds_ptr,
    class_mask_ptr,
    H,
    W,
    C_in,
    C_out,
    NC,
    M,
    ACTIVATION: tl.constexpr,
    HAS_CLASS_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """For BLOCK_M pixels p of the (N, H, W) map: logits[p, c] = act(bias[c] + Σ_k x[p, k] · w[c, k]), rounded to x's
    dtype as the conv's output would be, scores = logistic(logits) over the first NC columns, and NMS's best-class
    pass of them (`store_best_class`) at anchor `anchor_offset` + y·W + x of the image's row of `best_row` anchors."""
    logits, m_mask, img, oy, ox, offs_n, _ = _head_conv_outputs(
        x_ptr, stride_xn, stride_xh, stride_xw, w_ptr, bias_ptr, H, W, C_in, C_out, M,
        ACTIVATION, BLOCK_M, BLOCK_N, BLOCK_K, PDL,
    )  # fmt: skip
    decoded = m_mask[:, None] & (offs_n < NC)[None, :]
    scores = tl.where(decoded, logistic(logits), float("-inf"))
    best = tl.full([BLOCK_M], float("-inf"), tl.float32)
    best_class = tl.zeros([BLOCK_M], tl.int32)
    best, best_class = fold_best_class(best, best_class, scores, offs_n, NC, 1)
    offsets = img * best_row + anchor_offset + (oy * W + ox)
    store_best_class(
        best_ptr, best_class_ptr, offsets, m_mask, best, best_class, thresholds_ptr, class_mask_ptr, HAS_CLASS_MASK
    )


def score_conv_best_class(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    best: BestClassTargets,
    *,
    anchor_offset: int,
    nc: int,
    activation: str = "identity",
    pdl: bool = False,
    compile_only: bool = False,
) -> None:
    """NMS's best-class pass of a 1x1 conv's class scores, written into `best` without the scores being stored.

    x: (N, H, W, C_in) NHWC view with unit channel stride (fp16 or fp32); weight: contiguous (C_out, 1, 1, C_in) of
    x's dtype, C_out >= nc (the classes first, then any padding) and at most MOST_SCORE_CHANNELS; bias: contiguous
    float32 (C_out,). The map's anchors are `anchor_offset` + y·W + x of `best`'s (N, A) rows: one level of the head.
    """
    c_out = weight.shape[0]
    if not 1 <= nc <= c_out <= MOST_SCORE_CHANNELS:
        raise ValueError(f"score conv: {nc} classes of {c_out} outputs; at most {MOST_SCORE_CHANNELS} outputs")
    anchors = best.best_score.shape[1]
    batch, height, width, c_in = check_head_conv(
        "score conv", x, weight, bias, c_out, activation, anchor_offset, anchors
    )
    best.check("score conv", nc, (batch, anchors), x.device)
    m = batch * height * width
    if m == 0:
        return
    mask = best.thresholds if best.class_mask is None else best.class_mask.view(torch.uint8)
    network_launcher(_score_conv_kernel, (triton.cdiv(m, _BLOCK_M),), pdl, compile_only)(
        x, *x.stride()[:3], weight, bias, best.best_score, best.best_class, best.best_score.stride(0), anchor_offset,
        best.thresholds, mask, height, width, c_in, c_out, nc, m,
        ACTIVATION=ACTIVATIONS[activation], HAS_CLASS_MASK=best.class_mask is not None, BLOCK_M=_BLOCK_M,
        BLOCK_N=max(16, triton.next_power_of_2(c_out)), BLOCK_K=_BLOCK_K, num_warps=4, num_stages=3,
    )  # fmt: skip
