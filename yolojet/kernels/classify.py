"""The classification head's tail: global average pooling, then a linear layer and a softmax over classes."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yolojet.kernels.elementwise import check_view, nhwc_blocks, nhwc_offsets
from yolojet.kernels.pdl import launch_options, wait_for_previous_kernel

_FLOATS = (torch.float16, torch.float32)
# Classes per logits program: 63 programs an image for 1000 classes; 4 to 32 measured alike at batch 1 on an H200,
# 16 the best at batch 64.
_LINEAR_BLOCK_K = 16


@triton.jit
def _global_avg_pool_kernel(
    out_ptr,
    so_n,
    x_ptr,
    sx_n,
    sx_h,
    sx_w,
    W,
    C,
    HW,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr,
):
    n = tl.program_id(0)
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = ch < C
    wait_for_previous_kernel(PDL)
    acc = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    for p0 in range(0, HW, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        x_ptrs = x_ptr + nhwc_offsets(n, p // W, p % W, sx_n, sx_h, sx_w)[:, None] + ch[None, :]
        acc += tl.load(x_ptrs, mask=(p < HW)[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
    tl.store(out_ptr + n.to(tl.int64) * so_n + ch, tl.sum(acc, axis=0) / HW, mask=c_ok)


@triton.jit
def _linear_kernel(
    out_ptr,
    so_n,
    x_ptr,
    sx_n,
    w_ptr,
    sw_k,
    b_ptr,
    C,
    K,
    BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr,
):
    # A GEMV per batch row (one image's features): spread over class blocks so the weight streams through
    # many SMs at once; the fp32 products are summed per class at the end.
    ks = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    n = tl.program_id(1).to(tl.int64)
    k_ok = ks < K
    wait_for_previous_kernel(PDL)
    acc = tl.zeros((BLOCK_K, BLOCK_C), tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cs = c0 + tl.arange(0, BLOCK_C)
        c_ok = cs < C
        xv = tl.load(x_ptr + n * sx_n + cs, mask=c_ok, other=0.0).to(tl.float32)
        wv = tl.load(
            w_ptr + ks[:, None].to(tl.int64) * sw_k + cs[None, :], mask=k_ok[:, None] & c_ok[None, :], other=0.0
        )
        acc += wv.to(tl.float32) * xv[None, :]
    logits = tl.sum(acc, axis=1) + tl.load(b_ptr + ks, mask=k_ok)
    tl.store(out_ptr + n * so_n + ks, logits, mask=k_ok)


@triton.jit
def _softmax_rows_kernel(out_ptr, so_n, K, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    # In place over one row of logits: an online max and denominator, then a normalising pass.
    row = out_ptr + tl.program_id(0).to(tl.int64) * so_n
    wait_for_previous_kernel(PDL)
    run_max = tl.full((), float("-inf"), tl.float32)
    run_sum = tl.zeros((), tl.float32)  # sum of exp(logit - run_max)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        logits = tl.load(row + ks, mask=ks < K, other=float("-inf"))
        # The first block always holds a real class, so new_max is finite and exp(-inf - new_max) = 0 is safe.
        new_max = tl.maximum(run_max, tl.max(logits, axis=0))
        run_sum = run_sum * tl.exp(run_max - new_max) + tl.sum(tl.exp(logits - new_max), axis=0)
        run_max = new_max
    inv_sum = 1.0 / run_sum
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        logits = tl.load(row + ks, mask=ks < K)
        tl.store(row + ks, tl.exp(logits - run_max) * inv_sum, mask=ks < K)


def global_avg_pool_nhwc(out: torch.Tensor, x: torch.Tensor, *, pdl: bool = False) -> None:
    """out[n, c] = mean_{y, x} x[n, y, x, c], accumulated and stored in fp32.

    x: (N, H, W, C) fp16/fp32 view (any N/H/W strides, unit channel stride); out: (N, C) fp32 with unit C stride.
    """
    check_view("x", x, (None,) * 4)
    n, h, w, c = x.shape
    check_view("out", out, (n, c), torch.float32, x.device)
    block_p, block_c = nhwc_blocks(c)
    block_p = min(block_p, triton.next_power_of_2(h * w))
    _global_avg_pool_kernel[(n, triton.cdiv(c, block_c))](
        out, out.stride(0), x, *x.stride()[:3], w, c, h * w, BLOCK_P=block_p, BLOCK_C=block_c, PDL=pdl,
        **launch_options(pdl),
    )  # fmt: skip


def linear_softmax(
    out_probs: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *, pdl: bool = False
) -> None:
    """out_probs[n, k] = softmax_k(sum_c x[n, c] · weight[k, c] + bias[k]), computed and stored in fp32.

    x: (N, C) fp16/fp32; weight: (K, C) fp16/fp32; bias: fp32 (K,); out_probs: (N, K) fp32; all with unit last
    stride. Two launches: logits over (class block, row) programs into out_probs, then a softmax over each row.
    """
    check_view("x", x, (None, None))
    n, c = x.shape
    check_view("weight", weight, (None, c), device=x.device)
    k = weight.shape[0]
    for name, t in (("x", x), ("weight", weight)):
        if t.dtype not in _FLOATS:
            raise ValueError(f"{name}: dtype {t.dtype}, expected float16 or float32")
    check_view("bias", bias, (k,), torch.float32, x.device)
    check_view("out_probs", out_probs, (n, k), torch.float32, x.device)
    block_c = min(256, triton.next_power_of_2(c))
    _linear_kernel[(triton.cdiv(k, _LINEAR_BLOCK_K), n)](
        out_probs,
        out_probs.stride(0),
        x,
        x.stride(0),
        weight,
        weight.stride(0),
        bias,
        c,
        k,
        BLOCK_K=_LINEAR_BLOCK_K,
        BLOCK_C=block_c,
        PDL=pdl,
        **launch_options(pdl),
    )
    _softmax_rows_kernel[(n,)](
        out_probs, out_probs.stride(0), k, BLOCK_K=min(1024, triton.next_power_of_2(k)), PDL=pdl,
        **launch_options(pdl),
    )  # fmt: skip
