"""conv2d_nhwc against a float64 torch reference, on odd shapes and strided channel-slice views.

Without CUDA the kernels run under Triton's interpreter on small maps; on a GPU the same cases run compiled on
maps SPATIAL times larger.
"""

import ast
import builtins
import importlib
import inspect
import os
import textwrap
from dataclasses import dataclass, replace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.nn.functional as F
from kernel_checks import assert_close
from support import random_model
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

import yolojet.kernels.conv.dispatch as conv_dispatch
from yolojet.engine.lowering import PackedWeights, _lower_conv_transpose
from yolojet.export.walker import export_graph
from yolojet.kernels.conv import (
    ConvConfig,
    ConvKind,
    conv2d_nhwc,
    conv_candidate_configs,
    pixels_are_words,
    tma_loadable,
    tma_patch_loadable,
    tma_storable,
    two_input_candidates,
    untimed_gpu_config,
)
from yolojet.reference.executor import OPS as REFERENCE_OPS

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SPATIAL = 4 if DEVICE == "cuda" else 1
TOLERANCE = {torch.float16: 1e-2, torch.float32: 1e-4}
SENTINEL = 7.0
REFERENCE_ACTIVATIONS = {"identity": lambda t: t, "silu": F.silu, "relu": F.relu, "sigmoid": torch.sigmoid}
F16, F32 = torch.float16, torch.float32
SMALL_TILES = ConvConfig(16, 16, 16, 1, 1)  # forces several M, N and K tiles even on tiny maps


@dataclass(frozen=True)
class Case:
    batch: int
    h: int
    w: int
    c_in: int
    c_out: int
    kernel: int | tuple[int, int]
    stride: int | tuple[int, int] = 1
    padding: int | tuple[int, int] = 0
    dilation: int | tuple[int, int] = 1
    upsample: int = 1
    activation: str = "silu"
    residual: bool = False
    sliced: bool = False  # input, output and residual are channel (and spatial) slices of wider buffers
    dense_input: bool = False  # with `sliced`, the input keeps all its channels (as tap rows need), cropped spatially
    dtype: torch.dtype = F16
    config: ConvConfig | None = None


CASES = {
    "stem_c3_s2": Case(1, 9, 7, 3, 16, 3, stride=2, padding=1),
    "c3_b3_fp32": Case(3, 9, 7, 3, 7, 3, padding=1, dtype=F32),
    "1x1_identity": Case(1, 9, 7, 16, 33, 1, activation="identity"),
    "1x1_residual_fp32": Case(3, 5, 6, 40, 16, 1, residual=True, dtype=F32),
    "1x1_stride2_relu": Case(1, 9, 7, 5, 7, 1, stride=2, activation="relu"),
    "1x1_upsample_sliced": Case(3, 5, 6, 16, 16, 1, upsample=2, sliced=True),
    "1x1_pad1_fp32": Case(1, 5, 6, 40, 33, 1, padding=1, activation="identity", dtype=F32),
    "1x1_small_tiles_sliced_residual": Case(3, 5, 6, 40, 33, 1, residual=True, sliced=True, config=SMALL_TILES),
    "3x3_sliced_small_tiles": Case(3, 9, 7, 40, 33, 3, padding=1, sliced=True, config=SMALL_TILES),
    "3x3_small_tiles_fp32": Case(1, 9, 7, 40, 33, 3, padding=1, dtype=F32, config=SMALL_TILES),
    "3x3_bottleneck_residual": Case(1, 9, 7, 16, 16, 3, padding=1, residual=True),
    "3x3_stride2_relu_fp32": Case(3, 9, 7, 16, 33, 3, stride=2, padding=1, activation="relu", dtype=F32),
    "3x3_pad0_identity_fp32": Case(1, 9, 7, 5, 7, 3, activation="identity", dtype=F32),
    "3x3_stride2_pad0": Case(1, 9, 7, 13, 7, 3, stride=2),
    "3x3_c5_b3": Case(3, 5, 6, 5, 33, 3, padding=1),
    "3x3_upsample2": Case(1, 5, 6, 16, 7, 3, padding=1, upsample=2),
    "3x3_upsample2_stride2_residual_fp32": Case(
        3, 5, 6, 5, 16, 3, stride=2, padding=1, upsample=2, activation="identity", residual=True, dtype=F32
    ),
    "3x3_upsample3": Case(1, 5, 6, 13, 7, 3, padding=1, upsample=3),
    "3x3_dilation2": Case(1, 9, 7, 16, 16, 3, padding=2, dilation=2, dtype=F32),
    "3x3_stride_pad_pairs": Case(3, 9, 7, 5, 16, 3, stride=(2, 1), padding=(1, 0)),
    "1x3_kernel_fp32": Case(1, 9, 7, 13, 7, (1, 3), padding=(0, 1), dtype=F32),
    "3x3_sigmoid_sliced_fp32": Case(1, 9, 7, 16, 7, 3, padding=1, activation="sigmoid", sliced=True, dtype=F32),
    "3x3_residual_sliced_fp32": Case(3, 5, 6, 40, 16, 3, padding=1, residual=True, sliced=True, dtype=F32),
    "3x3_c40_c33": Case(3, 9, 7, 40, 33, 3, padding=1),
    "3x3_c5_sliced_residual_dilation": Case(3, 9, 7, 5, 16, 3, padding=2, dilation=2, residual=True, sliced=True),
    "3x3_c3_upsample_fp32": Case(1, 5, 6, 3, 7, 3, padding=1, upsample=2, dtype=F32),
    # The FMA kernel for few input channels.
    "direct_stem_c3_s2": Case(
        1, 9, 7, 3, 16, 3, stride=2, padding=1, config=ConvConfig(64, 16, 16, 2, 1, ConvKind.DIRECT)
    ),
    "direct_c8_residual_sliced": Case(
        3, 9, 7, 8, 16, 3, padding=1, residual=True, sliced=True, config=ConvConfig(32, 16, 16, 2, 1, ConvKind.DIRECT)
    ),
    "direct_c5_c33_upsample_dilation_fp32": Case(
        1,
        5,
        6,
        5,
        33,
        3,
        padding=2,
        dilation=2,
        upsample=2,
        dtype=F32,
        config=ConvConfig(64, 16, 16, 4, 1, ConvKind.DIRECT),
    ),
    "direct_1x3_stride_pairs": Case(
        3, 9, 7, 4, 7, (1, 3), stride=(2, 1), padding=(0, 1), config=ConvConfig(16, 16, 16, 1, 1, ConvKind.DIRECT)
    ),
    # Taps packed into K on tensor cores, for few input channels feeding many outputs; 16- and 64-deep K tiles
    # walk several K steps, a 32-deep one takes the stem's 27 at once.
    "packed_stem_c3_s2": Case(
        1, 9, 7, 3, 33, 3, stride=2, padding=1, config=ConvConfig(64, 64, 32, 4, 2, ConvKind.PACKED)
    ),
    "packed_c8_upsample_residual_sliced": Case(
        3,
        5,
        6,
        8,
        33,
        3,
        padding=1,
        upsample=2,
        residual=True,
        sliced=True,
        config=ConvConfig(32, 32, 64, 2, 2, ConvKind.PACKED),
    ),
    "packed_c5_dilation_fp32": Case(
        1, 9, 7, 5, 16, 3, padding=2, dilation=2, dtype=F32, config=ConvConfig(16, 16, 16, 1, 1, ConvKind.PACKED)
    ),
    "packed_1x3_stride_pairs": Case(
        3, 9, 7, 4, 7, (1, 3), stride=(2, 1), padding=(0, 1), config=ConvConfig(16, 16, 16, 1, 1, ConvKind.PACKED)
    ),
    # Packed tiles over a power of two of channels walk whole taps a K step (the channel count a constant): several
    # taps a step, a tap split across steps, the last step's spare taps masked, strided and dilated.
    "packed_taps_c16_stride2_sliced": Case(
        3, 9, 7, 16, 33, 3, stride=2, padding=1, sliced=True, config=ConvConfig(32, 32, 64, 2, 2, ConvKind.PACKED)
    ),
    "packed_taps_c8_residual_dilation": Case(
        1, 9, 7, 8, 16, 3, padding=2, dilation=2, residual=True, config=ConvConfig(16, 16, 16, 1, 1, ConvKind.PACKED)
    ),
    "packed_taps_c16_one_step_fp32": Case(
        1, 5, 6, 16, 7, 3, padding=1, dtype=F32, config=ConvConfig(16, 16, 256, 1, 1, ConvKind.PACKED)
    ),
    "packed_taps_c32_half_a_tap_a_step": Case(
        1, 5, 6, 32, 16, (3, 1), padding=(1, 0), config=ConvConfig(16, 16, 16, 1, 1, ConvKind.PACKED)
    ),
    # Tap rows: a kernel row's neighbouring pixels one run of a dense input, the span past the kernel's width masked;
    # a bottleneck's cv2 into a slice with a residual, stride 2, stride and padding pairs, rows dilated, a 5x5 kernel.
    "tap_rows_c8_residual_sliced_output": Case(
        3,
        9,
        7,
        8,
        16,
        3,
        padding=1,
        residual=True,
        sliced=True,
        dense_input=True,
        config=ConvConfig(32, 16, 32, 2, 2, ConvKind.PACKED, tap_rows=True),
    ),
    "tap_rows_c16_stride2_fp32": Case(
        1,
        9,
        7,
        16,
        33,
        3,
        stride=2,
        padding=1,
        dtype=F32,
        config=ConvConfig(16, 32, 64, 1, 1, ConvKind.PACKED, tap_rows=True),
    ),
    "tap_rows_c4_1x3_stride_pairs": Case(
        3,
        9,
        7,
        4,
        7,
        (1, 3),
        stride=(2, 1),
        padding=(0, 1),
        config=ConvConfig(16, 16, 16, 1, 1, ConvKind.PACKED, tap_rows=True),
    ),
    "tap_rows_c8_rows_dilated_pad0": Case(
        1,
        9,
        7,
        8,
        16,
        3,
        padding=(2, 0),
        dilation=(2, 1),
        config=ConvConfig(16, 16, 32, 1, 1, ConvKind.PACKED, tap_rows=True),
    ),
    "tap_rows_c4_5x5": Case(
        2, 9, 7, 4, 16, 5, padding=2, config=ConvConfig(16, 16, 32, 1, 1, ConvKind.PACKED, tap_rows=True)
    ),
    # A tap's bounds are a bit of one int32 up to 31 taps, of an int64 up to 63, and compared a step past that.
    "7x7_gemm_49_taps": Case(1, 9, 7, 8, 16, 7, padding=3, config=ConvConfig(16, 16, 16, 1, 1)),
    "9x9_gemm_81_taps_stride_2": Case(1, 9, 7, 8, 16, 9, stride=2, padding=4, config=ConvConfig(16, 16, 16, 1, 1)),
    "3x3_deep_k_tile": Case(1, 5, 6, 80, 33, 3, padding=1, config=ConvConfig(32, 64, 128, 4, 3)),
    "3x3_16_row_tile_fp32": Case(
        1, 5, 6, 80, 33, 3, stride=2, padding=1, dtype=F32, config=ConvConfig(16, 64, 128, 2, 3)
    ),
}


