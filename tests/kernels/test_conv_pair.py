"""conv_pair_nhwc (two 3x3 convs in one launch) against a float64 torch reference, on odd shapes, channel-slice views
and every tile offered. Without CUDA the kernel runs under Triton's interpreter on small maps."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.nn.functional as F
from kernel_checks import assert_close

from yolojet.kernels.conv.pair import (
    MAX_PAIR_CHANNELS,
    ConvPairTile,
    conv_pair_candidate_tiles,
    conv_pair_nhwc,
    conv_pair_scratch_elements,
    default_conv_pair_tile,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float16: 1e-2, torch.float32: 1e-4}
ACTIVATIONS = {"identity": lambda t: t, "silu": F.silu, "relu": F.relu, "sigmoid": torch.sigmoid}


def _pair_case(batch, h, w, c_in, c_mid, c_out, dtype, seed):
    """x as a channel slice of a wider buffer (C3k's inputs are split halves), out as a concat's slice (its other
    channels poisoned with NaN, which must stay), weights packed (C_out, 3, 3, C_in)."""
    g = torch.Generator().manual_seed(seed)
    xbuf = torch.randn(batch, h, w, c_in + 24, generator=g).to(dtype).to(DEVICE)
    x = xbuf[..., 8 : 8 + c_in]
    obuf = torch.full((batch, h, w, c_out + 16), float("nan"), dtype=dtype, device=DEVICE)
    out = obuf[..., 16:]
    w1 = (torch.randn(c_mid, 3, 3, c_in, generator=g) / (3 * c_in**0.5)).to(dtype).to(DEVICE)
    w2 = (torch.randn(c_out, 3, 3, c_mid, generator=g) / (3 * c_mid**0.5)).to(dtype).to(DEVICE)
    b1 = (torch.randn(c_mid, generator=g) * 0.1).to(DEVICE)
    b2 = (torch.randn(c_out, generator=g) * 0.1).to(DEVICE)
    return x, obuf, out, w1, b1, w2, b2


def _reference(x, w1, b1, w2, b2, act1, act2, residual):
    """Float64, the hidden map rounded to the activation dtype as the two-launch path stores it in the arena."""
    xr = x.permute(0, 3, 1, 2).double()
    hidden = ACTIVATIONS[act1](F.conv2d(xr, w1.permute(0, 3, 1, 2).double(), b1.double(), padding=1))
    hidden = hidden.to(x.dtype).double()
    out = ACTIVATIONS[act2](F.conv2d(hidden, w2.permute(0, 3, 1, 2).double(), b2.double(), padding=1))
    if residual is not None:
        out = out + residual.permute(0, 3, 1, 2).double()
    return out.permute(0, 2, 3, 1)


def _scratch(tile, x, c_mid, c_out):
    batch, h, w, _ = x.shape
    elements = conv_pair_scratch_elements(tile, batch, h, w, c_mid, c_out)
    return torch.full((elements,), float("nan"), dtype=x.dtype, device=DEVICE)


CASES = [
    # batch, h, w, c_in, c_mid, c_out, dtype, act1, act2, residual, tile
    (1, 5, 6, 32, 32, 32, torch.float16, "silu", "silu", True, None),  # C3k's bottleneck, one program a map
    (2, 7, 9, 24, 16, 24, torch.float16, "silu", "silu", True, ConvPairTile(4, 8, 4)),  # patches cut by the edges
    (1, 6, 5, 80, 16, 16, torch.float16, "silu", "relu", False, ConvPairTile(2, 4, 4)),  # K over two blocks
    (2, 4, 4, 16, 64, 48, torch.float32, "identity", "sigmoid", False, ConvPairTile(3, 2, 2)),
    (1, 3, 3, 8, 8, 8, torch.float32, "silu", "silu", True, ConvPairTile(1, 1, 1)),  # channels below a dot side
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-{c[4]}-{c[5]}-{c[6]}-{c[10]}")
def test_pair_matches_two_convs_in_float64(case):
    batch, h, w, c_in, c_mid, c_out, dtype, act1, act2, has_residual, tile = case
    x, obuf, out, w1, b1, w2, b2 = _pair_case(batch, h, w, c_in, c_mid, c_out, dtype, seed=h * w + c_in)
    residual = x[..., :c_out] if has_residual and c_in >= c_out else None
    if has_residual and residual is None:
        residual = torch.randn(batch, h, w, c_out).to(dtype).to(DEVICE)
    used = tile or default_conv_pair_tile(h, w)
    conv_pair_nhwc(out, x, w1, b1, w2, b2, scratch=_scratch(used, x, c_mid, c_out), activation1=act1,
                   activation2=act2, residual=residual, tile=tile)  # fmt: skip
    assert_close(out, _reference(x, w1, b1, w2, b2, act1, act2, residual), TOLERANCE[dtype])
    assert obuf[..., :16].isnan().all(), "the pair wrote outside its output slice"


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_a_1x1_conv_after_the_pair_in_the_same_launch(dtype):
    """A detect head's box branch: 3x3 -> 3x3 -> 1x1 in one launch, patches cut by the map's edges, a residual on the
    last conv; the pair's result rounded to the activation dtype before the 1x1 conv, as the arena would hold it."""
    x, _, _, w1, b1, w2, b2 = _pair_case(2, 7, 9, 24, 32, 48, dtype, seed=17)
    g = torch.Generator().manual_seed(18)
    w3 = (torch.randn(40, 1, 1, 48, generator=g) / 48**0.5).to(dtype).to(DEVICE)
    b3 = (torch.randn(40, generator=g) * 0.1).to(DEVICE)
    residual = torch.randn(2, 7, 9, 40, generator=g).to(dtype).to(DEVICE)
    obuf = torch.full((2, 7, 9, 56), float("nan"), dtype=dtype, device=DEVICE)
    out = obuf[..., 8:48]
    tile = ConvPairTile(4, 8, 4)
    conv_pair_nhwc(out, x, w1, b1, w2, b2, scratch=_scratch(tile, x, 32, 48), weight3=w3, bias3=b3,
                   activation3="identity", residual=residual, tile=tile)  # fmt: skip
    pair_out = _reference(x, w1, b1, w2, b2, "silu", "silu", None).to(dtype).double()
    expected = F.conv2d(pair_out.permute(0, 3, 1, 2), w3.permute(0, 3, 1, 2).double(), b3.double())
    expected = expected.permute(0, 2, 3, 1) + residual.double()
    assert_close(out, expected, TOLERANCE[dtype])
    assert obuf[..., :8].isnan().all() and obuf[..., 48:].isnan().all(), "the pair wrote outside its output slice"


def test_every_offered_tile_gives_the_same_map():
    """The tiles the autotuner times on a GPU (under the interpreter it offers one): every one computes the pair."""
    x, _, out, w1, b1, w2, b2 = _pair_case(1, 6, 10, 16, 16, 16, torch.float16, seed=3)
    expected = _reference(x, w1, b1, w2, b2, "silu", "silu", x)
    for tile in {*conv_pair_candidate_tiles(6, 10), ConvPairTile(4, 8, 4), ConvPairTile(2, 8, 4)}:
        out.fill_(float("nan"))
        conv_pair_nhwc(out, x, w1, b1, w2, b2, scratch=_scratch(tile, x, 16, 16), residual=x, tile=tile)
        assert_close(out, expected, TOLERANCE[torch.float16])


def test_bad_arguments_are_named():
    x, _, out, w1, b1, w2, b2 = _pair_case(1, 4, 4, 16, 16, 16, torch.float16, seed=5)
    tile = ConvPairTile(2, 2, 4)
    scratch = _scratch(tile, x, 16, 16)
    with pytest.raises(ValueError, match="scratch must be"):
        conv_pair_nhwc(out, x, w1, b1, w2, b2, scratch=scratch[:-1], tile=tile)
    wide = MAX_PAIR_CHANNELS + 16
    with pytest.raises(ValueError, match=f"at most {MAX_PAIR_CHANNELS}"):
        conv_pair_nhwc(torch.empty(1, 4, 4, wide, dtype=x.dtype, device=DEVICE), x, w1, b1,
                       torch.zeros(wide, 3, 3, 16, dtype=x.dtype, device=DEVICE), torch.zeros(wide, device=DEVICE),
                       scratch=scratch, tile=tile)  # fmt: skip
    with pytest.raises(ValueError, match="weight2"):
        conv_pair_nhwc(out, x, w1, b1, w2[:, :2], b2, scratch=scratch, tile=tile)
    with pytest.raises(ValueError, match="activation2"):
        conv_pair_nhwc(out, x, w1, b1, w2, b2, scratch=scratch, tile=tile, activation2="gelu")
    with pytest.raises(ValueError, match="tile sides"):
        ConvPairTile(0, 4, 4)
