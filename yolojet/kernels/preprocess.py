"""Predict pre-processing into NHWC batch slots: the detection letterbox of a whole batch of frames in one launch,
and the classification resize-and-crop.

Letterbox (detect, segment, pose, OBB): letterbox, BGR → RGB and /255 in one pass, every slot of a batch in one
launch. Each slot's frame is a row of a device table (`frame_row`): its address, strides, size, channels, channel
order and placement, so a captured graph serves frames of any size, anywhere in device memory, without capturing
again. The placement follows ultralytics' LetterBox (auto=False, center=True, scaleup=True, padding value 114) as
predict uses it (yolojet/geometry.py), and
  out[y, x, c] = resize(frame)[y − top, x − left, src(c)] / 255 inside the placed image, 114/255 outside
where resize is cv2.resize(INTER_LINEAR): source coordinate s = (d + 0.5)·(h0/new_h) − 0.5 per axis, clamped to
the image (cv2 replicates the edge), bilinear between the two neighbours with cv2's 11-bit fixed-point weights and
rounding (source coordinates in double, weights rounded half to even, the vertical pass of its vectorised loop).
At scale 1 the weights are exactly (2048, 0), so an unresized axis is a copy, as in LetterBox. The result equals
cv2's bit for bit when the image is shrunk (checked on random crops of real photos); when it is enlarged, a few
percent of pixels differ by one grey level.
"""

from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl

from yolojet.geometry import Letterbox
from yolojet.kernels.launch import launcher
from yolojet.kernels.views import check_view

# A resample program gathers (pixel, tap, channel) tiles of at most this many elements, all taps at once.
_RESAMPLE_ELEMENTS = 8192
_RESAMPLE_MAX_PIXELS = 512
# A letterbox program: a tile of output pixels, all three channels of each. 2 x 128 pixels on four warps took 182 us for
# 64 1080x810 frames into 640x480 slots on an H100, the fastest of ten tiles (193-447 us; 8 x 32 on two warps, the
# fastest before packed frames and the table's quotients, 216-219): bench_images.py --stages letterbox.
LETTERBOX_TILE = (2, 128, 4)  # rows, pixels a row, warps
# Triton's interpreter (CPU tensors) runs programs one after another and pays per operation rather than per element:
# there the largest tiles, 32 to 64 times fewer programs (a classify resample of a photo takes seconds, not a minute).
_INTERPRETER_RESAMPLE = (1 << 18, 1 << 14)  # elements, pixels
_INTERPRETER_LETTERBOX = (32, 1024, 4)  # rows, pixels a row, warps
# One frame's row of a letterbox table, int64: address, row / pixel / channel strides (elements), height, width,
# channels, BGR, pad top, pad left, resized height, resized width, whether the frame is packed (below), and the source
# pixels a resized pixel spans down and across (float64 bits: h0 / new_h, w0 / new_w, the quotients cv2 takes, worked
# out once here rather than in every thread); the rest is padding to 128 bytes.
FRAME_FIELDS = 16
# A frame whose three colour channels are neighbouring bytes and whose bytes all lie within 2**31 of its address (every
# camera frame and photo): the kernel then takes a tap's address once, in 32-bit offsets, and its three channels at
# fixed offsets from it, rather than a 64-bit address a channel.
_PACKED_SPAN = 1 << 31


