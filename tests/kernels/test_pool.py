"""maxpool2d_nhwc against F.max_pool2d and sppf_pools against chained F.max_pool2d, on strided channel slices."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.nn.functional as F

from yolojet.kernels.pool import maxpool2d_nhwc, sppf_pools

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SENTINEL = 7.0
F16, F32 = torch.float16, torch.float32


def _nhwc(shape, dtype, sliced, fill=None):
    """A random (or filled) NHWC tensor; when sliced, a view into a larger buffer with odd H/W/C offsets."""
    n, h, w, c = shape
    full = (n, h + 2, w + 3, c + 6) if sliced else shape
    buf = torch.randn(full, dtype=torch.float64) if fill is None else torch.full(full, fill, dtype=torch.float64)
    buf = buf.to(device=DEVICE, dtype=dtype)
    view = buf[:, 1 : h + 1, 2 : w + 2, 2 : c + 2] if sliced else buf
    return buf, view


def _assert_equal(out, ref):
    """Max pooling only selects inputs, so the result must be exact."""
    nan_count = int(out.isnan().sum())
    if nan_count:
        first = tuple(int(i) for i in out.isnan().nonzero()[0])
        pytest.fail(f"{nan_count} of {out.numel()} outputs are NaN (unwritten?), first at {first}")
    err = (out.double() - ref.double()).abs()
    if float(err.max()) > 0:
        worst = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))
        pytest.fail(
            f"{int((err > 0).sum())} outputs differ; worst at {worst}: got {float(out[worst]):.6g}, "
            f"expected {float(ref[worst]):.6g}"
        )


def _torch_pool(x, kernel, stride, padding):
    return F.max_pool2d(x.double().permute(0, 3, 1, 2), kernel, stride, padding).permute(0, 2, 3, 1)


MAXPOOL_CASES = [  # (shape, kernel, stride, padding, dtype, sliced)
    ((1, 7, 5, 5), 3, 2, 1, F16, False),
    ((3, 9, 9, 13), 2, 2, 0, F32, True),
    ((1, 9, 9, 40), 3, 1, 1, F16, True),
    ((3, 7, 5, 13), 5, 1, 2, F32, False),
    ((1, 9, 9, 13), 5, 3, 2, F16, True),
]


@pytest.mark.parametrize(("shape", "kernel", "stride", "padding", "dtype", "sliced"), MAXPOOL_CASES)
def test_maxpool_matches_torch(shape, kernel, stride, padding, dtype, sliced):
    torch.manual_seed(kernel * 10 + stride)
    x = _nhwc(shape, dtype, sliced)[1]
    ref = _torch_pool(x, kernel, stride, padding)
    buf, out = _nhwc(ref.shape, dtype, sliced, fill=SENTINEL)
    out.fill_(float("nan"))
    maxpool2d_nhwc(out, x, kernel=kernel, stride=stride, padding=padding)
    _assert_equal(out, ref)
    out.fill_(SENTINEL)
    assert bool((buf == SENTINEL).all()), "maxpool wrote outside its output slice"


SPPF_CASES = [  # (shape, kernel, repeats, dtype, spacing): output r is channel slice (1 + spacing·r)·C of one buffer
    ((1, 9, 9, 13), 5, 3, F16, 1),
    ((3, 7, 5, 5), 5, 3, F32, 1),
    ((1, 7, 5, 40), 3, 2, F16, 2),
    ((3, 9, 9, 13), 3, 4, F32, -1),
    ((1, 9, 7, 5), 7, 1, F32, 1),
]


@pytest.mark.parametrize(("shape", "kernel", "repeats", "dtype", "spacing"), SPPF_CASES)
def test_sppf_matches_chained_pools(shape, kernel, repeats, dtype, spacing):
    # SPPF's layout: x = y0 is the concat buffer's first slice and outs its next ones (here also spaced 2·C apart,
    # or in reverse order), inside a buffer with spare channels on both sides that must keep SENTINEL.
    torch.manual_seed(kernel + repeats)
    n, h, w, c = shape
    first = 1 + max(0, -spacing) * (repeats - 1)
    buf = torch.full((n, h, w, (abs(spacing) * (repeats - 1) + 3) * c), SENTINEL, dtype=dtype, device=DEVICE)
    x = buf[..., :c]
    x.copy_(torch.randn(shape, device=DEVICE))
    outs = [buf[..., (first + spacing * r) * c : (first + spacing * r + 1) * c] for r in range(repeats)]
    for o in outs:
        o.fill_(float("nan"))
    sppf_pools(outs, x, kernel=kernel, repeats=repeats)
    y = x
    for o in outs:
        y = _torch_pool(y, kernel, 1, kernel // 2)
        _assert_equal(o, y)
        o.fill_(SENTINEL)
    x.fill_(SENTINEL)
    assert bool((buf == SENTINEL).all()), "sppf_pools wrote outside its output slices"


def _x(c=8, dtype=F16):
    return torch.randn(2, 5, 4, c, device=DEVICE).to(dtype)


def _unevenly_spaced_outs():
    buf = _x(32)
    return [buf[..., :8], buf[..., 8:16], buf[..., 24:]]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        pytest.param(
            lambda: maxpool2d_nhwc(_x(), _x(), kernel=3, stride=2, padding=1),
            r"out: shape \(2, 5, 4, 8\), expected \(2, 3, 2, 8\)",
            id="pool_shape",
        ),
        pytest.param(
            lambda: maxpool2d_nhwc(_x(dtype=F32), _x(), kernel=3, stride=1, padding=1), "out: dtype", id="pool_dtype"
        ),
        pytest.param(
            lambda: maxpool2d_nhwc(_x(), _x(16)[..., ::2], kernel=3, stride=1, padding=1),
            "x: last-dimension stride 2",
            id="pool_stride",
        ),
        pytest.param(
            lambda: maxpool2d_nhwc(_x(), _x(), kernel=3, stride=1, padding=2),
            "padding: expected 0 <=",
            id="pool_padding",
        ),
        pytest.param(
            lambda: sppf_pools([_x(), _x()], _x(), repeats=3),
            "outs: expected repeats=3 outputs, got 2",
            id="sppf_count",
        ),
        pytest.param(lambda: sppf_pools([_x(), _x(7)], _x(), repeats=2), r"outs\[1\]: shape", id="sppf_shape"),
        pytest.param(lambda: sppf_pools([_x(), _x(dtype=F32)], _x(), repeats=2), r"outs\[1\]: dtype", id="sppf_dtype"),
        pytest.param(
            lambda: sppf_pools([_x(), _x(16)[..., 8:]], _x(), repeats=2), r"outs\[1\]: strides", id="sppf_strides"
        ),
        pytest.param(
            lambda: sppf_pools(_unevenly_spaced_outs(), _x(), repeats=3),
            r"outs\[2\]: not equally spaced",
            id="sppf_spacing",
        ),
        pytest.param(
            lambda: sppf_pools([_x()], _x(), kernel=4, repeats=1), "kernel: expected an odd int", id="sppf_kernel"
        ),
    ],
)
def test_launchers_reject_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
