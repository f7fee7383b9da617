"""The classification head's tail: global average pooling, then a linear layer and a softmax over classes, fused
into one launch (`classify_head`); the pooling alone (`global_avg_pool_nhwc`) serves unfused runs."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yolojet.kernels.launch import network_launcher
from yolojet.kernels.pdl import wait_for_previous_kernel
from yolojet.kernels.views import check_view, nhwc_blocks, nhwc_offsets

_FLOATS = (torch.float16, torch.float32)
# The head's programs: 64 channels by 128 classes (160 programs an image for 1,280 channels and 1,000 classes, each
# loading a 16 KB tile of the fp16 weight); the softmax holds up to 1,024 logits in registers.
_HEAD_BLOCK_C = 64
_HEAD_BLOCK_K = 128
_SOFTMAX_BLOCK = 1024


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
    copy_ptr,
    sc_n,
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
    CHANNEL_BLOCKS: tl.constexpr,
    CHANNEL_BLOCKS_P2: tl.constexpr,  # the next power of two, for the tile that sums them
    SOFTMAX_BLOCK: tl.constexpr,
    COPY: tl.constexpr,  # also write the probabilities to copy_ptr (pinned host memory: no copy launch after)
    PDL: tl.constexpr,
):
    # Program (channel block, class block, image): the mean of its channels over the map, then their share of
    # its classes' logits, one fp32 partial row. Every program does one load of each kind, so the launch waits
    # on memory a few times, not once per block. The last program of a class block to arrive sums its partial
    # rows in block order (results do not depend on arrival order) and adds the bias; the last class block of
    # an image to finish runs the softmax. Arrival counts: one per (image, class block), then one per image.
    cb = tl.program_id(0)
    kb = tl.program_id(1)
    n = tl.program_id(2).to(tl.int64)
    class_blocks = tl.num_programs(1)
    ch = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = ch < C
    ks = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    k_ok = ks < K
    wait_for_previous_kernel(PDL)
    acc = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    for p0 in range(0, HW, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        x_ptrs = x_ptr + nhwc_offsets(n, p // W, p % W, sx_n, sx_h, sx_w)[:, None] + ch[None, :]
        acc += tl.load(x_ptrs, mask=(p < HW)[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
    pooled = tl.sum(acc, axis=0) / HW
    wv = tl.load(w_ptr + ks[:, None].to(tl.int64) * sw_k + ch[None, :], mask=k_ok[:, None] & c_ok[None, :], other=0.0)
    block_rows = partial_ptr + (n * class_blocks + kb) * CHANNEL_BLOCKS * BLOCK_K  # this class block's partials
    tl.store(block_rows + cb * BLOCK_K + tl.arange(0, BLOCK_K), tl.sum(wv.to(tl.float32) * pooled[None, :], axis=1))
    # Every thread's partials are written before one thread's release makes the arrival visible.
    tl.debug_barrier()
    block_count = arrivals_ptr + n * class_blocks + kb
    if tl.atomic_add(block_count, 1, sem="acq_rel") == CHANNEL_BLOCKS - 1:
        rows = tl.arange(0, CHANNEL_BLOCKS_P2)
        # .cg reads from L2: L1 is not coherent with the other SMs' writes.
        tile = tl.load(block_rows + rows[:, None] * BLOCK_K + tl.arange(0, BLOCK_K)[None, :],
                       mask=(rows < CHANNEL_BLOCKS)[:, None], other=0.0, cache_modifier=".cg")  # fmt: skip
        row = probs_ptr + n * sp_n
        tl.store(row + ks, tl.sum(tile, axis=0) + tl.load(b_ptr + ks, mask=k_ok, other=0.0), mask=k_ok)
        tl.atomic_xchg(block_count, 0)
        tl.debug_barrier()
        image_count = arrivals_ptr + tl.num_programs(2) * class_blocks + n
        if tl.atomic_add(image_count, 1, sem="acq_rel") == class_blocks - 1:
            _softmax_in_place(row, copy_ptr + n * sc_n, K, SOFTMAX_BLOCK, COPY)
            tl.atomic_xchg(image_count, 0)


@triton.jit
def _softmax_in_place(row, copy_row, K, BLOCK: tl.constexpr, COPY: tl.constexpr):
    """Softmax over the K fp32 logits at `row`, which other programs wrote (so read from L2, .cg); with COPY the
    probabilities go to `copy_row` as well."""
    ks = tl.arange(0, BLOCK)
    logits = tl.load(row + ks, mask=ks < K, other=float("-inf"), cache_modifier=".cg")
    if K <= BLOCK:  # the usual case: every logit in registers, one load and one store
        shifted = tl.exp(logits - tl.max(logits, axis=0))
        probs = shifted / tl.sum(shifted, axis=0)
        tl.store(row + ks, probs, mask=ks < K)
        if COPY:
            tl.store(copy_row + ks, probs, mask=ks < K)
    else:
        # An online max and denominator over blocks, then a normalising pass. The first block always holds a
        # real class, so run_max is finite after it and exp(-inf - run_max) = 0 is safe.
        run_max = tl.max(logits, axis=0)
        run_sum = tl.sum(tl.exp(logits - run_max), axis=0)  # sum of exp(logit - run_max)
        for k0 in range(BLOCK, K, BLOCK):
            logits = tl.load(row + k0 + ks, mask=k0 + ks < K, other=float("-inf"), cache_modifier=".cg")
            new_max = tl.maximum(run_max, tl.max(logits, axis=0))
            run_sum = run_sum * tl.exp(run_max - new_max) + tl.sum(tl.exp(logits - new_max), axis=0)
            run_max = new_max
        inv_sum = 1.0 / run_sum
        for k0 in range(0, K, BLOCK):
            logits = tl.load(row + k0 + ks, mask=k0 + ks < K, cache_modifier=".cg")
            probs = tl.exp(logits - run_max) * inv_sum
            tl.store(row + k0 + ks, probs, mask=k0 + ks < K)
            if COPY:
                tl.store(copy_row + k0 + ks, probs, mask=k0 + ks < K)


def global_avg_pool_nhwc(out: torch.Tensor, x: torch.Tensor, *, pdl: bool = False, compile_only: bool = False) -> None:
    """out[n, c] = mean_{y, x} x[n, y, x, c], accumulated and stored in fp32.

    x: (N, H, W, C) fp16/fp32 view (any N/H/W strides, unit channel stride); out: (N, C) fp32 with unit C stride.
    `compile_only`: compile this launch's kernel without launching it.
    """
    check_view("x", x, (None,) * 4)
    n, h, w, c = x.shape
    check_view("out", out, (n, c), torch.float32, x.device)
    block_p, block_c = nhwc_blocks(c)
    block_p = min(block_p, triton.next_power_of_2(h * w))
    network_launcher(_global_avg_pool_kernel, (n, triton.cdiv(c, block_c)), pdl, compile_only)(
        out, out.stride(0), x, *x.stride()[:3], w, c, h * w, BLOCK_P=block_p, BLOCK_C=block_c,
    )  # fmt: skip


def classify_head_scratch(
    batch: int, channels: int, classes: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (partials, arrivals) `classify_head` needs: fp32 partial logits per (image, class block, channel
    block), and int32 arrival counts per (image, class block) and per image, zero (the kernel leaves them at
    zero)."""
    class_blocks, channel_blocks, block_k = _head_grid(channels, classes)
    partials = torch.empty(batch * class_blocks * channel_blocks * block_k, dtype=torch.float32, device=device)
    return partials, torch.zeros(batch * (class_blocks + 1), dtype=torch.int32, device=device)


