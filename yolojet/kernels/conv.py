"""NHWC convolution as an implicit GEMM on tensor cores, with bias, activation and residual fused.

The GEMM view: M = N·OH·OW output pixels, N_gemm = C_out, K = kh·kw·C_in ordered (ky, kx, ci) so that one
tap's K slice is a contiguous channel run in both the activation and the packed weight. Activations may be
channel slices of wider NHWC buffers (arbitrary N/H/W strides, unit channel stride), which is how concat and
split cost nothing in the engine.
"""

import functools
import hashlib
from dataclasses import dataclass, fields, replace

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from yolojet.kernels.activations import ACTIVATIONS, apply_activation
from yolojet.kernels.launch import launcher
from yolojet.kernels.pdl import launch_options, wait_for_previous_kernel
from yolojet.options import interpreting

# Launching programs in groups of GROUP_M M-tiles keeps the input rows a group shares resident in L2 while
# the group sweeps all C_out tiles.
_GROUP_M = 8
# About one wave on an H200 (132 SMs): on measured YOLO layers the biggest tile launching at least this many
# programs was the fastest or within 10% of it.
_TARGET_PROGRAMS = 100


@triton.jit
def _output_pixels(offs_m, OH, OW, conv_stride_y, conv_stride_x, pad_y, pad_x):
    """(image, output row, output column, first input row, first input column) of GEMM rows `offs_m`. The image
    index is int64: batch offsets overflow int32 at large batch."""
    img = (offs_m // (OH * OW)).to(tl.int64)
    pix = offs_m % (OH * OW)
    oy = pix // OW
    ox = pix % OW
    return img, oy, ox, oy * conv_stride_y - pad_y, ox * conv_stride_x - pad_x


@triton.jit
def _word_half(words, half: tl.constexpr, C_in):
    """fp16 channel `half` of 8-byte pixel words, zero past C_in: the word's spare halves are row padding that is
    never written, and garbage times a zero weight can still be NaN."""
    value = ((words >> (16 * half)) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    return tl.where(half < C_in, value, 0.0).to(tl.float16)


@triton.jit
def _split_range(steps, split, SPLIT_K: tl.constexpr):
    """The K steps [first, end) that split `split` of SPLIT_K walks."""
    if SPLIT_K == 1:
        return 0, steps
    per_split = tl.cdiv(steps, SPLIT_K)
    first = split * per_split
    return first, tl.minimum(first + per_split, steps)


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
    WHOLE_PIXELS: tl.constexpr,
    TWO_INPUTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    TMA_STORE: tl.constexpr,
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

    PACK_TAPS runs K over (ky, kx, ci) flattened, every tap in one K tile. With WHOLE_PIXELS too (fp16 input of
    at most 4 channels whose pixels are 8-byte words), K runs over (tap, the word's 4 halves): each tap's
    channels arrive as one 8-byte load and BLOCK_K = 4 · (taps rounded up to a power of two).
    """
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
        iy = iy0[:, None] + (ky * dil_y)[None, :]
        ix = ix0[:, None] + (kx * dil_x)[None, :]
        ok = m_mask[:, None] & (taps < KH * KW)[None, :] & (iy >= 0) & (iy < H_up) & (ix >= 0) & (ix < W_up)
        pixel = (iy // UPSAMPLE).to(tl.int64) * stride_xh + (ix // UPSAMPLE).to(tl.int64) * stride_xw
        words = tl.load(x_ptr.to(tl.pointer_type(tl.int64)) + (img * stride_xn)[:, None] // 4 + pixel // 4, mask=ok,
                        other=0)  # fmt: skip
        h0 = _word_half(words, 0, C_in)
        h1 = _word_half(words, 1, C_in)
        h2 = _word_half(words, 2, C_in)
        h3 = _word_half(words, 3, C_in)
        # join(join(h0, h2), join(h1, h3))[m, t, i, j] is half 2i + j of tap t: K index t·4 + half after the reshape.
        a = tl.reshape(tl.join(tl.join(h0, h2), tl.join(h1, h3)), (BLOCK_M, BLOCK_K))
        k = tl.arange(0, BLOCK_K)
        tap = k // 4
        ci = k % 4
        k_ok = (tap < KH * KW) & (ci < C_in)
        b = tl.load(w_rows[None, :] + (tap * C_in + ci)[:, None], mask=k_ok[:, None] & n_mask[None, :], other=0.0)
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
        for it in range(first, end):
            tap = it // k_blocks
            k0 = (it - tap * k_blocks) * BLOCK_K
            ky = tap // KW
            kx = tap % KW
            iy = iy0 + ky * dil_y
            ix = ix0 + kx * dil_x
            row_ok = m_mask & (iy >= 0) & (iy < H_up) & (ix >= 0) & (ix < W_up)
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


@triton.jit
def _epilogue_values(acc, mask, offs_n, n_mask, img, oy, ox, bias_ptr, res_ptr, stride_rn, stride_rh, stride_rw,
                     ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr):  # fmt: skip
    """bias, activation, then the residual: the values every conv kernel here ends by storing."""
    bias = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0)
    acc = apply_activation(acc + bias[None, :], ACTIVATION)
    if HAS_RESIDUAL:
        res_rows = res_ptr + img * stride_rn + oy.to(tl.int64) * stride_rh + ox.to(tl.int64) * stride_rw
        acc += tl.load(res_rows[:, None] + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    return acc


@triton.jit
def _epilogue(acc, mask, offs_n, n_mask, img, oy, ox, bias_ptr, res_ptr, stride_rn, stride_rh, stride_rw, out_ptr,
              stride_on, stride_oh, stride_ow, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr):  # fmt: skip
    """The epilogue's values stored in out's dtype, each thread writing its own accumulator elements."""
    acc = _epilogue_values(acc, mask, offs_n, n_mask, img, oy, ox, bias_ptr, res_ptr, stride_rn, stride_rh, stride_rw,
                           ACTIVATION, HAS_RESIDUAL)  # fmt: skip
    out_rows = out_ptr + img * stride_on + oy.to(tl.int64) * stride_oh + ox.to(tl.int64) * stride_ow
    tl.store(out_rows[:, None] + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _matrix_tile_epilogue(acc, mask, offs_n, n_mask, img, oy, ox, bias_ptr, res_ptr, stride_rn, stride_rh, stride_rw,
                          out_ptr, stride_on, stride_oh, stride_ow, out_desc, row0, col0, ACTIVATION: tl.constexpr,
                          HAS_RESIDUAL: tl.constexpr, TMA_STORE: tl.constexpr):  # fmt: skip
    """The epilogue of a tile that is the block at (row0, col0) of the (M, C_out) output matrix: stored by its
    threads, or with TMA_STORE through shared memory as one bulk copy (out_desc), clipped at the matrix's edges."""
    if TMA_STORE:
        acc = _epilogue_values(acc, mask, offs_n, n_mask, img, oy, ox, bias_ptr, res_ptr, stride_rn, stride_rh,
                               stride_rw, ACTIVATION, HAS_RESIDUAL)  # fmt: skip
        out_desc.store([row0, col0], acc.to(out_ptr.dtype.element_ty))
    else:
        _epilogue(acc, mask, offs_n, n_mask, img, oy, ox, bias_ptr, res_ptr, stride_rn, stride_rh, stride_rw, out_ptr,
                  stride_on, stride_oh, stride_ow, ACTIVATION, HAS_RESIDUAL)  # fmt: skip


@triton.jit
def _conv1x1_tma_kernel(
    out_ptr,
    stride_on,
    stride_oh,
    stride_ow,
    out_desc,
    x_desc,
    w_desc,
    bias_ptr,
    res_ptr,
    stride_rn,
    stride_rh,
    stride_rw,
    OH,
    OW,
    C_in,
    C_out,
    M,
    programs,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    TMA_STORE: tl.constexpr,
    PDL: tl.constexpr,
):
    """A 1x1 conv (stride 1, no padding) as a plain GEMM whose operands the tensor memory accelerator loads: the
    input's pixels are the rows of an (M, C_in) matrix (x_desc), the weight an (C_out, C_in) one (w_desc), and
    reads past either edge are zero. No thread computes a load address, which at large batch is what bounds the
    gathering kernel's 1x1 layers. `programs` programs walk the output tiles that far apart: one tile each when
    launched one per tile, or a fixed grid whose tile and K loops flatten into one pipelined loop. TMA_STORE: the
    output tile leaves the same way, through out_desc (the output as an (M, C_out) matrix).
    """
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(C_out, BLOCK_N)
    k_steps = tl.cdiv(C_in, BLOCK_K)
    wait_for_previous_kernel(PDL)
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, programs, flatten=True):
        pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(k_steps):
            a = x_desc.load([pid_m * BLOCK_M, kb * BLOCK_K])
            b = w_desc.load([pid_n * BLOCK_N, kb * BLOCK_K])
            acc = tl.dot(a, b.T, acc, input_precision="ieee")
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        img, oy, ox, _, _ = _output_pixels(offs_m, OH, OW, 1, 1, 0, 0)
        n_ok = offs_n < C_out
        _matrix_tile_epilogue(acc, (offs_m < M)[:, None] & n_ok[None, :], offs_n, n_ok, img, oy, ox, bias_ptr, res_ptr,
                              stride_rn, stride_rh, stride_rw, out_ptr, stride_on, stride_oh, stride_ow, out_desc,
                              pid_m * BLOCK_M, pid_n * BLOCK_N, ACTIVATION, HAS_RESIDUAL, TMA_STORE)  # fmt: skip


@triton.jit
def _conv_tma_kernel(
    out_ptr,
    stride_on,
    stride_oh,
    stride_ow,
    out_desc,
    x_desc,
    stride_xw,
    w_desc,
    bias_ptr,
    res_ptr,
    stride_rn,
    stride_rh,
    stride_rw,
    OH,
    OW,
    C_in,
    C_out,
    pad_y,
    pad_x,
    dil_y,
    dil_x,
    KH: tl.constexpr,
    KW: tl.constexpr,
    STRIDE: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    TILE_H: tl.constexpr,
    TILE_W: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    TMA_STORE: tl.constexpr,
    PDL: tl.constexpr,
):
    """A k x k conv whose operands the tensor memory accelerator loads: a program's output pixels are a
    TILE_H x TILE_W patch of one image, so each tap's input is the same patch shifted by the tap, one box of the
    (N, H, W, C_in) input (x_desc) that TMA fills with zeros where it leaves the image: the padding costs
    nothing and no thread computes a gather address. The weight is an (C_out, KH, KW, C_in) box per tap
    (w_desc). K walks (tap, channel block) in one loop, so the pipeline crosses taps.

    STRIDE 2 reads every other pixel, which a box cannot. The input (even H and W) is instead described as
    (N, H/2, 2, W/2, pixel stride + C_in): input row 2a + p is (a, p), and pixel 2b + q's channel c is (b, q·pixel
    stride + c), so a tap's pixels 2·(oy, ox) + r are the box at (oy + r // 2, r % 2) in each direction, one row
    and pixel apart like a stride-1 patch. A channel block never crosses from pixel 2b into 2b + 1 because C_in is a
    multiple of BLOCK_K, and a tap reaching above or left of the image lands at a negative a or b, zero-filled.

    TMA_STORE: the output patch leaves as one box of the (N, OH, OW, C_out) output (out_desc), clipped at its edges."""
    BLOCK_M: tl.constexpr = TILE_H * TILE_W
    tiles_x = tl.cdiv(OW, TILE_W)
    tiles_per_image = tl.cdiv(OH, TILE_H) * tiles_x
    num_pid_m = tl.num_programs(0) // tl.cdiv(C_out, BLOCK_N)
    pid_m, pid_n = _grouped_tile(tl.program_id(0), num_pid_m, tl.cdiv(C_out, BLOCK_N), GROUP_M)
    img = pid_m // tiles_per_image
    oy0 = (pid_m % tiles_per_image) // tiles_x * TILE_H
    ox0 = (pid_m % tiles_per_image) % tiles_x * TILE_W
    k_chunks = tl.cdiv(C_in, BLOCK_K)
    wait_for_previous_kernel(PDL)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(KH * KW * k_chunks):
        tap = step // k_chunks
        c0 = (step % k_chunks) * BLOCK_K
        ky = tap // KW
        kx = tap % KW
        if STRIDE == 1:
            a = x_desc.load([img, oy0 + ky * dil_y - pad_y, ox0 + kx * dil_x - pad_x, c0])
        else:
            # The tap's offsets r = k·d − pad shifted by an even 2·pad, so that // and % floor at negative r too.
            ry = ky * dil_y + pad_y
            rx = kx * dil_x + pad_x
            a = x_desc.load([img, oy0 + ry // 2 - pad_y, ry % 2, ox0 + rx // 2 - pad_x, (rx % 2) * stride_xw + c0])
        a = a.reshape(BLOCK_M, BLOCK_K)
        b = w_desc.load([pid_n * BLOCK_N, ky, kx, c0]).reshape(BLOCK_N, BLOCK_K)
        acc = tl.dot(a, b.T, acc, input_precision="ieee")
    r = tl.arange(0, BLOCK_M)
    oy = oy0 + r // TILE_W
    ox = ox0 + r % TILE_W
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < C_out
    mask = ((oy < OH) & (ox < OW))[:, None] & n_ok[None, :]
    if TMA_STORE:
        acc = _epilogue_values(acc, mask, offs_n, n_ok, img.to(tl.int64), oy, ox, bias_ptr, res_ptr, stride_rn,
                               stride_rh, stride_rw, ACTIVATION, HAS_RESIDUAL)  # fmt: skip
        patch = acc.to(out_ptr.dtype.element_ty).reshape(1, TILE_H, TILE_W, BLOCK_N)
        out_desc.store([img, oy0, ox0, pid_n * BLOCK_N], patch)
    else:
        _epilogue(acc, mask, offs_n, n_ok, img.to(tl.int64), oy, ox, bias_ptr, res_ptr, stride_rn, stride_rh,
                  stride_rw, out_ptr, stride_on, stride_oh, stride_ow, ACTIVATION, HAS_RESIDUAL)  # fmt: skip


@triton.jit
def _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of a tile id in launches grouped GROUP_M M-tiles at a time (see _GROUP_M)."""
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (tile // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    return first_pid_m + (tile % num_pid_in_group) % group_size_m, (tile % num_pid_in_group) // group_size_m


@triton.jit
def _conv2d_direct_kernel(
    out_ptr,
    stride_on,
    stride_oh,
    stride_ow,
    x_ptr,
    stride_xn,
    stride_xh,
    stride_xw,
    w_ptr,
    bias_ptr,
    res_ptr,
    stride_rn,
    stride_rh,
    stride_rw,
    H,
    W,
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
    C_IN: tl.constexpr,
    KH: tl.constexpr,
    KW: tl.constexpr,
    UPSAMPLE: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    WHOLE_PIXELS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    """The same convolution as _conv2d_nhwc_kernel for a handful of input channels (the stem's 3, C3k2's 8), as
    KH·KW·C_IN outer products on the FMA units: a tensor-core tile would spend most of its K on padding and its
    loads on gathers.

    WHOLE_PIXELS (fp16 input of at most 8 channels, every pixel starting on an 8-byte boundary): each tap loads a
    pixel's channels as one or two 8-byte words and takes the halves apart in registers, where there would be
    C_IN 2-byte gathers. The words' spare channels (row padding, never written) are never used."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(C_out, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < C_out
    img, oy, ox, iy0, ix0 = _output_pixels(offs_m, OH, OW, conv_stride_y, conv_stride_x, pad_y, pad_x)
    x_img = x_ptr + img * stride_xn
    w_cols = w_ptr + offs_n * (KH * KW * C_IN)

    words = x_ptr.to(tl.pointer_type(tl.int64))

    wait_for_previous_kernel(PDL)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ky in tl.static_range(KH):
        for kx in tl.static_range(KW):
            iy = iy0 + ky * dil_y
            ix = ix0 + kx * dil_x
            ok = m_mask & (iy >= 0) & (iy < H * UPSAMPLE) & (ix >= 0) & (ix < W * UPSAMPLE)
            in_image = (iy // UPSAMPLE).to(tl.int64) * stride_xh + (ix // UPSAMPLE).to(tl.int64) * stride_xw
            if WHOLE_PIXELS:
                first_word = words + (img * stride_xn + in_image) // 4
                low = tl.load(first_word, mask=ok, other=0)  # channels 0-3
                if C_IN > 4:
                    high = tl.load(first_word + 1, mask=ok, other=0)  # channels 4-7
            for ci in tl.static_range(C_IN):
                if WHOLE_PIXELS:
                    if ci < 4:
                        word = low
                    else:
                        word = high
                    half = ((word >> (16 * (ci % 4))) & 0xFFFF).to(tl.int16)
                    xv = half.to(tl.float16, bitcast=True).to(tl.float32)
                else:
                    xv = tl.load(x_img + in_image + ci, mask=ok, other=0.0).to(tl.float32)
                wv = tl.load(w_cols + ((ky * KW + kx) * C_IN + ci), mask=n_mask, other=0.0).to(tl.float32)
                acc += xv[:, None] * wv[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    _epilogue(acc, mask, offs_n, n_mask, img, oy, ox, bias_ptr, res_ptr, stride_rn, stride_rh, stride_rw, out_ptr,
              stride_on, stride_oh, stride_ow, ACTIVATION, HAS_RESIDUAL)  # fmt: skip


@dataclass(frozen=True)
class ConvConfig:
    """Tile shape and launch parameters of one conv kernel specialization."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 1  # programs sharing each output tile's K steps (see the kernel)
    direct: bool = False  # the FMA kernel for a few input channels; block_k, num_stages and split_k unused
    whole_pixels: bool = False  # direct or packed: each tap loads a pixel's channels as 8-byte words (WHOLE_PIXELS)
    packed: bool = False  # K tiles run over all taps at once (PACK_TAPS in the kernel), for a few input channels
    tma: bool = False  # operands loaded by the tensor memory accelerator: _conv1x1_tma_kernel, or with tile_w
    persistent: bool = False  # with tma: a fixed grid of programs walking the tiles, not a program per tile
    tile_w: int = 0  # with tma: k x k convs (stride 1 or 2) on patches tile_w pixels wide (_conv_tma_kernel)
    tma_store: bool = False  # the output tile stored by the tensor memory accelerator (TMA_STORE), K unsplit

    def __post_init__(self) -> None:
        # tl.arange needs powers of two, and 16 is the smallest fp16 tensor-core K.
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"ConvConfig.{name} must be a power of two >= 16, got {value}")
        if not isinstance(self.split_k, int) or self.split_k < 1:
            raise ValueError(f"ConvConfig.split_k must be a positive int, got {self.split_k!r}")
        if self.direct and self.split_k != 1:
            raise ValueError("ConvConfig: the direct kernel does not split K")
        if self.packed and (self.direct or self.split_k != 1):
            raise ValueError("ConvConfig: packed taps are a tensor-core tile that does not split K")
        if self.whole_pixels and not (self.direct or self.packed):
            raise ValueError("ConvConfig: whole-pixel loads are a mode of the direct kernel and of packed taps")
        if self.tma and (self.direct or self.packed or self.split_k != 1):
            raise ValueError("ConvConfig: the TMA kernel is a 1x1 tensor-core tile that does not split K")
        if self.tma_store and (self.direct or self.split_k != 1):
            raise ValueError("ConvConfig: TMA stores end the tensor-core tiles whose K is not split")
        if self.persistent and not self.tma:
            raise ValueError("ConvConfig: only the TMA kernel has a persistent grid")
        if self.tile_w and (not self.tma or self.persistent or self.tile_w & (self.tile_w - 1)
                            or self.block_m % self.tile_w):  # fmt: skip
            raise ValueError(
                f"ConvConfig: tile_w={self.tile_w} is the patch width of the non-persistent k x k TMA kernel, a "
                f"power of two dividing block_m={self.block_m}"
            )

    def split_scratch(self, m: int, n: int) -> tuple[int, int]:
        """(fp32 partial elements, arrival counters) a launch of this config needs for GEMM sizes M=m, N=n."""
        if self.split_k == 1:
            return 0, 0
        tiles = -(-m // self.block_m) * -(-n // self.block_n)
        return self.split_k * tiles * self.block_m * self.block_n, tiles


# Tiles measured on an H200 (fp16, YOLO layer shapes, batch 1 and 32). Among equal areas the earlier one won,
# which default_config relies on.
_CANDIDATES = (
    ConvConfig(128, 256, 64, 8, 3),  # wide layers at large batch; 8 warps, so left to timing, never the default
    ConvConfig(128, 128, 64, 4, 3),
    ConvConfig(64, 128, 64, 4, 3),
    ConvConfig(128, 64, 64, 4, 3),
    ConvConfig(128, 32, 32, 4, 3),  # early layers with 16-32 output channels, the stem included
    ConvConfig(64, 64, 64, 4, 3),
    ConvConfig(32, 64, 64, 4, 4),  # tiny maps (e.g. 20x20 at batch 1): enough programs to fill the SMs
    ConvConfig(64, 32, 32, 2, 3),
    ConvConfig(32, 32, 64, 2, 4),
    # Deep K on small maps (20x20 and 40x40 at batch 1, K up to 2304): half the dependent K steps of a 64-deep tile.
    ConvConfig(32, 64, 128, 4, 3),
    ConvConfig(32, 32, 128, 4, 3),
    ConvConfig(16, 64, 128, 2, 3),
)

_SPLITS = (2, 4, 8)
# Direct-kernel tiles (BLOCK_M, BLOCK_N cap, warps) for k×k convs of at most _DIRECT_MAX_C_IN input channels.
_DIRECT_TILES = ((128, 32, 4), (64, 32, 2), (256, 16, 4), (128, 64, 4))
_DIRECT_MAX_C_IN = 8
_HALVES_PER_WORD = 4  # fp16 channels in the 8-byte words of whole-pixel loads
# Packed-tap tensor-core tiles (BLOCK_M, BLOCK_N cap, warps, stages), offered to the same few-channel convs once
# they have this many output channels (the stem of s, m, l and x models): below that the FMA kernel does less
# work than a tile's gathers (measured on an H200 for yolo11n's 3->16 stem and 8->8 convs at batch 1 and 64).
_PACKED_TILES = ((128, 64, 4, 2), (64, 64, 4, 2))
_PACKED_MIN_C_OUT = 32
# Layers of at least this many output pixels (large batches: never at batch 1 for 640 inputs, whose largest maps
# after the stem are 160x160) are also offered the tiles below.
_LARGE_M = 1 << 17
# Wider tiles and a deeper pipeline for the big GEMMs (the 3x3 stride-2 convs of m models run at ~400 TFLOP/s on
# 128x256x64 with 3 stages).
_LARGE_M_TILES = (ConvConfig(256, 128, 64, 8, 3), ConvConfig(128, 256, 64, 8, 4))
# TMA-loaded 1x1 tiles (where the layer's views allow, see tma_loadable): a program per tile, and the usual
# winner's shape on a persistent grid of this many programs an SM.
_TMA_TILES = (
    ConvConfig(128, 128, 64, 4, 3, tma=True),
    ConvConfig(128, 256, 64, 8, 3, tma=True),
    ConvConfig(128, 128, 64, 4, 3, tma=True, persistent=True),
)
# The strides of the k x k convs the patch tiles are offered to (stride 2 through a view pairing rows and pixels).
_TMA_PATCH_STRIDES = (1, 2)
# Patch tiles of the k x k TMA kernel: 8x16 and 16x8 pixels (8 divides the 160-, 80- and 40-wide maps, 16 the
# first two).
_TMA_PATCH_TILES = (
    ConvConfig(128, 64, 64, 4, 3, tma=True, tile_w=16),
    ConvConfig(128, 128, 64, 4, 3, tma=True, tile_w=16),
    ConvConfig(128, 64, 64, 4, 4, tma=True, tile_w=8),
    ConvConfig(64, 64, 64, 4, 4, tma=True, tile_w=8),
)
# And to k x k convs of at least _TMA_PATCH_WIDE_MIN_N outputs (the stride-2 convs of s and m models at batch 64,
# whose plain GEMMs run best 256 wide): 8x8 patches, which tile the 40-wide maps exactly, and 8x16.
_TMA_PATCH_WIDE_TILES = (
    ConvConfig(64, 256, 64, 4, 3, tma=True, tile_w=8),
    ConvConfig(128, 256, 64, 8, 3, tma=True, tile_w=16),
)
_TMA_PATCH_WIDE_MIN_N = 256
# Layers writing at least this many output bytes (the 160x160 and 80x80 maps at batch 64) are also offered their
# TMA, packed (the stem) and wide two-input tiles with the output stored by the tensor memory accelerator: one bulk
# copy a tile through shared memory instead of each thread writing its accumulator's scattered pairs of values.
_TMA_STORE_MIN_BYTES = 1 << 27
# The tiles offered to a 1x1 conv that reads a second input (a folded upsample or concat): each is a specialization
# of its own to compile at start-up, so only the shapes that won such layers on an H200 (yolo11n, yolo26n and
# yolo11m at batch 1 and 64, 2026-11-30), the 8-warp ones only from 2^16 output pixels (yolo11m's 40x40 fold at
# batch 64 took 128x256; never offered at batch 1 for 640 inputs).
_TWO_INPUT_TILES = (
    ConvConfig(128, 64, 64, 4, 3),
    ConvConfig(64, 128, 64, 4, 3),
    ConvConfig(64, 64, 64, 4, 3),
    ConvConfig(32, 64, 64, 4, 4),
    ConvConfig(32, 32, 64, 2, 4),
    ConvConfig(32, 32, 128, 4, 3),
)
_TWO_INPUT_WIDE_TILES = (ConvConfig(128, 256, 64, 8, 3), ConvConfig(128, 256, 64, 8, 4))
_TWO_INPUT_WIDE_MIN_M = 1 << 16
# TMA tiles are offered to fp16 layers from this many output pixels: batch 64 at 40x40 and up, never at batch 1 for
# 640 inputs.
_TMA_MIN_M = 1 << 16
_PERSISTENT_PROGRAMS_PER_SM = 2
_INTERPRETER_PROGRAMS = 3  # under the interpreter: enough to walk tiles several apart
_TMA_ALIGN = 16  # bytes: TMA needs the base address and every stride but the last on this boundary
# Pipeline buffers must fit an SM's shared memory (227 KiB on Hopper) with room left for the epilogue.
_SMEM_BUDGET = 200 * 1024


def candidate_set_id() -> str:
    """A short digest of the candidate tiles: tuning results remembered for another set are not reused, so a
    new candidate gets timed."""
    offer = (
        _CANDIDATES, _SPLITS, _TARGET_PROGRAMS, _DIRECT_TILES, _DIRECT_MAX_C_IN, _PACKED_TILES, _PACKED_MIN_C_OUT,
        _SMEM_BUDGET, _LARGE_M, _LARGE_M_TILES, _TMA_TILES, _TMA_PATCH_TILES, _TMA_PATCH_STRIDES, _TMA_MIN_M,
        _TMA_PATCH_WIDE_TILES, _TMA_PATCH_WIDE_MIN_N, _TMA_STORE_MIN_BYTES,
        _PERSISTENT_PROGRAMS_PER_SM, _TWO_INPUT_TILES, _TWO_INPUT_WIDE_TILES, _TWO_INPUT_WIDE_MIN_M,
        [f.name for f in fields(ConvConfig)],  # a new kind of tile is a new field
    )  # fmt: skip
    return hashlib.sha1(repr(offer).encode()).hexdigest()[:8]


def _fit(block: int, size: int) -> int:
    # Plain Python: triton.next_power_of_2 is a jitted helper whose Python-side call costs microseconds.
    return min(block, max(16, 1 << (size - 1).bit_length()))


def conv_candidate_configs(
    m: int,
    n: int,
    k: int,
    kernel_is_1x1: bool,
    dtype: torch.dtype = torch.float16,
    c_in: int | None = None,
    whole_pixels: bool = False,
) -> list[ConvConfig]:
    """Tile configs worth timing for a conv with GEMM sizes M=m, N=C_out=n, K=kh·kw·C_in=k.

    Tiles are shrunk to the problem (down to the 16-wide minimum) so small layers are not offered tiles that
    would be mostly masked. BLOCK_K tiles one tap's channels, C_in = k for 1x1 kernels; without `c_in` other
    kernels are taken to be 3x3 (all of YOLO's), which for other sizes only mis-sizes the offer, never breaks a
    launch. Configs whose pipeline would not fit in shared memory at ``dtype`` are left out. `whole_pixels`: the
    input's pixels are 8-byte words (see `pixels_are_words`), so the direct tiles also come in that mode.
    """
    if c_in is None:
        c_in = k if kernel_is_1x1 else max(1, k // 9)
    configs = []
    for c in _CANDIDATES + (_LARGE_M_TILES if m >= _LARGE_M else ()):
        fitted = ConvConfig(_fit(c.block_m, m), _fit(c.block_n, n), _fit(c.block_k, c_in), c.num_warps, c.num_stages)
        smem = fitted.num_stages * (fitted.block_m + fitted.block_n) * fitted.block_k * dtype.itemsize
        if smem <= _SMEM_BUDGET and fitted not in configs:
            configs.append(fitted)
    few_channels = []
    if not kernel_is_1x1 and c_in <= _DIRECT_MAX_C_IN:
        for block_m, block_n, warps in _DIRECT_TILES:
            config = ConvConfig(_fit(block_m, m), _fit(block_n, n), 16, warps, 1, direct=True)
            for variant in (config, replace(config, whole_pixels=True)) if whole_pixels else (config,):
                if variant not in few_channels:
                    few_channels.append(variant)
        if n >= _PACKED_MIN_C_OUT:
            for block_m, block_n, warps, stages in _PACKED_TILES:
                # One K tile holds every tap (k <= 72 here), so there is no K loop to pipeline.
                config = ConvConfig(_fit(block_m, m), _fit(block_n, n), _fit(128, k), warps, stages, packed=True)
                if config not in few_channels:
                    few_channels.append(config)
        if whole_pixels and c_in <= _HALVES_PER_WORD:
            # A tap's channels in one word: K = 4 halves per tap, so the stem's tile reads 9 words a pixel.
            block_k = _HALVES_PER_WORD * max(4, 1 << (k // c_in - 1).bit_length())
            for block_m, block_n, warps, stages in _PACKED_TILES:
                config = ConvConfig(_fit(block_m, m), _fit(block_n, n), block_k, warps, stages, whole_pixels=True,
                                    packed=True)  # fmt: skip
                if config not in few_channels:
                    few_channels.append(config)
    tma = []
    if m >= _TMA_MIN_M and dtype == torch.float16:  # fp32 engines are for accuracy comparisons, not speed
        wide = _TMA_PATCH_WIDE_TILES if n >= _TMA_PATCH_WIDE_MIN_N else ()
        for c in _TMA_TILES if kernel_is_1x1 else _TMA_PATCH_TILES + wide:
            fitted = replace(c, block_n=_fit(c.block_n, n), block_k=_fit(c.block_k, c_in))
            smem = fitted.num_stages * (fitted.block_m + fitted.block_n) * fitted.block_k * dtype.itemsize
            if smem <= _SMEM_BUDGET and fitted not in tma:
                tma.append(fitted)
    stored = _tma_store_twins([c for c in few_channels if c.packed and c.whole_pixels] + tma, m, n, dtype)
    return configs + _split_k_variants(configs, m, n, k // c_in, c_in) + few_channels + tma + stored


def _tma_store_twins(configs: list[ConvConfig], m: int, n: int, dtype: torch.dtype) -> list[ConvConfig]:
    """The configs again with TMA stores, for fp16 layers writing at least _TMA_STORE_MIN_BYTES."""
    if dtype != torch.float16 or m * n * dtype.itemsize < _TMA_STORE_MIN_BYTES:
        return []
    return [replace(c, tma_store=True) for c in configs]


def two_input_candidates(m: int, n: int, c_in: int, dtype: torch.dtype = torch.float16) -> list[ConvConfig]:
    """Tile configs worth timing for a 1x1 conv reading a second input (`second` of conv2d_nhwc), GEMM sizes M=m,
    N=n, K=c_in over both inputs: unsplit GEMM tiles only, shrunk to the problem like every candidate."""
    configs = []
    wide = []
    for c in _TWO_INPUT_TILES + (_TWO_INPUT_WIDE_TILES if m >= _TWO_INPUT_WIDE_MIN_M else ()):
        fitted = ConvConfig(_fit(c.block_m, m), _fit(c.block_n, n), _fit(c.block_k, c_in), c.num_warps, c.num_stages)
        smem = fitted.num_stages * (fitted.block_m + fitted.block_n) * fitted.block_k * dtype.itemsize
        if smem <= _SMEM_BUDGET and fitted not in configs:
            configs.append(fitted)
            wide += [fitted] if c in _TWO_INPUT_WIDE_TILES else []
    return configs + _tma_store_twins(wide, m, n, dtype)


def tma_loadable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a conv's operands can be TMA-loaded: the input's and the weight's base addresses and strides
    aligned to 16 bytes, and for a 1x1 weight (loaded as matrices) the input's pixels evenly spaced rows (N, H
    and W strides nested, as in a whole buffer or a channel slice of one)."""
    if x.dim() != 4 or weight.dim() != 4 or x.stride(3) != 1 or not weight.is_contiguous():
        return False
    n, h, w, _ = x.shape
    size = x.element_size()
    if weight.shape[1] == weight.shape[2] == 1:
        nested = (h == 1 or x.stride(1) == w * x.stride(2)) and (n == 1 or x.stride(0) == h * w * x.stride(2))
        strides: tuple[int, ...] = (x.stride(2),)
    else:
        nested, strides = True, x.stride()[:3]
    return (
        nested
        and all((stride * size) % _TMA_ALIGN == 0 for stride in strides)
        and (weight.shape[3] * size) % _TMA_ALIGN == 0
        and x.data_ptr() % _TMA_ALIGN == 0
        and weight.data_ptr() % _TMA_ALIGN == 0
    )


def tma_storable(out: torch.Tensor, patches: bool) -> bool:
    """Whether the tensor memory accelerator can store a conv's output tiles: 16-byte aligned base and strides, unit
    channel stride, a pixel's channels a whole number of 16-byte chunks (TMA stores write whole chunks, so a
    narrower pixel's last chunk would overwrite the channels after it: a concat neighbour's), and, unless the
    tiles are patches of the (N, OH, OW, C_out) view, evenly spaced pixel rows (the output as an (M, C_out)
    matrix, as in a whole buffer or a channel slice of one)."""
    if out.dim() != 4 or out.stride(3) != 1 or (out.shape[3] * out.element_size()) % _TMA_ALIGN:
        return False
    n, h, w, _ = out.shape
    nested = patches or (
        (h == 1 or out.stride(1) == w * out.stride(2)) and (n == 1 or out.stride(0) == h * w * out.stride(2))
    )
    return (
        nested
        and all((stride * out.element_size()) % _TMA_ALIGN == 0 for stride in out.stride()[:3])
        and out.data_ptr() % _TMA_ALIGN == 0
    )


def tma_patch_loadable(x: torch.Tensor, weight: torch.Tensor, stride: tuple[int, int], block_k: int) -> bool:
    """Whether the k x k TMA kernel can load a conv's input patches: TMA-loadable operands (`tma_loadable`) and
    stride 1, or stride 2 on an input of even height and width whose channels are whole BLOCK_K blocks (its view
    pairs rows and pixels, see _conv_tma_kernel)."""
    if stride[0] != stride[1] or stride[0] not in _TMA_PATCH_STRIDES:
        return False
    if stride == (1, 1):
        return tma_loadable(x, weight)
    return (
        x.dim() == 4
        and x.shape[1] % 2 == 0
        and x.shape[2] % 2 == 0
        and x.shape[3] % block_k == 0
        and tma_loadable(x, weight)
    )


def pixels_are_words(x: torch.Tensor) -> bool:
    """Whether an NHWC view's pixels can be loaded as 8-byte words: fp16, at most 8 channels (two words), and every
    pixel starting on an 8-byte boundary (the stem's 3 channels in rows of 4, C3k2's 8-channel slices)."""
    return (
        x.dtype == torch.float16
        and x.dim() == 4
        and x.shape[3] <= 2 * _HALVES_PER_WORD
        and x.stride(3) == 1
        and all(stride % _HALVES_PER_WORD == 0 for stride in x.stride()[:3])
        and x.data_ptr() % 8 == 0
    )


@functools.cache
def _persistent_programs(device: torch.device) -> int:
    """How many programs a persistent grid launches: a few per SM (under the interpreter, enough to walk tiles
    several apart)."""
    if device.type != "cuda":
        return _INTERPRETER_PROGRAMS
    return torch.cuda.get_device_properties(device).multi_processor_count * _PERSISTENT_PROGRAMS_PER_SM


def _split_k_variants(configs: list[ConvConfig], m: int, n: int, taps: int, c_in: int) -> list[ConvConfig]:
    """Split-K versions of the tiles that launch under half a wave of programs on a long K walk (the 20x20 and
    40x40 layers at batch 1): up to 3 tiles, each split 2, 4 and 8 ways while every split keeps 2 K steps."""
    sparse = [c for c in configs if _programs(c, m, n) < _TARGET_PROGRAMS // 2]
    variants = []
    for c in sorted(sparse, key=lambda c: -_programs(c, m, n))[:3]:
        steps = taps * -(-c_in // c.block_k)
        for split in _SPLITS:
            if steps >= 2 * split and _programs(c, m, n) * split <= 3 * _TARGET_PROGRAMS:
                variants.append(replace(c, split_k=split))
    return variants


@functools.cache
def default_config(m: int, n: int, k: int, kernel_is_1x1: bool, dtype: torch.dtype = torch.float16) -> ConvConfig:
    """An untimed choice: the largest 4-warp tile that still launches about a wave of programs.

    Cached per layer shape because the launcher calls it on every launch without an explicit config.
    """
    configs = conv_candidate_configs(m, n, k, kernel_is_1x1, dtype)
    if interpreting():
        # The interpreter runs programs one after another, so the fewest, largest tiles are fastest.
        return max((c for c in configs if c.split_k == 1 and not (c.direct or c.packed or c.tma)), key=_tile_area)
    untimed = [c for c in configs if c.num_warps <= 4 and c.split_k == 1 and not (c.direct or c.packed or c.tma)]
    filling = [c for c in untimed if _programs(c, m, n) >= _TARGET_PROGRAMS]
    if filling:
        return max(filling, key=_tile_area)
    return max(untimed, key=lambda c: _programs(c, m, n))


def _tile_area(c: ConvConfig) -> int:
    return c.block_m * c.block_n


def _programs(c: ConvConfig, m: int, n: int) -> int:
    return -(-m // c.block_m) * -(-n // c.block_n)


def _pair(value: int | tuple[int, int], name: str, minimum: int) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= minimum for v in pair):
        raise ValueError(f"{name} must be an int or a pair of ints >= {minimum}, got {value!r}")
    return pair


def _check_nhwc(t: torch.Tensor, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.dtype != dtype:
        raise ValueError(f"{name} dtype {t.dtype} does not match x dtype {dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, x is on {device}")
    if t.stride(3) != 1:
        raise ValueError(f"{name} must have contiguous channels (stride(3) == 1), got strides {t.stride()}")


def _split_scratch(
    cfg: ConvConfig,
    m: int,
    n: int,
    partials: torch.Tensor | None,
    arrivals: torch.Tensor | None,
    fallback: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scratch tensors to pass the kernel: checked when the config splits K; otherwise `fallback` for both,
    any valid pointer, since the kernel then never touches them."""
    need_partials, need_arrivals = cfg.split_scratch(m, n)
    if need_arrivals == 0:
        return fallback, fallback
    device = fallback.device
    if (
        partials is None
        or partials.dtype != torch.float32
        or partials.device != device
        or partials.numel() < need_partials
    ):
        raise ValueError(f"split_k={cfg.split_k} needs partials: float32 with >= {need_partials} elements on {device}")
    if (
        arrivals is None
        or arrivals.dtype != torch.int32
        or arrivals.device != device
        or arrivals.numel() < need_arrivals
    ):
        raise ValueError(
            f"split_k={cfg.split_k} needs arrivals: int32 zeros with >= {need_arrivals} elements on {device}"
        )
    return partials, arrivals


def conv2d_nhwc(
    out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    *,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    activation: str = "silu",
    residual: torch.Tensor | None = None,
    upsample: int = 1,
    second: torch.Tensor | None = None,
    config: ConvConfig | None = None,
    pdl: bool = False,
    compile_only: bool = False,
    partials: torch.Tensor | None = None,
    arrivals: torch.Tensor | None = None,
) -> None:
    """out = act(conv2d(upsample_nearest(x, upsample), weight) + bias) (+ residual), written in place.

    With `second`, a 1x1 conv (stride 1, no padding) over the channel concat of upsample_nearest(x, upsample)
    and second: (N, OH, OW, C2) of x's dtype with unit channel stride, never upsampled; the weight then holds
    C_in + C2 input channels, x's first. A neck's Upsample and Concat then cost no launch and no memory traffic.

    x: (N, H, W, C_in) fp16/fp32 view with unit channel stride; out and residual: (N, OH, OW, C_out) views of
    the same dtype; weight: contiguous (C_out, kh, kw, C_in) of that dtype; bias: fp32 (C_out,). `pdl` launches
    with programmatic dependent launch (see yolojet.kernels.pdl). `compile_only` compiles the specialization this
    call needs without launching it (for compiling many tile candidates in parallel before timing them).
    A config with split_k > 1 needs `partials`, float32 with at least `config.split_scratch(M, C_out)[0]`
    elements, and `arrivals`, int32 zeros with at least `[1]` elements (the kernel leaves them at zero).
    """
    if x.dim() != 4:
        raise ValueError(f"x must be a 4-D NHWC tensor, got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"x dtype must be float16 or float32, got {x.dtype}")
    if weight.dim() != 4 or not weight.is_contiguous():
        raise ValueError(f"weight must be a contiguous (C_out, kh, kw, C_in) tensor, got shape {tuple(weight.shape)}")
    batch, height, width, c_in = x.shape
    c_out, kh, kw, w_c_in = weight.shape
    if second is not None and second.dim() != 4:
        raise ValueError(f"second must be a 4-D NHWC tensor, got shape {tuple(second.shape)}")
    c_second = 0 if second is None else second.shape[3]
    if w_c_in != c_in + c_second:
        inputs = f"x has {c_in} channels" + ("" if second is None else f" and second {c_second}")
        raise ValueError(f"weight expects C_in={w_c_in} but {inputs}")
    if weight.dtype != x.dtype:
        raise ValueError(f"weight dtype {weight.dtype} does not match x dtype {x.dtype}")
    if weight.device != x.device or bias.device != x.device:
        raise ValueError(f"weight ({weight.device}) and bias ({bias.device}) must be on x's device {x.device}")
    if x.stride(3) != 1:
        raise ValueError(f"x must have contiguous channels (stride(3) == 1), got strides {x.stride()}")
    if tuple(bias.shape) != (c_out,) or bias.dtype != torch.float32 or bias.stride(0) != 1:
        raise ValueError(f"bias must be contiguous float32 of shape ({c_out},), got {bias.dtype} {tuple(bias.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if not isinstance(upsample, int) or upsample < 1:
        raise ValueError(f"upsample must be a positive int, got {upsample!r}")
    sy, sx = _pair(stride, "stride", 1)
    py, px = _pair(padding, "padding", 0)
    dy, dx = _pair(dilation, "dilation", 1)
    oh = (height * upsample + 2 * py - dy * (kh - 1) - 1) // sy + 1
    ow = (width * upsample + 2 * px - dx * (kw - 1) - 1) // sx + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"kernel {kh}x{kw} does not fit the padded {height * upsample}x{width * upsample} input")
    out_shape = (batch, oh, ow, c_out)
    _check_nhwc(out, "out", out_shape, x.dtype, x.device)
    if second is not None:
        if (kh, kw, sy, sx, py, px, dy, dx) != (1, 1, 1, 1, 0, 0, 1, 1):
            raise ValueError(
                f"second: a second input needs a 1x1 conv with stride 1 and no padding, got a {kh}x{kw} kernel, "
                f"stride {(sy, sx)}, padding {(py, px)}, dilation {(dy, dx)}"
            )
        _check_nhwc(second, "second", (batch, oh, ow, c_second), x.dtype, x.device)
    if residual is not None:
        _check_nhwc(residual, "residual", out_shape, x.dtype, x.device)

    m = batch * oh * ow
    if m == 0 or c_out == 0:
        return
    cfg = config or default_config(m, c_out, kh * kw * w_c_in, kh == kw == 1, x.dtype)
    res = out if residual is None else residual  # never read without HAS_RESIDUAL; any valid pointer will do
    if second is not None and (cfg.direct or cfg.packed or cfg.tma):
        raise ValueError(f"config {cfg}: a second input is read by the GEMM tiles only")
    patches = cfg.tma and cfg.tile_w > 0
    out_desc = None  # unused unless TMA_STORE
    if cfg.tma_store:
        if not tma_storable(out, patches):
            raise ValueError(
                f"config {cfg} TMA-stores its output: out needs 16-byte aligned base and strides, unit channel "
                f"stride, pixels of whole 16-byte chunks ({_TMA_ALIGN // out.element_size()} channels a chunk)"
                f"{'' if patches else ', and evenly spaced pixel rows'} (out shape {tuple(out.shape)}, strides "
                f"{out.stride()})"
            )
        if patches:
            out_desc = TensorDescriptor(out, list(out.shape), list(out.stride()),
                                        [1, cfg.block_m // cfg.tile_w, cfg.tile_w, cfg.block_n])  # fmt: skip
        else:
            out_desc = TensorDescriptor(out, [m, c_out], [out.stride(2), 1], [cfg.block_m, cfg.block_n])
    if cfg.direct:
        if cfg.whole_pixels and not pixels_are_words(x):
            raise ValueError(
                f"config {cfg} loads whole pixels, but x ({x.dtype}, {c_in} channels, strides {x.stride()}) does not "
                "hold 8-byte-aligned pixels of at most 8 fp16 channels"
            )
        grid: tuple[int, ...] = (triton.cdiv(m, cfg.block_m) * triton.cdiv(c_out, cfg.block_n),)
        kernel = launcher(_conv2d_direct_kernel, grid, compile_only)
        kernel(
            out, *out.stride()[:3], x, *x.stride()[:3], weight, bias, res, *res.stride()[:3],
            height, width, oh, ow, c_out, m, sy, sx, py, px, dy, dx,
            C_IN=c_in, KH=kh, KW=kw, UPSAMPLE=upsample, ACTIVATION=ACTIVATIONS[activation],
            HAS_RESIDUAL=residual is not None, WHOLE_PIXELS=cfg.whole_pixels, BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, PDL=pdl,
            num_warps=cfg.num_warps, **launch_options(pdl),
        )  # fmt: skip
        return
    if cfg.tma and cfg.tile_w:
        if upsample != 1 or not tma_patch_loadable(x, weight, (sy, sx), cfg.block_k):
            raise ValueError(
                f"config {cfg} TMA-loads a conv's input patches: it needs stride 1, or stride 2 on an even-sized "
                f"input whose channels are whole K blocks, no upsample, and x's and the weight's strides 16-byte "
                f"aligned (stride {(sy, sx)}, upsample {upsample}, x shape {tuple(x.shape)} strides {x.stride()}, "
                f"weight {tuple(weight.shape)})"
            )
        tile_h = cfg.block_m // cfg.tile_w
        if sy == 1:
            x_desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [1, tile_h, cfg.tile_w, cfg.block_k])
        else:  # (N, H/2, 2, W/2, pixel stride + C_in): see _conv_tma_kernel
            sn, sh, sw = x.stride()[:3]
            x_desc = TensorDescriptor(x, [batch, height // 2, 2, width // 2, sw + c_in], [sn, 2 * sh, sh, 2 * sw, 1],
                                      [1, tile_h, 1, cfg.tile_w, cfg.block_k])  # fmt: skip
        w_desc = TensorDescriptor(weight, list(weight.shape), list(weight.stride()), [cfg.block_n, 1, 1, cfg.block_k])
        grid = (batch * triton.cdiv(oh, tile_h) * triton.cdiv(ow, cfg.tile_w) * triton.cdiv(c_out, cfg.block_n),)
        kernel = launcher(_conv_tma_kernel, grid, compile_only)
        kernel(
            out, *out.stride()[:3], out_desc, x_desc, x.stride(2), w_desc, bias, res, *res.stride()[:3], oh, ow, c_in,
            c_out, py, px, dy, dx, KH=kh, KW=kw, STRIDE=sy, ACTIVATION=ACTIVATIONS[activation],
            HAS_RESIDUAL=residual is not None, TILE_H=tile_h, TILE_W=cfg.tile_w, BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k, GROUP_M=_GROUP_M, TMA_STORE=cfg.tma_store, PDL=pdl,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch_options(pdl),
        )  # fmt: skip
        return
    if cfg.tma:
        if (kh, kw, sy, sx, py, px, upsample) != (1, 1, 1, 1, 0, 0, 1) or not tma_loadable(x, weight):
            raise ValueError(
                f"config {cfg} TMA-loads a 1x1 conv's operands: it needs stride 1, no padding, no upsample, "
                f"x's pixels evenly spaced and x and weight rows 16-byte aligned (weight {kh}x{kw}, stride "
                f"{(sy, sx)}, padding {(py, px)}, upsample {upsample}, x strides {x.stride()})"
            )
        x_desc = TensorDescriptor(x, [m, c_in], [x.stride(2), 1], [cfg.block_m, cfg.block_k])
        w_desc = TensorDescriptor(weight, [c_out, c_in], [c_in, 1], [cfg.block_n, cfg.block_k])
        tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(c_out, cfg.block_n)
        programs = min(tiles, _persistent_programs(x.device)) if cfg.persistent else tiles
        kernel = _conv1x1_tma_kernel
        launch = launcher(kernel, (programs,), compile_only)
        launch(
            out, *out.stride()[:3], out_desc, x_desc, w_desc, bias, res, *res.stride()[:3], oh, ow, c_in, c_out, m,
            programs, ACTIVATION=ACTIVATIONS[activation], HAS_RESIDUAL=residual is not None, BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=_GROUP_M, TMA_STORE=cfg.tma_store, PDL=pdl,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages, **launch_options(pdl),
        )  # fmt: skip
        return
    if cfg.whole_pixels:
        taps_block = _HALVES_PER_WORD * max(4, triton.next_power_of_2(kh * kw))
        if not pixels_are_words(x) or c_in > _HALVES_PER_WORD or cfg.block_k != taps_block:
            raise ValueError(
                f"config {cfg} loads whole pixels with packed taps: it needs 8-byte-aligned pixels of at most "
                f"{_HALVES_PER_WORD} fp16 channels (x: {x.dtype}, {c_in} channels, strides {x.stride()}) and "
                f"block_k = {taps_block} for a {kh}x{kw} kernel"
            )
    partials, arrivals = _split_scratch(cfg, m, c_out, partials, arrivals, bias)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(c_out, cfg.block_n), cfg.split_k)
    kernel = launcher(_conv2d_nhwc_kernel, grid, compile_only)
    two = x if second is None else second  # never read without TWO_INPUTS; any valid pointer will do
    kernel(
        out,
        *out.stride()[:3],
        out_desc,
        x,
        *x.stride()[:3],
        two,
        *two.stride()[:3],
        weight,
        bias,
        res,
        *res.stride()[:3],
        partials,
        arrivals,
        height,
        width,
        c_in,
        c_second,
        oh,
        ow,
        c_out,
        m,
        sy,
        sx,
        py,
        px,
        dy,
        dx,
        KH=kh,
        KW=kw,
        UPSAMPLE=upsample,
        ACTIVATION=ACTIVATIONS[activation],
        HAS_RESIDUAL=residual is not None,
        PACK_TAPS=cfg.packed,
        WHOLE_PIXELS=cfg.whole_pixels,
        TWO_INPUTS=second is not None,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=_GROUP_M,
        SPLIT_K=cfg.split_k,
        TMA_STORE=cfg.tma_store,
        PDL=pdl,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **launch_options(pdl),
    )
