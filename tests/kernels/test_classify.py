"""global_avg_pool_nhwc and classify_head against float64 torch references."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernel_checks import assert_close

from yolojet.kernels.classify import classify_head, classify_head_scratch, global_avg_pool_nhwc

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float16: 1e-2, torch.float32: 1e-4}
SENTINEL = 7.0
F16, F32 = torch.float16, torch.float32


def _row_slice(buf_shape, lo, width, fill):
    """Columns [lo, lo + width) of a (rows, cols) fp32 buffer filled with SENTINEL; the view is set to `fill`."""
    buf = torch.full(buf_shape, SENTINEL, device=DEVICE)
    view = buf[:, lo : lo + width]
    view.fill_(fill)
    return buf, view


GAP_CASES = [  # (shape, dtype, sliced input)
    ((1, 7, 5, 5), F16, False),
    ((3, 9, 9, 13), F32, True),
    ((1, 7, 7, 1280), F16, True),  # the classify head's 224-pixel map
    ((3, 5, 7, 40), F32, False),
    ((2, 1, 1, 13), F16, True),
]


@pytest.mark.parametrize(("shape", "dtype", "sliced"), GAP_CASES)
def test_global_avg_pool(shape, dtype, sliced):
    torch.manual_seed(shape[-1])
    n, h, w, c = shape
    x = torch.randn(n, h + 2, w + 3, c + 6, device=DEVICE).to(dtype)[:, 1 : h + 1, 2 : w + 2, 2 : c + 2]
    x = x if sliced else x.contiguous()
    buf, out = _row_slice((n, c + 5), 2, c, float("nan"))
    global_avg_pool_nhwc(out, x)
    assert_close(out, x.double().mean((1, 2)), TOLERANCE[F32])
    out.fill_(SENTINEL)
    assert bool((buf == SENTINEL).all()), "global_avg_pool_nhwc wrote outside its output slice"


HEAD_CASES = [  # (features (N, H, W, C), classes, features dtype, weight dtype)
    ((1, 7, 7, 1280), 1000, F16, F16),  # yolo11n-cls at 224: 20 channel blocks, 8 class blocks
    ((3, 1, 1, 1280), 1000, F32, F16),  # already pooled fp32 features (the unfused path), fp16 weights
    ((2, 3, 5, 40), 13, F32, F32),
    ((3, 2, 2, 5), 5, F16, F32),
    ((2, 9, 9, 200), 1100, F32, F32),  # several softmax blocks, partial channel and class blocks
]


@pytest.mark.parametrize(("shape", "classes", "x_dtype", "w_dtype"), HEAD_CASES)
def test_classify_head(shape, classes, x_dtype, w_dtype):
    torch.manual_seed(classes)
    n, h, w, c = shape
    x = torch.randn(n, h + 1, w + 2, c + 3, device=DEVICE).to(x_dtype)[:, 1:, 2:, 1 : c + 1]  # a sliced view
    # fan-in scaling keeps logits O(1), so the softmax is far from one-hot and every class is checked
    weight = (torch.randn(classes, c, device=DEVICE) / c**0.5).to(w_dtype)
    bias = torch.randn(classes, device=DEVICE)
    partials, arrivals = classify_head_scratch(n, c, classes, x.device)
    ref = (x.double().mean((1, 2)) @ weight.double().T + bias.double()).softmax(-1)
    for run in range(2):  # the second run finds the arrival counts the first left behind
        buf, probs = _row_slice((n, classes + 7), 3, classes, float("nan"))
        partials.fill_(float("nan"))
        classify_head(probs, x, weight, bias, partials, arrivals)
        assert_close(probs, ref, TOLERANCE[F32])
        assert bool((arrivals == 0).all()), f"run {run}: arrival counts not reset"
        probs.fill_(SENTINEL)
        assert bool((buf == SENTINEL).all()), "classify_head wrote outside its output slice"


@pytest.mark.parametrize("classes", [1000, 1100])  # one softmax block, and the blockwise softmax
def test_classify_head_copies_probabilities_to_host_memory(classes):
    """`copy_to` in host memory (pinned on a GPU, where the kernel writes it over the bus) gets exactly the
    probabilities the device row gets, for a batch written at a row stride wider than the classes."""
    torch.manual_seed(classes + 1)
    n, c = 3, 96
    x = torch.randn(n, 3, 3, c, device=DEVICE).to(F16)
    weight = (torch.randn(classes, c, device=DEVICE) / c**0.5).to(F16)
    bias = torch.randn(classes, device=DEVICE)
    partials, arrivals = classify_head_scratch(n, c, classes, x.device)
    probs = torch.full((n, classes), float("nan"), device=DEVICE)
    host = torch.full((n, classes + 5), SENTINEL, pin_memory=DEVICE == "cuda")
    host[:, :classes] = float("nan")
    classify_head(probs, x, weight, bias, partials, arrivals, copy_to=host[:, :classes])
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    assert_close(probs, (x.double().mean((1, 2)) @ weight.double().T + bias.double()).softmax(-1), TOLERANCE[F32])
    assert torch.equal(host[:, :classes], probs.cpu())
    assert bool((host[:, classes:] == SENTINEL).all()), "the copy went outside its rows"


def _head(probs, x, weight, bias, scratch=None):
    partials, arrivals = scratch or classify_head_scratch(x.shape[0], x.shape[3], weight.shape[0], x.device)
    classify_head(probs, x, weight, bias, partials, arrivals)


def _m(*shape, dtype=F32):
    return torch.randn(*shape, device=DEVICE).to(dtype)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        pytest.param(
            lambda: global_avg_pool_nhwc(_m(2, 7), _m(2, 3, 3, 8)),
            r"out: shape \(2, 7\), expected \(2, 8\)",
            id="gap_shape",
        ),
        pytest.param(
            lambda: global_avg_pool_nhwc(_m(2, 8, dtype=F16), _m(2, 3, 3, 8)),
            "out: dtype torch.float16",
            id="gap_dtype",
        ),
        pytest.param(
            lambda: global_avg_pool_nhwc(_m(2, 8), _m(2, 8, 3, 3).permute(0, 2, 3, 1)),
            "x: last-dimension stride 9",
            id="gap_stride",
        ),
        pytest.param(
            lambda: _head(_m(2, 10), _m(2, 3, 3, 16), _m(10, 15), _m(10)),
            r"weight: shape \(10, 15\), expected \(\?, 16\)",
            id="weight_shape",
        ),
        pytest.param(
            lambda: _head(_m(2, 10), _m(2, 3, 3, 16), _m(10, 16, dtype=torch.float64), _m(10)),
            "weight: dtype torch.float64, expected float16 or float32",
            id="weight_dtype",
        ),
        pytest.param(
            lambda: _head(_m(2, 10), _m(2, 3, 3, 16), _m(10, 16), _m(10, dtype=F16)),
            "bias: dtype torch.float16",
            id="bias_dtype",
        ),
        pytest.param(
            lambda: _head(_m(2, 10, dtype=F16), _m(2, 3, 3, 16), _m(10, 16), _m(10)),
            "out_probs: dtype torch.float16",
            id="probs_dtype",
        ),
        pytest.param(
            lambda: _head(_m(2, 10), _m(2, 3, 3, 16), _m(16, 10).T, _m(10)),
            "weight: last-dimension stride 10",
            id="weight_stride",
        ),
        pytest.param(
            lambda: _head(_m(2, 11), _m(2, 3, 3, 16), _m(10, 16), _m(10)),
            r"out_probs: shape \(2, 11\), expected \(2, 10\)",
            id="probs_shape",
        ),
        pytest.param(
            lambda: _head(_m(2, 10), _m(2, 3, 3, 16), _m(10, 16), _m(10), (_m(31), torch.zeros(4, dtype=torch.int32))),
            r"partials: expected contiguous torch.float32 with >= 32 elements",
            id="partials_size",
        ),
        pytest.param(
            lambda: _head(_m(2, 10), _m(2, 3, 3, 16), _m(10, 16), _m(10), (_m(32), torch.zeros(4))),
            r"arrivals: expected contiguous torch.int32",
            id="arrivals_dtype",
        ),
        pytest.param(
            lambda: _head(_m(2, 10), _m(2, 3, 3, 16, dtype=torch.float64), _m(10, 16), _m(10)),
            "features: dtype torch.float64, expected float16 or float32",
            id="features_dtype",
        ),
        pytest.param(
            lambda: classify_head(
                _m(2, 5), _m(2, 3, 3, 8), _m(5, 8), _m(5), *classify_head_scratch(2, 8, 5, DEVICE), copy_to=_m(2, 4)
            ),
            r"copy_to: shape \(2, 4\), expected \(2, 5\)",
            id="copy_shape",
        ),
    ],
)
def test_launchers_reject_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.gpu(reason="programs run one after another under the interpreter")
def test_classify_head_gives_the_same_probabilities_launch_after_launch():
    """The arrival counts order the programs' partial sums on the GPU: at batch 64, with 10,240 programs racing,
    every launch gives bit-identical probabilities (the partials are summed in block order, whatever arrives
    last) and the right ones."""
    torch.manual_seed(0)
    x = torch.randn(64, 7, 7, 1280, device=DEVICE).to(F16)
    weight = (torch.randn(1000, 1280, device=DEVICE) / 1280**0.5).to(F16)
    bias = torch.randn(1000, device=DEVICE)
    partials, arrivals = classify_head_scratch(64, 1280, 1000, x.device)
    first = torch.empty(64, 1000, device=DEVICE)
    classify_head(first, x, weight, bias, partials, arrivals)
    assert_close(first, (x.double().mean((1, 2)) @ weight.double().T + bias.double()).softmax(-1), TOLERANCE[F32])
    probs = torch.empty_like(first)
    for _ in range(50):
        probs.fill_(float("nan"))
        classify_head(probs, x, weight, bias, partials, arrivals)
        assert torch.equal(probs, first)
    assert bool((arrivals == 0).all())


def test_classify_head_refuses_a_copy_target_it_cannot_write():
    """On a GPU the kernel writes host memory only when it is pinned; under the interpreter any host tensor will
    do, but not one on another device. Either way the launch is refused before it runs."""
    x, weight, bias = _m(1, 3, 3, 8), _m(5, 8), _m(5)
    if DEVICE == "cuda":
        target, message = torch.empty(1, 5), r"copy_to: on cpu \(not pinned\)"
    else:
        target, message = torch.empty(1, 5, device="meta"), "copy_to: on meta"
    with pytest.raises(ValueError, match=message):
        classify_head(_m(1, 5), x, weight, bias, *classify_head_scratch(1, 8, 5, DEVICE), copy_to=target)
