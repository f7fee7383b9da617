"""Predict pre-processing of one uint8 frame into one NHWC batch slot: the detection letterbox, and the
classification resize-and-crop.

Letterbox (detect, segment, pose, OBB): letterbox, BGR → RGB and /255 in one pass.

Follows ultralytics' LetterBox (auto=False, center=True, scaleup=True, padding value 114) as used by predict:
  r = min(H/h0, W/w0);  new_w, new_h = max(round(w0·r), 1), max(round(h0·r), 1)
  top, left = round((H − new_h)/2 − 0.1), round((W − new_w)/2 − 0.1)     (Python's round: half to even)
  out[y, x, c] = resize(frame)[y − top, x − left, src(c)] / 255 inside the placed image, 114/255 outside
where resize is cv2.resize(INTER_LINEAR): source coordinate s = (d + 0.5)·(h0/new_h) − 0.5 per axis, clamped to
the image (cv2 replicates the edge), bilinear between the two neighbours with cv2's 11-bit fixed-point weights and
rounding (source coordinates in double, weights rounded half to even, the vertical pass of its vectorised loop).
At scale 1 the weights are exactly (2048, 0), so an unresized axis is a copy, as in LetterBox. The result equals
cv2's bit for bit when the image is shrunk (checked on random crops of real photos); when it is enlarged, a few
percent of pixels differ by one grey level.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from yolojet.kernels.elementwise import check_view

# A resample program gathers (pixel, first-pass tap, channel) tiles of at most this many elements, one a tap of
# the second pass, all in flight together.
_RESAMPLE_ELEMENTS = 2048
_RESAMPLE_MAX_PIXELS = 128
# The most 4-byte words a tap's run of pixels may take on the word path (a 64-byte run: 21 taps of 3 bytes).
_RESAMPLE_MAX_WORDS = 16
# A letterbox program: 4 rows of 256 output elements (85 pixels), 1,280 programs for a 640x640 input.
_LETTERBOX_ROWS = 4
_LETTERBOX_ELEMENTS = 256


@dataclass(frozen=True)
class Letterbox:
    """Placement of the resized frame in the model input: scaled by `gain` to new_h × new_w, top-left at
    (pad_top, pad_left). ultralytics' scale_boxes maps boxes back with these (per-axis gains new_h/h0, new_w/w0)."""

    gain: float
    pad_top: int
    pad_left: int
    new_h: int
    new_w: int


def letterbox_params(orig_hw: tuple[int, int], target_hw: tuple[int, int]) -> Letterbox:
    """ultralytics LetterBox.get_params (auto=False, center=True, scaleup=True) for a (h0, w0) frame and an (H, W)
    model input."""
    (h0, w0), (h, w) = orig_hw, target_hw
    if min(h0, w0, h, w) < 1:
        raise ValueError(f"letterbox: sizes must be positive, got frame {orig_hw} and target {target_hw}")
    r = min(h / h0, w / w0)
    new_h, new_w = max(round(h0 * r), 1), max(round(w0 * r), 1)
    return Letterbox(r, round((h - new_h) / 2 - 0.1), round((w - new_w) / 2 - 0.1), new_h, new_w)


