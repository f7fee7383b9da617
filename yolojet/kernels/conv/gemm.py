"""The implicit-GEMM kernel `_conv2d_nhwc_kernel`, which gathers its operands with pointer loads: 1x1 convs (optionally
reading a second input as the channels after x's), packed taps, K over (tap, channel) flattened (for a few input
channels, also with each tap's channels loaded as one 8-byte word; for a power of two of them, known as a constant,
also with a kernel row's neighbouring pixels loaded as one run),
and k x k convs walking (tap, channel block); its K steps can be split across programs. `_divisible`, `_word_half`,
`_split_range` and `_taps_inside` are helpers only it calls.
"""

import triton
import triton.language as tl

from yolojet.kernels.conv.config import _MOST_BIT_TAPS, _MOST_ROW_PIXELS
from yolojet.kernels.conv.epilogue import _grouped_tile, _matrix_tile_epilogue, _output_pixels
from yolojet.kernels.pdl import wait_for_previous_kernel


@triton.jit
def _word_half(words, half: tl.constexpr, C_IN: tl.constexpr):
    """fp16 channel `half` of 8-byte pixel words, zero past C_IN: the word's spare halves are row padding, and garbage
    times a zero weight can still be NaN."""
    if half < C_IN:
        return ((words >> (16 * half)) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    return tl.zeros(words.shape, tl.float16)


@triton.jit
def _split_range(steps, split, SPLIT_K: tl.constexpr):
    """The K steps [first, end) that split `split` of SPLIT_K walks."""
    if SPLIT_K == 1:
        return 0, steps
    per_split = tl.cdiv(steps, SPLIT_K)
    first = split * per_split
    return first, tl.minimum(first + per_split, steps)


@triton.jit
def _divisible(value, BY: tl.constexpr):
    """`value`, which the launcher found divisible by BY, in a form that tells the compiler so: Triton's JIT marks
    integer arguments divisible by 16 and no less, so an 8-channel fp16 map's 16-byte pixels would otherwise be
    loaded and stored as 2-byte halves. (tl.multiple_of marks only a tensor an operation made, not an argument.)"""
    if BY > 1 and BY < 16:
        return (value // BY) * BY
    return value


# The most taps whose bounds `_taps_inside` holds as bits (config's _MOST_BIT_TAPS, as jitted code reads it), and the
# widest tap row, whose pixels' bounds are bits of an int32 (config's _MOST_ROW_PIXELS).
_TAP_BITS = tl.constexpr(_MOST_BIT_TAPS)
_ROW_PIXELS = tl.constexpr(_MOST_ROW_PIXELS)


@triton.jit
def _taps_inside(m_mask, iy0, ix0, H_up, W_up, dil_y, dil_x, KH: tl.constexpr, KW: tl.constexpr):
    """Bit ky·KW + kx of each GEMM row: whether tap (ky, kx) of its output pixel reads inside the (upsampled) input,
    and the row is one of the output's (int64 bits past 31 taps; at most 63, `_TAP_BITS`)."""
    bits = tl.zeros_like(iy0).to(tl.int64 if KH * KW > 31 else tl.int32)
    for ky in tl.static_range(KH):
        iy = iy0 + ky * dil_y
        row = m_mask & (iy >= 0) & (iy < H_up)
        for kx in tl.static_range(KW):
            ix = ix0 + kx * dil_x
            ok = row & (ix >= 0) & (ix < W_up)
            bits = bits | (ok.to(bits.dtype) << (ky * KW + kx))
    return bits


@triton.jit
def _conv2d_nhwc_kernel(
    out_ptr,
    stride_on,
    stride_oh,
    stride_ow,
    out_desc,
    x_ptr,
    stride_xn,
    stride_xh,
    stride_xw,
    second_ptr,
    stride_sn,
    stride_sh,
    stride_sw,
    w_ptr,
    bias_ptr,
    res_ptr,
    stride_rn,
    stride_rh,
    stride_rw,
    partial_ptr,
    arrivals_ptr,
    H,
    W,
    C_in,
    C_second,
    OH,
    OW,
    C_out,
    M,
    conv_stride_y,
    conv_stride_x,
    pad_y,
    pad_x,
    dil_y,
    dil_x,
    KH: tl.constexpr,
    KW: tl.constexpr,
    UPSAMPLE: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    PACK_TAPS: tl.constexpr,
    TAP_CHANNELS: tl.constexpr,
    TAP_ROWS: tl.constexpr,
    WHOLE_PIXELS: tl.constexpr,
    TWO_INPUTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    TMA_STORE: tl.constexpr,
    X_ALIGN: tl.constexpr,
    OUT_ALIGN: tl.constexpr,
    PDL: tl.constexpr,
):
    """out[n, oy, ox, co] = act(bias[co] + Σ_{ky,kx,ci} xu[n, iy, ix, ci] · w[co, ky, kx, ci]) (+ res[n, oy, ox, co])

    with iy = oy·sy − py + ky·dy, ix = ox·sx − px + kx·dx, xu the nearest-neighbour upsample of x by UPSAMPLE
    (xu[n, iy, ix] = x[n, iy // UPSAMPLE, ix // UPSAMPLE]) and zero outside [0, H·UPSAMPLE) × [0, W·UPSAMPLE).
    Accumulation is fp32; the residual is added after the activation.

    With SPLIT_K > 1 the K steps of each output tile are shared by SPLIT_K programs (program_id(1)); each stores
    its fp32 partial tile in partial_ptr and counts itself in arrivals_ptr[tile], and the last to arrive sums
    the partials in split order (so results do not depend on arrival order), applies the epilogue, and resets
    the count to 0 for the next launch.

    TWO_INPUTS (1x1, stride 1, no padding): the input is the channel concat of xu (C_in channels) and `second`
    (C_second channels, never upsampled), as in a neck's Concat([Upsample(x), skip]) feeding a 1x1 conv; the
    weight rows hold C_in + C_second columns, and K walks x's blocks, then second's.

    TMA_STORE (unsplit K): the output tile is stored through out_desc, the output as an (M, C_out) matrix, by the
    tensor memory accelerator, which clips it at the matrix's edges.

    PACK_TAPS runs K over (ky, kx, ci) flattened, in K tiles of BLOCK_K; with TAP_CHANNELS (C_in, a power of two, no
    upsample, at most _TAP_BITS taps) known as a constant, each tap's channels are one contiguous run of a K tile
    (BLOCK_K // TAP_CHANNELS whole taps a tile, or a tap over several where BLOCK_K is the smaller).
    With TAP_ROWS too (x's pixel stride TAP_CHANNELS, no dilation across a row), K runs over kernel rows instead:
    a step loads BLOCK_K // TAP_CHANNELS neighbouring pixels from a row's first tap, those past KW masked.
    With WHOLE_PIXELS too (fp16 input of at most 4 channels, TAP_CHANNELS of them, whose pixels are 8-byte words), K
    runs over (tap, the word's 4 halves): each tap's channels arrive as one 8-byte load and BLOCK_K = 4 · (taps
    rounded up to a power of two).

    X_ALIGN divides x's (and second's) strides and channel counts, OUT_ALIGN out's and the residual's strides and
    C_out (`_divisible`).
    """
    stride_xn, stride_xh, stride_xw = (_divisible(stride_xn, X_ALIGN), _divisible(stride_xh, X_ALIGN),
                                       _divisible(stride_xw, X_ALIGN))  # fmt: skip
    stride_sn, stride_sh, stride_sw = (_divisible(stride_sn, X_ALIGN), _divisible(stride_sh, X_ALIGN),
                                       _divisible(stride_sw, X_ALIGN))  # fmt: skip
    C_in = _divisible(C_in, X_ALIGN)
    C_second = _divisible(C_second, X_ALIGN)
    stride_on, stride_oh, stride_ow = (_divisible(stride_on, OUT_ALIGN), _divisible(stride_oh, OUT_ALIGN),
                                       _divisible(stride_ow, OUT_ALIGN))  # fmt: skip
    stride_rn, stride_rh, stride_rw = (_divisible(stride_rn, OUT_ALIGN), _divisible(stride_rh, OUT_ALIGN),
                                       _divisible(stride_rw, OUT_ALIGN))  # fmt: skip
    C_out = _divisible(C_out, OUT_ALIGN)
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(C_out, BLOCK_N)
    pid_m, pid_n = _grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < C_out

    # Spatial decomposition happens once per tile, outside the K loop; batch offsets go through int64 because
    # N·H·W·C overflows int32 at large batch.
    img, oy, ox, iy0, ix0 = _output_pixels(offs_m, OH, OW, conv_stride_y, conv_stride_x, pad_y, pad_x)
    x_img = x_ptr + img * stride_xn
    H_up = H * UPSAMPLE
    W_up = W * UPSAMPLE
    if TWO_INPUTS:
        w_rows = w_ptr + offs_n * (C_in + C_second)
    else:
        w_rows = w_ptr + offs_n * (KH * KW * C_in)

    wait_for_previous_kernel(PDL)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # input_precision="ieee" keeps fp32 mode exact (no TF32); Triton ignores it for fp16 operands.
    if KH * KW == 1:
        # A 1x1 conv is a plain GEMM: each output pixel reads one fixed input pixel, so the row pointers and
        # bounds mask are loop invariants and the loop only walks channels.
        row_ok = m_mask & (iy0 >= 0) & (iy0 < H_up) & (ix0 >= 0) & (ix0 < W_up)
        x_rows = x_img + (iy0 // UPSAMPLE).to(tl.int64) * stride_xh + (ix0 // UPSAMPLE).to(tl.int64) * stride_xw
        x_blocks = tl.cdiv(C_in, BLOCK_K)
        if TWO_INPUTS:
            first, end = _split_range(x_blocks + tl.cdiv(C_second, BLOCK_K), split, SPLIT_K)
        else:
            first, end = _split_range(x_blocks, split, SPLIT_K)
        a_ptrs = x_rows[:, None] + (first * BLOCK_K + offs_k)[None, :]
        b_ptrs = w_rows[None, :] + (first * BLOCK_K + offs_k)[:, None]
        for kb in range(first, tl.minimum(end, x_blocks)):
            k_mask = offs_k < C_in - kb * BLOCK_K
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_mask[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision="ieee")
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
        if TWO_INPUTS:
            # Blocks x_blocks... of this split's range are second's channels 0...; its weight columns follow x's.
            first_second = tl.maximum(first, x_blocks) - x_blocks
            second_rows = second_ptr + img * stride_sn + oy.to(tl.int64) * stride_sh + ox.to(tl.int64) * stride_sw
            a_ptrs = second_rows[:, None] + (first_second * BLOCK_K + offs_k)[None, :]
            b_ptrs = w_rows[None, :] + C_in + (first_second * BLOCK_K + offs_k)[:, None]
            for kb in range(first_second, end - x_blocks):
                k_mask = offs_k < C_second - kb * BLOCK_K
                a = tl.load(a_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
                b = tl.load(b_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
                acc = tl.dot(a, b, acc, input_precision="ieee")
                a_ptrs += BLOCK_K
                b_ptrs += BLOCK_K
    elif PACK_TAPS and WHOLE_PIXELS:
        # The stem: 9 taps of 3 channels. One 8-byte word per (pixel, tap) replaces the 27 two-byte gathers of
        # the branch below; the word's halves are taken apart in registers and interleaved into K = (tap, half).
        TAPS: tl.constexpr = BLOCK_K // 4
        taps = tl.arange(0, TAPS)
        ky = taps // KW
        kx = taps - ky * KW
        x_words = x_ptr.to(tl.pointer_type(tl.int64))
        if UPSAMPLE == 1 and KH * KW <= _TAP_BITS:
            # As the k x k loop does: each row's first word and its taps' bits once, then a tap is a fixed word offset
            # and a bit (each (row, tap) pair worked out its pixel, four bounds and two 64-bit multiply-adds).
            tap_ok = taps < KH * KW
            inside = _taps_inside(m_mask, iy0, ix0, H_up, W_up, dil_y, dil_x, KH, KW)
            ok = (((inside[:, None] >> tl.where(tap_ok, taps, 0)[None, :]) & 1) != 0) & tap_ok[None, :]
            first = (img * stride_xn + iy0.to(tl.int64) * stride_xh + ix0.to(tl.int64) * stride_xw) // 4
            tap_words = ((ky * dil_y).to(tl.int64) * stride_xh + (kx * dil_x).to(tl.int64) * stride_xw) // 4
            words = tl.load(x_words + first[:, None] + tap_words[None, :], mask=ok, other=0)
        else:
            iy = iy0[:, None] + (ky * dil_y)[None, :]
            ix = ix0[:, None] + (kx * dil_x)[None, :]
            ok = m_mask[:, None] & (taps < KH * KW)[None, :] & (iy >= 0) & (iy < H_up) & (ix >= 0) & (ix < W_up)
            pixel = (iy // UPSAMPLE).to(tl.int64) * stride_xh + (ix // UPSAMPLE).to(tl.int64) * stride_xw
            words = tl.load(x_words + (img * stride_xn)[:, None] // 4 + pixel // 4, mask=ok, other=0)
        # The channel count is a constant here (TAP_CHANNELS), so a spare half is a zero and a used one needs no select.
        h0 = _word_half(words, 0, TAP_CHANNELS)
        h1 = _word_half(words, 1, TAP_CHANNELS)
        h2 = _word_half(words, 2, TAP_CHANNELS)
        h3 = _word_half(words, 3, TAP_CHANNELS)
        # join(join(h0, h2), join(h1, h3))[m, t, i, j] is half 2i + j of tap t: K index t·4 + half after the reshape.
        a = tl.reshape(tl.join(tl.join(h0, h2), tl.join(h1, h3)), (BLOCK_M, BLOCK_K))
        k = tl.arange(0, BLOCK_K)
        tap = k // 4
        ci = k % 4
        k_ok = (tap < KH * KW) & (ci < TAP_CHANNELS)
        b = tl.load(w_rows[None, :] + (tap * TAP_CHANNELS + ci)[:, None], mask=k_ok[:, None] & n_mask[None, :],
                    other=0.0)  # fmt: skip
        acc = tl.dot(a, b, acc, input_precision="ieee")
    elif PACK_TAPS and TAP_ROWS:
        # A kernel row's taps read neighbouring pixels, which in a map whose pixel stride is its channel count are one
        # contiguous run: K steps over kernel rows, each row of the tile loading SPAN pixels' channels from its row's
        # first tap (SPAN = BLOCK_K // TAP_CHANNELS, the power of two at or above KW). The pixels past KW have no
        # weight and are never loaded. A step then costs about what a GEMM tile's step over one tap does: one
        # address a row, one bounds test an input row, one predicate a channel vector.
        SPAN: tl.constexpr = BLOCK_K // TAP_CHANNELS
        rows_fit: tl.constexpr = UPSAMPLE == 1 and KW <= SPAN and SPAN <= _ROW_PIXELS
        tl.static_assert(rows_fit, "tap rows: no upsample; KW <= span <= 32")
        x_first = x_img + iy0.to(tl.int64) * stride_xh + ix0.to(tl.int64) * TAP_CHANNELS  # the pixel stride
        # Which of a row's KW pixels lie inside the input is the same for every kernel row: worked out once, a bit a
        # pixel, then each step only adds whether its input row is inside.
        columns = tl.zeros_like(ix0)
        for kx in tl.static_range(KW):
            columns = columns | (((ix0 + kx >= 0) & (ix0 + kx < W_up)).to(tl.int32) << kx)
        pixel = offs_k // TAP_CHANNELS
        column_ok = (((columns[:, None] >> pixel[None, :]) & 1) != 0) & (m_mask[:, None] & (pixel < KW)[None, :])
        for ky in range(KH):
            iy = iy0 + ky * dil_y
            ok = column_ok & ((iy >= 0) & (iy < H_up))[:, None]
            a = tl.load(x_first[:, None] + ((ky * dil_y).to(tl.int64) * stride_xh + offs_k)[None, :], mask=ok,
                        other=0.0)  # fmt: skip
            b = tl.load(w_rows[None, :] + (ky * KW * TAP_CHANNELS + offs_k)[:, None],
                        mask=(pixel < KW)[:, None] & n_mask[None, :], other=0.0)  # fmt: skip
            acc = tl.dot(a, b, acc, input_precision="ieee")
    elif PACK_TAPS and TAP_CHANNELS > 0:
        # A power of two of input channels (model.1's 16; the few-channel convs' packed tiles): K runs over (tap, ci)
        # as the weight is packed, BLOCK_K // TAP_CHANNELS taps a K step, where the GEMM tiles pay a step's waits and
        # bookkeeping for each tap's channels. The channel count a constant, each tap's channels are one contiguous
        # run the compiler loads as whole vectors; rows start at their first tap's address and test a tap's bit, as
        # the GEMM tiles' loop does.
        tl.static_assert(UPSAMPLE == 1 and KH * KW <= _TAP_BITS, "constant tap channels need no upsample, <= 63 taps")
        x_first = x_img + iy0.to(tl.int64) * stride_xh + ix0.to(tl.int64) * stride_xw
        inside = _taps_inside(m_mask, iy0, ix0, H_up, W_up, dil_y, dil_x, KH, KW)
        w_taps = w_ptr + offs_n * (KH * KW * TAP_CHANNELS)
        for k0 in range(0, KH * KW * TAP_CHANNELS, BLOCK_K):
            k = k0 + offs_k
            tap = k // TAP_CHANNELS
            tap_ok = tap < KH * KW
            ky = tap // KW
            kx = tap % KW
            ok = (((inside[:, None] >> tl.where(tap_ok, tap, 0)[None, :]) & 1) != 0) & tap_ok[None, :]
            offset = (ky * dil_y).to(tl.int64) * stride_xh + (kx * dil_x).to(tl.int64) * stride_xw + k % TAP_CHANNELS
            a = tl.load(x_first[:, None] + offset[None, :], mask=ok, other=0.0)
            b = tl.load(w_taps[None, :] + k[:, None], mask=tap_ok[:, None] & n_mask[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision="ieee")
    elif PACK_TAPS:
        # A handful of input channels feeding many outputs (the stem of the wider models): one tap's channels
        # would fill a sliver of a K tile, so K runs over (ky, kx, ci) flattened, as the weight is packed, and
        # each column gathers its own tap. The stem's 27-deep K is then one 32-deep tile, not nine 16-deep ones.
        k_total = KH * KW * C_in
        for k0 in range(0, k_total, BLOCK_K):
            k = k0 + offs_k
            k_ok = k < k_total
            tap = k // C_in
            ci = k - tap * C_in
            ky = tap // KW
            kx = tap - ky * KW
            iy = iy0[:, None] + (ky * dil_y)[None, :]
            ix = ix0[:, None] + (kx * dil_x)[None, :]
            ok = m_mask[:, None] & k_ok[None, :] & (iy >= 0) & (iy < H_up) & (ix >= 0) & (ix < W_up)
            pixel = (iy // UPSAMPLE).to(tl.int64) * stride_xh + (ix // UPSAMPLE).to(tl.int64) * stride_xw
            a = tl.load(x_img[:, None] + pixel + ci[None, :], mask=ok, other=0.0)
            b = tl.load(w_rows[None, :] + k[:, None], mask=k_ok[:, None] & n_mask[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        # Taps and channel blocks share one flat loop so the compiler can software-pipeline all of K, not just
        # the channel blocks of one tap (the stem has a single channel block per tap).
        k_blocks = tl.cdiv(C_in, BLOCK_K)
        first, end = _split_range(KH * KW * k_blocks, split, SPLIT_K)
        # Without an upsample a tap's input pixel is the first tap's moved by a fixed offset: each row's address is
        # worked out once, and a tap adds one scalar (a row's 64-bit multiply-adds a tap were most of the loop).
        x_first = x_img + iy0.to(tl.int64) * stride_xh + ix0.to(tl.int64) * stride_xw
        # Which taps of each row lie inside the input, a bit a tap, worked out once rather than four compares a tap.
        if KH * KW <= _TAP_BITS:
            inside = _taps_inside(m_mask, iy0, ix0, H_up, W_up, dil_y, dil_x, KH, KW)
        for it in range(first, end):
            tap = it // k_blocks
            k0 = (it - tap * k_blocks) * BLOCK_K
            ky = tap // KW
            kx = tap % KW
            iy = iy0 + ky * dil_y
            ix = ix0 + kx * dil_x
            if KH * KW <= _TAP_BITS:
                row_ok = ((inside >> tap) & 1) != 0
            else:
                row_ok = m_mask & (iy >= 0) & (iy < H_up) & (ix >= 0) & (ix < W_up)
            if UPSAMPLE == 1:
                x_rows = x_first + ((ky * dil_y).to(tl.int64) * stride_xh + (kx * dil_x).to(tl.int64) * stride_xw)
            else:
                x_rows = x_img + (iy // UPSAMPLE).to(tl.int64) * stride_xh + (ix // UPSAMPLE).to(tl.int64) * stride_xw
            k_mask = offs_k < C_in - k0
            a = tl.load(
                x_rows[:, None] + (k0 + offs_k)[None, :],
                mask=row_ok[:, None] & k_mask[None, :],
                other=0.0,
            )
            b = tl.load(
                w_rows[None, :] + (tap * C_in + k0 + offs_k)[:, None],
                mask=k_mask[:, None] & n_mask[None, :],
                other=0.0,
            )
            acc = tl.dot(a, b, acc, input_precision="ieee")

    mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K > 1:
        tile_elements = BLOCK_M * BLOCK_N
        in_tile = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tiles = tl.num_programs(0)
        tl.store(partial_ptr + (split * tiles + pid).to(tl.int64) * tile_elements + in_tile, acc)
        # Every thread's partial is written before one thread's release makes the arrival visible.
        tl.debug_barrier()
        arrived = tl.atomic_add(arrivals_ptr + pid, 1, sem="acq_rel")
        last = arrived == SPLIT_K - 1
        if last:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT_K):
                # .cg reads from L2: L1 is not coherent with the other SMs' writes.
                acc += tl.load(partial_ptr + (s * tiles + pid).to(tl.int64) * tile_elements + in_tile,
                               cache_modifier=".cg")  # fmt: skip
            tl.atomic_xchg(arrivals_ptr + pid, 0)
        mask = mask & last  # only the last program of a tile runs the epilogue's stores

    _matrix_tile_epilogue(acc, mask, offs_n, n_mask, img, oy, ox, bias_ptr, res_ptr, stride_rn, stride_rh, stride_rw,
                          out_ptr, stride_on, stride_oh, stride_ow, out_desc, pid_m * BLOCK_M, pid_n * BLOCK_N,
                          ACTIVATION, HAS_RESIDUAL, TMA_STORE)  # fmt: skip
