"""Instance masks of the segment head after NMS, retina_masks=False (ultralytics' default predict path).

- `assemble_masks`: ultralytics' `process_mask(protos, coefs, boxes, (H, W), upsample=True)` (ultralytics 8.4,
  ultralytics/utils/ops.py; yolojet/reference/segment.py `masks_upsampled` is the same), for image n and
  the rows k < count[n] of rows (N, K, 6 + nm) [x1, y1, x2, y2, conf, cls, coefficients], boxes in input pixels:

      logit[k, i, j]  = Σ_c coef[k, c] · proto[n, i, j, c]                    proto resolution (mh, mw)
      up[k, y, x]     = (logit[y0, x0]·wx0 + logit[y0, x1]·wx1)·wy0            F.interpolate(bilinear,
                      + (logit[y1, x0]·wx0 + logit[y1, x1]·wx1)·wy1             align_corners=False) to (H, W)
      mask[k, y, x]   = up > 0  ∧  x1 ≤ x < x2  ∧  y1 ≤ y < y2                 crop_mask, in input pixels

  Upsample first, crop at input resolution: current ultralytics does it in that order ("cropping first smears the
  bilinear edge outside the bbox", ultralytics #24272), so no proto neighbour is ever zeroed by the crop.
- `masks_to_original`: what ultralytics does to draw those masks on the original image,
  `scale_masks(masks[None].float(), (h0, w0))[0] > 0.5`: the letterboxed content
  [top, top + new_h) × [left, left + new_w) of the (H, W) mask is bilinearly resized (align_corners=False) to
  (h0, w0) and thresholded at 0.5.

Bilinear taps are torch's (aten/src/ATen/native/UpSample.h): scale = in / out in float32,
src = max(scale·(dst + 0.5) − 0.5, 0), i0 = min(⌊src⌋, in − 1), i1 = i0 + (i0 < in − 1), w1 = clamp(src − i0, 0, 1),
w0 = 1 − w1, and the sum above in torch's order (width inside, height outside).

Counts are read from the device tensor `count` (and the letterbox from `params`), so a captured graph serves any
number of detections; rows k ≥ count[n] of the outputs are never written.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from yolojet.kernels.views import check_view

# assemble_masks: one program per image and BLOCK_Y × BLOCK_X input pixels, walking the kept rows BLOCK_K at a time.
# 16 rows is tl.dot's smallest M; 8 × 16 = 128 pixels keeps the four fp32 [16, 128] neighbour logits in registers.
_BLOCK_K = 16
_BLOCK_Y = 8
_BLOCK_X = 16
# masks_to_original: tiles of 8 rows × 128 columns of the original image, one instance an iteration (8 pixels a
# thread at 4 warps; a row of the tile is 128 contiguous output bytes).
_ORIG_BLOCK_Y = 8
_ORIG_BLOCK_X = 128
# Under the interpreter, which runs programs one after another and pays per operation rather than per element, the
# largest tiles: a 1080 x 810 photo's mask is 17 programs an instance where the GPU's 8 x 128 tile makes 945 (a custom
# segment checkpoint's test 318 -> 64 s on a 2-core machine).
_INTERPRETER_BLOCKS = (64, 64, 64)  # assemble_masks' BLOCK_K, BLOCK_Y, BLOCK_X
_INTERPRETER_ORIG_BLOCKS = (64, 1024)
_MASK_DTYPES = (torch.uint8, torch.bool)


@triton.jit
def _bilinear_taps(dst, scale, size):
    """torch's upsample_bilinear2d taps along one axis (align_corners=False) for output indices `dst`:
    (i0, i1, w0, w1) with value = v[i0]·w0 + v[i1]·w1. An equal-size axis (scale 1) gives src = dst, w1 = 0:
    torch's plain copy.

    torch computes scale·(dst + 0.5) − 0.5 as one fused multiply-add (measured on its CPU build, where the unfused
    result misses ties like src = 15.5 by an ulp and flips pixels at exactly 0.5; nvcc contracts it by default
    too). In float64 the product and the difference are exact, so rounding once to float32 is that fma, bit for
    bit, on the GPU and under the interpreter (which fuses nothing).
    """
    src = (dst.to(tl.float64) + 0.5) * scale - 0.5
    src = tl.maximum(src.to(tl.float32), 0.0)
    i0 = tl.minimum(tl.floor(src).to(tl.int32), size - 1)
    w1 = tl.minimum(tl.maximum(src - i0.to(tl.float32), 0.0), 1.0)
    i1 = i0 + (i0 < size - 1).to(tl.int32)
    return i0, i1, 1.0 - w1, w1


@triton.jit
def _neighbour_logits(hi, lo, proto, SPLIT: tl.constexpr):
    """coefs · proto for one neighbour: [BLOCK_K, C] × [C, P] → fp32 [BLOCK_K, P].

    fp16 proto (SPLIT): the fp32 coefficients go to the tensor cores as hi + lo, two fp16 halves carrying 22 of
    their 24 bits; fp16 × fp16 products are exact in the fp32 accumulator, so the logits come out as accurate as
    ultralytics' fp32 matmul of `proto.float()`, where one fp16 dot would be off by ~1e-3 of the logit scale.
    fp32 proto: input_precision="ieee" keeps it exact (no TF32).
    """
    if SPLIT:
        acc = tl.dot(lo, proto, input_precision="ieee")
        acc = tl.dot(hi, proto, acc, input_precision="ieee")
    else:
        acc = tl.dot(hi, proto, input_precision="ieee")
    return acc


@triton.jit
def _assemble_masks_kernel(
    out_ptr,
    so_n,
    so_k,
    so_h,
    rows_ptr,
    sr_n,
    sr_k,
    count_ptr,
    proto_ptr,
    sp_n,
    sp_h,
    sp_w,
    K,
    H,
    W,
    MH,
    MW,
    NM,
    scale_y,
    scale_x,
    TILES_X,
    SPLIT: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_Y: tl.constexpr,
    BLOCK_X: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    n = tl.program_id(1).to(tl.int64)
    tile = tl.program_id(0)
    p = tl.arange(0, BLOCK_Y * BLOCK_X)
    y = (tile // TILES_X) * BLOCK_Y + p // BLOCK_X
    x = (tile % TILES_X) * BLOCK_X + p % BLOCK_X
    pix_ok = (y < H) & (x < W)

    # The four proto neighbours of each pixel, all channels, loaded once and shared by every row of the image
    # (loading them only for tiles under a box measured slower: the loads then wait for the box test).
    y0, y1, wy0, wy1 = _bilinear_taps(y, scale_y, MH)
    x0, x1, wx0, wx1 = _bilinear_taps(x, scale_x, MW)
    c = tl.arange(0, BLOCK_C)
    c_ok = c < NM
    ld = c_ok[:, None] & pix_ok[None, :]
    img = proto_ptr + n * sp_n + c[:, None]
    r0 = y0.to(tl.int64) * sp_h
    r1 = y1.to(tl.int64) * sp_h
    q0 = x0.to(tl.int64) * sp_w
    q1 = x1.to(tl.int64) * sp_w
    p00 = tl.load(img + (r0 + q0)[None, :], mask=ld, other=0.0)
    p01 = tl.load(img + (r0 + q1)[None, :], mask=ld, other=0.0)
    p10 = tl.load(img + (r1 + q0)[None, :], mask=ld, other=0.0)
    p11 = tl.load(img + (r1 + q1)[None, :], mask=ld, other=0.0)

    count = tl.minimum(tl.maximum(tl.load(count_ptr + n), 0), K)  # a bad count must not write past `out`
    yf = y.to(tl.float32)[None, :]
    xf = x.to(tl.float32)[None, :]
    out_pix = out_ptr + n * so_n + (y.to(tl.int64) * so_h + x)[None, :]
    for k0 in range(0, count, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < count
        row = rows_ptr + n * sr_n + k.to(tl.int64) * sr_k
        bx1 = tl.load(row, mask=k_ok, other=0.0)[:, None]
        by1 = tl.load(row + 1, mask=k_ok, other=0.0)[:, None]
        bx2 = tl.load(row + 2, mask=k_ok, other=0.0)[:, None]
        by2 = tl.load(row + 3, mask=k_ok, other=0.0)[:, None]
        # crop_mask on the float pixel index; rows past the count get the empty box [0, 0).
        keep = (xf >= bx1) & (xf < bx2) & (yf >= by1) & (yf < by2)
        # Most (tile, box) pairs miss: boxes are small next to the image. Only pay for the dots where one hits.
        if tl.sum(tl.sum(keep.to(tl.int32), 1), 0) > 0:
            coefs = tl.load(row[:, None] + 6 + c[None, :], mask=k_ok[:, None] & c_ok[None, :], other=0.0)
            hi = coefs.to(p00.dtype)
            lo = (coefs - hi.to(tl.float32)).to(p00.dtype)
            top = _neighbour_logits(hi, lo, p00, SPLIT) * wx0[None, :]
            top += _neighbour_logits(hi, lo, p01, SPLIT) * wx1[None, :]
            bottom = _neighbour_logits(hi, lo, p10, SPLIT) * wx0[None, :]
            bottom += _neighbour_logits(hi, lo, p11, SPLIT) * wx1[None, :]
            up = top * wy0[None, :] + bottom * wy1[None, :]
            keep &= up > 0.0
        tl.store(out_pix + k[:, None].to(tl.int64) * so_k, keep.to(out_ptr.dtype.element_ty),
                 mask=k_ok[:, None] & pix_ok[None, :])  # fmt: skip


def _float32_ratio(num: int, den: int) -> float:
    """num / den rounded once to float32, as torch's area_pixel_compute_scale; exact as a Python float."""
    return float(np.float32(num) / np.float32(den))


