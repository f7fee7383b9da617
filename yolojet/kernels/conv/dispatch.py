"""`conv2d_nhwc`, the launcher: it checks the tensors against each other (`_check_nhwc`, `_pair`), then hands the
checked call (`_ConvCall`) to the launcher of its config's kind (`_LAUNCHERS`: the gathering GEMM for GEMM and
packed tiles, direct, TMA 1x1, TMA patches), which checks what its kernel needs of the views, builds its TMA
descriptors and split-K scratch (`_split_scratch`), and launches it. The kernels and checks are looked up here
when `conv2d_nhwc` runs, so tests that count or replace them patch this module.
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from yolojet.kernels.activations import ACTIVATIONS
from yolojet.kernels.conv.config import (
    _HALVES_PER_WORD,
    _INTERPRETER_PROGRAMS,
    _MOST_BIT_TAPS,
    _MOST_ROW_PIXELS,
    _PERSISTENT_PROGRAMS_PER_SM,
    _TMA_ALIGN,
    ConvConfig,
    ConvKind,
    default_config,
)
from yolojet.kernels.conv.direct import _conv2d_direct_kernel
from yolojet.kernels.conv.feasibility import (
    pixels_are_words,
    rows_are_dense,
    tma_loadable,
    tma_patch_loadable,
    tma_storable,
)
from yolojet.kernels.conv.gemm import _conv2d_nhwc_kernel
from yolojet.kernels.conv.tma import _conv1x1_tma_kernel, _conv_tma_kernel
from yolojet.kernels.launch import network_launcher

# Launching programs in groups of GROUP_M M-tiles keeps the input rows a group shares resident in L2 while
# the group sweeps all C_out tiles.
_GROUP_M = 8


@functools.cache
def _persistent_programs(device: torch.device) -> int:
    """How many programs a persistent grid launches: a few per SM (under the interpreter, enough to walk tiles
    several apart)."""
    if device.type != "cuda":
        return _INTERPRETER_PROGRAMS
    return torch.cuda.get_device_properties(device).multi_processor_count * _PERSISTENT_PROGRAMS_PER_SM


def _pair(value: int | tuple[int, int], name: str, minimum: int) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= minimum for v in pair):
        raise ValueError(f"{name} must be an int or a pair of ints >= {minimum}, got {value!r}")
    return pair


def _check_nhwc(t: torch.Tensor, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.dtype != dtype:
        raise ValueError(f"{name} dtype {t.dtype} does not match x dtype {dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, x is on {device}")
    if t.stride(3) != 1:
        raise ValueError(f"{name} must have contiguous channels (stride(3) == 1), got strides {t.stride()}")


def _split_scratch(
    cfg: ConvConfig,
    m: int,
    n: int,
    partials: torch.Tensor | None,
    arrivals: torch.Tensor | None,
    fallback: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scratch tensors to pass the kernel: checked when the config splits K; otherwise `fallback` for both,
    any valid pointer, since the kernel then never touches them."""
    need_partials, need_arrivals = cfg.split_scratch(m, n)
    if need_arrivals == 0:
        return fallback, fallback
    device = fallback.device
    if (
        partials is None
        or partials.dtype != torch.float32
        or partials.device != device
        or partials.numel() < need_partials
    ):
        raise ValueError(f"split_k={cfg.split_k} needs partials: float32 with >= {need_partials} elements on {device}")
    if (
        arrivals is None
        or arrivals.dtype != torch.int32
        or arrivals.device != device
        or arrivals.numel() < need_arrivals
    ):
        raise ValueError(
            f"split_k={cfg.split_k} needs arrivals: int32 zeros with >= {need_arrivals} elements on {device}"
        )
    return partials, arrivals


