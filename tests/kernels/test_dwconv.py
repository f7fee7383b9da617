"""dwconv2d_nhwc against a float64 F.conv2d(groups=C) reference, on odd shapes and strided channel-slice views."""

import os
from dataclasses import dataclass

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.nn.functional as F
from kernel_checks import assert_close

from yolojet.kernels.dwconv import DwConvTile, default_dwconv_tile, dwconv2d_nhwc, dwconv_candidate_tiles

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float16: 1e-2, torch.float32: 1e-4}
SENTINEL = 7.0
REFERENCE_ACTIVATIONS = {"identity": lambda t: t, "silu": F.silu, "relu": F.relu, "sigmoid": torch.sigmoid}
F16, F32 = torch.float16, torch.float32


@dataclass(frozen=True)
class Case:
    batch: int
    h: int
    w: int
    c: int
    kernel: tuple[int, int] = (3, 3)
    stride: int = 1
    padding: int = 1
    activation: str = "silu"
    residual: bool = False
    sliced: bool = False  # input, output, residual and weight are channel (and spatial) slices of wider buffers
    dtype: torch.dtype = F16
    fp32_weight: bool = False  # the weight in fp32, as the engine packs it, whatever x's dtype


CASES = {
    "head_dw_c5": Case(1, 7, 5, 5),
    "head_dw_c13_b3_sliced_fp32": Case(3, 9, 9, 13, sliced=True, dtype=F32),
    "psa_pe_residual_sliced_fp32_weight": Case(
        1, 9, 9, 40, activation="identity", residual=True, sliced=True, fp32_weight=True
    ),
    "psa_pe_residual_fp32": Case(3, 7, 5, 13, activation="identity", residual=True, dtype=F32),
    "stride2_pad1_b3_fp32_weight": Case(3, 9, 9, 40, stride=2, fp32_weight=True),
    "stride2_pad0_relu_fp32": Case(1, 9, 9, 13, stride=2, padding=0, activation="relu", dtype=F32),
    "5x5_stride2_pad2_sigmoid_sliced": Case(
        3, 7, 5, 13, kernel=(5, 5), stride=2, padding=2, activation="sigmoid", sliced=True
    ),
    "1x3_pad0_fp32": Case(1, 7, 5, 40, kernel=(1, 3), padding=0, dtype=F32),
    "1x1_residual_sliced_fp32": Case(3, 7, 5, 5, kernel=(1, 1), padding=0, residual=True, sliced=True, dtype=F32),
}


def _nhwc(shape, dtype, sliced, fill=None):
    """A random (or filled) NHWC tensor; when sliced, a view into a larger buffer with odd H/W/C offsets."""
    n, h, w, c = shape
    full = (n, h + 2, w + 3, c + 6) if sliced else shape
    buf = torch.randn(full, dtype=torch.float64) if fill is None else torch.full(full, fill, dtype=torch.float64)
    buf = buf.to(device=DEVICE, dtype=dtype)
    view = buf[:, 1 : h + 1, 2 : w + 2, 2 : c + 2] if sliced else buf
    return buf, view


def _residual(shape, dtype):
    """A residual view whose strides differ from every output view's here, so a kernel reading it through the
    output's strides reads the wrong values."""
    n, h, w, c = shape
    buf = torch.randn(n, h + 3, w + 1, c + 10, dtype=torch.float64).to(device=DEVICE, dtype=dtype)
    return buf[:, 2 : h + 2, 1 : w + 1, 5 : c + 5]


