"""The conv tiles: `ConvConfig` (block sizes, warps, stages, and the kernel and mode it names), the candidate tiles
offered to the autotuner for a layer (`conv_candidate_configs`, `two_input_candidates`, with their split-K and
TMA-store variants), `default_config`, the untimed choice, and `candidate_set_id`, a digest of everything that
shapes the offer. The limits `feasibility`, `dispatch` and the kernels check against (`_HALVES_PER_WORD`,
`_TMA_ALIGN`, `_TMA_PATCH_STRIDES`, `_MOST_BIT_TAPS`, the persistent grid's programs an SM) are defined here with the
tables they shape.
"""

import enum
import functools
import hashlib
from dataclasses import dataclass, fields, replace

import torch

from yolojet.options import interpreting

# About one wave on an H200 (132 SMs): on measured YOLO layers the biggest tile launching at least this many
# programs was the fastest or within 10% of it.
_TARGET_PROGRAMS = 100


class ConvKind(str, enum.Enum):
    """The kernel a tile launches (conv2d_nhwc's dispatch table is keyed by it)."""

    GEMM = "gemm"  # _conv2d_nhwc_kernel: the implicit GEMM gathering one tap's channels a K step
    PACKED = "packed"  # the same kernel with K tiles over all taps at once (PACK_TAPS), for a few input channels
    DIRECT = "direct"  # _conv2d_direct_kernel: FMA outer products for a few input channels; no K tiles
    TMA_1X1 = "tma_1x1"  # _conv1x1_tma_kernel: a 1x1 conv whose operands the tensor memory accelerator loads
    TMA_PATCH = "tma_patch"  # _conv_tma_kernel: a k x k conv (stride 1 or 2) on TMA-loaded input patches

    def __repr__(self) -> str:
        return f"ConvKind.{self.name}"


# The modifiers each kind takes; a kind leaves the others at their defaults (_MODIFIER_DEFAULTS).
_MODIFIERS: dict[ConvKind, frozenset[str]] = {
    ConvKind.GEMM: frozenset({"split_k", "tma_store"}),
    ConvKind.PACKED: frozenset({"whole_pixels", "tap_rows", "tma_store"}),
    ConvKind.DIRECT: frozenset({"whole_pixels"}),
    ConvKind.TMA_1X1: frozenset({"persistent", "tma_store"}),
    ConvKind.TMA_PATCH: frozenset({"tile_w", "tma_store"}),
}
_MODIFIER_DEFAULTS = {
    "split_k": 1,
    "whole_pixels": False,
    "tap_rows": False,
    "persistent": False,
    "tile_w": 0,
    "tma_store": False,
}
_TMA_KINDS = (ConvKind.TMA_1X1, ConvKind.TMA_PATCH)


