"""separable_conv_nhwc (a depthwise conv and the 1x1 conv reading it, one launch) against a float64 torch reference,
on odd shapes, strides, channel-slice views and every tile offered. Without CUDA it runs under Triton's interpreter."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.nn.functional as F
from kernel_checks import assert_close

from yolojet.kernels.conv.epilogue import MAX_THEN_1X1_CHANNELS
from yolojet.kernels.conv.separable import (
    SeparableTile,
    separable_candidate_tiles,
    separable_conv_nhwc,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float16: 1e-2, torch.float32: 1e-4}
ACTIVATIONS = {"identity": lambda t: t, "silu": F.silu, "relu": F.relu, "sigmoid": torch.sigmoid}


def _case(batch, h, w, channels, c_out, kernel, dtype, seed):
    """x as a channel slice of a wider buffer, out as a slice of a NaN-poisoned one, weights as lowering packs them:
    depthwise (C, k, k), pointwise (C_out, 1, 1, C)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, h, w, channels + 16, generator=g).to(dtype).to(DEVICE)[..., 8 : 8 + channels]
    depthwise = (torch.randn(channels, kernel, kernel, generator=g) / kernel).to(dtype).to(DEVICE)
    pointwise = (torch.randn(c_out, 1, 1, channels, generator=g) / channels**0.5).to(dtype).to(DEVICE)
    biases = (torch.randn(channels, generator=g) * 0.1).to(DEVICE), (torch.randn(c_out, generator=g) * 0.1).to(DEVICE)
    return x, depthwise, pointwise, biases


def _reference(x, depthwise, pointwise, biases, stride, padding, act1, act2, residual):
    """Float64, the depthwise map rounded to x's dtype as the arena holds it between two launches."""
    xr = x.permute(0, 3, 1, 2).double()
    hidden = F.conv2d(xr, depthwise[:, None].double(), biases[0].double(), stride, padding, groups=x.shape[3])
    hidden = ACTIVATIONS[act1](hidden).to(x.dtype).double()
    out = ACTIVATIONS[act2](F.conv2d(hidden, pointwise.permute(0, 3, 1, 2).double(), biases[1].double()))
    if residual is not None:
        out = out + residual.permute(0, 3, 1, 2).double()
    return out.permute(0, 2, 3, 1)


def _second_1x1(first_out, pointwise2, bias2, act3, residual):
    """A second 1x1 conv after `_reference`'s result (computed without the residual), rounded as the arena holds it."""
    hidden = first_out.permute(0, 3, 1, 2).to(pointwise2.dtype).double()
    out = ACTIVATIONS[act3](F.conv2d(hidden, pointwise2.permute(0, 3, 1, 2).double(), bias2.double()))
    if residual is not None:
        out = out + residual.permute(0, 3, 1, 2).double()
    return out.permute(0, 2, 3, 1)