def _head_grid(channels: int, classes: int) -> tuple[int, int, int]:
    """(class blocks, channel blocks, BLOCK_K) of the head's launch."""
    block_k = min(_HEAD_BLOCK_K, triton.next_power_of_2(classes))
    return triton.cdiv(classes, block_k), triton.cdiv(channels, _head_block_c(channels)), block_k


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
    copy_to: torch.Tensor | None = None,
    pdl: bool = False,
    compile_only: bool = False,
) -> None:
    """out_probs[n, k] = softmax_k(sum_c mean_{y, x}(features[n, y, x, c]) · weight[k, c] + bias[k]), in fp32, in
    one launch: the classifier's pooling, linear layer and softmax. Already pooled features are a (N, 1, 1, C) view.
    `copy_to`, (N, K) fp32 with unit last stride, gets the probabilities too: pinned host memory there saves the
    copy after the launch (a CUDA kernel writes it directly).

    features: (N, H, W, C) fp16/fp32 view (any N/H/W strides, unit channel stride); weight: (K, C) fp16/fp32;
    bias: fp32 (K,); out_probs: (N, K) fp32; all with unit last stride. partials and arrivals as
    `classify_head_scratch(N, C, K)` makes them (at least that large).
    `compile_only`: compile this launch's kernel without launching it.
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
    if copy_to is not None:
        _check_copy_target(copy_to, n, k, features.device)
    block_c = _head_block_c(c)
    class_blocks, channel_blocks, block_k = _head_grid(c, k)
    for name, t, dtype, need in (
        ("partials", partials, torch.float32, n * class_blocks * channel_blocks * block_k),
        ("arrivals", arrivals, torch.int32, n * (class_blocks + 1)),
    ):
        if t.dtype != dtype or t.device != features.device or not t.is_contiguous() or t.numel() < need:
            raise ValueError(
                f"{name}: expected contiguous {dtype} with >= {need} elements on {features.device}, "
                f"got {tuple(t.shape)} {t.dtype} on {t.device}"
            )
    copy = out_probs if copy_to is None else copy_to  # unused unless COPY
    network_launcher(_classify_head_kernel, (channel_blocks, class_blocks, n), pdl, compile_only)(
        out_probs, out_probs.stride(0), copy, copy.stride(0), features, *features.stride()[:3], w, h * w, weight,
        weight.stride(0), bias,
        partials, arrivals, c, k,
        BLOCK_P=min(triton.next_power_of_2(h * w), max(1, 4096 // block_c)), BLOCK_C=block_c, BLOCK_K=block_k,
        CHANNEL_BLOCKS=channel_blocks, CHANNEL_BLOCKS_P2=triton.next_power_of_2(channel_blocks),
        SOFTMAX_BLOCK=min(_SOFTMAX_BLOCK, triton.next_power_of_2(k)), COPY=copy_to is not None,
    )  # fmt: skip


def _check_copy_target(copy_to: torch.Tensor, n: int, k: int, device: torch.device) -> None:
    """A second home for the probabilities: the kernel's device, or host memory the kernel can write (pinned for a
    CUDA kernel; any, for the interpreter on the CPU)."""
    on_host = copy_to.device.type == "cpu"
    if copy_to.device != device and not (on_host and (device.type == "cpu" or copy_to.is_pinned())):
        where = f"{copy_to.device}{' (not pinned)' if on_host else ''}"
        raise ValueError(f"copy_to: on {where}, expected {device} or pinned host memory")
    check_view("copy_to", copy_to, (n, k), torch.float32)