@triton.jit
def _cv2_taps(d, size, resized):
    """cv2.resize INTER_LINEAR source taps and 11-bit weights along one axis for destination indices d.

    The source coordinate is computed in double and rounded to float, as cv2 does (launched without FMA
    contraction, which cv2's build does not use either): float32 arithmetic moves some taps by a rounding step.
    """
    scale = size.to(tl.float64) / resized.to(tl.float64)
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
def _letterbox_kernel(
    out_ptr,
    so_h,
    so_w,
    frame_ptr,
    sf_h,
    sf_w,
    H,
    W,
    H0,
    W0,
    pad_top,
    pad_left,
    new_h,
    new_w,
    C_IN: tl.constexpr,
    BGR: tl.constexpr,
    BLOCK_Y: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    # A program covers BLOCK_Y output rows and BLOCK_E consecutive elements of each, element e of a row being
    # channel e % 3 of pixel e // 3: the stores of a row run contiguously, and each axis's taps are computed once
    # a row or a column rather than once a pixel.
    y = tl.program_id(0) * BLOCK_Y + tl.arange(0, BLOCK_Y)
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    x = e // 3
    ch = e - x * 3
    y_ok = y < H
    e_ok = e < W * 3
    dy = y - pad_top
    dx = x - pad_left
    y_inside = (dy >= 0) & (dy < new_h)
    x_inside = (dx >= 0) & (dx < new_w)

    y0, y1, wy0, wy1 = _cv2_taps(dy, H0, new_h)
    x0, x1, wx0, wx1 = _cv2_taps(dx, W0, new_w)
    if C_IN == 1:
        src_ch = ch * 0  # grey: every output channel reads the one input channel
    elif BGR:
        src_ch = 2 - ch
    else:
        src_ch = ch  # RGB(A): alpha, channel 3, is never read
    row0 = frame_ptr + (y0.to(tl.int64) * sf_h)[:, None]
    row1 = frame_ptr + (y1.to(tl.int64) * sf_h)[:, None]
    col0 = (x0.to(tl.int64) * sf_w + src_ch)[None, :]
    col1 = (x1.to(tl.int64) * sf_w + src_ch)[None, :]
    m = (y_ok & y_inside)[:, None] & (e_ok & x_inside)[None, :]
    p00 = tl.load(row0 + col0, mask=m, other=0).to(tl.int32)
    p01 = tl.load(row0 + col1, mask=m, other=0).to(tl.int32)
    p10 = tl.load(row1 + col0, mask=m, other=0).to(tl.int32)
    p11 = tl.load(row1 + col1, mask=m, other=0).to(tl.int32)
    # cv2's fixed-point arithmetic (11-bit weights; the vertical pass drops 4 bits, weighs, drops 16, then
    # rounds the last 2), so resized pixels equal cv2.resize's bit for bit wherever its SIMD path runs.
    upper = p00 * wx0[None, :] + p01 * wx1[None, :]
    lower = p10 * wx0[None, :] + p11 * wx1[None, :]
    pixel = (((upper >> 4) * wy0[:, None]) >> 16) + (((lower >> 4) * wy1[:, None]) >> 16)
    pixel = tl.minimum(tl.maximum((pixel + 2) >> 2, 0), 255).to(tl.float32)
    # 114: LetterBox's padding grey. Correctly rounded division, as numpy's and torch's: on a GPU Triton's `/`
    # on float32 is an approximation that can miss by an ulp.
    v = tl.math.div_rn(tl.where(m, pixel, 114.0), tl.full(pixel.shape, 255.0, tl.float32))

    o_off = (y.to(tl.int64) * so_h)[:, None] + (x.to(tl.int64) * so_w + ch)[None, :]
    tl.store(out_ptr + o_off, v.to(out_ptr.dtype.element_ty), mask=y_ok[:, None] & e_ok[None, :])


def preprocess_letterbox(
    out: torch.Tensor, frame: torch.Tensor, *, bgr: bool, params: Letterbox | None = None
) -> Letterbox:
    """Letterbox a uint8 (h0, w0, C) frame into `out`, an (H, W, 3) fp16/fp32 view (one NHWC batch slot, channel
    stride 1), as RGB/255; returns the placement (default letterbox_params((h0, w0), (H, W))).

    C = 1: grey, replicated to RGB; C = 3: BGR (bgr=True) or RGB; C = 4: BGRA or RGBA, alpha dropped. The frame
    may be a crop view (any row and pixel strides, channel stride 1) on out's device.
    """
    check_view("out", out, (None, None, 3))
    if out.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"out: dtype {out.dtype}, expected torch.float16 or torch.float32")
    if frame.dim() == 3 and frame.shape[2] == 1:
        frame = frame[..., 0, None]  # a lone channel's stride is meaningless (numpy's [..., None] makes it 0)
    check_view("frame", frame, (None, None, None), torch.uint8, out.device)
    h0, w0, c = frame.shape
    if h0 == 0 or w0 == 0:
        raise ValueError(f"frame: empty, shape {tuple(frame.shape)}")
    if c not in (1, 3, 4):
        raise ValueError(f"frame: {c} channels, expected 1 (grey), 3 (BGR/RGB) or 4 (BGRA/RGBA)")
    h, w = out.shape[:2]
    lb = letterbox_params((h0, w0), (h, w)) if params is None else params
    if not (0 <= lb.pad_top <= h - lb.new_h and 0 <= lb.pad_left <= w - lb.new_w and min(lb.new_h, lb.new_w) >= 1):
        raise ValueError(f"params: {lb} does not place the frame inside the {h}×{w} output")
    _letterbox_kernel[(triton.cdiv(h, _LETTERBOX_ROWS), triton.cdiv(3 * w, _LETTERBOX_ELEMENTS))](
        out,
        *out.stride()[:2],
        frame,
        *frame.stride()[:2],
        h,
        w,
        h0,
        w0,
        lb.pad_top,
        lb.pad_left,
        lb.new_h,
        lb.new_w,
        C_IN=c,
        BGR=bgr,
        BLOCK_Y=_LETTERBOX_ROWS,
        BLOCK_E=_LETTERBOX_ELEMENTS,
        enable_fp_fusion=False,
    )
    return lb


