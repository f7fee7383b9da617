"""The classification head's tail: global average pooling, then a linear layer and a softmax over classes, fused
into one launch (`classify_head`); the pooling alone (`global_avg_pool_nhwc`) serves unfused runs."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yolojet.kernels.elementwise import check_view, nhwc_blocks, nhwc_offsets
from yolojet.kernels.pdl import launch_options, wait_for_previous_kernel

_FLOATS = (torch.float16, torch.float32)
# The head's programs: channel blocks of 64 (20 programs an image for 1,280 channels, each streaming a 1000 x 64
# slice of the weight, 128 KB in fp16), classes 128 at a time.
_HEAD_BLOCK_C = 64
_HEAD_BLOCK_K = 128


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
def _classify_head_kernel(
    probs_ptr,
    sp_n,
    x_ptr,
    sx_n,
    sx_h,
    sx_w,
    W,
    HW,
    w_ptr,
    sw_k,
    b_ptr,
    partial_ptr,
    arrivals_ptr,
    C,
    K,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SOFTMAX_BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    # Program (channel block, image): the mean of its channels over the map, then their share of every class's
    # logit, written as one fp32 partial row. The weight streams through as many SMs as there are channel
    # blocks. The last program of an image to arrive sums the partial rows in block order (so the result does
    # not depend on arrival order), adds the bias and runs the softmax.
    cb = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    blocks = tl.num_programs(0)
    ch = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = ch < C
    wait_for_previous_kernel(PDL)
    acc = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    for p0 in range(0, HW, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        x_ptrs = x_ptr + nhwc_offsets(n, p // W, p % W, sx_n, sx_h, sx_w)[:, None] + ch[None, :]
        acc += tl.load(x_ptrs, mask=(p < HW)[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
    pooled = tl.sum(acc, axis=0) / HW
    partials = partial_ptr + n * blocks * K
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        wv = tl.load(
            w_ptr + ks[:, None].to(tl.int64) * sw_k + ch[None, :], mask=k_ok[:, None] & c_ok[None, :], other=0.0
        )
        tl.store(partials + cb * K + ks, tl.sum(wv.to(tl.float32) * pooled[None, :], axis=1), mask=k_ok)
    # Every thread's partials are written before one thread's release makes the arrival visible.
    tl.debug_barrier()
    arrived = tl.atomic_add(arrivals_ptr + n, 1, sem="acq_rel")
    if arrived == blocks - 1:
        row = probs_ptr + n * sp_n
        run_max = tl.full((), float("-inf"), tl.float32)
        run_sum = tl.zeros((), tl.float32)  # sum of exp(logit - run_max)
        for k0 in range(0, K, SOFTMAX_BLOCK):
            ks = k0 + tl.arange(0, SOFTMAX_BLOCK)
            k_ok = ks < K
            logits = tl.load(b_ptr + ks, mask=k_ok, other=0.0)
            for b in range(blocks):
                # .cg reads from L2: L1 is not coherent with the other SMs' writes.
                logits += tl.load(partials + b * K + ks, mask=k_ok, other=0.0, cache_modifier=".cg")
            logits = tl.where(k_ok, logits, float("-inf"))
            tl.store(row + ks, logits, mask=k_ok)
            # The first block always holds a real class, so new_max is finite and exp(-inf - new_max) = 0 is safe.
            new_max = tl.maximum(run_max, tl.max(logits, axis=0))
            run_sum = run_sum * tl.exp(run_max - new_max) + tl.sum(tl.exp(logits - new_max), axis=0)
            run_max = new_max
        inv_sum = 1.0 / run_sum
        tl.debug_barrier()  # the logits above were stored by whichever threads held them
        for k0 in range(0, K, SOFTMAX_BLOCK):
            ks = k0 + tl.arange(0, SOFTMAX_BLOCK)
            logits = tl.load(row + ks, mask=ks < K)
            tl.store(row + ks, tl.exp(logits - run_max) * inv_sum, mask=ks < K)
        tl.atomic_xchg(arrivals_ptr + n, 0)


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


def classify_head_scratch(
    batch: int, channels: int, classes: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (partials, arrivals) `classify_head` needs: fp32 partial logits per (image, channel block), and one
    int32 arrival count per image, zero (the kernel leaves them at zero)."""
    blocks = triton.cdiv(channels, _head_block_c(channels))
    partials = torch.empty(batch * blocks * classes, dtype=torch.float32, device=device)
    return partials, torch.zeros(batch, dtype=torch.int32, device=device)


def _head_block_c(channels: int) -> int:
    return min(_HEAD_BLOCK_C, triton.next_power_of_2(channels))


def classify_head(
    out_probs: torch.Tensor,
    features: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    partials: torch.Tensor,
    arrivals: torch.Tensor,
    *,
    pdl: bool = False,
) -> None:
    """out_probs[n, k] = softmax_k(sum_c mean_{y, x}(features[n, y, x, c]) · weight[k, c] + bias[k]), in fp32, in
    one launch: the classifier's pooling, linear layer and softmax. Already pooled features are a (N, 1, 1, C) view.

    features: (N, H, W, C) fp16/fp32 view (any N/H/W strides, unit channel stride); weight: (K, C) fp16/fp32;
    bias: fp32 (K,); out_probs: (N, K) fp32; all with unit last stride. partials and arrivals as
    `classify_head_scratch(N, C, K)` makes them (at least that large).
    """
    check_view("features", features, (None,) * 4)
    n, h, w, c = features.shape
    check_view("weight", weight, (None, c), device=features.device)
    k = weight.shape[0]
    for name, t in (("features", features), ("weight", weight)):
        if t.dtype not in _FLOATS:
            raise ValueError(f"{name}: dtype {t.dtype}, expected float16 or float32")
    check_view("bias", bias, (k,), torch.float32, features.device)
    check_view("out_probs", out_probs, (n, k), torch.float32, features.device)
    block_c = _head_block_c(c)
    blocks = triton.cdiv(c, block_c)
    for name, t, dtype, need in (
        ("partials", partials, torch.float32, n * blocks * k),
        ("arrivals", arrivals, torch.int32, n),
    ):
        if t.dtype != dtype or t.device != features.device or not t.is_contiguous() or t.numel() < need:
            raise ValueError(f"{name}: expected contiguous {dtype} with >= {need} elements on {features.device}, "
                             f"got {tuple(t.shape)} {t.dtype} on {t.device}")  # fmt: skip
    _classify_head_kernel[(blocks, n)](
        out_probs, out_probs.stride(0), features, *features.stride()[:3], w, h * w, weight, weight.stride(0), bias,
        partials, arrivals, c, k,
        BLOCK_P=min(triton.next_power_of_2(h * w), max(1, 4096 // block_c)), BLOCK_C=block_c,
        BLOCK_K=min(_HEAD_BLOCK_K, triton.next_power_of_2(k)), SOFTMAX_BLOCK=min(1024, triton.next_power_of_2(k)),
        PDL=pdl, **launch_options(pdl),
    )  # fmt: skip