def _reference_and_inputs(case: Case):
    kh, kw = case.kernel
    x = _nhwc((case.batch, case.h, case.w, case.c), case.dtype, case.sliced)[1]
    # Tap-major (kh, kw, C), as the kernel reads it; sliced, its tap strides are not kw·C and C.
    w_buf = torch.randn(kh, kw + 2, case.c + 3, dtype=torch.float64) / (kh * kw) ** 0.5
    w_buf = w_buf.to(DEVICE, F32 if case.fp32_weight else case.dtype)
    weight = w_buf[:, 1 : kw + 1, 2 : case.c + 2] if case.sliced else w_buf[:, :kw, : case.c].contiguous()
    bias = torch.randn(case.c, device=DEVICE)
    ref = F.conv2d(
        x.double().permute(0, 3, 1, 2),
        weight.double().permute(2, 0, 1)[:, None],
        bias.double(),
        case.stride,
        case.padding,
        groups=case.c,
    )
    ref = REFERENCE_ACTIVATIONS[case.activation](ref).permute(0, 2, 3, 1)
    residual = _residual(ref.shape, case.dtype) if case.residual else None
    if residual is not None:
        ref = ref + residual.double()
    return ref, x, weight, bias, residual


@pytest.mark.parametrize("name", list(CASES))
def test_dwconv_matches_reference(name):
    case = CASES[name]
    torch.manual_seed(list(CASES).index(name))
    _check_tile(case, *_reference_and_inputs(case), tile=None)


def _check_tile(case, ref, x, weight, bias, residual, tile):
    """dwconv2d_nhwc with `tile` (None: the default) into a NaN-poisoned output slice matches `ref` and writes
    nothing outside the slice."""
    out_buf, out = _nhwc(ref.shape, case.dtype, case.sliced, fill=SENTINEL)
    out.fill_(float("nan"))
    dwconv2d_nhwc(
        out,
        x,
        weight,
        bias,
        stride=case.stride,
        padding=case.padding,
        activation=case.activation,
        residual=residual,
        tile=tile,
    )
    assert_close(out, ref, TOLERANCE[case.dtype])
    out.fill_(SENTINEL)
    assert bool((out_buf == SENTINEL).all()), f"dwconv with {tile} wrote outside its output slice"


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Case(2, 9, 7, 80, sliced=True, fp32_weight=True), id="c80_in_blocks_of_16_64_128_sliced"),
        pytest.param(Case(1, 11, 9, 13, stride=2, activation="identity", residual=True), id="c13_stride2_residual"),
    ],
)
def test_every_candidate_tile_matches_reference(case):
    """The tiles tuning may pick: channel blocks that divide the channels, overhang them, or hold them all."""
    torch.manual_seed(case.c)
    inputs = _reference_and_inputs(case)
    tiles = dwconv_candidate_tiles(case.c)
    assert tiles and default_dwconv_tile(case.c) in tiles
    for tile in tiles:
        _check_tile(case, *inputs, tile=tile)


# Row-walking tiles: bands that overhang the map's bottom, pixel blocks its right edge, padding 0 and 1, the
# residual, channel slices, fp32 (the launcher runs any tile it is given).
ROW_CASES = {
    "b3_bands_overhang_sliced": (Case(3, 11, 9, 40, sliced=True), DwConvTile(4, 16, 1, 4)),
    "psa_pe_residual_wide_tile": (Case(1, 9, 7, 13, activation="identity", residual=True), DwConvTile(16, 16, 4, 8)),
    "pad0_relu_fp32_sliced": (
        Case(2, 7, 12, 24, padding=0, activation="relu", sliced=True, dtype=F32),
        DwConvTile(8, 16, 2, 2),
    ),
    "one_row_bands": (Case(1, 5, 6, 8), DwConvTile(2, 8, 1, 1)),
}


@pytest.mark.parametrize("name", list(ROW_CASES))
def test_row_walking_tiles_match_reference(name):
    case, tile = ROW_CASES[name]
    torch.manual_seed(50 + list(ROW_CASES).index(name))
    _check_tile(case, *_reference_and_inputs(case), tile=tile)


