"""`_conv2d_direct_kernel`: k x k convs of a handful of input channels as outer products on the FMA units, optionally
loading each pixel's channels as 8-byte words.
"""

import triton
import triton.language as tl

from yolojet.kernels.conv.epilogue import _epilogue, _output_pixels
from yolojet.kernels.pdl import wait_for_previous_kernel


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