def _nhwc(shape: tuple[int, int, int, int], dtype: torch.dtype, sliced: bool, fill: float | None = None):
    """A random (or filled) NHWC tensor; when sliced, a view into a larger buffer with odd H/W/C offsets."""
    n, h, w, c = shape
    full = (n, h + 2, w + 3, c + 6) if sliced else shape
    buf = torch.randn(full, dtype=torch.float64) if fill is None else torch.full(full, fill, dtype=torch.float64)
    buf = buf.to(device=DEVICE, dtype=dtype)
    view = buf[:, 1 : h + 1, 2 : w + 2, 2 : c + 2] if sliced else buf
    return buf, view


def _reference(case: Case, x, weight, bias, residual):
    x64 = x.double().permute(0, 3, 1, 2)
    if case.upsample > 1:
        x64 = F.interpolate(x64, scale_factor=case.upsample, mode="nearest")
    y = F.conv2d(x64, weight.double().permute(0, 3, 1, 2), bias.double(), case.stride, case.padding, case.dilation)
    y = REFERENCE_ACTIVATIONS[case.activation](y).permute(0, 2, 3, 1)
    return y if residual is None else y + residual.double()


def _make_case(case: Case, seed: int):
    torch.manual_seed(seed)
    kh, kw = (case.kernel, case.kernel) if isinstance(case.kernel, int) else case.kernel
    x_shape = (case.batch, case.h * SPATIAL, case.w * SPATIAL, case.c_in)
    if case.sliced and case.dense_input:  # a spatial crop keeping every channel: pixels dense, rows not W·C apart
        x_buf, _ = _nhwc((x_shape[0], x_shape[1] + 2, x_shape[2] + 3, x_shape[3]), case.dtype, False)
        x = x_buf[:, 1 : x_shape[1] + 1, 2 : x_shape[2] + 2]
    else:
        x_buf, x = _nhwc(x_shape, case.dtype, case.sliced)
    # fan-in scaling keeps fp16 outputs O(1), so the relative tolerance measures accumulation, not overflow
    weight = (torch.randn(case.c_out, kh, kw, case.c_in, dtype=torch.float64) / (kh * kw * case.c_in) ** 0.5).to(
        device=DEVICE, dtype=case.dtype
    )
    bias = torch.randn(case.c_out, dtype=torch.float32, device=DEVICE)
    return x_buf, x, weight, bias


@pytest.mark.parametrize("name", list(CASES))
def test_conv_matches_reference(name: str) -> None:
    case = CASES[name]
    _, x, weight, bias = _make_case(case, seed=list(CASES).index(name))
    shape = _reference(case, x, weight, bias, None).shape
    residual = _nhwc(shape, case.dtype, case.sliced)[1] if case.residual else None
    ref = _reference(case, x, weight, bias, residual)
    out_buf, out = _nhwc(shape, case.dtype, case.sliced, fill=SENTINEL)
    out.fill_(float("nan"))

    conv2d_nhwc(
        out,
        x,
        weight,
        bias,
        stride=case.stride,
        padding=case.padding,
        dilation=case.dilation,
        activation=case.activation,
        residual=residual,
        upsample=case.upsample,
        config=case.config,
    )

    assert_close(out, ref, TOLERANCE[case.dtype])
    if case.sliced:
        out.fill_(SENTINEL)
        assert bool((out_buf == SENTINEL).all()), "conv wrote outside its output slice"


@pytest.mark.parametrize("config", [ConvConfig(16, 16, 16, 1, 1), ConvConfig(16, 16, 32, 1, 1, ConvKind.PACKED)])
def test_the_input_and_output_divisors_hold_for_every_view_they_cover(config: ConvConfig) -> None:
    """The gathering kernel is told what divides x's strides and channels, and apart what divides out's and the
    residual's (8 for an 8-channel map, so its pixels load as whole vectors): x is 8 channels of a 24-wide buffer,
    out 16 of a 24-wide one, the residual 16 of a 20-wide one, which holds the output side's divisor to 4 (told 8,
    the kernel would read the residual at a 16-wide stride)."""
    case = Case(2, 9, 7, 8, 16, 3, padding=1, residual=True)
    torch.manual_seed(7)
    n, h, w = case.batch, case.h * SPATIAL, case.w * SPATIAL
    x = torch.randn(n, h, w, 24, device=DEVICE).half()[..., 8:16]
    weight = (torch.randn(16, 3, 3, 8, device=DEVICE) / 72**0.5).half()
    bias = torch.randn(16, device=DEVICE)
    residual = torch.randn(n, h, w, 20, device=DEVICE).half()[..., 4:]
    out_buf = torch.full((n, h, w, 24), SENTINEL, device=DEVICE).half()
    out = out_buf[..., 8:]
    out.fill_(float("nan"))
    conv2d_nhwc(out, x, weight, bias, padding=1, residual=residual, config=config)
    assert_close(out, _reference(case, x, weight, bias, residual), TOLERANCE[F16])
    assert bool((out_buf[..., :8] == SENTINEL).all()), "conv wrote outside its output slice"


@pytest.mark.filterwarnings("ignore:overflow encountered in exp2:RuntimeWarning")  # the interpreter's numpy, at -1e4
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_the_logistic_holds_from_minus_to_plus_ten_thousand(activation: str) -> None:
    """SiLU and the sigmoid through a 1x1 fp32 conv of identity weights (its GEMM passes x through exactly), on values
    from -1e4 to 1e4: within a few fp32 ulp, and at the limits where e^-x overflows or vanishes (0 and 1, or 0 and x).
    Compiled, the logistic is the flush-to-zero exp2 and reciprocal approximations; under the interpreter, a plain
    division."""
    values = [-1e4, -100.0, -88.7, -30.0, -5.0, -1.0, -1e-3, 0.0, 1e-3, 1.0, 5.0, 30.0, 88.7, 100.0, 1e4]
    x = torch.tensor(values, dtype=F32, device=DEVICE)[:, None].repeat(1, 16).reshape(1, 1, len(values), 16)
    out = torch.full_like(x, float("nan"))
    identity = torch.eye(16, dtype=F32, device=DEVICE).reshape(16, 1, 1, 16)
    conv2d_nhwc(out, x, identity, torch.zeros(16, device=DEVICE), activation=activation)
    expected = REFERENCE_ACTIVATIONS[activation](x.double())
    torch.testing.assert_close(out.double(), expected, rtol=4e-6, atol=1e-30)