@triton.jit
def _run_byte_weights(first_weight, b, lead: tl.constexpr, first_taps, PIXEL_BYTES: tl.constexpr,
                      FIRST_TAPS: tl.constexpr):  # fmt: skip
    """(BLOCK, bytes) weights of the bytes of a run loaded from `lead` bytes before its start: the weight of the
    tap whose pixel the byte is in, 0 outside the run."""
    rel = b - lead
    pixel = tl.maximum(rel, 0) // PIXEL_BYTES
    used = (rel >= 0) & (pixel < first_taps)
    index = tl.broadcast_to(tl.minimum(pixel, FIRST_TAPS - 1)[None, :], (first_weight.shape[0], b.shape[0]))
    return tl.where(used[None, :], tl.gather(first_weight, index, axis=1), 0)


@triton.jit
def _resample_kernel(
    out_ptr,
    so_y,
    so_x,
    src_ptr,
    src_lead,
    ss_y,
    ss_x,
    first_index_ptr,
    first_weight_ptr,
    first_taps,
    second_index_ptr,
    second_weight_ptr,
    rows,
    cols,
    C_SRC: tl.constexpr,
    BGR: tl.constexpr,
    FIRST_IS_X: tl.constexpr,
    WORDS: tl.constexpr,
    PIXEL_BYTES: tl.constexpr,
    BLOCK: tl.constexpr,
    FIRST_TAPS: tl.constexpr,
    SECOND_TAPS: tl.constexpr,
):
    # Element e is output pixel (y, x), x fast: neighbouring lanes read neighbouring source pixels whichever pass
    # comes first. For each of the second pass's taps, the first pass's value at that tap is recomputed from the
    # source and rounded to uint8 exactly as Pillow's intermediate image is; the taps' loop is unrolled so that all
    # its loads are in flight together. An intermediate value is computed about scale + 1 times instead of once,
    # which costs less than a second launch and a round trip through memory, as long as the loads are few:
    # - WORDS > 0 (the first pass runs along rows, its taps consecutive pixels): a tap's source pixels are one run
    #   of bytes, loaded as WORDS aligned 4-byte words (src_lead: how far src_ptr is past a 4-byte boundary) and
    #   split into bytes in registers, each byte weighted by its pixel's tap;
    # - otherwise a (pixel, tap, channel) gather of single bytes.
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = e < rows * cols
    y = e // cols
    x = e % cols
    if FIRST_IS_X:
        o_first, o_second, ss_first, ss_second = x, y, ss_x, ss_y
    else:
        o_first, o_second, ss_first, ss_second = y, x, ss_y, ss_x
    ch = tl.arange(0, 4)  # three channels and a masked lane: tensor dimensions must be powers of two
    c_ok = ch < 3
    if C_SRC == 1:
        src_ch = ch * 0  # grey replicated to RGB
    elif BGR:
        src_ch = 2 - ch
    else:
        src_ch = ch
    t = tl.arange(0, FIRST_TAPS)
    tap_ok = ok[:, None] & (t < first_taps)[None, :]
    tap_at = o_first[:, None] * first_taps + t[None, :]
    first_weight = tl.load(first_weight_ptr + tap_at, mask=tap_ok, other=0)
    if WORDS > 0:
        word_ptr = (src_ptr - src_lead).to(tl.pointer_type(tl.int32))
        run_at = tl.load(first_index_ptr + o_first * first_taps, mask=ok, other=0).to(tl.int64) * PIXEL_BYTES + src_lead
        w = tl.arange(0, WORDS)
        b = tl.arange(0, 4 * WORDS)
        shift = tl.arange(0, 4) * 8
        run_bytes = first_taps * PIXEL_BYTES
        # Byte b of the loaded words is byte b - lead of the run, lead = how far the run starts past a word
        # boundary, which changes from tap to tap with the row: each byte's weight for every lead, once.
        weight_0 = _run_byte_weights(first_weight, b, 0, first_taps, PIXEL_BYTES, FIRST_TAPS)
        weight_1 = _run_byte_weights(first_weight, b, 1, first_taps, PIXEL_BYTES, FIRST_TAPS)
        weight_2 = _run_byte_weights(first_weight, b, 2, first_taps, PIXEL_BYTES, FIRST_TAPS)
        weight_3 = _run_byte_weights(first_weight, b, 3, first_taps, PIXEL_BYTES, FIRST_TAPS)
    else:
        first_at = tl.load(first_index_ptr + tap_at, mask=tap_ok, other=0).to(tl.int64) * ss_first
        pixel_at = first_at[:, :, None] + src_ch[None, None, :]
        pixel_ok = tap_ok[:, :, None] & c_ok[None, None, :]
    acc = tl.zeros((BLOCK, 4), tl.int32) + (1 << 21)  # Pillow's 22-bit fixed point: half a step before the shift
    for k in tl.static_range(SECOND_TAPS):
        line = tl.load(second_index_ptr + o_second * SECOND_TAPS + k, mask=ok, other=0)
        weight = tl.load(second_weight_ptr + o_second * SECOND_TAPS + k, mask=ok, other=0)
        if WORDS > 0:
            at = line.to(tl.int64) * ss_second + run_at  # bytes from the word-aligned base
            lead = (at % 4).to(tl.int32)
            word_ok = ok[:, None] & ((w * 4)[None, :] < (lead + run_bytes)[:, None])  # no word past the run
            word = tl.load(word_ptr + (at // 4)[:, None] + w[None, :], mask=word_ok, other=0)
            byte = tl.reshape((word[:, :, None] >> shift[None, None, :]) & 255, (BLOCK, 4 * WORDS))
            lead_2d = lead[:, None]
            byte_weight = tl.where(lead_2d < 2, tl.where(lead_2d == 0, weight_0, weight_1),
                                   tl.where(lead_2d == 2, weight_2, weight_3))  # fmt: skip
            weighted = byte * byte_weight
            channel = (b[None, :] + 12 - lead_2d) % PIXEL_BYTES  # + 12, a multiple of every pixel size, keeps it >= 0
            first = tl.zeros((BLOCK, 4), tl.int32)
            for c in tl.static_range(3):
                if C_SRC == 1:
                    source = 0
                elif BGR:
                    source = 2 - c
                else:
                    source = c
                total = tl.sum(tl.where(channel == source, weighted, 0), axis=1)
                first = tl.where(ch[None, :] == c, total[:, None], first)
        else:
            line_ptr = src_ptr + line.to(tl.int64) * ss_second
            pixel = tl.load(line_ptr[:, None, None] + pixel_at, mask=pixel_ok, other=0)
            first = tl.sum(pixel.to(tl.int32) * first_weight[:, :, None], axis=1)
        # Integer sums: any order is exact, as in Pillow's own int accumulators.
        first = (first + (1 << 21)) >> 22
        acc += tl.minimum(tl.maximum(first, 0), 255) * weight[:, None]
    value = tl.minimum(tl.maximum(acc >> 22, 0), 255)
    # ToTensor's /255, correctly rounded as torch's division is (Triton's `/` on a GPU is not).
    scaled = tl.math.div_rn(value.to(tl.float32), tl.full(value.shape, 255.0, tl.float32))
    target = out_ptr + (y.to(tl.int64) * so_y + x.to(tl.int64) * so_x)[:, None] + ch[None, :]
    tl.store(target, scaled.to(out_ptr.dtype.element_ty), mask=ok[:, None] & c_ok[None, :])


def _check_taps(name: str, index: torch.Tensor, weights: torch.Tensor, device: torch.device) -> None:
    if index.dtype != torch.int32 or weights.dtype != torch.int32 or index.shape != weights.shape or index.dim() != 2:
        raise ValueError(
            f"{name} index {tuple(index.shape)} {index.dtype}, weights {tuple(weights.shape)} {weights.dtype}: "
            "expected the same (outputs, taps) shape, int32"
        )
    if not (index.is_contiguous() and weights.is_contiguous()) or {index.device, weights.device} != {device}:
        raise ValueError(f"{name} index and weights must be contiguous and on out's device")


def _word_run_words(src: torch.Tensor, first_axis: int, first_taps: int, runs: bool) -> int:
    """How many 4-byte words the word path loads a tap (a power of two), or 0 where it cannot be used: the first
    pass must run along rows over consecutive pixels of at most 4 bytes, the run of a tap's bytes fit in 16 words,
    and the frame's memory extend at least 3 bytes past the view's last byte (a run's last word may reach past its
    last byte)."""
    pixel_bytes = src.stride(1)
    if not runs or first_axis != 1 or not 1 <= pixel_bytes <= 4:
        return 0
    words = triton.next_power_of_2(-(-(3 + first_taps * pixel_bytes) // 4))
    storage = src.untyped_storage()
    last = src.data_ptr() + sum((size - 1) * stride for size, stride in zip(src.shape, src.stride(), strict=True))
    if words > _RESAMPLE_MAX_WORDS or storage.data_ptr() + storage.nbytes() - (last + 1) < 3:
        return 0
    return words


def resample(
    out: torch.Tensor,
    src: torch.Tensor,
    first_axis: int,
    first: tuple[torch.Tensor, torch.Tensor],
    second: tuple[torch.Tensor, torch.Tensor],
    *,
    bgr: bool,
    runs: bool = False,
) -> None:
    """Pillow's two resampling passes of a uint8 (rows, cols, C) view into `out`, in one launch.

    The first pass runs along `first_axis` (0 rows, 1 columns), the second along the other; each is an
    (index, weights) pair of (outputs, taps) int32 tables on the device: output i = sum_t in[index[i, t]] *
    weights[i, t] in 22-bit fixed point, rounded and clipped to uint8 as Pillow does, the first pass's result too.
    An axis that is not resized takes the identity (one tap, weight 2^22). `runs`: the first pass's taps are
    consecutive pixels, index[i, t] = index[i, 0] + t wherever weights[i, t] != 0 (Pillow's are), which lets the
    kernel load a tap's pixels as whole words when the view allows it. `out` is an (rows', cols', 3) fp16/fp32
    view (one NHWC batch slot) and receives RGB / 255: grey replicated, BGR flipped when `bgr`, a fourth (alpha)
    channel never read. Both views need channel stride 1.
    """
    if src.dim() == 3 and src.shape[2] == 1:
        src = src[..., 0, None]  # a lone channel's stride is meaningless (numpy's [..., None] makes it 0)
    check_view("src", src, (None, None, None), torch.uint8, out.device)
    if src.shape[2] not in (1, 3, 4):
        raise ValueError(f"src: {src.shape[2]} channels, expected 1, 3 or 4")
    check_view("out", out, (None, None, 3))
    if out.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"out: dtype {out.dtype}, expected torch.float16 or torch.float32")
    if first_axis not in (0, 1):
        raise ValueError(f"first_axis {first_axis}: expected 0 (rows) or 1 (columns)")
    _check_taps("first", *first, out.device)
    _check_taps("second", *second, out.device)
    second_axis = 1 - first_axis
    if out.shape[first_axis] != first[0].shape[0] or out.shape[second_axis] != second[0].shape[0]:
        raise ValueError(f"out {tuple(out.shape)}: expected {first[0].shape[0]} along axis {first_axis} and "
                         f"{second[0].shape[0]} along axis {second_axis}")  # fmt: skip
    rows, cols = out.shape[0], out.shape[1]
    if rows * cols == 0:
        return
    first_taps = triton.next_power_of_2(first[0].shape[1])
    words = _word_run_words(src, first_axis, first[0].shape[1], runs)
    block = max(1, min(_RESAMPLE_MAX_PIXELS, _RESAMPLE_ELEMENTS // (4 * (words or first_taps))))
    _resample_kernel[(triton.cdiv(rows * cols, block),)](
        out,
        out.stride(0),
        out.stride(1),
        src,
        src.data_ptr() % 4,
        src.stride(0),
        src.stride(1),
        first[0],
        first[1],
        first[0].shape[1],
        second[0],
        second[1],
        rows,
        cols,
        C_SRC=1 if src.shape[2] == 1 else 3,
        BGR=bool(bgr),
        FIRST_IS_X=first_axis == 1,
        WORDS=words,
        PIXEL_BYTES=src.stride(1) if words else 1,
        BLOCK=block,
        FIRST_TAPS=first_taps,
        SECOND_TAPS=second[0].shape[1],
    )
