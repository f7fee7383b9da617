"""Final detections: the end-to-end head's confidence filter, and mapping boxes back to the original image.

- `select_rows`: the one-to-one head already ranks its (N, K, 6 + E) rows by score; keep, in order,
  those with score > conf and an allowed class, at most max_det (ultralytics' `non_max_suppression`
  with end2end=True). conf and max_det are read from device tensors, so a captured graph serves any
  threshold.
- `scale_boxes`: rows' x1, y1, x2, y2 from model-input pixels to original pixels,
  x = clamp((x − pad_x) / gain_x, 0, w0), likewise y — ultralytics' `scale_boxes` + `clip_boxes`,
  with per-image [pad_x, pad_y, gain_x, gain_y, w0, h0] read from a device tensor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yolojet.kernels.views import check_view


@triton.jit
def _select_rows_kernel(
    out_ptr,
    so_n,
    so_k,
    count_ptr,
    rows_ptr,
    sr_n,
    sr_k,
    thresholds_ptr,
    limits_ptr,
    class_mask_ptr,
    K,
    C,
    HAS_CLASS_MASK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    conf = tl.load(thresholds_ptr)
    max_det = tl.load(limits_ptr)
    kept = 0
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        row = rows_ptr + n * sr_n + k * sr_k
        score = tl.load(row + 4, mask=k_ok, other=0.0)
        keep = k_ok & (score > conf)
        if HAS_CLASS_MASK:
            cls = tl.load(row + 5, mask=k_ok, other=0.0).to(tl.int32)
            keep &= tl.load(class_mask_ptr + cls, mask=keep, other=0) != 0
        slot = kept + tl.cumsum(keep.to(tl.int32), axis=0) - 1
        keep &= slot < max_det
        for c0 in range(0, C, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            ok = keep[:, None] & (c < C)[None, :]
            values = tl.load(row[:, None] + c[None, :], mask=ok, other=0.0)
            tl.store(out_ptr + n * so_n + slot[:, None] * so_k + c[None, :], values, mask=ok)
        kept = tl.minimum(kept + tl.sum(keep.to(tl.int32), axis=0), max_det)
    tl.store(count_ptr + n, kept)


def select_rows(
    out: torch.Tensor,
    count: torch.Tensor,
    rows: torch.Tensor,
    thresholds: torch.Tensor,
    limits: torch.Tensor,
    class_mask: torch.Tensor | None = None,
) -> None:
    """out[n, :count[n]] = rows[n] whose score (column 4) > thresholds[0] and class is allowed, first limits[0].

    rows: (N, K, C) float32 ranked rows; out: (N, max_det, C) float32; count: (N,) int32; thresholds: float32
    [conf, ...]; limits: int32 [max_det, ...] with max_det <= out.shape[1]; class_mask: optional (nc,) uint8.
    """
    check_view("rows", rows, (None, None, None), torch.float32)
    n, k, c = rows.shape
    check_view("out", out, (n, None, c), torch.float32, rows.device)
    check_view("count", count, (n,), torch.int32, rows.device)
    check_view("thresholds", thresholds, (None,), torch.float32, rows.device)
    check_view("limits", limits, (None,), torch.int32, rows.device)
    if class_mask is not None:
        check_view("class_mask", class_mask, (None,), torch.uint8, rows.device)
    _select_rows_kernel[(n,)](
        out, out.stride(0), out.stride(1), count, rows, rows.stride(0), rows.stride(1),
        thresholds, limits, class_mask if class_mask is not None else count, k, c,
        HAS_CLASS_MASK=class_mask is not None, BLOCK_K=128, BLOCK_C=triton.next_power_of_2(min(c, 64)),
    )  # fmt: skip


@triton.jit
def map_box_columns(row, ok, pad_x, pad_y, gain_x, gain_y, w0, h0):
    """Columns 0..3 (xyxy) of the rows at `row` (where `ok`) from model-input to original pixels, clipped."""
    for axis in tl.static_range(4):
        value = tl.load(row + axis, mask=ok, other=0.0)
        if axis % 2 == 0:
            value = tl.minimum(tl.maximum(tl.math.div_rn(value - pad_x, gain_x), 0.0), w0)
        else:
            value = tl.minimum(tl.maximum(tl.math.div_rn(value - pad_y, gain_y), 0.0), h0)
        tl.store(row + axis, value, mask=ok)


@triton.jit
def _scale_boxes_kernel(rows_ptr, sr_n, sr_k, count_ptr, params_ptr, BLOCK_K: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    count = tl.load(count_ptr + n)
    p = params_ptr + n * 6
    pad_x, pad_y = tl.load(p), tl.load(p + 1)
    gain_x, gain_y = tl.load(p + 2), tl.load(p + 3)
    w0, h0 = tl.load(p + 4), tl.load(p + 5)
    for k0 in range(0, count, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        map_box_columns(rows_ptr + n * sr_n + k * sr_k, k < count, pad_x, pad_y, gain_x, gain_y, w0, h0)


def scale_boxes(rows: torch.Tensor, count: torch.Tensor, params: torch.Tensor) -> None:
    """Map rows[n, :count[n], :4] (xyxy, model-input pixels) to original pixels in place.

    params: (N, 6) float32 [pad_x, pad_y, gain_x, gain_y, w0, h0] per image, on the rows' device.
    """
    check_view("rows", rows, (None, None, None), torch.float32)
    n = rows.shape[0]
    check_view("count", count, (n,), torch.int32, rows.device)
    check_view("params", params, (n, 6), torch.float32, rows.device)
    if not params.is_contiguous():
        raise ValueError("params: expected a contiguous (N, 6) tensor")
    _scale_boxes_kernel[(n,)](rows, rows.stride(0), rows.stride(1), count, params, BLOCK_K=128)
