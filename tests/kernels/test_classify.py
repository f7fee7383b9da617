"""global_avg_pool_nhwc and linear_softmax against float64 torch references."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernel_checks import assert_close

from yolojet.kernels.classify import global_avg_pool_nhwc, linear_softmax

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


LINEAR_CASES = [  # (batch, channels, classes, x dtype, weight dtype)
    (1, 1280, 1000, F16, F16),  # ImageNet head
    (3, 1280, 1000, F32, F16),  # fp32 pooled features, fp16 weights
    (2, 40, 13, F32, F32),
    (3, 5, 5, F16, F32),
    (1, 200, 130, F32, F32),  # several class blocks, last partial
]


@pytest.mark.parametrize(("batch", "channels", "classes", "x_dtype", "w_dtype"), LINEAR_CASES)
def test_linear_softmax(batch, channels, classes, x_dtype, w_dtype):
    torch.manual_seed(classes)
    x = torch.randn(batch, channels, device=DEVICE).to(x_dtype)
    # fan-in scaling keeps logits O(1), so the softmax is far from one-hot and every class is checked
    weight = (torch.randn(classes, channels, device=DEVICE) / channels**0.5).to(w_dtype)
    bias = torch.randn(classes, device=DEVICE)
    buf, probs = _row_slice((batch, classes + 7), 3, classes, float("nan"))
    linear_softmax(probs, x, weight, bias)
    ref = (x.double() @ weight.double().T + bias.double()).softmax(-1)
    assert_close(probs, ref, TOLERANCE[F32])
    probs.fill_(SENTINEL)
    assert bool((buf == SENTINEL).all()), "linear_softmax wrote outside its output slice"


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
            lambda: linear_softmax(_m(2, 10), _m(2, 16), _m(10, 15), _m(10)),
            r"weight: shape \(10, 15\), expected \(\?, 16\)",
            id="weight_shape",
        ),
        pytest.param(
            lambda: linear_softmax(_m(2, 10), _m(2, 16), _m(10, 16, dtype=torch.float64), _m(10)),
            "weight: dtype torch.float64, expected float16 or float32",
            id="weight_dtype",
        ),
        pytest.param(
            lambda: linear_softmax(_m(2, 10), _m(2, 16), _m(10, 16), _m(10, dtype=F16)),
            "bias: dtype torch.float16",
            id="bias_dtype",
        ),
        pytest.param(
            lambda: linear_softmax(_m(2, 10, dtype=F16), _m(2, 16), _m(10, 16), _m(10)),
            "out_probs: dtype torch.float16",
            id="probs_dtype",
        ),
        pytest.param(
            lambda: linear_softmax(_m(2, 10), _m(2, 16), _m(16, 10).T, _m(10)),
            "weight: last-dimension stride 10",
            id="weight_stride",
        ),
        pytest.param(
            lambda: linear_softmax(_m(2, 11), _m(2, 16), _m(10, 16), _m(10)),
            r"out_probs: shape \(2, 11\), expected \(2, 10\)",
            id="probs_shape",
        ),
    ],
)
def test_launchers_reject_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