def assemble_masks(
    out: torch.Tensor, rows: torch.Tensor, count: torch.Tensor, proto: torch.Tensor, *, input_hw: tuple[int, int]
) -> None:
    """out[n, k] = input-resolution mask of rows[n, k] for k < count[n] (ultralytics' process_mask, upsample=True).

    out: (N, K, H, W) uint8 (0/1) or bool, (H, W) = input_hw, unit last-dimension stride; rows k ≥ count[n] are
    left untouched. rows: (N, K, 6 + nm) float32 [x1, y1, x2, y2, conf, cls, nm coefficients], boxes in input
    pixels. count: (N,) int32, read on the device. proto: the NHWC view (N, mh, mw, nm) of the prototypes, float16
    or float32, unit channel stride (a channel slice of a wider buffer is fine). With fp16 proto the coefficients
    enter the tensor cores as fp16 halves, so |coefficient| must stay below 65504 (real heads give tens at most).
    """
    check_view("proto", proto, (None,) * 4)
    if proto.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"proto: dtype {proto.dtype}, expected torch.float16 or torch.float32")
    n, mh, mw, nm = proto.shape
    if nm < 1:
        raise ValueError(f"proto: shape {tuple(proto.shape)} has no prototype channels")
    if len(input_hw) != 2 or any(not isinstance(s, int) or s < 1 for s in input_hw):
        raise ValueError(f"input_hw: expected two positive ints, got {input_hw!r}")
    h, w = input_hw
    check_view("rows", rows, (n, None, 6 + nm), torch.float32, proto.device)
    k = rows.shape[1]
    check_view("count", count, (n,), torch.int32, proto.device)
    check_view("out", out, (n, k, h, w), None, proto.device)
    if out.dtype not in _MASK_DTYPES:
        raise ValueError(f"out: dtype {out.dtype}, expected torch.uint8 or torch.bool")
    if n == 0 or k == 0:
        return
    block_k, block_y, block_x = (_BLOCK_K, _BLOCK_Y, _BLOCK_X) if proto.is_cuda else _INTERPRETER_BLOCKS
    tiles_x = triton.cdiv(w, block_x)
    _assemble_masks_kernel[(triton.cdiv(h, block_y) * tiles_x, n)](
        out, out.stride(0), out.stride(1), out.stride(2), rows, rows.stride(0), rows.stride(1), count,
        proto, *proto.stride()[:3], k, h, w, mh, mw, nm, _float32_ratio(mh, h), _float32_ratio(mw, w), tiles_x,
        SPLIT=proto.dtype == torch.float16, BLOCK_K=block_k, BLOCK_Y=block_y, BLOCK_X=block_x,
        BLOCK_C=max(16, triton.next_power_of_2(nm)),
    )  # fmt: skip