def test_eight_channel_maps_are_told_their_divisor_of_8(monkeypatch) -> None:
    """yolo11n's narrow bottleneck convs (an 8-channel output, then an 8-channel input into a 48-wide buffer) are told
    8, not 1, which is what lets their pixels load and store as 16-byte vectors; the stem's 3 channels in rows of 4,
    1; 16-channel views, 16 (as Triton's JIT finds itself)."""
    told: list[tuple[int, int]] = []

    def recording(kernel, grid, pdl, compile_only=False):
        return lambda *args, **named: told.append((named["X_ALIGN"], named["OUT_ALIGN"]))

    monkeypatch.setattr(conv_dispatch, "network_launcher", recording)
    gemm = ConvConfig(16, 16, 16, 1, 1)
    wide = torch.empty(1, 6, 5, 48, dtype=F16, device=DEVICE)
    narrow = torch.empty(1, 6, 5, 8, dtype=F16, device=DEVICE)
    bias8, bias16 = torch.zeros(8, device=DEVICE), torch.zeros(16, device=DEVICE)
    cv1_weight = torch.empty(8, 3, 3, 16, dtype=F16, device=DEVICE)
    cv2_weight = torch.empty(16, 3, 3, 8, dtype=F16, device=DEVICE)
    conv2d_nhwc(narrow, wide[..., 16:32], cv1_weight, bias8, padding=1, config=gemm)
    conv2d_nhwc(wide[..., 32:], narrow, cv2_weight, bias16, padding=1, residual=wide[..., 16:32], config=gemm)
    stem, stem_weight = torch.empty(1, 6, 5, 4, dtype=F16, device=DEVICE)[..., :3], cv2_weight[..., :3].contiguous()
    conv2d_nhwc(wide[..., :16], stem, stem_weight, bias16, padding=1, config=gemm)
    assert told == [(16, 8), (8, 16), (1, 16)]


@pytest.mark.parametrize(("dtype", "c_in"), [(F16, 40), (F32, 40), (F16, 5), (F16, 16)])
def test_every_candidate_config_runs(dtype: torch.dtype, c_in: int) -> None:
    case = Case(3, 9, 7, c_in, 33, 3, padding=1, dtype=dtype)
    _, x, weight, bias = _make_case(case, seed=100)
    ref = _reference(case, x, weight, bias, None)
    m, k = ref.shape[0] * ref.shape[1] * ref.shape[2], 9 * case.c_in
    for config in conv_candidate_configs(m, case.c_out, k, kernel_is_1x1=False, dtype=dtype):
        out = torch.full(ref.shape, float("nan"), dtype=dtype, device=DEVICE)
        partials, arrivals = split_scratch(config, m, case.c_out)
        conv2d_nhwc(out, x, weight, bias, padding=1, config=config, partials=partials, arrivals=arrivals)
        assert_close(out, ref, TOLERANCE[dtype])


