"""add_nhwc, upsample_nearest_nhwc and copy_nhwc against torch on odd shapes and strided channel-slice views."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.nn.functional as F
from kernel_checks import assert_close

from yolojet.kernels.elementwise import add_nhwc, copy_nhwc, upsample_nearest_nhwc

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float16: 1e-2, torch.float32: 1e-4}
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


def _output(shape, dtype, sliced):
    """A NaN-poisoned output view; outside it (when sliced) the buffer holds SENTINEL."""
    buf, view = _nhwc(shape, dtype, sliced, fill=SENTINEL)
    view.fill_(float("nan"))
    return buf, view


def _assert_slice_only(buf, view):
    view.fill_(SENTINEL)
    assert bool((buf == SENTINEL).all()), "kernel wrote outside its output slice"


CASES = [  # (shape, dtype, sliced inputs, sliced output)
    ((1, 7, 5, 5), F16, False, False),
    ((3, 9, 9, 13), F32, True, True),
    ((1, 9, 9, 40), F16, True, False),
    ((3, 7, 5, 40), F32, False, True),
    ((3, 5, 7, 13), F16, True, True),
]


@pytest.mark.parametrize(("shape", "dtype", "sliced_in", "sliced_out"), CASES)
def test_add(shape, dtype, sliced_in, sliced_out):
    torch.manual_seed(1)
    a, b = _nhwc(shape, dtype, sliced_in)[1], _nhwc(shape, dtype, sliced_in)[1]
    buf, out = _output(shape, dtype, sliced_out)
    add_nhwc(out, a, b)
    assert_close(out, a.double() + b.double(), TOLERANCE[dtype])
    _assert_slice_only(buf, out)


@pytest.mark.parametrize(("shape", "dtype", "sliced_in", "sliced_out"), CASES)
def test_upsample_nearest(shape, dtype, sliced_in, sliced_out):
    torch.manual_seed(2)
    factor = 3 if shape[-1] == 5 else 2
    x = _nhwc(shape, dtype, sliced_in)[1]
    n, h, w, c = shape
    buf, out = _output((n, h * factor, w * factor, c), dtype, sliced_out)
    upsample_nearest_nhwc(out, x, factor)
    ref = F.interpolate(x.double().permute(0, 3, 1, 2), scale_factor=factor, mode="nearest").permute(0, 2, 3, 1)
    assert_close(out, ref, 0.0)
    _assert_slice_only(buf, out)


@pytest.mark.parametrize(("shape", "dtype", "sliced_in", "sliced_out"), CASES)
def test_copy(shape, dtype, sliced_in, sliced_out):
    torch.manual_seed(3)
    x = _nhwc(shape, dtype, sliced_in)[1]
    buf, out = _output(shape, dtype, sliced_out)
    copy_nhwc(out, x)
    assert_close(out, x.double(), 0.0)
    _assert_slice_only(buf, out)


def _x(c=8, dtype=F16):
    return torch.randn(2, 3, 4, c, device=DEVICE).to(dtype)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        pytest.param(
            lambda: add_nhwc(_x(), _x(), _x(7)), r"b: shape \(2, 3, 4, 7\), expected \(2, 3, 4, 8\)", id="shape"
        ),
        pytest.param(lambda: add_nhwc(_x(dtype=F32), _x(), _x()), "out: dtype torch.float32", id="dtype"),
        pytest.param(lambda: add_nhwc(_x(), _x(16)[..., ::2], _x()), "a: last-dimension stride 2", id="stride"),
        pytest.param(lambda: add_nhwc(_x()[0], _x()[0], _x()[0]), r"a: shape \(3, 4, 8\)", id="3d"),
        pytest.param(
            lambda: upsample_nearest_nhwc(_x(), _x(), 2),
            r"out: shape \(2, 3, 4, 8\), expected \(2, 6, 8, 8\)",
            id="up_shape",
        ),
        pytest.param(lambda: upsample_nearest_nhwc(_x(), _x(), 0), "factor: expected a positive int", id="factor"),
        pytest.param(
            lambda: copy_nhwc(_x(), _x().transpose(1, 3).contiguous().transpose(1, 3)),
            "x: last-dimension",
            id="copy_stride",
        ),
        pytest.param(lambda: copy_nhwc(_x(dtype=F32), _x()), "out: dtype", id="copy_dtype"),
    ],
)
def test_launchers_reject_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