@triton.jit
def _masks_to_original_kernel(
    out_ptr,
    so_k,
    so_h,
    masks_ptr,
    sm_k,
    sm_h,
    count_ptr,
    params_ptr,
    boxes_ptr,
    sb_k,
    K,
    H,
    W,
    H0,
    W0,
    h0f,
    w0f,
    TILES_X,
    HAS_BOXES: tl.constexpr,
    BLOCK_Y: tl.constexpr,
    BLOCK_X: tl.constexpr,
):
    # A BLOCK_Y × BLOCK_X tile of output pixels: the taps are computed once per tile row and column (not per
    # pixel), and each row of the tile is a contiguous run of the output, so stores go out whole.
    tile = tl.program_id(0)
    oy = (tile // TILES_X) * BLOCK_Y + tl.arange(0, BLOCK_Y)
    ox = (tile % TILES_X) * BLOCK_X + tl.arange(0, BLOCK_X)
    ok = (oy < H0)[:, None] & (ox < W0)[None, :]
    # The letterbox content window as scale_masks cuts it: params hold the letterbox's integer offsets
    # (pad_left = round((W − new_w)/2 − 0.1), scale_masks' `left`) and gains new_w / w0, new_h / h0, whose products
    # with w0, h0 sit within an ulp of the integers new_w, new_h (scale_masks' max(round(w0·gain), 1)).
    left = tl.floor(tl.load(params_ptr) + 0.5).to(tl.int32)
    top = tl.floor(tl.load(params_ptr + 1) + 0.5).to(tl.int32)
    width = tl.maximum(tl.floor(tl.load(params_ptr + 2) * w0f + 0.5), 1.0)
    height = tl.maximum(tl.floor(tl.load(params_ptr + 3) * h0f + 0.5), 1.0)
    # Rounded division, as torch's float32 scale (Triton's `/` is approximate on NVIDIA).
    sy0, sy1, wy0, wy1 = _bilinear_taps(oy, tl.math.div_rn(height, h0f), height.to(tl.int32))
    sx0, sx1, wx0, wx1 = _bilinear_taps(ox, tl.math.div_rn(width, w0f), width.to(tl.int32))
    # Clamped into the mask so that params that do not fit the input cannot read outside it.
    row0 = tl.minimum(tl.maximum(top + sy0, 0), H - 1)
    row1 = tl.minimum(tl.maximum(top + sy1, 0), H - 1)
    col0 = tl.minimum(tl.maximum(left + sx0, 0), W - 1)
    col1 = tl.minimum(tl.maximum(left + sx1, 0), W - 1)
    # The window of mask pixels any tap of this tile reads, as floats to compare with the boxes.
    first_row = tl.min(row0, 0).to(tl.float32)
    last_row = tl.max(row1, 0).to(tl.float32)
    first_col = tl.min(col0, 0).to(tl.float32)
    last_col = tl.max(col1, 0).to(tl.float32)
    r0 = (row0.to(tl.int64) * sm_h)[:, None]
    r1 = (row1.to(tl.int64) * sm_h)[:, None]
    q0 = col0[None, :]
    q1 = col1[None, :]
    wx0 = wx0[None, :]
    wx1 = wx1[None, :]
    wy0 = wy0[:, None]
    wy1 = wy1[:, None]
    out_pix = out_ptr + (oy.to(tl.int64) * so_h)[:, None] + ox[None, :]

    count = tl.minimum(tl.maximum(tl.load(count_ptr), 0), K)
    src = masks_ptr
    box = boxes_ptr
    for _ in range(0, count):  # pointers step an instance at a time: 64-bit, however large K·H·W
        if HAS_BOXES:
            # assemble_masks leaves a mask 0 outside x1 ≤ x < x2, y1 ≤ y < y2 of its box (input pixels): a tile
            # whose window of taps lies outside is all zeros, written without reading the mask.
            hit = (last_col >= tl.load(box)) & (first_col < tl.load(box + 2))
            hit &= (last_row >= tl.load(box + 1)) & (first_row < tl.load(box + 3))
        else:
            hit = True
        if hit:
            # The 0/1 masks as float, as scale_masks' masks.float(); any nonzero byte counts as 1.
            m00 = (tl.load(src + r0 + q0, mask=ok, other=0) != 0).to(tl.float32)
            m01 = (tl.load(src + r0 + q1, mask=ok, other=0) != 0).to(tl.float32)
            m10 = (tl.load(src + r1 + q0, mask=ok, other=0) != 0).to(tl.float32)
            m11 = (tl.load(src + r1 + q1, mask=ok, other=0) != 0).to(tl.float32)
            value = (m00 * wx0 + m01 * wx1) * wy0 + (m10 * wx0 + m11 * wx1) * wy1
            tl.store(out_pix, (value > 0.5).to(out_ptr.dtype.element_ty), mask=ok)
        else:
            tl.store(out_pix, tl.zeros((BLOCK_Y, BLOCK_X), tl.int1).to(out_ptr.dtype.element_ty), mask=ok)
        src += sm_k
        box += sb_k
        out_pix += so_k


def masks_to_original(
    out: torch.Tensor | Sequence[torch.Tensor],
    masks: torch.Tensor,
    count: torch.Tensor,
    params: torch.Tensor,
    *,
    rows: torch.Tensor | None = None,
) -> None:
    """out[n][k] = masks[n, k] taken to image n's original (h0, w0) pixels for k < count[n], as ultralytics'
    `scale_masks(masks[None].float(), (h0, w0))[0] > 0.5`.

    Images of one batch may differ in size, so `out` is one tensor per image: a sequence of N (K, h0_n, w0_n)
    uint8 (0/1) or bool tensors with a unit last-dimension stride (or one (N, K, h0, w0) tensor when all share a
    size). Their shapes are fixed when a graph is captured (one graph per frame size), so each image is one
    launch with (h0_n, w0_n) as kernel arguments; counts and the letterbox are read on the device. Rows k ≥
    count[n] are left untouched.

    masks: (N, K, H, W) uint8 or bool input-resolution masks (assemble_masks' out); count: (N,) int32;
    params: contiguous (N, 6) float32 [pad_x, pad_y, gain_x, gain_y, w0, h0] (Letterbox.box_params, as
    kernels/boxes.py's scale_boxes), whose w0, h0 must be out[n]'s (the kernel reads pad and gain only).
    rows: assemble_masks' rows (N, K, 6 + nm) float32 with the boxes still in input pixels, if the masks are 0
    outside them (as assemble_masks writes them): tiles of the original image that no tap of a box reaches are
    then written as zeros without reading the mask, the same result for less work.
    """
    check_view("masks", masks, (None,) * 4)
    if masks.dtype not in _MASK_DTYPES:
        raise ValueError(f"masks: dtype {masks.dtype}, expected torch.uint8 or torch.bool")
    n, k, h, w = masks.shape
    check_view("count", count, (n,), torch.int32, masks.device)
    check_view("params", params, (n, 6), torch.float32, masks.device)
    if not params.is_contiguous():
        raise ValueError("params: expected a contiguous (N, 6) tensor")
    if rows is not None:
        check_view("rows", rows, (n, k, None), torch.float32, masks.device)
        if rows.shape[2] < 4:
            raise ValueError(f"rows: shape {tuple(rows.shape)} has no boxes")
    if isinstance(out, torch.Tensor):
        check_view("out", out, (n, k, None, None), None, masks.device)
        outs = list(out)
    else:
        outs = list(out)
        if len(outs) != n:
            raise ValueError(f"out: {len(outs)} tensors for a batch of {n} images")
    for i, o in enumerate(outs):
        check_view(f"out[{i}]", o, (k, None, None), None, masks.device)
        if o.dtype not in _MASK_DTYPES:
            raise ValueError(f"out[{i}]: dtype {o.dtype}, expected torch.uint8 or torch.bool")
        if o.shape[1] < 1 or o.shape[2] < 1:
            raise ValueError(f"out[{i}]: shape {tuple(o.shape)} has an empty image")
    if k == 0:
        return
    block_y, block_x = (_ORIG_BLOCK_Y, _ORIG_BLOCK_X) if masks.is_cuda else _INTERPRETER_ORIG_BLOCKS
    for i, o in enumerate(outs):
        h0, w0 = o.shape[1:]
        tiles_x = triton.cdiv(w0, block_x)
        _masks_to_original_kernel[(triton.cdiv(h0, block_y) * tiles_x,)](
            o, o.stride(0), o.stride(1), masks[i], masks.stride(1), masks.stride(2), count[i:], params[i],
            params[i] if rows is None else rows[i], 0 if rows is None else rows.stride(1),
            k, h, w, h0, w0, float(h0), float(w0), tiles_x,
            HAS_BOXES=rows is not None, BLOCK_Y=block_y, BLOCK_X=block_x,
        )  # fmt: skip