def frame_row(pixels: torch.Tensor, *, bgr: bool, placement: Letterbox) -> list[int]:
    """The letterbox table row of a uint8 (h0, w0, C) frame, C = 1 (grey, replicated to RGB), 3 (BGR with
    `bgr`, else RGB) or 4 (BGRA / RGBA, alpha dropped), any strides, placed by `placement`.

    The table holds the frame's address: the frame must stay alive, unchanged, until every launch that reads the
    table has run.
    """
    if pixels.dtype != torch.uint8 or pixels.dim() != 3:
        raise ValueError(f"frame: {tuple(pixels.shape)} {pixels.dtype}, expected uint8 (h0, w0, C)")
    h0, w0, c = pixels.shape
    if h0 == 0 or w0 == 0:
        raise ValueError(f"frame: empty, shape {tuple(pixels.shape)}")
    if c not in (1, 3, 4):
        raise ValueError(f"frame: {c} channels, expected 1 (grey), 3 (BGR/RGB) or 4 (BGRA/RGBA)")
    if (placement.orig_h, placement.orig_w) != (h0, w0):
        raise ValueError(f"placement: for a {placement.orig_h}×{placement.orig_w} frame, not {h0}×{w0}")
    if min(placement.new_h, placement.new_w, placement.pad_top + 1, placement.pad_left + 1) < 1:
        raise ValueError(f"placement: {placement} does not place the frame")
    row_stride, pixel_stride, channel_stride = pixels.stride()
    span = (h0 - 1) * row_stride + (w0 - 1) * pixel_stride + (c - 1) * channel_stride + 1
    packed = c >= 3 and channel_stride == 1 and span <= _PACKED_SPAN
    values = [
        pixels.data_ptr(),
        row_stride,
        pixel_stride,
        channel_stride,
        h0,
        w0,
        c,
        int(bgr),
        placement.pad_top,
        placement.pad_left,
        placement.new_h,
        placement.new_w,
        int(packed),
        _float64_bits(h0 / placement.new_h),
        _float64_bits(w0 / placement.new_w),
    ]
    return values + [0] * (FRAME_FIELDS - len(values))


def _float64_bits(value: float) -> int:
    return struct.unpack("<q", struct.pack("<d", value))[0]


@triton.jit
def _cv2_taps(d, size, scale):
    """cv2.resize INTER_LINEAR source taps and 11-bit weights along one axis for destination indices d, `scale` the
    source size over the resized size (float64).

    The source coordinate is computed in double and rounded to float, as cv2 does (launched without FMA
    contraction, which cv2's build does not use either): float32 arithmetic moves some taps by a rounding step.
    """
    f = ((d.to(tl.float64) + 0.5) * scale - 0.5).to(tl.float32)
    i = tl.floor(f)
    frac = f - i
    i = i.to(tl.int32)
    frac = tl.where(i < 0, 0.0, frac)
    i = tl.maximum(i, 0)
    frac = tl.where(i >= size - 1, 0.0, frac)  # cv2 replicates the last row or column
    i = tl.minimum(i, size - 1)
    scaled = (1.0 - frac) * 2048.0
    w0 = tl.floor(scaled + 0.5)
    w0 = tl.where((w0 - scaled == 0.5) & (w0 % 2 != 0), w0 - 1, w0).to(tl.int32)  # half to even, as cvRound
    return i, tl.minimum(i + 1, size - 1), w0, 2048 - w0


@triton.jit
def _resampled(p00, p01, p10, p11, channel, m, wx0, wx1, wy0, wy1):
    """One output channel of a tile: cv2's fixed-point bilinear of the four taps' bytes at `channel` (11-bit weights;
    the vertical pass drops 4 bits, weighs, drops 16, then rounds the last 2), so that resized pixels equal
    cv2.resize's bit for bit wherever its SIMD path runs; 114 (LetterBox's padding grey) outside the image."""
    v00 = tl.load(p00 + channel, mask=m, other=0).to(tl.int32)
    v01 = tl.load(p01 + channel, mask=m, other=0).to(tl.int32)
    v10 = tl.load(p10 + channel, mask=m, other=0).to(tl.int32)
    v11 = tl.load(p11 + channel, mask=m, other=0).to(tl.int32)
    upper = v00 * wx0[None, :] + v01 * wx1[None, :]
    lower = v10 * wx0[None, :] + v11 * wx1[None, :]
    pixel = (((upper >> 4) * wy0[:, None]) >> 16) + (((lower >> 4) * wy1[:, None]) >> 16)
    pixel = tl.minimum(tl.maximum((pixel + 2) >> 2, 0), 255)
    return tl.where(m, pixel, 114).to(tl.float32)


@triton.jit
def _scaled(pixel, HALF: tl.constexpr):
    """pixel / 255 in float32, such that rounded to the output's precision it is torch's quotient. For fp16 outputs the
    product with float32(1/255) rounds to the same half as the correctly rounded quotient for every value 0-255
    (checked for all 256); in fp32 it differs by an ulp for 126 of them, so fp32 divides (Triton's `/` on a GPU is
    an approximation that can miss by an ulp: `div_rn`)."""
    if HALF:
        scaled = pixel * (1.0 / 255.0)
    else:
        scaled = tl.math.div_rn(pixel, tl.full(pixel.shape, 255.0, tl.float32))
    return scaled