def test_row_walking_tiles_are_offered_to_large_3x3_stride_1_layers_only():
    large = dwconv_candidate_tiles(256, walks_rows=True, pixels=64 * 80 * 80)
    assert [(t.block_p, t.block_c, t.rows) for t in large if t.rows] == [(16, 64, 8), (32, 64, 8)]
    assert not any(t.rows for t in dwconv_candidate_tiles(256, walks_rows=True, pixels=80 * 80))  # batch 1
    assert not any(t.rows for t in dwconv_candidate_tiles(256, walks_rows=False, pixels=64 * 80 * 80))
    assert dwconv_candidate_tiles(256, F32, walks_rows=True, pixels=64 * 80 * 80) == [default_dwconv_tile(256)]
    with pytest.raises(ValueError, match="walks rows of a 3x3 stride-1 conv"):
        dwconv2d_nhwc(
            _t(1, 3, 3, 8),
            _t(1, 6, 6, 8),
            _t(3, 3, 8),
            _t(8, dtype=F32),
            stride=2,
            padding=1,
            tile=DwConvTile(4, 8, 1, 2),
        )
    with pytest.raises(ValueError, match="rows must be >= 0"):
        DwConvTile(4, 8, 1, -1)


def test_candidate_tiles_fit_the_channels():
    assert {t.block_c for t in dwconv_candidate_tiles(80)} == {16, 64, 128}  # 16 divides 80 exactly
    assert {t.block_c for t in dwconv_candidate_tiles(256)} == {64, 128}
    assert {t.block_c for t in dwconv_candidate_tiles(5)} == {8}
    assert dwconv_candidate_tiles(80, F32) == [default_dwconv_tile(80)]
    with pytest.raises(ValueError, match="block_c must be a power of two"):
        DwConvTile(16, 48, 4)
    with pytest.raises(ValueError, match="num_warps"):
        DwConvTile(16, 64, 3)


def _t(*shape, dtype=F16):
    return torch.randn(*shape, device=DEVICE).to(dtype)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param(
            lambda: {"weight": _t(3, 3, 7)}, r"weight: shape \(3, 3, 7\), expected \(\?, \?, 8\)", id="weight_shape"
        ),
        pytest.param(
            lambda: {"weight": _t(3, 3, 8, dtype=torch.float64)},
            r"weight: dtype torch.float64, expected torch.float16 \(x's\) or torch.float32",
            id="weight_dtype",
        ),
        pytest.param(
            lambda: {"weight": _t(8, 3, 3).permute(1, 2, 0)}, "weight: last-dimension stride 9", id="weight_stride"
        ),
        pytest.param(lambda: {"bias": _t(8, dtype=F16)}, "bias: dtype torch.float16", id="bias_dtype"),
        pytest.param(lambda: {"out": _t(1, 5, 6, 8, dtype=F32)}, "out: dtype torch.float32", id="out_dtype"),
        pytest.param(
            lambda: {"out": _t(1, 3, 4, 8)}, r"out: shape \(1, 3, 4, 8\), expected \(1, 5, 6, 8\)", id="out_shape"
        ),
        pytest.param(lambda: {"x": _t(1, 8, 5, 6).permute(0, 2, 3, 1)}, "x: last-dimension stride", id="x_stride"),
        pytest.param(
            lambda: {"residual": _t(1, 5, 6, 16)[..., ::2]}, "residual: last-dimension stride", id="residual_stride"
        ),
        pytest.param(lambda: {"activation": "gelu"}, "activation: expected one of", id="activation"),
        pytest.param(lambda: {"stride": 0}, "stride/padding", id="stride"),
        pytest.param(lambda: {"padding": 0, "x": _t(1, 2, 2, 8)}, "kernel does not fit", id="too_small"),
    ],
)
def test_launcher_rejects_bad_arguments(changes, message):
    args = {"out": _t(1, 5, 6, 8), "x": _t(1, 5, 6, 8), "weight": _t(3, 3, 8), "bias": _t(8, dtype=F32), "padding": 1}
    args.update(changes())
    with pytest.raises(ValueError, match=message):
        dwconv2d_nhwc(args.pop("out"), args.pop("x"), args.pop("weight"), args.pop("bias"), **args)