CASES = [
    # batch, h, w, channels, c_out, kernel, stride, padding, dtype, act1, act2, residual, tile
    (1, 6, 7, 80, 80, 3, 1, 1, torch.float16, "silu", "silu", False, None),  # the YOLO11 head's class branch
    (2, 5, 9, 48, 24, 3, 1, 1, torch.float16, "silu", "identity", True, SeparableTile(16, 16, 16, 4)),  # N blocks
    (1, 9, 8, 24, 40, 3, 2, 1, torch.float32, "relu", "sigmoid", False, SeparableTile(16, 64, 16, 2)),  # stride 2
    (1, 7, 7, 16, 16, 5, 1, 2, torch.float32, "identity", "silu", True, None),  # 5x5
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-{c[4]}-k{c[5]}s{c[6]}-{c[8]}")
def test_separable_conv_matches_its_two_convs_in_float64(case):
    batch, h, w, channels, c_out, kernel, stride, padding, dtype, act1, act2, has_residual, tile = case
    x, depthwise, pointwise, biases = _case(batch, h, w, channels, c_out, kernel, dtype, seed=h * w + channels)
    oh, ow = (h + 2 * padding - kernel) // stride + 1, (w + 2 * padding - kernel) // stride + 1
    obuf = torch.full((batch, oh, ow, c_out + 8), float("nan"), dtype=dtype, device=DEVICE)
    out = obuf[..., 8:]
    residual = torch.randn(batch, oh, ow, c_out).to(dtype).to(DEVICE) if has_residual else None
    separable_conv_nhwc(out, x, depthwise, biases[0], pointwise, biases[1], stride=stride, padding=padding,
                        activation1=act1, activation2=act2, residual=residual, tile=tile)  # fmt: skip
    expected = _reference(x, depthwise, pointwise, biases, stride, padding, act1, act2, residual)
    assert_close(out, expected, TOLERANCE[dtype])
    assert obuf[..., :8].isnan().all(), "the launch wrote outside its output slice"


CHAINS = [
    # batch, h, w, channels, c_out, c_out2, dtype, residual, tile
    (2, 6, 7, 64, 80, 80, torch.float16, False, None),  # the YOLO11 head's class branch: DWConv, Conv, Conv2d
    (1, 5, 4, 32, 48, 24, torch.float32, True, SeparableTile(16, 64, 16, 2)),
]


@pytest.mark.parametrize("case", CHAINS, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-{c[4]}-{c[5]}-{c[6]}")
def test_a_second_1x1_conv_in_the_same_launch(case):
    batch, h, w, channels, c_out, c_out2, dtype, has_residual, tile = case
    x, depthwise, pointwise, biases = _case(batch, h, w, channels, c_out, 3, dtype, seed=c_out2 + h)
    g = torch.Generator().manual_seed(c_out2)
    pointwise2 = (torch.randn(c_out2, 1, 1, c_out, generator=g) / c_out**0.5).to(dtype).to(DEVICE)
    bias2 = (torch.randn(c_out2, generator=g) * 0.1).to(DEVICE)
    residual = torch.randn(batch, h, w, c_out2).to(dtype).to(DEVICE) if has_residual else None
    obuf = torch.full((batch, h, w, c_out2 + 8), float("nan"), dtype=dtype, device=DEVICE)
    out = obuf[..., :c_out2]
    separable_conv_nhwc(out, x, depthwise, biases[0], pointwise, biases[1], pointwise2=pointwise2,
                        pointwise2_bias=bias2, activation3="identity", residual=residual, tile=tile)  # fmt: skip
    first = _reference(x, depthwise, pointwise, biases, 1, 1, "silu", "silu", None)
    assert_close(out, _second_1x1(first, pointwise2, bias2, "identity", residual), TOLERANCE[dtype])
    assert obuf[..., c_out2:].isnan().all(), "the launch wrote outside its output slice"


def test_every_offered_tile_gives_the_same_map():
    x, depthwise, pointwise, biases = _case(1, 4, 6, 80, 80, 3, torch.float16, seed=11)
    expected = _reference(x, depthwise, pointwise, biases, 1, 1, "silu", "silu", None)
    offered = separable_candidate_tiles(80, 80)
    for tile in {*offered, SeparableTile(64, 128, 16, 4), SeparableTile(32, 128, 32, 4)}:
        out = torch.full((1, 4, 6, 80), float("nan"), dtype=torch.float16, device=DEVICE)
        separable_conv_nhwc(out, x, depthwise, biases[0], pointwise, biases[1], tile=tile)
        assert_close(out, expected, TOLERANCE[torch.float16])


def test_bad_arguments_are_named():
    x, depthwise, pointwise, biases = _case(1, 4, 4, 16, 16, 3, torch.float16, seed=2)
    out = torch.empty(1, 4, 4, 16, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="pointwise"):
        separable_conv_nhwc(out, x, depthwise, biases[0], pointwise[..., :8], biases[1])
    with pytest.raises(ValueError, match="square"):
        separable_conv_nhwc(out, x, depthwise[:, :2], biases[0], pointwise, biases[1])
    with pytest.raises(ValueError, match=r"^out: shape \(1, 4, 4, 16\), expected \(1, 2, 2, 16\)"):
        separable_conv_nhwc(out, x, depthwise, biases[0], pointwise, biases[1], stride=2)
    with pytest.raises(ValueError, match="activation1"):
        separable_conv_nhwc(out, x, depthwise, biases[0], pointwise, biases[1], activation1="gelu")
    with pytest.raises(ValueError, match="power of two"):
        SeparableTile(48, 16, 16, 4)
    wide = MAX_THEN_1X1_CHANNELS + 16
    pointwise2 = torch.zeros(wide, 1, 1, 16, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match=f"at most {MAX_THEN_1X1_CHANNELS}"):
        separable_conv_nhwc(torch.empty(1, 4, 4, wide, dtype=torch.float16, device=DEVICE), x, depthwise, biases[0],
                            pointwise, biases[1], pointwise2=pointwise2,
                            pointwise2_bias=torch.zeros(wide, device=DEVICE))  # fmt: skip
    first_wide = torch.zeros(32, 1, 1, 16, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="block_n"):  # one program must hold the first 1x1 conv's 32 channels
        separable_conv_nhwc(out, x, depthwise, biases[0], first_wide, torch.zeros(32, device=DEVICE),
                            pointwise2=torch.zeros(16, 1, 1, 32, dtype=torch.float16, device=DEVICE),
                            pointwise2_bias=biases[1], tile=SeparableTile(16, 16, 16, 4))  # fmt: skip