@triton.jit
def _letterbox_kernel(
    out_ptr,
    so_n,
    so_h,
    so_w,
    table_ptr,
    H,
    W,
    FIELDS: tl.constexpr,
    BLOCK_Y: tl.constexpr,
    BLOCK_X: tl.constexpr,
    PAD_ROW: tl.constexpr,
    HALF: tl.constexpr,
):
    # A program covers BLOCK_Y x BLOCK_X output pixels of one slot and all three channels of each: each axis's taps
    # are computed once a row or a column, each tap's address once a pixel, and with PAD_ROW a pixel's four halves
    # (the fourth, the row's padding, zero) go out as one 8-byte store, so every memory sector is written whole. The
    # frame comes from the slot's table row, so its sizes are values, not specializations (a 1-pixel side compiles
    # like any other).
    slot = tl.program_id(2)
    row = table_ptr + slot * FIELDS
    frame_ptr = tl.load(row).to(tl.pointer_type(tl.uint8))
    sf_h = tl.load(row + 1)
    sf_w = tl.load(row + 2)
    sf_c = tl.load(row + 3)
    H0 = tl.load(row + 4).to(tl.int32)
    W0 = tl.load(row + 5).to(tl.int32)
    c_in = tl.load(row + 6)
    bgr = tl.load(row + 7)
    pad_top = tl.load(row + 8).to(tl.int32)
    pad_left = tl.load(row + 9).to(tl.int32)
    new_h = tl.load(row + 10).to(tl.int32)
    new_w = tl.load(row + 11).to(tl.int32)
    packed = tl.load(row + 12)
    scale_y = tl.load(row + 13).to(tl.float64, bitcast=True)
    scale_x = tl.load(row + 14).to(tl.float64, bitcast=True)

    y = tl.program_id(0) * BLOCK_Y + tl.arange(0, BLOCK_Y)
    x = tl.program_id(1) * BLOCK_X + tl.arange(0, BLOCK_X)
    y_ok = y < H
    x_ok = x < W
    dy = y - pad_top
    dx = x - pad_left
    y0, y1, wy0, wy1 = _cv2_taps(dy, H0, scale_y)
    x0, x1, wx0, wx1 = _cv2_taps(dx, W0, scale_x)
    m = (y_ok & (dy >= 0) & (dy < new_h))[:, None] & (x_ok & (dx >= 0) & (dx < new_w))[None, :]
    if packed != 0:
        # A tap's address once, from 32-bit offsets; its channels at +0, +1, +2, which the loads take as immediates.
        top = (y0 * sf_h.to(tl.int32))[:, None]
        bottom = (y1 * sf_h.to(tl.int32))[:, None]
        left = (x0 * sf_w.to(tl.int32))[None, :]
        right = (x1 * sf_w.to(tl.int32))[None, :]
        q00 = frame_ptr + (top + left)
        q01 = frame_ptr + (top + right)
        q10 = frame_ptr + (bottom + left)
        q11 = frame_ptr + (bottom + right)
        first = _resampled(q00, q01, q10, q11, 0, m, wx0, wx1, wy0, wy1)
        g = _resampled(q00, q01, q10, q11, 1, m, wx0, wx1, wy0, wy1)
        third = _resampled(q00, q01, q10, q11, 2, m, wx0, wx1, wy0, wy1)
        swap = bgr != 0
        r = tl.where(swap, third, first)
        b = tl.where(swap, first, third)
    else:
        row0 = (y0.to(tl.int64) * sf_h)[:, None]
        row1 = (y1.to(tl.int64) * sf_h)[:, None]
        col0 = (x0.to(tl.int64) * sf_w)[None, :]
        col1 = (x1.to(tl.int64) * sf_w)[None, :]
        p00 = frame_ptr + (row0 + col0)
        p01 = frame_ptr + (row0 + col1)
        p10 = frame_ptr + (row1 + col0)
        p11 = frame_ptr + (row1 + col1)
        # The source channel of each output channel (RGB): BGR(A) flipped, RGB(A) as is (alpha never read), grey one.
        grey = c_in == 1
        red = tl.where(grey, 0, tl.where(bgr != 0, 2, 0)) * sf_c
        green = tl.where(grey, 0, 1) * sf_c
        blue = tl.where(grey, 0, tl.where(bgr != 0, 0, 2)) * sf_c
        r = _resampled(p00, p01, p10, p11, red, m, wx0, wx1, wy0, wy1)
        g = _resampled(p00, p01, p10, p11, green, m, wx0, wx1, wy0, wy1)
        b = _resampled(p00, p01, p10, p11, blue, m, wx0, wx1, wy0, wy1)
    r = _scaled(r, HALF).to(out_ptr.dtype.element_ty)
    g = _scaled(g, HALF).to(out_ptr.dtype.element_ty)
    b = _scaled(b, HALF).to(out_ptr.dtype.element_ty)

    ok = y_ok[:, None] & x_ok[None, :]
    if PAD_ROW:  # rows of 4: r, g, b and a zero, one store a pixel (the literal 4 lets Triton vectorize it)
        at = slot.to(tl.int64) * so_n + (y.to(tl.int64) * so_h)[:, None] + (x.to(tl.int64) * 4)[None, :]
        # join stacks along a new last axis: join(join(r, b), join(g, 0))[..., i, j] is (r, g, b, 0)[2 i + j]
        pixels = tl.reshape(tl.join(tl.join(r, b), tl.join(g, tl.zeros_like(b))), [BLOCK_Y, BLOCK_X, 4])
        tl.store(out_ptr + at[:, :, None] + tl.arange(0, 4)[None, None, :], pixels, mask=ok[:, :, None])
    else:
        at = slot.to(tl.int64) * so_n + (y.to(tl.int64) * so_h)[:, None] + (x.to(tl.int64) * so_w)[None, :]
        tl.store(out_ptr + at, r, mask=ok)
        tl.store(out_ptr + at + 1, g, mask=ok)
        tl.store(out_ptr + at + 2, b, mask=ok)


