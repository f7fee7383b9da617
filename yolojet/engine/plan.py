"""Memory plan: where every value of the graph lives on the device.

Feature maps live in NHWC buffers carved out of one activation arena. A concat's output is one
buffer, and its inputs are placed as channel slices of it, so their producers write there directly
and the concat itself costs nothing; a split's outputs are channel slices of its input. A value
that cannot be placed where a concat wants it (it already lives elsewhere, or is the graph input)
is copied, and the plan lists those copies. Buffers share memory only when every use of one comes before
every write of the other in the graph itself (not just in launch order), so independent branches may run
side by side.
Head tensors (decode, top-k, classification outputs) are float32 and get their own arena.

A value of an odd channel count passed only from a conv to convs or the head decode (pose's 51 keypoint
channels) is widened to a multiple of 16 for the kernels: its producer writes the extra channels from zero
weights and bias, consuming convs give them zero weights, the decode reads and drops them, and Triton,
seeing strides and channel counts divisible by 16, loads whole 16-byte vectors instead of single elements.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from yolojet.engine.fusion import box_folds, concat_folds, extra_folds, upsample_folds
from yolojet.ir import Graph, Node

CHANNEL_ALIGN = 8  # 16-byte pixel rows in fp16: vector loads stay aligned in every slice that starts aligned
# The image (3 channels) in rows of 4: an 8-byte fp16 pixel is one word for the stem's whole-pixel tiles, and a
# 32-byte memory sector holds 4 pixels instead of 2, halving what the stem reads at large batch.
INPUT_ROW = 4
# Triton specializes integer arguments divisible by 16; only then does it know a pixel row or a K block is
# aligned, and vectorize the loads.
KERNEL_CHANNELS = 16
ARENA_ALIGN = 64  # elements; 128-byte aligned buffer starts in fp16
FEATURE_OPS_WRITING_VIEWS = {"conv", "conv_transpose", "maxpool", "upsample", "add", "attention", "concat"}


@dataclass
class Buffer:
    """A root allocation: NHWC (`pixels` = H·W, `row` = padded channels) or a flat float32 head tensor."""

    index: int
    kind: str  # "feature" (activation dtype, NHWC) or "head" (float32, logical layout)
    shape: tuple[int, ...]  # per image: (H, W, row) for features, the value's shape without batch for heads
    first: int  # index of the node that first writes it (-1: graph input)
    last: int  # index of the node that last reads it (len(nodes): a graph output)
    offset: int = 0  # in elements of the buffer's arena

    @property
    def per_image(self) -> int:
        size = 1
        for d in self.shape:
            size *= d
        return size


@dataclass
class Placement:
    """A value = channels [channel, channel + channels) of a buffer (all channels for head tensors)."""

    buffer: int
    channel: int
    channels: int


@dataclass
class MemoryPlan:
    buffers: list[Buffer]
    placements: dict[str, Placement]
    copies: dict[str, list[str]]  # concat node name -> its inputs that must be copied into place
    # value -> the channel count its producing and consuming convs work on (see _widened_for_kernels)
    widened: dict[str, int] = field(default_factory=dict)
    # 1x1 conv node -> the upsample node it may read through (see upsample_folds)
    upsample_folds: dict[str, str] = field(default_factory=dict)
    # 1x1 conv node -> the concat whose copied first input it may read in place (see concat_folds)
    concat_folds: dict[str, str] = field(default_factory=dict)
    feature_elements: int = 0  # arena sizes per image slot, in elements
    head_elements: int = 0
    stats: dict[str, int] = field(default_factory=dict)

    def arena_elements(self, kind: str, max_batch: int) -> int:
        per_image = self.feature_elements if kind == "feature" else self.head_elements
        return per_image * max_batch


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _reads_widened(reader: Node, value: str) -> bool:
    """Whether `reader` can take `value` with extra channels: a plain conv reading nothing else (its zero weights
    for them are packed in), or the head decode reading it as a score or extra map (box maps it reads exactly)."""
    if reader.op == "conv":
        return reader.attrs["groups"] == 1 and reader.inputs == [value]
    levels = reader.attrs.get("levels", 0)
    return reader.op == "decode" and all(i >= levels for i, name in enumerate(reader.inputs) if name == value)


def _widened_for_kernels(graph: Graph) -> dict[str, int]:
    """Values whose kernels work on them `KERNEL_CHANNELS`-aligned: a channel count above 16 and not a multiple
    of it, written by a conv without a residual and read only as the input of other convs or by the head decode,
    so the extra channels never reach anything else (the zero weights that read them make their values
    irrelevant, act(0 + 0) keeps them finite, and the decode never stores them)."""
    consumers: dict[str, list] = {}
    for node in graph.nodes:
        for name in node.inputs:
            consumers.setdefault(name, []).append(node)
    widened = {}
    for node in graph.nodes:
        if node.op != "conv" or node.attrs["groups"] != 1 or len(node.inputs) != 1:  # a fused residual stays narrow
            continue
        value = node.outputs[0]
        channels = int(graph.values[value].shape[1])
        readers = consumers.get(value, [])
        if (
            channels > KERNEL_CHANNELS
            and channels % KERNEL_CHANNELS
            and value not in graph.outputs
            and readers
            and all(_reads_widened(r, value) for r in readers)
        ):
            widened[value] = _round_up(channels, KERNEL_CHANNELS)
    return widened


def plan_memory(graph: Graph) -> MemoryPlan:
    producers = {out: (i, node) for i, node in enumerate(graph.nodes) for out in node.outputs}
    placements: dict[str, Placement] = {}
    buffers: list[Buffer] = []
    copies: dict[str, list[str]] = {}
    widened = _widened_for_kernels(graph)

    def new_buffer(value: str, kind: str) -> int:
        shape = graph.values[value].shape[1:]
        if kind == "feature":
            c, h, w = shape
            row = INPUT_ROW if value in graph.inputs and c <= INPUT_ROW else _round_up(c, CHANNEL_ALIGN)
            shape = (h, w, widened.get(value, row))
        buffers.append(Buffer(len(buffers), kind, tuple(int(d) for d in shape), first=0, last=0))
        return len(buffers) - 1

    def split_run_fits(split_node, concat_inputs: list[str], position: int) -> bool:
        """A split's outputs may share a concat buffer only if they appear there whole, in order, unplaced."""
        outs = split_node.outputs
        return concat_inputs[position : position + len(outs)] == outs and not any(o in placements for o in outs)

    def place_into(value: str, buffer: int, channel: int, concat_inputs: list[str], position: int) -> bool:
        """Try to make `value` a slice of `buffer`; False means the concat must copy it."""
        if value in placements or value not in producers:
            return False
        _, producer = producers[value]
        channels = int(graph.values[value].shape[1])
        if producer.op == "split":
            source = producer.inputs[0]
            if not split_run_fits(producer, concat_inputs, position):
                return False
            if not place_into(source, buffer, channel, [source], 0):
                return False
            offset = channel
            for out, size in zip(producer.outputs, producer.attrs["sizes"], strict=True):
                placements[out] = Placement(buffer, offset, size)
                offset += size
            return True
        if producer.op not in FEATURE_OPS_WRITING_VIEWS:
            return False
        placements[value] = Placement(buffer, channel, channels)
        return True

    # Concats first, last to first, so an outer concat claims its inputs before an inner one is laid out.
    for node in reversed(graph.nodes):
        if node.op != "concat":
            continue
        out = node.outputs[0]
        if out not in placements:
            placements[out] = Placement(new_buffer(out, "feature"), 0, int(graph.values[out].shape[1]))
        target = placements[out]
        channel = target.channel
        for position, value in enumerate(node.inputs):
            where = placements.get(value)
            in_place = where is not None and (where.buffer, where.channel) == (target.buffer, channel)
            if not in_place and not place_into(value, target.buffer, channel, node.inputs, position):
                copies.setdefault(node.name, []).append(value)
            channel += int(graph.values[value].shape[1])

    # Everything else: split outputs are views of their input, other values get a buffer of their own.
    for name in graph.inputs:
        if name not in placements:
            placements[name] = Placement(new_buffer(name, "feature"), 0, int(graph.values[name].shape[1]))
    for node in graph.nodes:
        if node.op == "split":
            source = placements[node.inputs[0]]
            offset = source.channel
            for out, size in zip(node.outputs, node.attrs["sizes"], strict=True):
                placements.setdefault(out, Placement(source.buffer, offset, size))
                offset += size
            continue
        for out in node.outputs:
            if out not in placements:
                kind = "feature" if len(graph.values[out].shape) == 4 else "head"
                channels = int(graph.values[out].shape[1])
                placements[out] = Placement(new_buffer(out, kind), 0, channels)

    folds = upsample_folds(graph, copies)
    cat_folds = concat_folds(graph, copies, folds)
    # A conv folding an upsample reads the upsample's input itself, and one folding a concat the input that
    # concat would copy: those buffers must outlive the conv.
    node_index = {node.name: i for i, node in enumerate(graph.nodes)}
    by_name = {node.name: node for node in graph.nodes}
    extra_reads = {node_index[conv]: by_name[up].inputs[0] for conv, up in folds.items()}
    extra_reads |= {node_index[conv]: by_name[cat].inputs[0] for conv, cat in cat_folds.items()}
    # A box or extra conv that may decode its level's boxes or extras (fusion.box_folds, fusion.extra_folds) writes
    # the decode's output: that buffer must be its own from the conv on.
    extra_writes = {node_index[conv]: fold.output for conv, fold in box_folds(graph).items()}
    extra_writes |= {node_index[conv]: fold.output for conv, fold in extra_folds(graph).items()}
    _set_lifetimes(graph, buffers, placements, extra_reads, extra_writes)
    ordered = _ordered_pairs(graph, buffers, placements, extra_reads, extra_writes)
    plan = MemoryPlan(buffers, placements, copies, widened, folds, cat_folds)
    plan.feature_elements = _allocate([b for b in buffers if b.kind == "feature"], ordered)
    plan.head_elements = _allocate([b for b in buffers if b.kind == "head"], ordered)
    plan.stats = {
        "buffers": len(buffers),
        "copies": sum(len(v) for v in copies.values()),
        "feature_elements_unshared": sum(b.per_image for b in buffers if b.kind == "feature"),
    }
    return plan


