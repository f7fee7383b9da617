"""Lowering: each IR node (or fused group of nodes) becomes a `Launch` of one of our Triton kernels.

A `Launch` is bound to device views for one batch size, so running the network is calling the
launches in order, and capturing it is calling them inside a CUDA graph. Weights are packed once
per engine (`PackedWeights`) and shared by every batch size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import torch

from yolojet.engine.fusion import BoxFold, ExtraFold, HeadFold, LaunchGroup, ScoreFold, decide_fusions, launch_groups
from yolojet.engine.plan import MemoryPlan
from yolojet.errors import GraphError
from yolojet.ir import Graph, Node, pair
from yolojet.kernels.attention import AttentionTile, attention_candidate_tiles, default_attention_tile, psa_attention
from yolojet.kernels.classify import classify_head, classify_head_scratch, global_avg_pool_nhwc
from yolojet.kernels.conv import (
    ConvConfig,
    ConvKind,
    box_conv_decode,
    conv2d_nhwc,
    conv_candidate_configs,
    default_config,
    extra_conv_decode,
    pixels_are_words,
    rows_are_dense,
    score_conv_best_class,
    tma_loadable,
    tma_patch_loadable,
    tma_storable,
    two_input_candidates,
)
from yolojet.kernels.decode import DecodeSpec, decode_heads
from yolojet.kernels.dwconv import DwConvTile, default_dwconv_tile, dwconv2d_nhwc, dwconv_candidate_tiles
from yolojet.kernels.elementwise import add_nhwc, copy_nhwc, upsample_nearest_nhwc
from yolojet.kernels.nms import BestClassTargets, NmsScratch
from yolojet.kernels.one_to_one import OneToOneScratch, select_one_to_one
from yolojet.kernels.pool import maxpool2d_nhwc, sppf_pools
from yolojet.options import EngineOptions

T = TypeVar("T")

# view(name) -> the value's device view; view(name, widened=True) -> with the extra channels its convs work on
ViewFn = Callable[..., torch.Tensor]
# What tuning picks for a launch: a conv's tile, a depthwise conv's or the attention's blocking
TileConfig = ConvConfig | DwConvTile | AttentionTile


@dataclass
class Launch:
    """One kernel launch bound to its views; `tune_key` is set for launches whose tile config is tuned."""

    family: str
    nodes: list[str]  # the IR nodes this launch completes (more than one when fused)
    outputs: list[str]
    run: Callable[..., None]  # run(compile_only=True) compiles the kernels it launches, launching nothing
    tune_key: str | None = None
    # Each takes the launch's own kind of tile (one of TileConfig's), the kind its candidates are.
    configure: Callable[[Any], None] | None = None
    compile: Callable[[Any], None] | None = None  # compiles a candidate without launching it
    candidates: Sequence[TileConfig] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)  # values read and written: what orders it against others
    writes: list[str] = field(default_factory=list)
    # Split-K scratch: the launch's slot in SplitKScratch, and the (partials, arrivals) its current tile needs
    split_slot: int = -1
    split_need: Callable[[], tuple[int, int]] = lambda: (0, 0)
    # Launches that can also write their output to pinned host memory (the classifier's probabilities): sets or
    # clears that copy; TritonNetwork.copying_output scopes it to one block of runs or captures.
    copy_output: Callable[[torch.Tensor | None], None] | None = None
    # The head's decode, which can also write NMS's best-class pass (TritonNetwork.writing_best_class scopes it).
    best_class_output: Callable[[BestClassTargets | None], None] | None = None


class _TunedTile:
    """The tile a tuned launch runs now and how to launch any tile: `run` launches the current one, `configure`
    replaces it (after `fit` adapts a remembered pick to today's views), `compile` compiles a candidate without
    launching it (`compile_tile`, where compiling needs other arguments than launching)."""

    def __init__(
        self,
        launch_tile: Callable[[Any, bool], None],
        tile: Any,
        fit: Callable[[Any], Any] | None = None,
        compile_tile: Callable[[Any], None] | None = None,
    ) -> None:
        self.launch_tile, self.tile, self.fit = launch_tile, tile, fit
        self.compile_tile = compile_tile

    def run(self, compile_only: bool = False) -> None:
        self.launch_tile(self.tile, compile_only)

    def configure(self, tile: Any) -> None:
        self.tile = self.fit(tile) if self.fit is not None else tile

    def compile(self, tile: Any) -> None:
        if self.compile_tile is not None:
            self.compile_tile(tile)
        else:
            self.launch_tile(tile, True)


class _HeadFoldingTile(_TunedTile):
    """A head's score, box or extra conv's tuned tile, which while its side target holds NMS's best-class targets
    that store no scores runs `fused` instead, writing what the decode would have made of its output (the level's
    part of the best-class pass, its boxes or its extras: fusion.score_folds, box_folds, extra_folds); the decode then
    skips that level's map, as `_lower_decode` tells it under the same condition.

    Compiling the conv (the start-up's compile pass, on every core) compiles the fused kernel too, for `stand_ins`
    shaped as the predict path's targets: else a cold engine compiled each fused kernel one after another at its
    first frame, when the predict path first runs them."""

    def __init__(
        self,
        tuned: _TunedTile,
        best: _SideTarget[BestClassTargets],
        fused: Callable[[BestClassTargets, bool], None],
        stand_ins: Callable[[], list[BestClassTargets]],
    ) -> None:
        super().__init__(tuned.launch_tile, tuned.tile, tuned.fit, tuned.compile_tile)
        self.best, self.fused, self.stand_ins = best, fused, stand_ins

    def compile(self, tile: Any) -> None:
        super().compile(tile)
        for targets in self.stand_ins():
            self.fused(targets, True)

    def run(self, compile_only: bool = False) -> None:
        targets = self.best.value
        if targets is None or targets.store_scores:  # a decode storing the scores reads every map
            super().run(compile_only)
            for stand_in in self.stand_ins() if compile_only else []:
                self.fused(stand_in, True)
        else:
            self.fused(targets, compile_only)


# The predict path's class mask lies 20 bytes into its inputs' buffer (predict_path.RunInputs), off a 16-byte boundary:
# Triton specializes a pointer on whether it is on one, so a stand-in's mask lies off one too.
_CLASS_MASK_OFFSET = 20


def _stand_in_targets(
    batch: int, anchors: int, device: torch.device, classes: int | None
) -> Callable[[], list[BestClassTargets]]:
    """Best-class targets as the predict path hands them to a batch of `batch` images (NmsScratch rows of `anchors`,
    thresholds at the start of their buffer, no scores stored), made when asked, so that a compile-only launch given
    them compiles the same specializations as the path's runs: without a class filter, and with `classes` also with
    one (a mask of that many classes; None where the kernel takes no class filter)."""

    def made() -> list[BestClassTargets]:
        scratch = NmsScratch.allocate(batch, anchors, device)
        thresholds = torch.empty(2, dtype=torch.float32, device=device)
        found = [BestClassTargets(scratch.best_score, scratch.best_class, thresholds, None, store_scores=False)]
        if classes is not None:
            mask = torch.zeros(_CLASS_MASK_OFFSET + classes, dtype=torch.uint8, device=device)[_CLASS_MASK_OFFSET:]
            found.append(replace(found[0], class_mask=mask))
        return found

    return made


class _SideTarget(Generic[T]):
    """What a launch also writes besides its output while a block of runs or captures asks it to (the classifier's
    probabilities into pinned host memory, the decode's best classes into NMS's scratch), or None."""

    def __init__(self) -> None:
        self.value: T | None = None

    def set(self, value: T | None) -> None:
        self.value = value


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class SplitKScratch:
    """The partial tiles and arrival counts of split-K conv launches.

    Each split-K launch has a slot. Until `lay_out` runs (while tiles are compiled and timed one launch at a
    time) every slot uses the whole shared area, which lowering sizes for the largest candidate; launches read
    the tensors when they run, so growth then is fine. `lay_out`, called with the tiles picked and before CUDA
    graphs are captured (they hold the addresses), gives each slot that splits K its own part, so launches on
    parallel streams never share one. Every launch leaves its arrival counts at zero.
    """

    def __init__(self, device: torch.device) -> None:
        self.partials = torch.empty(0, dtype=torch.float32, device=device)
        self.arrivals = torch.zeros(0, dtype=torch.int32, device=device)
        self.slots = 0
        self.parts: dict[int, tuple[slice, slice]] = {}  # slot -> its (partials, arrivals) once laid out

    def new_slot(self) -> int:
        self.slots += 1
        return self.slots - 1

    def reserve(self, partials: int, arrivals: int) -> None:
        if partials > self.partials.numel():
            self.partials = torch.empty(partials, dtype=torch.float32, device=self.partials.device)
        if arrivals > self.arrivals.numel():
            self.arrivals = torch.zeros(arrivals, dtype=torch.int32, device=self.arrivals.device)

    def lay_out(self, needs: dict[int, tuple[int, int]]) -> None:
        """Give each slot its own (partials, arrivals) part of the sizes given."""
        self.reserve(sum(_round_up(p, 4) for p, _ in needs.values()), sum(_round_up(a, 4) for _, a in needs.values()))
        self.parts = {}
        partials = arrivals = 0
        for slot, (p, a) in sorted(needs.items()):
            self.parts[slot] = (slice(partials, partials + p), slice(arrivals, arrivals + a))
            # Parts start 16-byte aligned, as the whole area does: Triton specializes kernels on pointer
            # alignment, and the tiles were timed with aligned pointers.
            partials, arrivals = partials + _round_up(p, 4), arrivals + _round_up(a, 4)

    def views(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        part = self.parts.get(slot)
        if part is None:
            return self.partials, self.arrivals
        return self.partials[part[0]], self.arrivals[part[1]]


class PackedWeights:
    """Weights in the layouts the kernels read: conv [C_out, kh, kw, C_in], depthwise [kh, kw, C] in fp32 (a tap's
    weights for a run of channels one vector load, needing no conversion), bias fp32.

    `widened` (the plan's) maps values to the channel count their convs work on: a conv writing such a value
    gets zero weight rows and zero bias for the extra output channels, a conv reading it zero weights for the
    extra input channels.
    """

    def __init__(
        self, graph: Graph, device: torch.device, dtype: torch.dtype, widened: dict[str, int] | None = None
    ) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        widened = widened or {}
        for node in graph.nodes:
            w = {role: torch.from_numpy(a) for role, a in graph.node_weights(node).items()}
            if node.op == "conv":
                weight, bias = w["weight"], w["bias"]
                if node.attrs["groups"] == 1:
                    packed = weight.permute(0, 2, 3, 1)
                    extra_in = widened.get(node.inputs[0], packed.shape[3]) - packed.shape[3]
                    extra_out = widened.get(node.outputs[0], packed.shape[0]) - packed.shape[0]
                    packed = torch.nn.functional.pad(packed, (0, extra_in, 0, 0, 0, 0, 0, extra_out))
                    bias = torch.nn.functional.pad(bias, (0, extra_out))
                    self._put(node, "weight", packed, dtype, device)
                else:
                    self._put(node, "weight", weight[:, 0].permute(1, 2, 0), torch.float32, device)
                self._put(node, "bias", bias, torch.float32, device)
            elif node.op == "conv_transpose":
                # One 1x1 conv per kernel tap (dy, dx): weight (C_in, C_out, 2, 2) -> 4 x (C_out, 1, 1, C_in).
                weight = w["weight"]
                for dy in range(weight.shape[2]):
                    for dx in range(weight.shape[3]):
                        tap = weight[:, :, dy, dx].T[:, None, None, :]
                        self._put(node, f"weight{dy}{dx}", tap, dtype, device)
                self._put(node, "bias", w["bias"], torch.float32, device)
            elif node.op == "linear":
                self._put(node, "weight", w["weight"], dtype, device)
                self._put(node, "bias", w["bias"], torch.float32, device)
            elif node.weights:
                raise GraphError(f"node {node.name}: no weight packing for op {node.op}")

    def _put(self, node: Node, role: str, t: torch.Tensor, dtype: torch.dtype, device: torch.device) -> None:
        self.tensors[f"{node.name}.{role}"] = t.to(device=device, dtype=dtype).contiguous()

    def get(self, node: Node, role: str) -> torch.Tensor:
        return self.tensors[f"{node.name}.{role}"]


def _conv_tune_key(
    family: str, x: torch.Tensor, out: torch.Tensor, weight: torch.Tensor, node: Node, residual: bool
) -> str:
    a = node.attrs
    return (
        f"{family}|{x.dtype}|x{tuple(x.shape)}s{tuple(x.stride())}|o{tuple(out.shape)}s{tuple(out.stride())}"
        f"|w{tuple(weight.shape)}|st{a['stride']}|p{a['padding']}|d{a['dilation']}|{a['activation']}|r{int(residual)}"
    )


def _lower_conv(
    node: Node,
    view: ViewFn,
    weights: PackedWeights,
    scratch: SplitKScratch,
    pdl: bool,
    fold: tuple[Node | None, Node] | None = None,
    head_fold: HeadFold | None = None,
) -> Launch:
    """A conv; with `fold` = (upsample, concat) nodes feeding it (plan.upsample_folds), it reads the upsample's
    input through a nearest upsample and the concat's other part as a second input, and the launch covers the
    upsample node too. With `fold` = (None, concat) (plan.concat_folds) it reads the concat's first part where
    it lies, the part the concat would copy, and the concat's slice of its second part as a second input. With a
    `head_fold`, inside the network's `writing_best_class` block it writes instead of its output its level's part of
    NMS's best-class pass (a ScoreFold: kernels/conv/scores.py), or its level's decoded boxes (a BoxFold:
    kernels/conv/boxes.py) or extras (an ExtraFold: kernels/conv/extras.py) into the decode's output."""
    a = node.attrs
    x, out = view(node.inputs[0], widened=True), view(node.outputs[0], widened=True)
    residual = view(node.inputs[1]) if len(node.inputs) > 1 else None
    second, scale, nodes, key_suffix = None, 1, [node.name], ""
    if fold is not None:
        up, cat = fold
        # The concat's slice of its second part: placed there by its producer or by a copy.
        second = x[..., view(cat.inputs[0]).shape[3] :]
        if up is not None:
            x, scale, nodes = view(up.inputs[0], widened=True), int(up.attrs["scale"]), [up.name, node.name]
        else:
            # The concat node joins the launch, so the launch reads both of its parts (stream order).
            x, nodes = view(cat.inputs[0]), [cat.name, node.name]
        key_suffix = f"|up{scale}|second{tuple(second.shape)}s{tuple(second.stride())}"
    weight, bias = weights.get(node, "weight"), weights.get(node, "bias")
    stride, padding, dilation = pair(a["stride"]), pair(a["padding"]), pair(a["dilation"])
    if a["groups"] != 1:
        if a["groups"] != x.shape[3] or weight.shape[2] != x.shape[3] or dilation != (1, 1) or stride[0] != stride[1]:
            raise GraphError(f"node {node.name}: grouped conv with groups={a['groups']} has no kernel")
        return _lower_depthwise(node, x, out, weight, bias, residual, stride[0], padding[0], pdl)

    batch, oh, ow, c_out = out.shape
    m, k = batch * oh * ow, weight.shape[1] * weight.shape[2] * weight.shape[3]
    is_1x1 = weight.shape[1] == weight.shape[2] == 1
    whole_pixels = pixels_are_words(x)
    dense_rows = rows_are_dense(x) and dilation[1] == 1 and scale == 1
    c_in = x.shape[3] + (0 if second is None else second.shape[3])
    if second is None:
        candidates = conv_candidate_configs(
            m, c_out, k, is_1x1, x.dtype, c_in=c_in, whole_pixels=whole_pixels, dense_rows=dense_rows,
            kernel_w=weight.shape[2],
        )  # fmt: skip
    else:
        candidates = two_input_candidates(m, c_out, c_in, x.dtype)

    # The TMA kernels: a 1x1 conv as a plain GEMM, or a k x k conv (stride 1, or 2 in whole K blocks) on patches.
    def tma_fits(config: ConvConfig) -> bool:
        if config.tma_store and not tma_storable(out, patches=config.kind is ConvKind.TMA_PATCH):
            return False
        if not config.loads_by_tma:
            return True
        if second is not None or scale != 1:
            return False
        if config.kind is ConvKind.TMA_PATCH:
            return not is_1x1 and tma_patch_loadable(x, weight, stride, config.block_k)
        return is_1x1 and stride == (1, 1) and padding == (0, 0) and tma_loadable(x, weight)

    candidates = [c for c in candidates if tma_fits(c)]
    for config in candidates:
        scratch.reserve(*config.split_scratch(m, c_out))
    slot = scratch.new_slot()

    def conv(config: ConvConfig, compile_only: bool, partials: torch.Tensor, arrivals: torch.Tensor) -> None:
        conv2d_nhwc(
            out,
            x,
            weight,
            bias,
            stride=stride,
            padding=padding,
            dilation=dilation,
            activation=a["activation"],
            residual=residual,
            upsample=scale,
            second=second,
            config=config,
            pdl=pdl,
            partials=partials,
            arrivals=arrivals,
            compile_only=compile_only,
        )

    def launch_tile(config: ConvConfig, compile_only: bool) -> None:
        conv(config, compile_only, *scratch.views(slot))

    def fit(config: ConvConfig) -> ConvConfig:
        scratch.reserve(*config.split_scratch(m, c_out))  # a remembered pick may not be among today's candidates
        if config.whole_pixels and not whole_pixels:  # nor fit today's views (the tuning key has no addresses)
            config = replace(config, whole_pixels=False)
        if not tma_fits(config):  # nor TMA-store today's output (alignment): the same tile, stored by its threads
            config = replace(config, tma_store=False)
        if not tma_fits(config):  # nor TMA-load today's operands: the same tile, gathered
            config = config.gathered()
        return config

    def compile_config(config: ConvConfig) -> None:  # before the scratch is laid out: its whole buffers
        conv(config, True, scratch.partials, scratch.arrivals)

    tuned = _TunedTile(launch_tile, default_config(m, c_out, k, is_1x1, x.dtype), fit, compile_config)
    best: _SideTarget[BestClassTargets] = _SideTarget()
    if head_fold is not None:
        # The level's anchors follow the earlier levels' (the decode's order), at this input's map sizes.
        anchor_offset = sum(view(v).shape[1] * view(v).shape[2] for v in head_fold.box_values[: head_fold.level])
        anchors = sum(view(v).shape[1] * view(v).shape[2] for v in head_fold.box_values)
        tuned = _HeadFoldingTile(
            tuned,
            best,
            _head_fold_launch(x, weight, bias, a["activation"], anchor_offset, head_fold, view, pdl),
            _stand_in_targets(batch, anchors, x.device, head_fold.nc if isinstance(head_fold, ScoreFold) else None),
        )
    return Launch(
        "conv",
        nodes,
        list(node.outputs),
        tuned.run,
        tune_key=_conv_tune_key("conv", x, out, weight, node, residual is not None) + key_suffix,
        configure=tuned.configure,
        compile=tuned.compile,
        candidates=candidates,
        split_slot=slot,
        split_need=lambda: tuned.tile.split_scratch(m, c_out),
        best_class_output=best.set if head_fold is not None else None,
    )


def _lower_depthwise(
    node: Node,
    x: torch.Tensor,
    out: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    residual: torch.Tensor | None,
    stride: int,
    padding: int,
    pdl: bool,
) -> Launch:
    """A depthwise conv, its blocking tuned like a conv's tile."""
    activation = node.attrs["activation"]

    def launch_tile(tile: DwConvTile, compile_only: bool) -> None:
        dwconv2d_nhwc(
            out,
            x,
            weight,
            bias,
            stride=stride,
            padding=padding,
            activation=activation,
            residual=residual,
            tile=tile,
            pdl=pdl,
            compile_only=compile_only,
        )

    tuned = _TunedTile(launch_tile, default_dwconv_tile(x.shape[3]))
    return Launch(
        "dwconv",
        [node.name],
        list(node.outputs),
        tuned.run,
        tune_key=_conv_tune_key("dwconv", x, out, weight, node, residual is not None),
        configure=tuned.configure,
        compile=tuned.compile,
        candidates=dwconv_candidate_tiles(
            x.shape[3],
            x.dtype,
            walks_rows=tuple(weight.shape[:2]) == (3, 3) and stride == 1,
            pixels=out[..., 0].numel(),
        ),
    )


def _lower_conv_transpose(node: Node, view: ViewFn, weights: PackedWeights, pdl: bool) -> Launch:
    """A stride-2, 2x2 transposed conv is four 1x1 convs, each writing every other row and column."""
    sy, sx = pair(node.attrs["stride"])
    taps = [key for key in weights.tensors if key.startswith(f"{node.name}.weight")]
    if (sy, sx) != (2, 2) or pair(node.attrs["padding"]) != (0, 0) or len(taps) != 4:
        raise GraphError(f"node {node.name}: only 2x2 stride-2 transposed convs without padding have a kernel")
    x, out, bias = view(node.inputs[0]), view(node.outputs[0]), weights.get(node, "bias")
    parts = [(out[:, dy::2, dx::2, :], weights.get(node, f"weight{dy}{dx}")) for dy in (0, 1) for dx in (0, 1)]

    def run(compile_only: bool = False) -> None:
        for target, weight in parts:
            conv2d_nhwc(target, x, weight, bias, activation="identity", pdl=pdl, compile_only=compile_only)

    return Launch("conv", [node.name], list(node.outputs), run)


def _lower_pools(chain: list[Node], view: ViewFn, pdl: bool) -> Launch | None:
    """SPPF's pools as one launch, when their outputs are equally spaced slices with one set of strides (where the
    memory plan placed them: None otherwise, and each pool gets its own launch)."""
    outs = [view(n.outputs[0]) for n in chain]
    step = outs[1].data_ptr() - outs[0].data_ptr()
    spaced = step > 0 and all(o.data_ptr() - outs[0].data_ptr() == i * step for i, o in enumerate(outs))
    if not spaced or any(o.stride() != outs[0].stride() for o in outs):
        return None
    x = view(chain[0].inputs[0])
    kernel = pair(chain[0].attrs["kernel"])[0]

    def run(compile_only: bool = False) -> None:
        sppf_pools(outs, x, kernel=kernel, repeats=len(outs), pdl=pdl, compile_only=compile_only)

    return Launch("pool", [n.name for n in chain], [n.outputs[0] for n in chain], run)


def _lower_maxpool(node: Node, view: ViewFn, pdl: bool) -> Launch:
    x, out = view(node.inputs[0]), view(node.outputs[0])
    (kernel, _), (stride, _), (padding, _) = (pair(node.attrs[k]) for k in ("kernel", "stride", "padding"))

    def run(compile_only: bool = False) -> None:
        maxpool2d_nhwc(out, x, kernel=kernel, stride=stride, padding=padding, pdl=pdl, compile_only=compile_only)

    return Launch("pool", [node.name], list(node.outputs), run)


def _lower_attention(node: Node, out: torch.Tensor, ins: list[torch.Tensor], pdl: bool) -> Launch:
    """PSA attention, its blocking tuned like a conv's tile."""
    q, k, v = ins
    heads, scale = node.attrs["num_heads"], node.attrs["scale"]
    tokens = q.shape[1] * q.shape[2]

    def launch_tile(tile: AttentionTile, compile_only: bool) -> None:
        psa_attention(out, q, k, v, num_heads=heads, scale=scale, tile=tile, pdl=pdl, compile_only=compile_only)

    tuned = _TunedTile(launch_tile, default_attention_tile(tokens, q.dtype))
    views = "".join(
        f"|{name}{tuple(t.shape)}s{tuple(t.stride())}" for name, t in zip("qkvo", (q, k, v, out), strict=True)
    )
    return Launch(
        "attention",
        [node.name],
        list(node.outputs),
        tuned.run,
        tune_key=f"attention|{q.dtype}{views}|h{heads}",
        configure=tuned.configure,
        compile=tuned.compile,
        candidates=attention_candidate_tiles(tokens, q.dtype),
    )


def _lower_simple(node: Node, view: ViewFn, pdl: bool) -> Launch:
    ins = [view(i) for i in node.inputs]
    outs = [view(o) for o in node.outputs]
    a = node.attrs
    if node.op == "upsample":

        def run(compile_only: bool = False) -> None:
            upsample_nearest_nhwc(outs[0], ins[0], a["scale"], pdl=pdl, compile_only=compile_only)

        family = "elementwise"
    elif node.op == "add":

        def run(compile_only: bool = False) -> None:
            add_nhwc(outs[0], ins[0], ins[1], pdl=pdl, compile_only=compile_only)

        family = "elementwise"
    elif node.op == "attention":
        return _lower_attention(node, outs[0], ins, pdl)
    elif node.op == "global_avg_pool":

        def run(compile_only: bool = False) -> None:
            global_avg_pool_nhwc(outs[0], ins[0], pdl=pdl, compile_only=compile_only)

        family = "classify"
    elif node.op == "decode":
        return _lower_decode(node, view, pdl, frozenset(), frozenset(), frozenset())
    elif node.op == "topk":
        return _lower_one_to_one(node, ins[0], outs[0], pdl)
    else:
        raise GraphError(f"node {node.name}: op {node.op} has no GPU kernel")
    return Launch(family, [node.name], list(node.outputs), run)


def _head_fold_launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    activation: str,
    anchor_offset: int,
    fold: HeadFold,
    view: ViewFn,
    pdl: bool,
) -> Callable[[BestClassTargets, bool], None]:
    """A head fold's fused launch: the score conv writing its level's part of the best-class pass, or the box or
    extra conv its level's boxes or extras into the decode's output."""
    if isinstance(fold, ScoreFold):

        def write_best_class(targets: BestClassTargets, compile_only: bool) -> None:
            score_conv_best_class(x, weight, bias, targets, anchor_offset=anchor_offset, nc=fold.nc,
                                  activation=activation, pdl=pdl, compile_only=compile_only)  # fmt: skip

        return write_best_class
    # The launch's declared writes stay its own map's: each level writes its own anchors of the decode's output, so
    # declaring the whole buffer would chain the levels' convs for nothing, and the plan keeps every other value out
    # of that buffer's memory from the first box or extra conv on.
    decoded = view(fold.output)
    if isinstance(fold, BoxFold):
        box = fold

        def write_boxes(_: BestClassTargets, compile_only: bool) -> None:
            box_conv_decode(x, weight, bias, decoded, anchor_offset=anchor_offset, stride=box.stride,
                            reg_max=box.reg_max, xywh=box.xywh, activation=activation, pdl=pdl,
                            compile_only=compile_only)  # fmt: skip

        return write_boxes
    extra: ExtraFold = fold

    def write_extras(_: BestClassTargets, compile_only: bool) -> None:
        extra_conv_decode(x, weight, bias, decoded, first_row=extra.first_row, extra=extra.extra,
                          anchor_offset=anchor_offset, stride=extra.stride, keypoint_dim=extra.keypoint_dim,
                          keypoints_v26=extra.keypoints_v26, activation=activation, pdl=pdl,
                          compile_only=compile_only)  # fmt: skip

    return write_extras


def _lower_decode(
    node: Node,
    view: ViewFn,
    pdl: bool,
    folded_scores: frozenset[int],
    folded_boxes: frozenset[int],
    folded_extras: frozenset[int],
    takes_pass: bool = True,
) -> Launch:
    """The head's decode. Inside the network's `writing_best_class` block it also writes NMS's best-class pass, for
    every level but `folded_scores`, whose score convs write theirs (fusion.score_folds), the boxes of every level
    but `folded_boxes` and the extras of every level but `folded_extras`, whose box and extra convs write theirs
    (fusion.box_folds, fusion.extra_folds). Where its predict path `takes_pass` (not an end-to-end head's), compiling
    it compiles the variant writing the pass too, for stand-in targets (`_stand_in_targets`)."""
    levels = node.attrs["levels"]
    spec = DecodeSpec.from_attrs(node.attrs)
    maps = [view(i, widened=True) for i in node.inputs]  # widened maps are read whole: aligned vector loads
    boxes, scores, extras = maps[:levels], maps[levels : 2 * levels], maps[2 * levels :] or None
    out = view(node.outputs[0])
    best: _SideTarget[BestClassTargets] = _SideTarget()
    stand_ins = _stand_in_targets(out.shape[0], out.shape[2], out.device, spec.nc)

    def decode(targets: BestClassTargets | None, compile_only: bool) -> None:
        # The folding convs' condition (_HeadFoldingTile): targets that store no scores.
        folding = targets is not None and not targets.store_scores
        decode_heads(
            out,
            boxes,
            scores,
            extras,
            spec,
            best=targets,
            folded_scores=folded_scores if folding else frozenset(),
            folded_boxes=folded_boxes if folding else frozenset(),
            folded_extras=folded_extras if folding else frozenset(),
            pdl=pdl,
            compile_only=compile_only,
        )

    def run(compile_only: bool = False) -> None:
        decode(best.value, compile_only)
        if compile_only and takes_pass and best.value is None:  # the start-up's compile pass: the path's decode too
            for stand_in in stand_ins():
                decode(stand_in, True)

    return Launch("decode", [node.name], list(node.outputs), run, best_class_output=best.set)


def _lower_one_to_one(node: Node, preds: torch.Tensor, out: torch.Tensor, pdl: bool) -> Launch:
    """YOLO26's one-to-one selection, with its scratch for this batch size allocated here: kernels never allocate,
    and the captured graphs hold the scratch's addresses."""
    nc, max_det = node.attrs["nc"], node.attrs["max_det"]
    batch, channels, anchors = preds.shape
    scratch = OneToOneScratch.allocate(batch, anchors, nc, channels - 4 - nc, max_det, preds.device)

    def run(compile_only: bool = False) -> None:
        select_one_to_one(out, preds, nc=nc, max_det=max_det, scratch=scratch, pdl=pdl, compile_only=compile_only)

    return Launch("one_to_one", [node.name], list(node.outputs), run)


@dataclass(frozen=True)
class LoweringContext:
    """What every lowering reads besides its nodes: the views at this batch size, the packed weights, the split-K
    scratch, whether launches use programmatic dependent launch, and whether the model's head is end to end (YOLO26's
    one-to-one selection, whose path takes no best-class pass)."""

    view: ViewFn
    weights: PackedWeights
    scratch: SplitKScratch
    pdl: bool
    end2end: bool = False


def _lower_pool_chain(chain: tuple[Node, ...], c: LoweringContext) -> list[Launch]:
    fused = _lower_pools(list(chain), c.view, c.pdl)
    return [fused] if fused is not None else [_lower_maxpool(node, c.view, c.pdl) for node in chain]


# The lowering of each kind of launch group (engine/fusion.py's LaunchGroup): the group's launches, in order.
LOWERINGS: dict[str, Callable[[LaunchGroup, LoweringContext], list[Launch]]] = {
    "concat_copy": lambda g, c: [_copy_into_concat(g.nodes[0], str(g.value), c.view, c.pdl)],
    "conv": lambda g, c: [_lower_conv(g.nodes[0], c.view, c.weights, c.scratch, c.pdl, g.fold, g.head_fold)],
    "decode": lambda g, c: [_lower_decode(g.nodes[0], c.view, c.pdl, *g.folded(), takes_pass=not c.end2end)],
    "conv_transpose": lambda g, c: [_lower_conv_transpose(g.nodes[0], c.view, c.weights, c.pdl)],
    "maxpool": lambda g, c: [_lower_maxpool(g.nodes[0], c.view, c.pdl)],
    "pool_chain": lambda g, c: _lower_pool_chain(g.nodes, c),
    "classify_head": lambda g, c: [_lower_classify_head(g.nodes, c.view, c.weights, c.pdl)],
    "simple": lambda g, c: [_lower_simple(g.nodes[0], c.view, c.pdl)],
}


def lower(
    graph: Graph,
    view: ViewFn,
    weights: PackedWeights,
    plan: MemoryPlan,
    scratch: SplitKScratch,
    options: EngineOptions,
) -> list[Launch]:
    """The launch list for one batch size; `view(name)` gives each value's device view at that size.

    Three passes: engine/fusion.py decides which nodes share a launch (none without `options.fuse`; the plan names
    the concat inputs to copy) and cuts the graph into launch groups; each group is lowered by its kind's entry in
    LOWERINGS; each launch's reads and writes are set (what orders it against the others). `scratch` serves the
    convs whose tuned tile splits K; `options.pdl` (resolved for the device: True or False) launches every kernel
    with programmatic dependent launch (yolojet.kernels.pdl).
    """
    groups = launch_groups(graph, plan, decide_fusions(graph, plan, options.fuse))
    context = LoweringContext(view, weights, scratch, bool(options.pdl), graph.meta.end2end)
    launches = [launch for group in groups for launch in LOWERINGS[group.kind](group, context)]
    by_name = {node.name: node for node in graph.nodes}
    for launch in launches:
        _set_access(launch, by_name)
    return launches


def _set_access(launch: Launch, by_name: dict[str, Node]) -> None:
    """A launch reads its nodes' inputs that none of them produce, and writes all their outputs; a launch that
    declares its own (a concat's copy, which completes no node) keeps them."""
    if launch.reads or launch.writes:
        return
    nodes = [by_name[name] for name in launch.nodes]
    produced = {out for node in nodes for out in node.outputs}
    launch.reads = list(dict.fromkeys(v for node in nodes for v in node.inputs if v not in produced))
    launch.writes = list(dict.fromkeys(produced))


def _copy_into_concat(node: Node, value: str, view: ViewFn, pdl: bool) -> Launch:
    position = node.inputs.index(value)
    source, target = view(value), view(node.outputs[0])
    start = sum(view(v).shape[3] for v in node.inputs[:position])
    destination = target[..., start : start + source.shape[3]]

    def run(compile_only: bool = False) -> None:
        copy_nhwc(destination, source, pdl=pdl, compile_only=compile_only)

    return Launch("elementwise", [f"{node.name}<-{value}"], [], run, reads=[value], writes=[node.outputs[0]])


def _lower_classify_head(head: Sequence[Node], view: ViewFn, weights: PackedWeights, pdl: bool) -> Launch:
    """The classifier's linear layer and the softmax after it are one kernel, which also pools when the head's first
    node is the global average pool before them (else the head is the linear layer, reading pooled features, and
    what follows it)."""
    pooling = head[0].op == "global_avg_pool"
    if len(head) < 2:
        raise GraphError(f"node {head[0].name}: a linear layer runs on the GPU only fused with the softmax after it")
    linear, following = head[-2], head[-1]
    if following.op != "softmax" or following.inputs != linear.outputs:
        raise GraphError(f"node {linear.name}: a linear layer runs on the GPU only fused with the softmax after it")
    features = view(head[0].inputs[0])
    if not pooling:
        features = features[:, None, None, :]  # pooled (N, C): a 1 x 1 map
    probs = view(following.outputs[0])
    weight, bias = weights.get(linear, "weight"), weights.get(linear, "bias")
    partials, arrivals = classify_head_scratch(features.shape[0], features.shape[3], weight.shape[0], features.device)
    copy: _SideTarget[torch.Tensor] = _SideTarget()

    def run(compile_only: bool = False) -> None:
        classify_head(
            probs, features, weight, bias, partials, arrivals, copy_to=copy.value, pdl=pdl, compile_only=compile_only
        )

    return Launch("classify", [n.name for n in head], list(following.outputs), run, copy_output=copy.set)