def letterbox_frames(
    out: torch.Tensor, table: torch.Tensor, *, pad_row: bool = False, compile_only: bool = False
) -> None:
    """Letterbox the frame of each of out's N slots (table row n, `frame_row`) into `out`, an (N, H, W, 3)
    fp16/fp32 view (NHWC batch slots, channel stride 1), as RGB/255.

    `pad_row`: out's pixels are rows of 4 (pixel stride 4) whose fourth channel is padding that nothing reads as
    data; it is written with zeros, so that each pixel is one store. Without it nothing outside the 3 channels is
    written.

    table: (at least N, FRAME_FIELDS) int64, contiguous, on out's device, read on the device when the launch runs
    (a captured graph reads whatever rows it then holds). Frames must lie on out's device.
    """
    check_view("out", out, (None, None, None, 3))
    if out.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"out: dtype {out.dtype}, expected torch.float16 or torch.float32")
    if pad_row and out.stride(2) != 4:
        raise ValueError(f"out: pixel stride {out.stride(2)}, pad_row needs rows of 4")
    n, h, w, _ = out.shape
    if table.dtype != torch.int64 or table.dim() != 2 or table.shape[0] < n or table.shape[1] != FRAME_FIELDS:
        raise ValueError(f"table: {tuple(table.shape)} {table.dtype}, expected ({n}+, {FRAME_FIELDS}) int64")
    if not table.is_contiguous() or table.device != out.device:
        raise ValueError("table: expected a contiguous tensor on out's device")
    if n == 0:
        return
    rows, pixels, warps = LETTERBOX_TILE if out.is_cuda else _INTERPRETER_LETTERBOX
    grid = (triton.cdiv(h, rows), triton.cdiv(w, pixels), n)
    launcher(_letterbox_kernel, grid, compile_only)(
        out, *out.stride()[:3], table, h, w,
        FIELDS=FRAME_FIELDS, BLOCK_Y=rows, BLOCK_X=pixels, PAD_ROW=pad_row,
        HALF=out.dtype == torch.float16, num_warps=warps, enable_fp_fusion=False,
    )  # fmt: skip