@dataclass(frozen=True)
class ConvConfig:
    """One conv kernel specialization: the tile's shape and launch parameters, the kernel `kind` it launches, and
    that kind's modifiers."""

    block_m: int
    block_n: int
    block_k: int  # unused by DIRECT
    num_warps: int
    num_stages: int  # unused by DIRECT
    kind: ConvKind = ConvKind.GEMM
    split_k: int = 1  # GEMM: programs sharing each output tile's K steps (see the kernel)
    whole_pixels: bool = False  # DIRECT, PACKED: each tap loads a pixel's channels as 8-byte words (WHOLE_PIXELS)
    tap_rows: bool = False  # PACKED: K steps over kernel rows, a row's neighbouring pixels one load (TAP_ROWS)
    persistent: bool = False  # TMA_1X1: a fixed grid of programs walking the tiles, not a program per tile
    tile_w: int = 0  # TMA_PATCH: the output tile's width in pixels (a power of two dividing block_m)
    tma_store: bool = False  # all but DIRECT: the output tile stored by the tensor memory accelerator, K unsplit

    def __post_init__(self) -> None:
        # A tuning cache stores the kind by its value.
        try:
            object.__setattr__(self, "kind", ConvKind(self.kind))
        except ValueError:
            raise ValueError(
                f"ConvConfig.kind must be one of {[k.value for k in ConvKind]}, got {self.kind!r}"
            ) from None
        # tl.arange needs powers of two, and 16 is the smallest fp16 tensor-core K.
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"ConvConfig.{name} must be a power of two >= 16, got {value}")
        if not isinstance(self.split_k, int) or self.split_k < 1:
            raise ValueError(f"ConvConfig.split_k must be a positive int, got {self.split_k!r}")
        for name, default in _MODIFIER_DEFAULTS.items():
            if name not in _MODIFIERS[self.kind] and getattr(self, name) != default:
                takes = ", ".join(sorted(_MODIFIERS[self.kind]))
                raise ValueError(f"ConvConfig: a {self.kind.value} tile has no {name} (it takes {takes})")
        if self.whole_pixels and self.tap_rows:
            raise ValueError("ConvConfig: a packed tile loads whole pixels or tap rows, not both")
        if self.tma_store and self.split_k != 1:
            raise ValueError("ConvConfig: TMA stores end tiles whose K is not split")
        tile_w = self.tile_w
        if self.kind is ConvKind.TMA_PATCH and (tile_w < 1 or tile_w & (tile_w - 1) or self.block_m % tile_w):
            raise ValueError(
                f"ConvConfig: tile_w={tile_w} is the output tile's width of a {self.kind.value} tile, a power of two "
                f"dividing block_m={self.block_m}"
            )

    @property
    def loads_by_tma(self) -> bool:
        """Whether the tensor memory accelerator loads the operands (the TMA kinds)."""
        return self.kind in _TMA_KINDS

    def gathered(self) -> "ConvConfig":
        """The same tile with its operands gathered by its threads: a TMA kind's on the GEMM kernel (for views the
        tensor memory accelerator cannot load), any other kind unchanged."""
        if not self.loads_by_tma:
            return self
        return ConvConfig(
            self.block_m,
            self.block_n,
            self.block_k,
            self.num_warps,
            self.num_stages,
            split_k=self.split_k,
            tma_store=self.tma_store,
        )

    def split_scratch(self, m: int, n: int) -> tuple[int, int]:
        """(fp32 partial elements, arrival counters) a launch of this config needs for GEMM sizes M=m, N=n."""
        if self.split_k == 1:
            return 0, 0
        tiles = -(-m // self.block_m) * -(-n // self.block_n)
        return self.split_k * tiles * self.block_m * self.block_n, tiles


# Tiles measured on an H200 (fp16, YOLO layer shapes, batch 1 and 32). Among equal areas the earlier one won,
# which default_config relies on.
_CANDIDATES = (
    ConvConfig(128, 256, 64, 8, 3),  # wide layers at large batch; 8 warps, so left to timing, never the default
    ConvConfig(128, 128, 64, 4, 3),
    ConvConfig(64, 128, 64, 4, 3),
    ConvConfig(128, 64, 64, 4, 3),
    ConvConfig(128, 32, 32, 4, 3),  # early layers with 16-32 output channels, the stem included
    ConvConfig(64, 64, 64, 4, 3),
    ConvConfig(32, 64, 64, 4, 4),  # tiny maps (e.g. 20x20 at batch 1): enough programs to fill the SMs
    ConvConfig(64, 32, 32, 2, 3),
    ConvConfig(32, 32, 64, 2, 4),
    # Deep K on small maps (20x20 and 40x40 at batch 1, K up to 2304): half the dependent K steps of a 64-deep tile.
    ConvConfig(32, 64, 128, 4, 3),
    ConvConfig(32, 32, 128, 4, 3),
    ConvConfig(16, 64, 128, 2, 3),
)

_SPLITS = (2, 4, 8)
# Direct-kernel tiles (BLOCK_M, BLOCK_N cap, warps) for k×k convs of at most _DIRECT_MAX_C_IN input channels.
_DIRECT_TILES = ((128, 32, 4), (64, 32, 2), (256, 16, 4), (128, 64, 4))
_DIRECT_MAX_C_IN = 8
_HALVES_PER_WORD = 4  # fp16 channels in the 8-byte words of whole-pixel loads
# Packed-tap tensor-core tiles (BLOCK_M, BLOCK_N cap, warps, stages), offered to the same few-channel convs once
# they have this many output channels (the stem of s, m, l and x models): below that the FMA kernel does less
# work than a tile's gathers (measured on an H200 for yolo11n's 3->16 stem and 8->8 convs at batch 1 and 64).
_PACKED_TILES = ((128, 64, 4, 2), (64, 64, 4, 2))
_PACKED_MIN_C_OUT = 32
# The most taps whose bounds the gathering kernel holds as bits of one int64 (less its sign); a kernel of more taps
# compares a tap's bounds at each step, and its packed tiles take C_in at run time.
_MOST_BIT_TAPS = 63
# A packed tile (BLOCK_M, BLOCK_N cap, BLOCK_K, warps, stages) walking whole taps of 16 input channels, a constant to
# the kernel (TAP_CHANNELS): 4 taps a K step where the GEMM tiles take one. Offered to k x k convs of 16 input channels
# and at most _MOST_BIT_TAPS taps: it won yolo11n's model.1 (3x3 stride 2, 16->32) at batch 64 on an H100, 139.0 us
# against the GEMM tiles' best 143.1; it lost the 16->8 and 8->16 bottleneck convs by 12-46 %, as did a 64-row and a
# 128-deep twin everywhere (bench/NOTES.md).
_WHOLE_TAP_CHANNELS = (16,)
_WHOLE_TAP_TILES = ((128, 32, 64, 4, 3),)
# Packed tiles over kernel rows (BLOCK_M, BLOCK_N cap, warps, stages; BLOCK_K is a row's span of pixels, KW rounded up
# to a power of two, times C_in), offered to k x k convs without dilation across a row or upsample whose input's pixel
# stride is its channel count, one of these: a row's taps are then one contiguous run a GEMM row. On an H100 at batch
# 64 they won the 8-channel bottleneck cv2 of yolo11n's first C3k2 (98.9 against 114.1 us), lost the 16-channel ones
# (38.9 against 31.7) and tied model.1 (16 -> 32, stride 2; bench/NOTES.md): each tile offered is one more to compile
# at start-up, so only 8 channels are offered (the kernel takes any power of two whose row spans 16 or more).
_TAP_ROW_CHANNELS = (8,)
_TAP_ROW_TILES = ((128, 32, 4, 3), (64, 32, 2, 3))
# The widest span of a tap row: which of its pixels lie inside the input are bits of one int32.
_MOST_ROW_PIXELS = 32
# Layers of at least this many output pixels (large batches: never at batch 1 for 640 inputs, whose largest maps
# after the stem are 160x160) are also offered the tiles below.
_LARGE_M = 1 << 17
# Wider tiles and a deeper pipeline for the big GEMMs (the 3x3 stride-2 convs of m models run at ~400 TFLOP/s on
# 128x256x64 with 3 stages).
_LARGE_M_TILES = (ConvConfig(256, 128, 64, 8, 3), ConvConfig(128, 256, 64, 8, 4))
# TMA-loaded 1x1 tiles (where the layer's views allow, see tma_loadable): a program per tile, and on a persistent
# grid the usual winner's shape and a 128x64 tile on 8 warps. YOLO's 1x1 convs have 1-3 K steps, so the epilogue is
# most of a tile's work, and 8 warps share it (32 accumulator registers a thread, where the 4-warp 128x128 tile
# holds 128 and ran at 12 % occupancy): it won 9 of yolo11n's 1x1 layers at batch 64 on an H100 by 2-10 %, and the
# whole path by 2.1-2.9 % in two A/B runs (bench/tile_offers.py, bench/NOTES.md).
_TMA_TILES = (
    ConvConfig(128, 128, 64, 4, 3, ConvKind.TMA_1X1),
    ConvConfig(128, 256, 64, 8, 3, ConvKind.TMA_1X1),
    ConvConfig(128, 128, 64, 4, 3, ConvKind.TMA_1X1, persistent=True),
    ConvConfig(128, 64, 64, 8, 3, ConvKind.TMA_1X1, persistent=True),
)
# The strides of the k x k convs the patch tiles are offered to (stride 2 through a view pairing rows and pixels).
_TMA_PATCH_STRIDES = (1, 2)
# Patch tiles of the k x k TMA kernel: 8x16 and 16x8 pixels (8 divides the 160-, 80- and 40-wide maps, 16 the
# first two).
_TMA_PATCH_TILES = (
    ConvConfig(128, 64, 64, 4, 3, ConvKind.TMA_PATCH, tile_w=16),
    ConvConfig(128, 128, 64, 4, 3, ConvKind.TMA_PATCH, tile_w=16),
    ConvConfig(128, 64, 64, 4, 4, ConvKind.TMA_PATCH, tile_w=8),
    ConvConfig(64, 64, 64, 4, 4, ConvKind.TMA_PATCH, tile_w=8),
)
# And to k x k convs of at least _TMA_PATCH_WIDE_MIN_N outputs (the stride-2 convs of s and m models at batch 64,
# whose plain GEMMs run best 256 wide): 8x8 patches, which tile the 40-wide maps exactly, and 8x16.
_TMA_PATCH_WIDE_TILES = (
    ConvConfig(64, 256, 64, 4, 3, ConvKind.TMA_PATCH, tile_w=8),
    ConvConfig(128, 256, 64, 8, 3, ConvKind.TMA_PATCH, tile_w=16),
)
_TMA_PATCH_WIDE_MIN_N = 256
# Layers writing at least this many output bytes (the 160x160 and 80x80 maps at batch 64) are also offered their
# TMA, packed (the stem) and wide two-input tiles with the output stored by the tensor memory accelerator: one bulk
# copy a tile through shared memory instead of each thread writing its accumulator's scattered pairs of values.
_TMA_STORE_MIN_BYTES = 1 << 27
# The tiles offered to a 1x1 conv that reads a second input (a folded upsample or concat): each is a specialization
# of its own to compile at start-up, so only the shapes that won such layers on an H200 (yolo11n, yolo26n and
# yolo11m at batch 1 and 64; bench/NOTES.md), the 8-warp ones only from 2^16 output pixels (yolo11m's 40x40 fold at
# batch 64 took 128x256; never offered at batch 1 for 640 inputs).
_TWO_INPUT_TILES = (
    ConvConfig(128, 64, 64, 4, 3),
    ConvConfig(64, 128, 64, 4, 3),
    ConvConfig(64, 64, 64, 4, 3),
    ConvConfig(32, 64, 64, 4, 4),
    ConvConfig(32, 32, 64, 2, 4),
    ConvConfig(32, 32, 128, 4, 3),
)
_TWO_INPUT_WIDE_TILES = (ConvConfig(128, 256, 64, 8, 3), ConvConfig(128, 256, 64, 8, 4))
_TWO_INPUT_WIDE_MIN_M = 1 << 16
# TMA tiles are offered to fp16 layers from this many output pixels: batch 64 at 40x40 and up, never at batch 1 for
# 640 inputs.
_TMA_MIN_M = 1 << 16
_PERSISTENT_PROGRAMS_PER_SM = 2
_INTERPRETER_PROGRAMS = 3  # under the interpreter: enough to walk tiles several apart
_INTERPRETER_TILE = (1024, 256, 256)  # block_m, block_n, block_k of the interpreter's untimed tile
_TMA_ALIGN = 16  # bytes: TMA needs the base address and every stride but the last on this boundary
# Pipeline buffers must fit an SM's shared memory (227 KiB on Hopper) with room left for the epilogue.
_SMEM_BUDGET = 200 * 1024


def candidate_set_id() -> str:
    """A short digest of the candidate tiles: tuning results remembered for another set are not reused, so a
    new candidate gets timed."""
    offer = (
        _CANDIDATES,
        _SPLITS,
        _TARGET_PROGRAMS,
        _DIRECT_TILES,
        _DIRECT_MAX_C_IN,
        _PACKED_TILES,
        _PACKED_MIN_C_OUT,
        _WHOLE_TAP_CHANNELS,
        _WHOLE_TAP_TILES,
        _TAP_ROW_CHANNELS,
        _TAP_ROW_TILES,
        _MOST_ROW_PIXELS,
        _MOST_BIT_TAPS,
        _SMEM_BUDGET,
        _LARGE_M,
        _LARGE_M_TILES,
        _TMA_TILES,
        _TMA_PATCH_TILES,
        _TMA_PATCH_STRIDES,
        _TMA_MIN_M,
        _TMA_PATCH_WIDE_TILES,
        _TMA_PATCH_WIDE_MIN_N,
        _TMA_STORE_MIN_BYTES,
        _PERSISTENT_PROGRAMS_PER_SM,
        _TWO_INPUT_TILES,
        _TWO_INPUT_WIDE_TILES,
        _TWO_INPUT_WIDE_MIN_M,
        [f.name for f in fields(ConvConfig)],  # a new kind of tile is a new field
    )
    return hashlib.sha1(repr(offer).encode()).hexdigest()[:8]


def _fit(block: int, size: int) -> int:
    # Plain Python: triton.next_power_of_2 is a jitted helper whose Python-side call costs microseconds.
    return min(block, max(16, 1 << (size - 1).bit_length()))


def _tap_channels(k: int, kernel_is_1x1: bool) -> int:
    """A tap's input channels when only K = kh·kw·C_in is known: K itself for 1x1 kernels, else K / 9, as if 3x3
    (all of YOLO's), which for other sizes only mis-sizes a tile, never breaks a launch."""
    return k if kernel_is_1x1 else max(1, k // 9)


def conv_candidate_configs(
    m: int,
    n: int,
    k: int,
    kernel_is_1x1: bool,
    dtype: torch.dtype = torch.float16,
    c_in: int | None = None,
    whole_pixels: bool = False,
    dense_rows: bool = False,
    kernel_w: int = 3,
) -> list[ConvConfig]:
    """Tile configs worth timing for a conv with GEMM sizes M=m, N=C_out=n, K=kh·kw·C_in=k.

    Tiles are shrunk to the problem (down to the 16-wide minimum) so small layers are not offered tiles that
    would be mostly masked. BLOCK_K tiles one tap's channels, C_in = k for 1x1 kernels; without `c_in` other
    kernels are taken to be 3x3 (all of YOLO's), which for other sizes only mis-sizes the offer, never breaks a
    launch. Configs whose pipeline would not fit in shared memory at ``dtype`` are left out. `whole_pixels`: the
    input's pixels are 8-byte words (see `pixels_are_words`), so the direct tiles also come in that mode.
    `dense_rows`: a kernel row's taps read one contiguous run (see `rows_are_dense`; no dilation across a row, no
    upsample), so the tap-row tiles are offered, K sized by the kernel's width `kernel_w`.
    """
    if c_in is None:
        c_in = _tap_channels(k, kernel_is_1x1)
    configs = []
    for c in _CANDIDATES + (_LARGE_M_TILES if m >= _LARGE_M else ()):
        fitted = ConvConfig(_fit(c.block_m, m), _fit(c.block_n, n), _fit(c.block_k, c_in), c.num_warps, c.num_stages)
        smem = fitted.num_stages * (fitted.block_m + fitted.block_n) * fitted.block_k * dtype.itemsize
        if smem <= _SMEM_BUDGET and fitted not in configs:
            configs.append(fitted)
    few_channels = []
    if not kernel_is_1x1 and c_in <= _DIRECT_MAX_C_IN:
        for block_m, block_n, warps in _DIRECT_TILES:
            config = ConvConfig(_fit(block_m, m), _fit(block_n, n), 16, warps, 1, ConvKind.DIRECT)
            for variant in (config, replace(config, whole_pixels=True)) if whole_pixels else (config,):
                if variant not in few_channels:
                    few_channels.append(variant)
        if n >= _PACKED_MIN_C_OUT:
            for block_m, block_n, warps, stages in _PACKED_TILES:
                # One K tile holds every tap (k <= 72 here), so there is no K loop to pipeline.
                config = ConvConfig(_fit(block_m, m), _fit(block_n, n), _fit(128, k), warps, stages, ConvKind.PACKED)
                if config not in few_channels:
                    few_channels.append(config)
        if whole_pixels and c_in <= _HALVES_PER_WORD:
            # A tap's channels in one word: K = 4 halves per tap, so the stem's tile reads 9 words a pixel.
            block_k = _HALVES_PER_WORD * max(4, 1 << (k // c_in - 1).bit_length())
            for block_m, block_n, warps, stages in _PACKED_TILES:
                config = ConvConfig(
                    _fit(block_m, m), _fit(block_n, n), block_k, warps, stages, ConvKind.PACKED, whole_pixels=True
                )
                if config not in few_channels:
                    few_channels.append(config)
    if not kernel_is_1x1 and c_in in _WHOLE_TAP_CHANNELS and k // c_in <= _MOST_BIT_TAPS:
        for block_m, block_n, block_k, warps, stages in _WHOLE_TAP_TILES:
            config = ConvConfig(_fit(block_m, m), _fit(block_n, n), block_k, warps, stages, ConvKind.PACKED)
            smem = stages * (config.block_m + config.block_n) * block_k * dtype.itemsize
            if smem <= _SMEM_BUDGET and config not in few_channels:
                few_channels.append(config)
    span = 1 << (kernel_w - 1).bit_length()
    rows_fit = c_in in _TAP_ROW_CHANNELS and span * c_in >= 16 and span <= _MOST_ROW_PIXELS
    if not kernel_is_1x1 and dense_rows and rows_fit:
        for block_m, block_n, warps, stages in _TAP_ROW_TILES:
            config = ConvConfig(_fit(block_m, m), _fit(block_n, n), span * c_in, warps, stages, ConvKind.PACKED,
                                tap_rows=True)  # fmt: skip
            smem = stages * (config.block_m + config.block_n) * config.block_k * dtype.itemsize
            if smem <= _SMEM_BUDGET and config not in few_channels:
                few_channels.append(config)
    tma = []
    if m >= _TMA_MIN_M and dtype == torch.float16:  # fp32 engines are for accuracy comparisons, not speed
        wide = _TMA_PATCH_WIDE_TILES if n >= _TMA_PATCH_WIDE_MIN_N else ()
        for c in _TMA_TILES if kernel_is_1x1 else _TMA_PATCH_TILES + wide:
            fitted = replace(c, block_n=_fit(c.block_n, n), block_k=_fit(c.block_k, c_in))
            smem = fitted.num_stages * (fitted.block_m + fitted.block_n) * fitted.block_k * dtype.itemsize
            if smem <= _SMEM_BUDGET and fitted not in tma:
                tma.append(fitted)
    stored = _tma_store_twins(
        [c for c in few_channels if c.kind is ConvKind.PACKED and c.whole_pixels] + tma, m, n, dtype
    )
    return configs + _split_k_variants(configs, m, n, k // c_in, c_in) + few_channels + tma + stored


def _tma_store_twins(configs: list[ConvConfig], m: int, n: int, dtype: torch.dtype) -> list[ConvConfig]:
    """The configs again with TMA stores, for fp16 layers writing at least _TMA_STORE_MIN_BYTES."""
    if dtype != torch.float16 or m * n * dtype.itemsize < _TMA_STORE_MIN_BYTES:
        return []
    return [replace(c, tma_store=True) for c in configs]


def two_input_candidates(m: int, n: int, c_in: int, dtype: torch.dtype = torch.float16) -> list[ConvConfig]:
    """Tile configs worth timing for a 1x1 conv reading a second input (`second` of conv2d_nhwc), GEMM sizes M=m,
    N=n, K=c_in over both inputs: unsplit GEMM tiles only, shrunk to the problem like every candidate."""
    configs = []
    wide = []
    for c in _TWO_INPUT_TILES + (_TWO_INPUT_WIDE_TILES if m >= _TWO_INPUT_WIDE_MIN_M else ()):
        fitted = ConvConfig(_fit(c.block_m, m), _fit(c.block_n, n), _fit(c.block_k, c_in), c.num_warps, c.num_stages)
        smem = fitted.num_stages * (fitted.block_m + fitted.block_n) * fitted.block_k * dtype.itemsize
        if smem <= _SMEM_BUDGET and fitted not in configs:
            configs.append(fitted)
            wide += [fitted] if c in _TWO_INPUT_WIDE_TILES else []
    return configs + _tma_store_twins(wide, m, n, dtype)


def _split_k_variants(configs: list[ConvConfig], m: int, n: int, taps: int, c_in: int) -> list[ConvConfig]:
    """Split-K versions of the tiles that launch under half a wave of programs on a long K walk (the 20x20 and
    40x40 layers at batch 1): up to 3 tiles, each split 2, 4 and 8 ways while every split keeps 2 K steps."""
    sparse = [c for c in configs if _programs(c, m, n) < _TARGET_PROGRAMS // 2]
    variants = []
    for c in sorted(sparse, key=lambda c: -_programs(c, m, n))[:3]:
        steps = taps * -(-c_in // c.block_k)
        for split in _SPLITS:
            if steps >= 2 * split and _programs(c, m, n) * split <= 3 * _TARGET_PROGRAMS:
                variants.append(replace(c, split_k=split))
    return variants


@functools.cache
def default_config(m: int, n: int, k: int, kernel_is_1x1: bool, dtype: torch.dtype = torch.float16) -> ConvConfig:
    """An untimed choice: on a GPU `untimed_gpu_config`; under Triton's interpreter, which runs programs and K steps
    one after another and pays per operation rather than per element, the fewest, largest tiles, larger than any
    GPU's (a yolo11n pipeline test at 128 pixels 78 -> 54 s on a 2-core machine).

    Cached per layer shape because the launcher calls it on every launch without an explicit config.
    """
    if interpreting():
        block_m, block_n, block_k = _INTERPRETER_TILE
        return ConvConfig(_fit(block_m, m), _fit(block_n, n), _fit(block_k, _tap_channels(k, kernel_is_1x1)), 4, 1)
    return untimed_gpu_config(m, n, k, kernel_is_1x1, dtype)


def untimed_gpu_config(m: int, n: int, k: int, kernel_is_1x1: bool, dtype: torch.dtype = torch.float16) -> ConvConfig:
    """The largest 4-warp GEMM tile among the candidates that still launches about a wave of programs."""
    configs = conv_candidate_configs(m, n, k, kernel_is_1x1, dtype)
    untimed = [c for c in configs if c.num_warps <= 4 and c.split_k == 1 and c.kind is ConvKind.GEMM]
    filling = [c for c in untimed if _programs(c, m, n) >= _TARGET_PROGRAMS]
    if filling:
        return max(filling, key=_tile_area)
    return max(untimed, key=lambda c: _programs(c, m, n))


def _tile_area(c: ConvConfig) -> int:
    return c.block_m * c.block_n


def _programs(c: ConvConfig, m: int, n: int) -> int:
    return -(-m // c.block_m) * -(-n // c.block_n)