def _set_lifetimes(
    graph: Graph,
    buffers: list[Buffer],
    placements: dict[str, Placement],
    extra_reads: dict[int, str],
    extra_writes: dict[int, str],
) -> None:
    end = len(graph.nodes)
    first = {b.index: end for b in buffers}
    last = {b.index: -1 for b in buffers}
    for name in graph.inputs:
        first[placements[name].buffer] = -1
    for i, node in enumerate(graph.nodes):
        for name in [*node.outputs, *([extra_writes[i]] if i in extra_writes else [])]:
            index = placements[name].buffer
            first[index] = min(first[index], i)
            last[index] = max(last[index], i)
        for name in [*node.inputs, *([extra_reads[i]] if i in extra_reads else [])]:
            last[placements[name].buffer] = max(last[placements[name].buffer], i)
    for name in graph.outputs:
        last[placements[name].buffer] = end
    for b in buffers:
        # Reserved from the node before its first writer: a launch that fuses a node with the one before it
        # (linear + softmax, SPPF's pools) writes this buffer while that earlier node's inputs are still read.
        b.first, b.last = max(first[b.index] - 1, -1), last[b.index]


def _ordered_pairs(
    graph: Graph,
    buffers: list[Buffer],
    placements: dict[str, Placement],
    extra_reads: dict[int, str],
    extra_writes: dict[int, str],
) -> Callable[[int, int], bool]:
    """Whether every node touching one buffer is an ancestor, in the graph, of every node writing the other.

    Only such buffers may share memory. Sharing by network order alone would be enough for launches that run one
    after another, but independent branches (the head's per-level chains) may run side by side on parallel
    streams (engine/streams.py), and a branch must not reuse memory that another branch may still be using.
    """
    producers = {out: i for i, node in enumerate(graph.nodes) for out in node.outputs}
    ancestors: list[int] = []  # bit i set: node i is an ancestor
    for node in graph.nodes:
        mask = 0
        for name in node.inputs:
            if name in producers:
                mask |= ancestors[producers[name]] | (1 << producers[name])
        ancestors.append(mask)
    touching = [0] * len(buffers)
    writers: list[list[int]] = [[] for _ in buffers]
    for i, node in enumerate(graph.nodes):
        for name in [*node.inputs, *([extra_reads[i]] if i in extra_reads else [])]:
            touching[placements[name].buffer] |= 1 << i
        for name in [*node.outputs, *([extra_writes[i]] if i in extra_writes else [])]:
            touching[placements[name].buffer] |= 1 << i
            writers[placements[name].buffer].append(i)

    def before(a: int, b: int) -> bool:
        return bool(writers[b]) and all(touching[a] & ~ancestors[w] == 0 for w in writers[b])

    def ordered(a: int, b: int) -> bool:
        return before(a, b) or before(b, a)

    return ordered


def _allocate(buffers: list[Buffer], ordered: Callable[[int, int], bool]) -> int:
    """Offsets (per image slot) so that buffers that may be in use at the same time never overlap; returns the
    arena size.

    Largest buffers first, each at the lowest aligned offset that clears every already placed buffer
    whose lifetime intersects its own or that is not ordered with it in the graph: a greedy interval packing
    that is near-optimal for these chains.
    """
    placed: list[Buffer] = []
    top = 0
    for buf in sorted(buffers, key=lambda b: -b.per_image):
        size = _round_up(buf.per_image, ARENA_ALIGN)
        busy = sorted(
            (p.offset, p.offset + _round_up(p.per_image, ARENA_ALIGN))
            for p in placed
            if (p.first <= buf.last and buf.first <= p.last) or not ordered(p.index, buf.index)
        )
        offset = 0
        for start, stop in busy:
            if offset + size <= start:
                break
            offset = max(offset, stop)
        buf.offset = offset
        placed.append(buf)
        top = max(top, offset + size)
    return top