@triton.jit
def _tap_sums(index_ptr, weight_ptr, taps, o, ok, line, ss_o, ch, t, C_SRC: tl.constexpr, FLIP: tl.constexpr):
    """(pixel, channel) sums of pixel · weight over taps `t` (those past `taps` masked) of outputs `o`, int32.

    Each source channel is a (pixel, tap) gather of its own, so no lane loads the fourth channel's place; output
    channel c reads source channel 2 - c with FLIP (BGR to RGB), and a grey source fills every channel."""
    tap_ok = ok[:, None] & (t < taps)[None, :]
    tap_at = o[:, None] * taps + t[None, :]
    index = tl.load(index_ptr + tap_at, mask=tap_ok, other=0)
    weight = tl.load(weight_ptr + tap_at, mask=tap_ok, other=0)
    pixel_ptrs = line[:, None] + index.to(tl.int64) * ss_o
    sums = (o * 0)[:, None] + ch[None, :] * 0
    if C_SRC == 1:
        pixel = tl.load(pixel_ptrs, mask=tap_ok, other=0)
        sums += tl.sum(pixel.to(tl.int32) * weight, axis=1)[:, None]
    else:
        for c in tl.static_range(3):
            pixel = tl.load(pixel_ptrs + (2 - c if FLIP else c), mask=tap_ok, other=0)
            sums = tl.where(ch[None, :] == c, tl.sum(pixel.to(tl.int32) * weight, axis=1)[:, None], sums)
    return sums


@triton.jit
def _resample_pass_kernel(
    out_ptr,
    so_o,
    so_j,
    src_ptr,
    ss_o,
    ss_j,
    index_ptr,
    weight_ptr,
    taps,
    count,
    length,
    C_SRC: tl.constexpr,
    FINAL: tl.constexpr,
    BGR: tl.constexpr,
    BLOCK: tl.constexpr,
    TAPS_HEAD: tl.constexpr,
    TAPS_TAIL: tl.constexpr,
    OUTPUTS_FAST: tl.constexpr,
):
    # Element e is output o (along the resampled axis) of line j (along the other axis), neighbouring elements
    # neighbouring along whichever axis is contiguous in memory (OUTPUTS_FAST: the resampled one), so that a
    # warp's gathers fall in a few cache lines. Every tap's index, weight and pixel is loaded in one go, a
    # (pixel, tap, channel) tile: two rounds of memory latency a program rather than two for each tap. The taps
    # are two tiles, TAPS_HEAD (a power of two) and the rest rounded up (TAPS_TAIL, 0 for none): tile sizes must
    # be powers of two, and 9 taps as 8 + 1 gather 36 elements a pixel where one 16-tap tile gathers 64.
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ch = tl.arange(0, 4)  # up to three channels and a masked lane: tensor dimensions must be powers of two
    ok = e < count * length
    if OUTPUTS_FAST:
        o = e % count
        j = e // count
    else:
        o = e // length
        j = e % length
    # The last pass writes RGB (a grey source replicated); an intermediate keeps the source's channels and order.
    c_ok = ch < (3 if FINAL else C_SRC)
    flip = FINAL and BGR and C_SRC == 3
    m = ok[:, None] & c_ok[None, :]
    line = src_ptr + j.to(tl.int64) * ss_j
    # Pillow's 22-bit fixed point: half a step added before the shift. Integer sums: any order is exact.
    head = tl.arange(0, TAPS_HEAD)
    acc = _tap_sums(index_ptr, weight_ptr, taps, o, ok, line, ss_o, ch, head, C_SRC, flip) + (1 << 21)
    if TAPS_TAIL > 0:
        tail = TAPS_HEAD + tl.arange(0, TAPS_TAIL)
        acc += _tap_sums(index_ptr, weight_ptr, taps, o, ok, line, ss_o, ch, tail, C_SRC, flip)
    value = tl.minimum(tl.maximum(acc >> 22, 0), 255)
    target = out_ptr + (o.to(tl.int64) * so_o + j.to(tl.int64) * so_j)[:, None] + ch[None, :]
    if FINAL:
        # ToTensor's /255, correctly rounded as torch's division is (Triton's `/` on a GPU is not).
        scaled = tl.math.div_rn(value.to(tl.float32), tl.full(value.shape, 255.0, tl.float32))
        tl.store(target, scaled.to(out_ptr.dtype.element_ty), mask=m)
    else:
        tl.store(target, value.to(tl.uint8), mask=m)


