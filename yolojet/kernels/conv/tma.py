"""The kernels whose operands the tensor memory accelerator loads through host-side `TensorDescriptor`s:
`_conv1x1_tma_kernel`, a 1x1 conv as a GEMM of an (M, C_in) and a (C_out, C_in) matrix, one program a tile or a
persistent grid; and `_conv_tma_kernel`, k x k convs (stride 1 or 2) on patches of one image's output pixels,
each tap's input one box of the input.
"""

import triton
import triton.language as tl

from yolojet.kernels.conv.epilogue import (
    _epilogue,
    _epilogue_values,
    _grouped_tile,
    _matrix_tile_epilogue,
    _output_pixels,
)
from yolojet.kernels.pdl import wait_for_previous_kernel


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