def split_scratch(config: ConvConfig, m: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-K scratch for one launch: partials poisoned with NaN (a partial read before it is written shows),
    arrival counts at zero."""
    elements, tiles = config.split_scratch(m, n)
    partials = torch.full((max(elements, 1),), float("nan"), dtype=torch.float32, device=DEVICE)
    return partials, torch.zeros(max(tiles, 1), dtype=torch.int32, device=DEVICE)


SPLIT_CASES = {
    # 1x1 and 3x3, splits that divide the K steps and ones that leave the last split short or empty, residual
    # and channel-slice views, fp16 and fp32.
    "1x1_split2": (Case(1, 5, 6, 80, 33, 1), ConvConfig(16, 32, 16, 2, 2, split_k=2)),
    "1x1_split3_uneven_residual_sliced": (
        Case(3, 5, 6, 80, 33, 1, residual=True, sliced=True),
        ConvConfig(32, 16, 16, 2, 2, split_k=3),
    ),
    "3x3_split4_fp32": (Case(1, 5, 6, 40, 16, 3, padding=1, dtype=F32), ConvConfig(16, 16, 16, 1, 1, split_k=4)),
    "3x3_split8_stride2_sliced": (
        Case(3, 9, 7, 20, 33, 3, stride=2, padding=1, sliced=True),
        ConvConfig(16, 32, 32, 2, 2, split_k=8),
    ),
    "3x3_split7_more_splits_than_steps": (Case(1, 5, 6, 5, 7, 3, padding=1), ConvConfig(16, 16, 16, 1, 1, split_k=7)),
}


@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_split_k_matches_reference_and_leaves_the_counts_at_zero(name: str) -> None:
    case, config = SPLIT_CASES[name]
    _, x, weight, bias = _make_case(case, seed=200 + list(SPLIT_CASES).index(name))
    shape = _reference(case, x, weight, bias, None).shape
    residual = _nhwc(shape, case.dtype, case.sliced)[1] if case.residual else None
    ref = _reference(case, x, weight, bias, residual)
    m = shape[0] * shape[1] * shape[2]
    partials, arrivals = split_scratch(config, m, case.c_out)
    for _ in range(2):  # the second launch relies on the first having reset its counts
        out_buf, out = _nhwc(shape, case.dtype, case.sliced, fill=SENTINEL)
        out.fill_(float("nan"))
        conv2d_nhwc(
            out,
            x,
            weight,
            bias,
            stride=case.stride,
            padding=case.padding,
            residual=residual,
            config=config,
            partials=partials,
            arrivals=arrivals,
        )
        assert_close(out, ref, TOLERANCE[case.dtype])
        assert int(arrivals.abs().sum()) == 0
        if case.sliced:
            out.fill_(SENTINEL)
            assert bool((out_buf == SENTINEL).all()), "conv wrote outside its output slice"


def test_split_k_needs_its_scratch() -> None:
    case = Case(1, 5, 6, 40, 16, 3, padding=1)
    _, x, weight, bias = _make_case(case, seed=0)
    out = torch.empty(1, 5 * SPATIAL, 6 * SPATIAL, 16, dtype=F16, device=DEVICE)
    config = ConvConfig(16, 16, 16, 1, 1, split_k=2)
    with pytest.raises(ValueError, match="split_k=2 needs partials"):
        conv2d_nhwc(out, x, weight, bias, padding=1, config=config)
    partials, _ = split_scratch(config, out.shape[1] * out.shape[2], 16)
    with pytest.raises(ValueError, match="needs arrivals"):
        conv2d_nhwc(out, x, weight, bias, padding=1, config=config, partials=partials)
    with pytest.raises(ValueError, match="split_k must be a positive int"):
        ConvConfig(16, 16, 16, 1, 1, split_k=0)


def test_direct_kernel_offered_only_for_few_input_channels() -> None:
    stem = conv_candidate_configs(320 * 320, 16, 27, kernel_is_1x1=False)
    assert (
        any(c.kind is ConvKind.DIRECT for c in stem)
        and untimed_gpu_config(320 * 320, 16, 27, False).kind is ConvKind.GEMM
    )
    assert not any(
        c.kind is ConvKind.DIRECT for c in conv_candidate_configs(160 * 160, 32, 9 * 16, kernel_is_1x1=False)
    )
    assert not any(c.kind is ConvKind.DIRECT for c in conv_candidate_configs(160 * 160, 32, 4, kernel_is_1x1=True))
    # A 2x2 kernel over 20 channels (K = 80) is not a 3x3 over 8 once the real channel count is given.
    assert not any(c.kind is ConvKind.DIRECT for c in conv_candidate_configs(400, 32, 80, kernel_is_1x1=False, c_in=20))
    with pytest.raises(ValueError, match="a direct tile has no split_k"):
        ConvConfig(64, 16, 16, 2, 1, ConvKind.DIRECT, split_k=2)


def test_packed_taps_offered_for_few_input_channels_and_many_outputs_or_whole_taps() -> None:
    wide_stem = conv_candidate_configs(64 * 320 * 320, 64, 27, kernel_is_1x1=False)
    packed = [c for c in wide_stem if c.kind is ConvKind.PACKED]
    assert packed and all(c.block_k == 32 and c.block_n == 64 for c in packed)
    assert untimed_gpu_config(64 * 320 * 320, 64, 27, False).kind is ConvKind.GEMM
    assert any(
        c.kind is ConvKind.PACKED and c.block_k == 128
        for c in conv_candidate_configs(6400, 32, 72, kernel_is_1x1=False)
    )
    assert not any(c.kind is ConvKind.PACKED for c in conv_candidate_configs(320 * 320, 16, 27, kernel_is_1x1=False))
    # 16 channels: whole taps a K step, for any output width; 8, 32 or 5 channels with few outputs, or more taps than
    # the kernel's bits (9x9), none.
    for c_out in (8, 32):
        offered = conv_candidate_configs(160 * 160, c_out, 9 * 16, kernel_is_1x1=False, c_in=16)
        assert [c.block_k for c in offered if c.kind is ConvKind.PACKED] == [64]
    for c_in, taps in ((8, 9), (32, 9), (5, 9), (16, 81)):
        offered = conv_candidate_configs(160 * 160, 16, taps * c_in, kernel_is_1x1=False, c_in=c_in)
        assert not any(c.kind is ConvKind.PACKED for c in offered)
    assert not any(c.kind is ConvKind.PACKED for c in conv_candidate_configs(160 * 160, 64, 4, kernel_is_1x1=True))
    with pytest.raises(ValueError, match="a packed tile has no split_k"):
        ConvConfig(64, 64, 32, 4, 2, ConvKind.PACKED, split_k=2)
    with pytest.raises(ValueError, match="kind must be one of"):
        ConvConfig(64, 64, 32, 4, 1, "packed_direct")  # type: ignore[arg-type]


WHOLE_PIXEL_CASES = {
    # (case, row width of the input buffer, config): rows of 4 as the engine's graph input (one word), 8 (two
    # words, or one word and padding), 16 (a channel slice, as C3k2's bottleneck inputs)
    "stem_c3_s2": (Case(1, 9, 7, 3, 16, 3, stride=2, padding=1), 4, ConvConfig(64, 16, 16, 2, 1, ConvKind.DIRECT)),
    "c4_b3_residual_upsample": (
        Case(3, 5, 6, 4, 33, 3, padding=1, upsample=2, residual=True),
        4,
        ConvConfig(32, 32, 16, 2, 1, ConvKind.DIRECT),
    ),
    "c8_two_words_residual": (
        Case(3, 9, 7, 8, 16, 3, padding=1, residual=True),
        16,
        ConvConfig(64, 16, 16, 2, 1, ConvKind.DIRECT),
    ),
    "c5_two_words_stride2": (
        Case(1, 9, 7, 5, 33, 3, stride=2, padding=1),
        8,
        ConvConfig(32, 64, 16, 4, 1, ConvKind.DIRECT),
    ),
    "c1_dilation_stride_pairs": (
        Case(2, 9, 7, 1, 7, 3, stride=(2, 1), padding=2, dilation=2),
        8,
        ConvConfig(16, 16, 16, 1, 1, ConvKind.DIRECT),
    ),
}


PACKED_WHOLE_PIXEL_CASES = {
    # (case, row width of the input buffer, config): the stem's 3 channels in rows of 4 (the engine's graph input)
    # and of 8, 4 channels in a slice of rows of 16 with a residual and an upsample, one channel with dilation and
    # a 1x3 kernel (taps padded to 4)
    "stem_c3_s2_b2": (Case(2, 9, 7, 3, 33, 3, stride=2, padding=1), 4, ConvConfig(64, 64, 64, 4, 2)),
    "stem_c3_rows_of_8": (Case(1, 9, 7, 3, 16, 3, stride=2, padding=1), 8, ConvConfig(64, 16, 64, 2, 2)),
    "c4_slice_residual_upsample": (
        Case(3, 5, 6, 4, 16, 3, padding=1, upsample=2, residual=True),
        16,
        ConvConfig(32, 16, 64, 2, 2),
    ),
    "c1_1x3_dilation_stride_pairs": (
        Case(2, 9, 7, 1, 7, (1, 3), stride=(2, 1), padding=(0, 2), dilation=2),
        8,
        ConvConfig(16, 16, 16, 1, 1),
    ),
}


@pytest.mark.parametrize(
    ("table", "name"),
    [("direct", name) for name in WHOLE_PIXEL_CASES] + [("packed", name) for name in PACKED_WHOLE_PIXEL_CASES],
)
def test_whole_pixel_loads(table: str, name: str) -> None:
    """Each tap loads a pixel as one or two 8-byte words, in the direct kernel and in packed tensor-core taps; the
    rest of each row (padding past the channels, and for rows of 16 the channels before the slice too) holds NaN,
    which must never reach the output (packed taps zero the word's spare halves)."""
    cases = WHOLE_PIXEL_CASES if table == "direct" else PACKED_WHOLE_PIXEL_CASES
    case, row, config = cases[name]
    _, x_dense, weight, bias = _make_case(case, seed=(200 if table == "direct" else 300) + list(cases).index(name))
    buf = torch.full((*x_dense.shape[:3], row), float("nan"), dtype=F16, device=DEVICE)
    first = 8 if row >= 16 else 0
    x = buf[..., first : first + case.c_in]
    x.copy_(x_dense)
    assert pixels_are_words(x)
    shape = _reference(case, x, weight, bias, None).shape
    residual = _nhwc(shape, F16, False)[1] if case.residual else None
    ref = _reference(case, x, weight, bias, residual)
    out = torch.full(shape, float("nan"), dtype=F16, device=DEVICE)
    config = replace(config, kind=ConvKind.PACKED if table == "packed" else ConvKind.DIRECT, whole_pixels=True)
    conv2d_nhwc(
        out,
        x,
        weight,
        bias,
        stride=case.stride,
        padding=case.padding,
        dilation=case.dilation,
        residual=residual,
        upsample=case.upsample,
        config=config,
    )
    assert_close(out, ref, TOLERANCE[F16])


def test_packed_whole_pixels_need_words_of_at_most_4_channels_and_a_k_tile_of_every_tap() -> None:
    x = torch.randn(1, 5, 6, 8, device=DEVICE).to(F16)
    args = (
        torch.empty(1, 5, 6, 16, dtype=F16, device=DEVICE),
        x[..., :3],
        torch.zeros(16, 3, 3, 3, dtype=F16, device=DEVICE),
        torch.zeros(16, device=DEVICE),
    )
    with pytest.raises(ValueError, match="block_k = 64 for a 3x3 kernel"):
        conv2d_nhwc(*args, padding=1, config=ConvConfig(64, 16, 32, 4, 2, ConvKind.PACKED, whole_pixels=True))
    five = (args[0], x[..., :5], torch.zeros(16, 3, 3, 5, dtype=F16, device=DEVICE), args[3])
    with pytest.raises(ValueError, match="at most 4 fp16 channels"):
        conv2d_nhwc(*five, padding=1, config=ConvConfig(64, 16, 64, 4, 2, ConvKind.PACKED, whole_pixels=True))
    stem = conv_candidate_configs(320 * 320, 16, 27, kernel_is_1x1=False, whole_pixels=True)
    assert {(c.block_k, c.block_n) for c in stem if c.kind is ConvKind.PACKED and c.whole_pixels} == {(64, 16)}
    eight = conv_candidate_configs(160 * 160, 16, 72, kernel_is_1x1=False, c_in=8, whole_pixels=True)
    assert not any(c.kind is ConvKind.PACKED and c.whole_pixels for c in eight)


def test_tap_rows_need_a_dense_input_no_dilation_across_a_row_and_a_k_tile_of_a_row() -> None:
    """A tap-row tile refuses a channel slice (its pixels are not one run), dilation across a row, an upsample and a K
    tile other than a row's span of pixels; it is offered to 8 channels of dense maps only (where it won)."""
    rows = ConvConfig(32, 16, 32, 2, 2, ConvKind.PACKED, tap_rows=True)
    buffer = torch.randn(1, 5, 6, 16, device=DEVICE).to(F16)
    out = torch.empty(1, 5, 6, 16, dtype=F16, device=DEVICE)
    weight, bias = torch.zeros(16, 3, 3, 8, dtype=F16, device=DEVICE), torch.zeros(16, device=DEVICE)
    with pytest.raises(ValueError, match="pixel stride to be its channel count"):
        conv2d_nhwc(out, buffer[..., :8], weight, bias, padding=1, config=rows)
    dense = buffer[..., :8].contiguous()
    with pytest.raises(ValueError, match="no dilation across a row"):
        conv2d_nhwc(out[:, :, 1:5], dense, weight, bias, padding=1, dilation=(1, 2), config=rows)
    with pytest.raises(ValueError, match="block_k = 32 for a 3x3 kernel"):
        conv2d_nhwc(out, dense, weight, bias, padding=1, config=replace(rows, block_k=64))
    with pytest.raises(ValueError, match="whole pixels or tap rows"):
        ConvConfig(32, 16, 32, 2, 2, ConvKind.PACKED, whole_pixels=True, tap_rows=True)
    with pytest.raises(ValueError, match="a gemm tile has no tap_rows"):
        ConvConfig(32, 16, 32, 2, 2, tap_rows=True)

    def offered(c_in: int, **options) -> set[int]:
        configs = conv_candidate_configs(160 * 120, 16, 9 * c_in, kernel_is_1x1=False, c_in=c_in, **options)
        return {c.block_k for c in configs if c.tap_rows}

    assert offered(8, dense_rows=True) == {32}
    assert offered(8, dense_rows=True, kernel_w=5) == {64}  # (K as if 3x5: the offer reads only C_in and KW)
    assert offered(8, dense_rows=True, kernel_w=33) == set()  # a row of 64 pixels: more bounds than an int32's bits
    assert offered(8) == offered(16, dense_rows=True) == offered(4, dense_rows=True) == set()
    assert not any(c.tap_rows for c in conv_candidate_configs(160 * 120, 16, 8, True, c_in=8, dense_rows=True))


TWO_INPUT_CASES = {
    # (batch, h, w of the upsampled map, C1 upsampled, C2, C_out, upsample, dtype, config, residual, sliced)
    "neck_default_tile": (2, 6, 8, 20, 13, 16, 2, F16, None, False, True),
    # one K block a split: splits wholly in x and wholly in second
    "split_k_a_block_each": (2, 6, 8, 20, 13, 33, 2, F16, ConvConfig(16, 32, 16, 2, 2, split_k=3), False, False),
    # 2 + 3 K blocks in 2 splits of 3: the first split straddles x and second
    "split_k_straddling_both_inputs": (
        2,
        6,
        8,
        20,
        40,
        16,
        2,
        F16,
        ConvConfig(16, 16, 16, 1, 1, split_k=2),
        False,
        True,
    ),
    "fp32_residual_no_upsample": (3, 5, 6, 8, 24, 16, 1, F32, ConvConfig(32, 16, 16, 1, 1), True, True),
}


@pytest.mark.parametrize("name", list(TWO_INPUT_CASES))
def test_two_inputs_read_as_one_upsampled_concat(name: str) -> None:
    """A 1x1 conv over cat(upsample(x), second), the concat and the upsample never built."""
    batch, h, w, c1, c2, c_out, up, dtype, config, with_residual, sliced = TWO_INPUT_CASES[name]
    torch.manual_seed(400 + list(TWO_INPUT_CASES).index(name))
    x = _nhwc((batch, h // up, w // up, c1), dtype, sliced)[1]
    second = _nhwc((batch, h, w, c2), dtype, sliced)[1]
    weight = (torch.randn(c_out, 1, 1, c1 + c2, dtype=torch.float64) / (c1 + c2) ** 0.5).to(DEVICE, dtype)
    bias = torch.randn(c_out, device=DEVICE)
    joined = torch.cat(
        [F.interpolate(x.double().permute(0, 3, 1, 2), scale_factor=up), second.double().permute(0, 3, 1, 2)], 1
    )
    ref = F.silu(F.conv2d(joined, weight.double().permute(0, 3, 1, 2), bias.double())).permute(0, 2, 3, 1)
    residual = _nhwc(ref.shape, dtype, sliced)[1] if with_residual else None
    if residual is not None:
        ref = ref + residual.double()
    out_buf, out = _nhwc(ref.shape, dtype, sliced, fill=SENTINEL)
    out.fill_(float("nan"))
    scratch = {}
    if config is not None and config.split_k > 1:
        elements, tiles = config.split_scratch(batch * h * w, c_out)
        scratch = {
            "partials": torch.empty(elements, device=DEVICE),
            "arrivals": torch.zeros(tiles, dtype=torch.int32, device=DEVICE),
        }
    conv2d_nhwc(out, x, weight, bias, upsample=up, second=second, residual=residual, config=config, **scratch)
    assert_close(out, ref, TOLERANCE[dtype])
    out.fill_(SENTINEL)
    assert bool((out_buf == SENTINEL).all()), "the conv wrote outside its output slice"
    if scratch:
        assert int(scratch["arrivals"].abs().sum()) == 0


def test_a_second_input_needs_a_plain_1x1_conv_on_gemm_tiles() -> None:
    x, second = torch.randn(1, 3, 4, 8, device=DEVICE).to(F16), torch.randn(1, 6, 8, 8, device=DEVICE).to(F16)
    out, bias = torch.empty(1, 6, 8, 16, dtype=F16, device=DEVICE), torch.zeros(16, device=DEVICE)
    one_by_one = torch.zeros(16, 1, 1, 16, dtype=F16, device=DEVICE)
    with pytest.raises(ValueError, match="weight expects C_in=8 but x has 8 channels and second 8"):
        conv2d_nhwc(out, x, one_by_one[..., :8].contiguous(), bias, upsample=2, second=second)
    with pytest.raises(ValueError, match="needs a 1x1 conv with stride 1 and no padding"):
        conv2d_nhwc(
            out, x, torch.zeros(16, 3, 3, 16, dtype=F16, device=DEVICE), bias, upsample=2, padding=1, second=second
        )
    with pytest.raises(ValueError, match=r"second must have shape \(1, 6, 8, 8\)"):
        conv2d_nhwc(out, x, one_by_one, bias, upsample=2, second=second[:, :5])
    with pytest.raises(ValueError, match="GEMM tiles only"):
        tma_tile = ConvConfig(16, 16, 16, 1, 1, ConvKind.TMA_1X1)
        conv2d_nhwc(out, x, one_by_one, bias, upsample=2, second=second, config=tma_tile)
    with pytest.raises(ValueError, match="second must be a 4-D"):
        conv2d_nhwc(out, x, one_by_one, bias, upsample=2, second=second[0])


def test_two_input_convs_are_offered_unsplit_gemm_tiles_wide_ones_only_when_large() -> None:
    small = two_input_candidates(40 * 40, 128, 384)  # yolo11n's 20x20 -> 40x40 fold at batch 1
    large = two_input_candidates(64 * 40 * 40, 512, 1024)  # yolo11m's at batch 64
    for configs in (small, large):
        assert configs and all(c.split_k == 1 and c.kind is ConvKind.GEMM for c in configs)
    assert not any(c.num_warps == 8 for c in small)
    assert (128, 256, 64, 8, 3) in {(c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages) for c in large}
    assert all(c.block_n <= 128 for c in two_input_candidates(64 * 40 * 40, 128, 384))  # shrunk to N


def test_whole_pixels_need_aligned_fp16_pixels_of_at_most_8_channels() -> None:
    rows_of_8 = torch.zeros(1, 5, 6, 8, dtype=F16, device=DEVICE)
    assert pixels_are_words(rows_of_8[..., :3]) and pixels_are_words(rows_of_8) and pixels_are_words(rows_of_8[..., 4:])
    assert not pixels_are_words(torch.zeros(1, 5, 6, 12, dtype=F16, device=DEVICE)[..., :9])  # more than two words
    assert not pixels_are_words(rows_of_8[..., 1:4])  # starts off a word boundary
    assert not pixels_are_words(torch.zeros(1, 5, 6, 3, dtype=F16, device=DEVICE))  # rows of 3
    assert not pixels_are_words(torch.zeros(1, 5, 6, 4, dtype=F32, device=DEVICE))
    with pytest.raises(ValueError, match="loads whole pixels"):
        conv2d_nhwc(
            torch.empty(1, 5, 6, 16, dtype=F16, device=DEVICE),
            torch.zeros(1, 5, 6, 3, dtype=F16, device=DEVICE),
            torch.zeros(16, 3, 3, 3, dtype=F16, device=DEVICE),
            torch.zeros(16, device=DEVICE),
            padding=1,
            config=ConvConfig(64, 16, 16, 2, 1, ConvKind.DIRECT, whole_pixels=True),
        )
    with pytest.raises(ValueError, match="a gemm tile has no whole_pixels"):
        ConvConfig(64, 16, 16, 2, 1, whole_pixels=True)
    stem = conv_candidate_configs(320 * 320, 16, 27, kernel_is_1x1=False, whole_pixels=True)
    assert {c.whole_pixels for c in stem if c.kind is ConvKind.DIRECT} == {False, True}
    assert not any(c.whole_pixels for c in conv_candidate_configs(320 * 320, 16, 27, kernel_is_1x1=False))


def test_wide_tiles_offered_only_to_large_layers() -> None:
    wide = {(256, 128, 64, 8, 3), (128, 256, 64, 8, 4)}

    def tiles(m: int, dtype: torch.dtype = F16) -> set[tuple[int, ...]]:
        configs = conv_candidate_configs(m, 256, 9 * 256, kernel_is_1x1=False, dtype=dtype)
        return {(c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages) for c in configs}

    assert wide <= tiles(64 * 80 * 80)
    assert not wide & tiles(80 * 80)  # batch 1
    assert not wide & tiles(64 * 80 * 80, F32)  # their pipelines overflow shared memory in fp32


def _channel_slice(n: int, h: int, w: int, c: int, dtype: torch.dtype, fill: float | None = None):
    """Channels [8, 8 + c) of a random (or filled) (n, h, w, c + 16) buffer: nested strides, rows 16-byte aligned."""
    buf = torch.randn(n, h, w, c + 16, dtype=torch.float64) if fill is None else torch.full((n, h, w, c + 16), fill)
    buf = buf.to(device=DEVICE, dtype=dtype)
    return buf, buf[..., 8 : 8 + c]


# (batch, h, w, c_in, c_out, dtype, residual, config): K and N tails (TMA reads past C_in are zero), a spatially
# sliced residual, programs one per tile or three walking 40-64 tiles.
TMA_CASES = {
    "fp16_residual_tails": (3, 9, 7, 40, 33, F16, True, ConvConfig(16, 16, 16, 1, 1, ConvKind.TMA_1X1)),
    "fp16_persistent": (3, 9, 7, 40, 33, F16, False, ConvConfig(16, 16, 16, 1, 2, ConvKind.TMA_1X1, persistent=True)),
    "fp32_persistent_residual": (
        2,
        5,
        6,
        20,
        16,
        F32,
        True,
        ConvConfig(16, 16, 16, 2, 2, ConvKind.TMA_1X1, persistent=True),
    ),
    "fp16_wide_tile": (1, 9, 7, 64, 48, F16, False, ConvConfig(64, 32, 32, 2, 3, ConvKind.TMA_1X1)),
    "fp16_persistent_eight_warps": (  # the 8-warp persistent tile offered to large layers, with an N tail
        2,
        9,
        7,
        64,
        80,
        F16,
        True,
        ConvConfig(128, 64, 64, 8, 3, ConvKind.TMA_1X1, persistent=True),
    ),
}


@pytest.mark.parametrize("name", list(TMA_CASES))
def test_tma_1x1_matches_reference(name: str) -> None:
    batch, h, w, c_in, c_out, dtype, with_residual, config = TMA_CASES[name]
    torch.manual_seed(list(TMA_CASES).index(name))
    _, x = _channel_slice(batch, h * SPATIAL, w * SPATIAL, c_in, dtype)
    weight = (torch.randn(c_out, 1, 1, c_in, dtype=torch.float64) / c_in**0.5).to(device=DEVICE, dtype=dtype)
    bias = torch.randn(c_out, dtype=torch.float32, device=DEVICE)
    assert tma_loadable(x, weight)
    shape = (batch, h * SPATIAL, w * SPATIAL, c_out)
    residual = _nhwc(shape, dtype, sliced=True)[1] if with_residual else None
    case = Case(batch, h, w, c_in, c_out, 1, activation="silu")
    ref = _reference(case, x, weight, bias, residual)
    out_buf, out = _channel_slice(*shape, dtype, fill=SENTINEL)
    out.fill_(float("nan"))
    conv2d_nhwc(out, x, weight, bias, residual=residual, config=config)
    assert_close(out, ref, TOLERANCE[dtype])
    out.fill_(SENTINEL)
    assert bool((out_buf == SENTINEL).all()), "the conv wrote outside its output slice"


# (case, patch tile): stride-1 k x k convs whose input patches TMA loads, zeros where a patch leaves the image;
# inputs are spatial and channel slices of wider buffers (16-byte aligned), map sizes not multiples of the patch.
TMA_PATCH_CASES = {
    "3x3_pad1_residual": (
        Case(3, 9, 7, 40, 33, 3, padding=1, residual=True),
        ConvConfig(32, 16, 16, 1, 2, ConvKind.TMA_PATCH, tile_w=8),
    ),
    "3x3_dilation2_fp32": (
        Case(1, 9, 7, 20, 16, 3, padding=2, dilation=2, activation="relu", dtype=F32),
        ConvConfig(16, 16, 16, 2, 2, ConvKind.TMA_PATCH, tile_w=4),
    ),
    "1x3_pad_pairs": (
        Case(2, 5, 6, 16, 7, (1, 3), padding=(0, 1), activation="identity"),
        ConvConfig(32, 16, 16, 1, 3, ConvKind.TMA_PATCH, tile_w=16),
    ),
    "3x3_pad0": (Case(2, 9, 7, 24, 40, 3), ConvConfig(64, 32, 32, 2, 2, ConvKind.TMA_PATCH, tile_w=8)),
    # Stride 2 reads the input as pixel pairs: even maps, channels in whole K blocks; the input is a channel slice,
    # so a block crossing past a pixel's channels would read the buffer's NaN spare channels.
    "3x3_s2_pad1_residual": (
        Case(3, 10, 8, 32, 40, 3, stride=2, padding=1, residual=True),
        ConvConfig(32, 16, 16, 1, 2, ConvKind.TMA_PATCH, tile_w=8),
    ),
    "3x3_s2_pad0_fp32": (
        Case(1, 8, 12, 16, 24, 3, stride=2, activation="relu", dtype=F32),
        ConvConfig(16, 16, 16, 2, 2, ConvKind.TMA_PATCH, tile_w=4),
    ),
    "3x3_s2_wide_tile": (  # the 64 x 256 tile offered to wide stride-2 layers, with an N tail
        Case(1, 16, 16, 64, 264, 3, stride=2, padding=1),
        ConvConfig(64, 256, 64, 4, 3, ConvKind.TMA_PATCH, tile_w=8),
    ),
    "1x3_s2_dilation2": (
        Case(2, 6, 10, 48, 16, (1, 3), stride=2, padding=(0, 2), dilation=2, activation="identity"),
        ConvConfig(32, 16, 16, 1, 3, ConvKind.TMA_PATCH, tile_w=16),
    ),
}


@pytest.mark.parametrize("name", list(TMA_PATCH_CASES))
def test_tma_patch_conv_matches_reference(name: str) -> None:
    case, config = TMA_PATCH_CASES[name]
    torch.manual_seed(300 + list(TMA_PATCH_CASES).index(name))
    kh, kw = (case.kernel, case.kernel) if isinstance(case.kernel, int) else case.kernel
    n, h, w = case.batch, case.h * SPATIAL, case.w * SPATIAL
    # NaN all around the input view (spare channels, rows and pixels of the buffer): a tap or channel block that
    # reads past the view, instead of the zeros TMA gives outside it, turns its output NaN.
    buf = torch.full((n, h + 2, w + 3, case.c_in + 16), float("nan"), dtype=torch.float64)
    buf[:, 1 : h + 1, 2 : w + 2, 8 : 8 + case.c_in] = torch.randn(n, h, w, case.c_in, dtype=torch.float64)
    buf = buf.to(device=DEVICE, dtype=case.dtype)
    x = buf[:, 1 : h + 1, 2 : w + 2, 8 : 8 + case.c_in]
    weight = (torch.randn(case.c_out, kh, kw, case.c_in, dtype=torch.float64) / (kh * kw * case.c_in) ** 0.5).to(
        device=DEVICE, dtype=case.dtype
    )
    bias = torch.randn(case.c_out, dtype=torch.float32, device=DEVICE)
    assert tma_loadable(x, weight)
    shape = _reference(case, x, weight, bias, None).shape
    residual = _nhwc(shape, case.dtype, sliced=True)[1] if case.residual else None
    ref = _reference(case, x, weight, bias, residual)
    out_buf, out = _nhwc(shape, case.dtype, True, fill=SENTINEL)
    out.fill_(float("nan"))
    conv2d_nhwc(
        out,
        x,
        weight,
        bias,
        stride=case.stride,
        padding=case.padding,
        dilation=case.dilation,
        activation=case.activation,
        residual=residual,
        config=config,
    )
    assert_close(out, ref, TOLERANCE[case.dtype])
    out.fill_(SENTINEL)
    assert bool((out_buf == SENTINEL).all()), "the conv wrote outside its output slice"


# (case, config with a TMA store): every kernel that can end in one, with K, M and N tails. Flat tiles (the output
# as an (M, C_out) matrix) write a channel slice of a wider buffer; patches a spatial and channel slice. The stem's
# input is 3 channels in rows of 4 (8-byte pixel words). C_out is a multiple of 8 (see tma_storable).
TMA_STORE_CASES = {
    "1x1_tma_residual": (
        Case(3, 9, 7, 40, 56, 1, residual=True),
        ConvConfig(32, 16, 16, 1, 2, ConvKind.TMA_1X1, tma_store=True),
    ),
    "1x1_tma_persistent": (
        Case(2, 5, 6, 24, 40, 1),
        ConvConfig(16, 16, 16, 1, 2, ConvKind.TMA_1X1, persistent=True, tma_store=True),
    ),
    "3x3_patch_s1_residual": (
        Case(2, 9, 7, 24, 40, 3, padding=1, residual=True),
        ConvConfig(32, 32, 16, 1, 2, ConvKind.TMA_PATCH, tile_w=8, tma_store=True),
    ),
    "3x3_patch_s2": (
        Case(1, 10, 8, 32, 24, 3, stride=2, padding=1),
        ConvConfig(16, 16, 16, 1, 2, ConvKind.TMA_PATCH, tile_w=4, tma_store=True),
    ),
    "3x3_gather_s2_residual": (
        Case(2, 9, 7, 20, 56, 3, stride=2, padding=1, residual=True),
        ConvConfig(32, 32, 16, 2, 2, tma_store=True),
    ),
    "stem_packed_words": (
        Case(2, 12, 10, 3, 40, 3, stride=2, padding=1),
        ConvConfig(32, 32, 64, 2, 2, ConvKind.PACKED, whole_pixels=True, tma_store=True),
    ),
}


@pytest.mark.parametrize("name", list(TMA_STORE_CASES))
def test_tma_stored_outputs_match_reference(name: str) -> None:
    case, config = TMA_STORE_CASES[name]
    torch.manual_seed(400 + list(TMA_STORE_CASES).index(name))
    kh, kw = case.kernel, case.kernel
    n, h, w = case.batch, case.h * SPATIAL, case.w * SPATIAL
    if config.whole_pixels:
        x = torch.randn(n, h, w, 4, dtype=torch.float64).to(device=DEVICE, dtype=case.dtype)[..., : case.c_in]
    else:
        x = _channel_slice(n, h, w, case.c_in, case.dtype)[1]
    weight = (torch.randn(case.c_out, kh, kw, case.c_in, dtype=torch.float64) / (kh * kw * case.c_in) ** 0.5).to(
        device=DEVICE, dtype=case.dtype
    )
    bias = torch.randn(case.c_out, dtype=torch.float32, device=DEVICE)
    shape = _reference(case, x, weight, bias, None).shape
    residual = _nhwc(shape, case.dtype, sliced=True)[1] if case.residual else None
    ref = _reference(case, x, weight, bias, residual)
    patches = config.tile_w > 0
    out_buf, out = _aligned_slice(shape, case.dtype, spatial=patches)
    assert tma_storable(out, patches) and (
        patches or not tma_storable(_aligned_slice(shape, case.dtype, True)[1], False)
    )
    out.fill_(float("nan"))
    conv2d_nhwc(out, x, weight, bias, stride=case.stride, padding=case.padding, residual=residual, config=config)
    assert_close(out, ref, TOLERANCE[case.dtype])
    out.fill_(SENTINEL)
    assert bool((out_buf == SENTINEL).all()), "the conv wrote outside its output slice"


def _aligned_slice(shape: tuple[int, ...], dtype: torch.dtype, spatial: bool):
    """A SENTINEL-filled buffer and channels [8, 8 + C) of it, rows 16-byte aligned whatever C is; `spatial`: also
    rows [1, H + 1) and pixels [2, W + 2), so its pixels are not evenly spaced rows of a matrix."""
    n, h, w, c = shape
    channels = -(-(c + 16) // 8) * 8
    buf = torch.full(
        (n, h + 2, w + 3, channels) if spatial else (n, h, w, channels), SENTINEL, dtype=dtype, device=DEVICE
    )
    return buf, (buf[:, 1 : h + 1, 2 : w + 2] if spatial else buf)[..., 8 : 8 + c]


def test_tma_stores_offered_to_large_fp16_outputs_whose_views_allow_them() -> None:
    stored = [c for c in conv_candidate_configs(64 * 160 * 160, 256, 192, kernel_is_1x1=True) if c.tma_store]
    assert [(c.block_n, c.persistent) for c in stored] == [(128, False), (256, False), (128, True), (64, True)]
    stem = conv_candidate_configs(64 * 320 * 320, 64, 27, kernel_is_1x1=False, c_in=3, whole_pixels=True)
    assert [c.block_m for c in stem if c.tma_store and c.kind is ConvKind.PACKED and c.whole_pixels] == [128, 64]
    assert not any(c.tma_store for c in conv_candidate_configs(64 * 20 * 20, 512, 9 * 512, kernel_is_1x1=False))
    assert not any(c.tma_store for c in conv_candidate_configs(64 * 160 * 160, 256, 192, True, dtype=F32))
    assert sum(c.tma_store for c in two_input_candidates(64 * 80 * 80, 256, 768)) == 2
    with pytest.raises(ValueError, match="TMA stores end tiles whose K is not split"):
        ConvConfig(32, 32, 32, 2, 2, split_k=2, tma_store=True)
    # TMA stores write whole 16-byte chunks: 33 fp16 channels would end in a chunk reaching into the next channels.
    for spatial in (False, True):
        assert not tma_storable(_aligned_slice((1, 4, 4, 33), F16, spatial)[1], spatial)
        assert tma_storable(_aligned_slice((1, 4, 4, 40), F16, spatial)[1], spatial)
    out = _aligned_slice((1, 4, 4, 16), F16, spatial=True)[1]  # patches only
    with pytest.raises(ValueError, match=r"TMA-stores its output: .* evenly spaced pixel rows"):
        conv2d_nhwc(
            out,
            _channel_slice(1, 4, 4, 16, F16)[1],
            torch.zeros(16, 1, 1, 16, dtype=F16, device=DEVICE),
            torch.zeros(16, device=DEVICE),
            config=ConvConfig(16, 16, 16, 1, 1, tma_store=True),
        )


def test_tma_tiles_offered_only_to_large_1x1_layers_whose_operands_allow_them() -> None:
    large = conv_candidate_configs(64 * 160 * 160, 256, 192, kernel_is_1x1=True)
    assert [(c.block_n, c.num_warps, c.persistent) for c in large if c.loads_by_tma and not c.tma_store] == [
        (128, 4, False),
        (256, 8, False),
        (128, 4, True),
        (64, 8, True),
    ]
    assert not untimed_gpu_config(64 * 160 * 160, 256, 192, True).loads_by_tma
    assert not any(
        c.loads_by_tma for c in conv_candidate_configs(64 * 160 * 160, 256, 192, kernel_is_1x1=True, dtype=F32)
    )
    assert not any(c.loads_by_tma for c in conv_candidate_configs(160 * 160, 256, 192, kernel_is_1x1=True))
    patches = [c for c in conv_candidate_configs(64 * 40 * 40, 64, 9 * 64, kernel_is_1x1=False) if c.loads_by_tma]
    assert [(c.block_m, c.block_n, c.tile_w) for c in patches] == [(128, 64, 16), (128, 64, 8), (64, 64, 8)]
    wide = [c for c in conv_candidate_configs(64 * 40 * 40, 512, 9 * 512, kernel_is_1x1=False) if c.loads_by_tma]
    assert [(c.block_m, c.block_n, c.num_warps, c.tile_w) for c in wide][-2:] == [(64, 256, 4, 8), (128, 256, 8, 16)]
    assert not any(
        c.loads_by_tma for c in conv_candidate_configs(160 * 160, 32, 9 * 32, kernel_is_1x1=False)
    )  # batch 1
    assert not tma_loadable(
        torch.zeros(2, 5, 6, 36, dtype=F16, device=DEVICE)[..., :32],
        torch.zeros(16, 3, 3, 32, dtype=F16, device=DEVICE),
    )  # 72-byte pixels
    with pytest.raises(ValueError, match=r"the output tile's width of a tma_patch tile"):
        ConvConfig(64, 64, 64, 4, 3, ConvKind.TMA_PATCH, tile_w=48)
    weight = torch.zeros(16, 1, 1, 40, dtype=F16, device=DEVICE)
    buf, x = _channel_slice(2, 5, 6, 40, F16)
    assert tma_loadable(x, weight) and tma_loadable(buf[..., :40], weight)
    assert not tma_loadable(buf[..., 1:41], weight)  # starts 2 bytes off a 16-byte boundary
    assert not tma_loadable(buf[:, :, 1:, :40], torch.zeros(16, 1, 1, 40, dtype=F16, device=DEVICE))  # rows gapped
    rows_of_72_bytes = torch.zeros(2, 5, 6, 36, dtype=F16, device=DEVICE)
    assert not tma_loadable(rows_of_72_bytes, torch.zeros(16, 1, 1, 36, dtype=F16, device=DEVICE))
    with pytest.raises(ValueError, match="a tma_1x1 tile has no split_k"):
        ConvConfig(64, 64, 64, 4, 3, ConvKind.TMA_1X1, split_k=2)
    with pytest.raises(ValueError, match="a gemm tile has no persistent"):
        ConvConfig(64, 64, 64, 4, 3, persistent=True)
    with pytest.raises(ValueError, match="a tma_1x1 tile has no tile_w"):
        ConvConfig(64, 64, 64, 4, 3, ConvKind.TMA_1X1, tile_w=8)
    with pytest.raises(ValueError, match="TMA-loads a conv's input patches: it needs stride 1"):  # 5 rows: odd
        conv2d_nhwc(
            torch.empty(2, 3, 3, 16, dtype=F16, device=DEVICE),
            x,
            torch.zeros(16, 3, 3, 40, dtype=F16, device=DEVICE),
            torch.zeros(16, device=DEVICE),
            stride=2,
            padding=1,
            config=ConvConfig(16, 16, 16, 1, 1, ConvKind.TMA_PATCH, tile_w=4),
        )
    even = _channel_slice(2, 6, 6, 40, F16)[1]
    weight3 = torch.zeros(16, 3, 3, 40, dtype=F16, device=DEVICE)
    assert tma_patch_loadable(even, weight3, (2, 2), 8) and tma_patch_loadable(x, weight3, (1, 1), 64)
    assert not tma_patch_loadable(even, weight3, (2, 2), 16)  # 40 channels are not whole 16-wide blocks
    assert not tma_patch_loadable(x, weight3, (2, 2), 8)  # 5 rows
    assert not tma_patch_loadable(even, weight3, (2, 1), 8)
    with pytest.raises(ValueError, match="stride 2 on an even-sized input whose channels are whole K blocks"):
        conv2d_nhwc(
            torch.empty(2, 3, 3, 16, dtype=F16, device=DEVICE),
            even,
            weight3,
            torch.zeros(16, device=DEVICE),
            stride=2,
            padding=1,
            config=ConvConfig(16, 16, 16, 1, 1, ConvKind.TMA_PATCH, tile_w=4),
        )
    for kernel, padding, view in ((3, 1, x), (1, 0, buf[..., 1:41])):
        with pytest.raises(ValueError, match="TMA-loads a 1x1 conv's operands"):  # a 3x3 weight: no tile_w
            conv2d_nhwc(
                torch.empty(2, 5, 6, 16, dtype=F16, device=DEVICE),
                view,
                torch.zeros(16, kernel, kernel, 40, dtype=F16, device=DEVICE),
                torch.zeros(16, device=DEVICE),
                padding=padding,
                config=ConvConfig(16, 16, 16, 1, 1, ConvKind.TMA_1X1),
            )


def test_split_k_offered_only_to_sparse_layers_with_long_k() -> None:
    small = conv_candidate_configs(400, 64, 9 * 256, kernel_is_1x1=False)  # 20x20, 256 -> 64 at batch 1
    assert any(c.split_k > 1 for c in small)
    for c in small:
        steps = 9 * -(-256 // c.block_k)
        assert steps >= 2 * c.split_k
    large = conv_candidate_configs(64 * 80 * 80, 256, 9 * 128, kernel_is_1x1=False)
    assert all(c.split_k == 1 for c in large)
    assert untimed_gpu_config(400, 64, 9 * 256, False).split_k == 1  # untimed picks never split


def test_candidate_configs_cover_tiny_and_large_layers() -> None:
    large = conv_candidate_configs(64 * 80 * 80, 256, 9 * 128, kernel_is_1x1=False)
    assert ConvConfig(128, 128, 64, 4, 3) in large
    tiny = conv_candidate_configs(400, 256, 256, kernel_is_1x1=True)
    assert any(c.block_m == 32 for c in tiny)
    stem = conv_candidate_configs(320 * 320, 16, 27, kernel_is_1x1=False)
    assert all(c.block_n == 16 and c.block_k == 16 for c in stem)
    for dtype in (F16, F32):
        configs = conv_candidate_configs(64 * 80 * 80, 256, 9 * 128, kernel_is_1x1=False, dtype=dtype)
        assert all(c.num_stages * (c.block_m + c.block_n) * c.block_k * dtype.itemsize <= 200 * 1024 for c in configs)
        assert untimed_gpu_config(64 * 80 * 80, 256, 9 * 128, False, dtype) in configs


# Each entry replaces some arguments of a valid call (fp16, 8 -> 4 channels, 3x3, padding 1) to break one rule.
BAD_ARGUMENTS = {
    "c_in": (lambda a: {"weight": a["weight"][..., :7].contiguous()}, "C_in=7 but x has 8"),
    "x_channel_stride": (lambda a: {"x": torch.cat([a["x"]] * 2, 3)[..., ::2]}, "x must have contiguous channels"),
    "out_channel_stride": (
        lambda a: {"out": a["out"].transpose(1, 3).contiguous().transpose(1, 3)},
        "out must have contiguous channels",
    ),
    "weight_dtype": (lambda a: {"weight": a["weight"].float()}, "weight dtype"),
    "out_dtype": (lambda a: {"out": a["out"].float()}, "out dtype"),
    "bias_dtype": (lambda a: {"bias": a["bias"].half()}, "bias must be"),
    "out_shape": (lambda a: {"out": a["out"][..., :3]}, "out must have shape"),
    "residual_shape": (lambda a: {"residual": a["out"][:, :4]}, "residual must have shape"),
    "activation": (lambda a: {"activation": "gelu"}, "activation must be"),
    "upsample": (lambda a: {"upsample": 0}, "upsample must be"),
    "stride": (lambda a: {"stride": (1, 0)}, "stride must be"),
}


@pytest.mark.parametrize("name", list(BAD_ARGUMENTS))
def test_launcher_rejects_bad_arguments(name: str) -> None:
    change, message = BAD_ARGUMENTS[name]
    args = {
        "out": torch.empty(1, 5, 6, 4, device=DEVICE, dtype=F16),
        "x": torch.randn(1, 5, 6, 8, device=DEVICE).half(),
        "weight": torch.randn(4, 3, 3, 8, device=DEVICE).half(),
        "bias": torch.zeros(4, device=DEVICE),
        "padding": 1,
    }
    args.update(change(args))
    with pytest.raises(ValueError, match=message):
        conv2d_nhwc(args.pop("out"), args.pop("x"), args.pop("weight"), args.pop("bias"), **args)


def test_offsets_beyond_int32() -> None:
    # Batch strides of 2^31 elements put image 1 of x, out and residual past int32 range; the three views
    # interleave in one buffer so the test reserves 4 GiB, not three times that. The buffer is left
    # uninitialised and only the views are written, so on the CPU just the touched pages are ever mapped.
    buf = torch.empty(2**31 + 1024, device=DEVICE, dtype=F16)
    x = buf.as_strided((2, 4, 4, 8), (2**31, 32, 8, 1))
    out = buf.as_strided((2, 4, 4, 16), (2**31, 64, 16, 1), storage_offset=256).fill_(float("nan"))
    residual = buf.as_strided((2, 4, 4, 16), (2**31, 64, 16, 1), storage_offset=512)
    x.copy_(torch.randn(x.shape, device=DEVICE, dtype=F16))
    residual.copy_(torch.randn(residual.shape, device=DEVICE, dtype=F16))
    weight = torch.randn(16, 3, 3, 8, device=DEVICE, dtype=F16) / 8
    bias = torch.randn(16, device=DEVICE)
    case = Case(2, 4, 4, 8, 16, 3, padding=1, residual=True)
    ref = _reference(case, x, weight, bias, residual)
    conv2d_nhwc(out, x, weight, bias, padding=1, residual=residual)
    assert_close(out, ref, TOLERANCE[F16])


def test_transposed_conv_lowered_to_four_strided_1x1_convs() -> None:
    """Proto's 2x2 stride-2 transposed conv, as the engine lowers it (one 1x1 conv per tap, each writing every
    other row and column of the output), against torch's conv_transpose2d: input a channel slice of a wider
    buffer, two images, and nothing written past the output's own channels."""
    graph = export_graph(random_model("yolov8n-seg.yaml"), 64)
    node = next(n for n in graph.nodes if n.op == "conv_transpose")
    (_, c_in, h, w), c_out = graph.values[node.inputs[0]].shape, graph.values[node.outputs[0]].shape[1]
    x = torch.randn(2, h, w, 8 + c_in, device=DEVICE, dtype=F16)[..., 8:]
    out_buffer = torch.full((2, 2 * h, 2 * w, c_out + 16), float("nan"), device=DEVICE, dtype=F16)
    out = out_buffer[..., :c_out]
    views = {node.inputs[0]: x, node.outputs[0]: out}
    _lower_conv_transpose(node, views.__getitem__, PackedWeights(graph, DEVICE, F16), pdl=False).run()
    weights = {role: torch.from_numpy(a).to(DEVICE) for role, a in graph.node_weights(node).items()}
    (expected,) = REFERENCE_OPS["conv_transpose"](node, [x.permute(0, 3, 1, 2).float()], weights)
    assert_close(out, expected.permute(0, 2, 3, 1), TOLERANCE[F16])
    assert out_buffer[..., c_out:].isnan().all()


def _jitted_functions() -> list:
    """Every @triton.jit function the kernel modules define, the conv package's included (interpreted ones without
    a GPU)."""
    import pkgutil

    import yolojet.kernels

    found = []
    for info in pkgutil.walk_packages(yolojet.kernels.__path__, "yolojet.kernels."):
        module = importlib.import_module(info.name)
        found += [
            value
            for value in vars(module).values()
            if isinstance(value, (JITFunction, InterpretedFunction)) and value.fn.__module__ == module.__name__
        ]
    return found


def _free_names(fn) -> set[str]:
    """The names a function's source loads that are neither its parameters nor assigned in it: the ones looked up
    in its module's globals (its decorator's and annotations' included)."""
    (definition,) = ast.parse(textwrap.dedent(inspect.getsource(fn))).body
    nodes = list(ast.walk(definition))
    bound = {n.arg for n in nodes if isinstance(n, ast.arg)}
    bound |= {n.id for n in nodes if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    return {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound


def test_every_name_a_jitted_function_uses_is_a_global_of_its_module() -> None:
    """A jitted function finds the helpers and constants it names in the globals of the module defining it, when
    it is compiled: a missing import fails only then, for the TMA kernels only on a GPU. So every free name of
    every jitted function in the package must be a global of its own module or a builtin."""
    functions = _jitted_functions()
    names = {f.fn.__name__ for f in functions}
    assert {"_conv2d_nhwc_kernel", "_conv2d_direct_kernel", "_conv1x1_tma_kernel", "_conv_tma_kernel"} <= names
    assert {"_output_pixels", "_grouped_tile", "_epilogue_values", "_epilogue", "_matrix_tile_epilogue"} <= names
    unresolved = {
        f"{f.fn.__module__}.{f.fn.__name__}": sorted(
            name for name in _free_names(f.fn) if name not in f.fn.__globals__ and not hasattr(builtins, name)
        )
        for f in functions
    }
    assert not any(unresolved.values()), {where: names for where, names in unresolved.items() if names}