def conv2d_nhwc(
    out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    *,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    activation: str = "silu",
    residual: torch.Tensor | None = None,
    upsample: int = 1,
    second: torch.Tensor | None = None,
    config: ConvConfig | None = None,
    pdl: bool = False,
    compile_only: bool = False,
    partials: torch.Tensor | None = None,
    arrivals: torch.Tensor | None = None,
) -> None:
    """out = act(conv2d(upsample_nearest(x, upsample), weight) + bias) (+ residual), written in place.

    With `second`, a 1x1 conv (stride 1, no padding) over the channel concat of upsample_nearest(x, upsample)
    and second: (N, OH, OW, C2) of x's dtype with unit channel stride, never upsampled; the weight then holds
    C_in + C2 input channels, x's first. A neck's Upsample and Concat then cost no launch and no memory traffic.

    x: (N, H, W, C_in) fp16/fp32 view with unit channel stride; out and residual: (N, OH, OW, C_out) views of
    the same dtype; weight: contiguous (C_out, kh, kw, C_in) of that dtype; bias: fp32 (C_out,). `pdl` launches
    with programmatic dependent launch (see yolojet.kernels.pdl). `compile_only` compiles the specialization this
    call needs without launching it (for compiling many tile candidates in parallel before timing them).
    A config with split_k > 1 needs `partials`, float32 with at least `config.split_scratch(M, C_out)[0]`
    elements, and `arrivals`, int32 zeros with at least `[1]` elements (the kernel leaves them at zero).
    """
    if x.dim() != 4:
        raise ValueError(f"x must be a 4-D NHWC tensor, got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"x dtype must be float16 or float32, got {x.dtype}")
    if weight.dim() != 4 or not weight.is_contiguous():
        raise ValueError(f"weight must be a contiguous (C_out, kh, kw, C_in) tensor, got shape {tuple(weight.shape)}")
    batch, height, width, c_in = x.shape
    c_out, kh, kw, w_c_in = weight.shape
    if second is not None and second.dim() != 4:
        raise ValueError(f"second must be a 4-D NHWC tensor, got shape {tuple(second.shape)}")
    c_second = 0 if second is None else second.shape[3]
    if w_c_in != c_in + c_second:
        inputs = f"x has {c_in} channels" + ("" if second is None else f" and second {c_second}")
        raise ValueError(f"weight expects C_in={w_c_in} but {inputs}")
    if weight.dtype != x.dtype:
        raise ValueError(f"weight dtype {weight.dtype} does not match x dtype {x.dtype}")
    if weight.device != x.device or bias.device != x.device:
        raise ValueError(f"weight ({weight.device}) and bias ({bias.device}) must be on x's device {x.device}")
    if x.stride(3) != 1:
        raise ValueError(f"x must have contiguous channels (stride(3) == 1), got strides {x.stride()}")
    if tuple(bias.shape) != (c_out,) or bias.dtype != torch.float32 or bias.stride(0) != 1:
        raise ValueError(f"bias must be contiguous float32 of shape ({c_out},), got {bias.dtype} {tuple(bias.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if not isinstance(upsample, int) or upsample < 1:
        raise ValueError(f"upsample must be a positive int, got {upsample!r}")
    sy, sx = _pair(stride, "stride", 1)
    py, px = _pair(padding, "padding", 0)
    dy, dx = _pair(dilation, "dilation", 1)
    oh = (height * upsample + 2 * py - dy * (kh - 1) - 1) // sy + 1
    ow = (width * upsample + 2 * px - dx * (kw - 1) - 1) // sx + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"kernel {kh}x{kw} does not fit the padded {height * upsample}x{width * upsample} input")
    out_shape = (batch, oh, ow, c_out)
    _check_nhwc(out, "out", out_shape, x.dtype, x.device)
    if second is not None:
        if (kh, kw, sy, sx, py, px, dy, dx) != (1, 1, 1, 1, 0, 0, 1, 1):
            raise ValueError(
                f"second: a second input needs a 1x1 conv with stride 1 and no padding, got a {kh}x{kw} kernel, "
                f"stride {(sy, sx)}, padding {(py, px)}, dilation {(dy, dx)}"
            )
        _check_nhwc(second, "second", (batch, oh, ow, c_second), x.dtype, x.device)
    if residual is not None:
        _check_nhwc(residual, "residual", out_shape, x.dtype, x.device)

    m = batch * oh * ow
    if m == 0 or c_out == 0:
        return
    cfg = config or default_config(m, c_out, kh * kw * w_c_in, kh == kw == 1, x.dtype)
    if second is not None and cfg.kind is not ConvKind.GEMM:
        raise ValueError(f"config {cfg}: a second input is read by the GEMM tiles only")
    call = _ConvCall(
        out,
        x,
        weight,
        bias,
        residual,
        second,
        stride=(sy, sx),
        padding=(py, px),
        dilation=(dy, dx),
        upsample=upsample,
        activation=ACTIVATIONS[activation],
        m=m,
        pdl=pdl,
        compile_only=compile_only,
        partials=partials,
        arrivals=arrivals,
    )
    _LAUNCHERS[cfg.kind](call, cfg)


@dataclass(frozen=True)
class _ConvCall:
    """A checked call of conv2d_nhwc: what every kind's launcher reads."""

    out: torch.Tensor
    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor
    residual: torch.Tensor | None
    second: torch.Tensor | None
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    upsample: int
    activation: int  # the kernels' ACTIVATION code
    m: int  # output pixels: the GEMM's M
    pdl: bool
    compile_only: bool
    partials: torch.Tensor | None  # split-K's scratch, checked by the GEMM's launcher
    arrivals: torch.Tensor | None

    @property
    def res(self) -> torch.Tensor:
        """The residual, or any valid pointer (never read without HAS_RESIDUAL)."""
        return self.out if self.residual is None else self.residual

    def launcher(self, kernel: Any, grid: tuple[int, ...]) -> Callable[..., Any]:
        return network_launcher(kernel, grid, self.pdl, self.compile_only)


def _output_descriptor(call: _ConvCall, cfg: ConvConfig) -> TensorDescriptor | None:
    """The output's TMA descriptor for a config that TMA-stores, else None (unused without TMA_STORE)."""
    if not cfg.tma_store:
        return None
    out = call.out
    patches = cfg.kind is ConvKind.TMA_PATCH
    if not tma_storable(out, patches):
        raise ValueError(
            f"config {cfg} TMA-stores its output: out needs 16-byte aligned base and strides, unit channel "
            f"stride, pixels of whole 16-byte chunks ({_TMA_ALIGN // out.element_size()} channels a chunk)"
            f"{'' if patches else ', and evenly spaced pixel rows'} (out shape {tuple(out.shape)}, strides "
            f"{out.stride()})"
        )
    if patches:
        block = [1, cfg.block_m // cfg.tile_w, cfg.tile_w, cfg.block_n]
        return TensorDescriptor(out, list(out.shape), list(out.stride()), block)
    return TensorDescriptor(out, [call.m, out.shape[3]], [out.stride(2), 1], [cfg.block_m, cfg.block_n])


def _launch_direct(call: _ConvCall, cfg: ConvConfig) -> None:
    out, x, weight, res = call.out, call.x, call.weight, call.res
    _, height, width, c_in = x.shape
    _, oh, ow, c_out = out.shape
    if cfg.whole_pixels and not pixels_are_words(x):
        raise ValueError(
            f"config {cfg} loads whole pixels, but x ({x.dtype}, {c_in} channels, strides {x.stride()}) does not "
            "hold 8-byte-aligned pixels of at most 8 fp16 channels"
        )
    (sy, sx), (py, px), (dy, dx) = call.stride, call.padding, call.dilation
    kernel = call.launcher(_conv2d_direct_kernel, (triton.cdiv(call.m, cfg.block_m) * triton.cdiv(c_out, cfg.block_n),))
    kernel(
        out, *out.stride()[:3], x, *x.stride()[:3], weight, call.bias, res, *res.stride()[:3],
        height, width, oh, ow, c_out, call.m, sy, sx, py, px, dy, dx,
        C_IN=c_in, KH=weight.shape[1], KW=weight.shape[2], UPSAMPLE=call.upsample, ACTIVATION=call.activation,
        HAS_RESIDUAL=call.residual is not None, WHOLE_PIXELS=cfg.whole_pixels, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
    )  # fmt: skip


def _launch_tma_patch(call: _ConvCall, cfg: ConvConfig) -> None:
    out, x, weight, res = call.out, call.x, call.weight, call.res
    batch, height, width, c_in = x.shape
    _, oh, ow, c_out = out.shape
    (sy, _), (py, px), (dy, dx) = call.stride, call.padding, call.dilation
    if call.upsample != 1 or not tma_patch_loadable(x, weight, call.stride, cfg.block_k):
        raise ValueError(
            f"config {cfg} TMA-loads a conv's input patches: it needs stride 1, or stride 2 on an even-sized "
            f"input whose channels are whole K blocks, no upsample, and x's and the weight's strides 16-byte "
            f"aligned (stride {call.stride}, upsample {call.upsample}, x shape {tuple(x.shape)} strides "
            f"{x.stride()}, weight {tuple(weight.shape)})"
        )
    tile_h = cfg.block_m // cfg.tile_w
    if sy == 1:
        x_desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [1, tile_h, cfg.tile_w, cfg.block_k])
    else:  # (N, H/2, 2, W/2, pixel stride + C_in): see _conv_tma_kernel
        sn, sh, sw = x.stride()[:3]
        x_desc = TensorDescriptor(
            x,
            [batch, height // 2, 2, width // 2, sw + c_in],
            [sn, 2 * sh, sh, 2 * sw, 1],
            [1, tile_h, 1, cfg.tile_w, cfg.block_k],
        )
    w_desc = TensorDescriptor(weight, list(weight.shape), list(weight.stride()), [cfg.block_n, 1, 1, cfg.block_k])
    grid = (batch * triton.cdiv(oh, tile_h) * triton.cdiv(ow, cfg.tile_w) * triton.cdiv(c_out, cfg.block_n),)
    out_desc = _output_descriptor(call, cfg)
    call.launcher(_conv_tma_kernel, grid)(
        out, *out.stride()[:3], out_desc, x_desc, x.stride(2), w_desc, call.bias, res, *res.stride()[:3], oh, ow,
        c_in, c_out, py, px, dy, dx, KH=weight.shape[1], KW=weight.shape[2], STRIDE=sy, ACTIVATION=call.activation,
        HAS_RESIDUAL=call.residual is not None, TILE_H=tile_h, TILE_W=cfg.tile_w, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, GROUP_M=_GROUP_M, TMA_STORE=cfg.tma_store, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )  # fmt: skip


def _launch_tma_1x1(call: _ConvCall, cfg: ConvConfig) -> None:
    out, x, weight, res = call.out, call.x, call.weight, call.res
    c_in, (_, oh, ow, c_out) = x.shape[3], out.shape
    kh, kw = weight.shape[1:3]
    geometry = (kh, kw, *call.stride, *call.padding, call.upsample)
    if geometry != (1, 1, 1, 1, 0, 0, 1) or not tma_loadable(x, weight):
        raise ValueError(
            f"config {cfg} TMA-loads a 1x1 conv's operands: it needs stride 1, no padding, no upsample, "
            f"x's pixels evenly spaced and x and weight rows 16-byte aligned (weight {kh}x{kw}, stride "
            f"{call.stride}, padding {call.padding}, upsample {call.upsample}, x strides {x.stride()})"
        )
    x_desc = TensorDescriptor(x, [call.m, c_in], [x.stride(2), 1], [cfg.block_m, cfg.block_k])
    w_desc = TensorDescriptor(weight, [c_out, c_in], [c_in, 1], [cfg.block_n, cfg.block_k])
    tiles = triton.cdiv(call.m, cfg.block_m) * triton.cdiv(c_out, cfg.block_n)
    programs = min(tiles, _persistent_programs(x.device)) if cfg.persistent else tiles
    out_desc = _output_descriptor(call, cfg)
    call.launcher(_conv1x1_tma_kernel, (programs,))(
        out, *out.stride()[:3], out_desc, x_desc, w_desc, call.bias, res, *res.stride()[:3], oh, ow, c_in, c_out,
        call.m, programs, ACTIVATION=call.activation, HAS_RESIDUAL=call.residual is not None, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=_GROUP_M, TMA_STORE=cfg.tma_store,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def _launch_gemm(call: _ConvCall, cfg: ConvConfig) -> None:
    """The gathering GEMM: GEMM tiles (one tap's channels a K step, optionally split) and PACKED ones."""
    out, x, weight, second, res = call.out, call.x, call.weight, call.second, call.res
    _, height, width, c_in = x.shape
    _, oh, ow, c_out = out.shape
    kh, kw = weight.shape[1:3]
    (sy, sx), (py, px), (dy, dx) = call.stride, call.padding, call.dilation
    if cfg.whole_pixels:
        taps_block = _HALVES_PER_WORD * max(4, triton.next_power_of_2(kh * kw))
        if not pixels_are_words(x) or c_in > _HALVES_PER_WORD or cfg.block_k != taps_block:
            raise ValueError(
                f"config {cfg} loads whole pixels with packed taps: it needs 8-byte-aligned pixels of at most "
                f"{_HALVES_PER_WORD} fp16 channels (x: {x.dtype}, {c_in} channels, strides {x.stride()}) and "
                f"block_k = {taps_block} for a {kh}x{kw} kernel"
            )
    if cfg.tap_rows:
        span = triton.next_power_of_2(kw)
        if (
            not rows_are_dense(x)
            or c_in & (c_in - 1)
            or dx != 1
            or call.upsample != 1
            or cfg.block_k != span * c_in
            or span > _MOST_ROW_PIXELS
        ):
            raise ValueError(
                f"config {cfg} loads tap rows: it needs x's pixel stride to be its channel count, a power of two "
                f"(x: {c_in} channels, strides {x.stride()}), no dilation across a row ({dx}) nor upsample "
                f"({call.upsample}), block_k = {span * c_in} for a {kh}x{kw} kernel, and a row's span of at most "
                f"{_MOST_ROW_PIXELS} pixels ({span})"
            )
    partials, arrivals = _split_scratch(cfg, call.m, c_out, call.partials, call.arrivals, call.bias)
    grid = (triton.cdiv(call.m, cfg.block_m) * triton.cdiv(c_out, cfg.block_n), cfg.split_k)
    two = x if second is None else second  # never read without TWO_INPUTS; any valid pointer will do
    c_second = 0 if second is None else second.shape[3]
    out_desc = _output_descriptor(call, cfg)
    call.launcher(_conv2d_nhwc_kernel, grid)(
        out, *out.stride()[:3], out_desc, x, *x.stride()[:3], two, *two.stride()[:3], weight, call.bias, res,
        *res.stride()[:3], partials, arrivals, height, width, c_in, c_second, oh, ow, c_out, call.m,
        sy, sx, py, px, dy, dx, KH=kh, KW=kw, UPSAMPLE=call.upsample, ACTIVATION=call.activation,
        HAS_RESIDUAL=call.residual is not None, PACK_TAPS=cfg.kind is ConvKind.PACKED,
        TAP_CHANNELS=_tap_channels_constant(call, cfg), TAP_ROWS=cfg.tap_rows, WHOLE_PIXELS=cfg.whole_pixels,
        TWO_INPUTS=second is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=_GROUP_M, SPLIT_K=cfg.split_k, TMA_STORE=cfg.tma_store,
        X_ALIGN=_common_divisor(*x.stride()[:3], c_in, *two.stride()[:3], c_second),
        OUT_ALIGN=_common_divisor(*out.stride()[:3], *res.stride()[:3], c_out), num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )  # fmt: skip


def _tap_channels_constant(call: _ConvCall, cfg: ConvConfig) -> int:
    """C_in for a packed tile to know as a constant: for word tiles always (at most 4 channels: a spare half is then a
    zero) and tap rows (checked by the launcher); for the others a power of two, no upsample, taps within
    `_MOST_BIT_TAPS` (whole taps a K step, each tap's channels one vector run); else 0, which the kernel reads as C_in
    unknown until it runs."""
    c_in = call.x.shape[3]
    kh, kw = call.weight.shape[1:3]
    if cfg.kind is not ConvKind.PACKED:
        return 0
    if cfg.whole_pixels or cfg.tap_rows:
        return c_in
    known = call.upsample == 1 and kh * kw <= _MOST_BIT_TAPS and c_in & (c_in - 1) == 0
    return c_in if known else 0


# What the JIT itself finds of integer arguments: divisibility by 16 (see _divisible).
_JIT_DIVISOR = 16


def _common_divisor(*values: int) -> int:
    """The largest power of two up to _JIT_DIVISOR dividing every value (strides and channel counts, in elements)."""
    divisor = _JIT_DIVISOR
    while divisor > 1 and any(value % divisor for value in values):
        divisor //= 2
    return divisor


# The launcher of each kind of tile.
_LAUNCHERS = {
    ConvKind.GEMM: _launch_gemm,
    ConvKind.PACKED: _launch_gemm,
    ConvKind.DIRECT: _launch_direct,
    ConvKind.TMA_1X1: _launch_tma_1x1,
    ConvKind.TMA_PATCH: _launch_tma_patch,
}