def resample_pass(
    out: torch.Tensor, src: torch.Tensor, axis: int, index: torch.Tensor, weights: torch.Tensor, *, bgr: bool | None
) -> None:
    """One Pillow resampling pass of a uint8 (rows, cols, C) view along `axis` (0 rows, 1 columns) into `out`.

    Output i along the axis is sum_t src[index[i, t]] * weights[i, t] in 22-bit fixed point, rounded and clipped
    to uint8 as Pillow does; index and weights are (outputs, taps) int32 on the device. With `bgr=None` the pass
    is an intermediate one: `out` is uint8 with src's channels (1, or the first 3 of 3 or 4). Otherwise it is the
    last: `out` is an (rows', cols', 3) fp16/fp32 view (one NHWC batch slot) and receives RGB / 255 (grey
    replicated, BGR flipped when `bgr`). Both views need channel stride 1.
    """
    final = bgr is not None
    if src.dim() == 3 and src.shape[2] == 1:
        src = src[..., 0, None]  # a lone channel's stride is meaningless (numpy's [..., None] makes it 0)
    check_view("src", src, (None, None, None), torch.uint8, out.device)
    if src.shape[2] not in (1, 3, 4):
        raise ValueError(f"src: {src.shape[2]} channels, expected 1, 3 or 4")
    c_src = 1 if src.shape[2] == 1 else 3  # a fourth channel (alpha) is never read
    if final:
        check_view("out", out, (None, None, 3))
        if out.dtype not in (torch.float16, torch.float32):
            raise ValueError(f"out: dtype {out.dtype}, expected torch.float16 or torch.float32")
    else:
        check_view("out", out, (None, None, c_src), torch.uint8)
    if axis not in (0, 1):
        raise ValueError(f"axis {axis}: expected 0 (rows) or 1 (columns)")
    other = 1 - axis
    if index.dtype != torch.int32 or weights.dtype != torch.int32 or index.shape != weights.shape or index.dim() != 2:
        raise ValueError(
            f"index {tuple(index.shape)} {index.dtype}, weights {tuple(weights.shape)} {weights.dtype}: "
            "expected the same (outputs, taps) shape, int32"
        )
    if not (index.is_contiguous() and weights.is_contiguous()) or {index.device, weights.device} != {out.device}:
        raise ValueError("index and weights must be contiguous and on out's device")
    if out.shape[axis] != index.shape[0] or out.shape[other] != src.shape[other]:
        raise ValueError(
            f"out {tuple(out.shape)}: expected {index.shape[0]} along axis {axis} and src's "
            f"{src.shape[other]} along the other"
        )
    count, length = out.shape[axis], out.shape[other]
    if count * length == 0:
        return
    taps = index.shape[1]
    head = 1 << (taps.bit_length() - 1)  # the largest power of two <= taps
    tail = 0 if taps == head else triton.next_power_of_2(taps - head)
    elements, max_pixels = (_RESAMPLE_ELEMENTS, _RESAMPLE_MAX_PIXELS) if out.is_cuda else _INTERPRETER_RESAMPLE
    fit = max(1, elements // (4 * (head + tail)))
    block = min(max_pixels, 1 << (fit.bit_length() - 1))  # a power of two
    _resample_pass_kernel[(triton.cdiv(count * length, block),)](
        out,
        out.stride(axis),
        out.stride(other),
        src,
        src.stride(axis),
        src.stride(other),
        index,
        weights,
        index.shape[1],
        count,
        length,
        C_SRC=c_src,
        FINAL=final,
        BGR=bool(bgr),
        BLOCK=block,
        TAPS_HEAD=head,
        TAPS_TAIL=tail,
        OUTPUTS_FAST=src.stride(axis) < src.stride(other),
    )
