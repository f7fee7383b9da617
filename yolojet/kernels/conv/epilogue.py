"""The @triton.jit helpers more than one conv kernel calls: the output pixels of a tile's GEMM rows (`_output_pixels`),
the grouped launch order of output tiles (`_grouped_tile`; the group size `_GROUP_M` is set in `dispatch`), and
the epilogue every kernel ends with: bias, activation and residual (`_epilogue_values`), stored by each thread
(`_epilogue`) or, for a tile of the (M, C_out) output matrix, optionally as one TMA bulk copy
(`_matrix_tile_epilogue`); and the head folds' 1x1 conv of a pixel block onto every output, as its map would hold
them (`_head_conv_outputs`).
"""

import triton
import triton.language as tl

from yolojet.kernels.activations import apply_activation
from yolojet.kernels.pdl import wait_for_previous_kernel


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
def _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of a tile id in launches grouped GROUP_M M-tiles at a time (see _GROUP_M)."""
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (tile // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    return first_pid_m + (tile % num_pid_in_group) % group_size_m, (tile % num_pid_in_group) // group_size_m


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
def _head_conv_outputs(
    x_ptr,
    stride_xn,
    stride_xh,
    stride_xw,
    w_ptr,
    bias_ptr,
    H,
    W,
    C_in,
    C_out,
    M,
    ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """A head fold's 1x1 conv (kernels/conv/scores.py, boxes.py, extras.py) on this program's BLOCK_M pixels of the
    (N, H, W) map and all its C_out <= BLOCK_N outputs: act(bias + x · wᵀ) rounded to x's dtype, as the conv's store
    would round its map, in float32; with the rows' mask, image, y and x, and the columns (offs_n, their mask)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < C_out
    img, oy, ox, _, _ = _output_pixels(offs_m, H, W, 1, 1, 0, 0)
    x_rows = x_ptr + img * stride_xn + oy.to(tl.int64) * stride_xh + ox.to(tl.int64) * stride_xw
    w_rows = w_ptr + offs_n * C_in
    wait_for_previous_kernel(PDL)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, C_in, BLOCK_K):
        k_mask = offs_k < C_in - k0
        a = tl.load(x_rows[:, None] + (k0 + offs_k)[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(w_rows[None, :] + (k0 + offs_k)[:, None], mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    raw = apply_activation(acc + tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0)[None, :], ACTIVATION)
    return raw.to(x_ptr.dtype.element_ty).to(tl.float32), m_mask, img, oy, ox, offs_n, n_mask
