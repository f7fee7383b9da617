"""Which nodes share a launch, decided in one place: each fusion's pattern, found on the graph (and, for the folds,
on which concat inputs the memory plan copies), then the graph cut into the launches that follow from them
(`launch_groups`, which engine/lowering.py turns into kernel launches). The memory plan keeps the folds' inputs
alive; `EngineOptions(fuse=False)` turns every fusion off.

- upsample folds: a 1x1 conv reading Concat([Upsample(x), y]) reads x through the upsample (a neck's Upsample →
  Concat → C2f/C3k2): no upsample launch;
- concat folds: a 1x1 conv reading a concat that must copy its first part (C2PSA's) reads that part where it lies:
  no copy launch;
- pool chains: maxpools chained on each other's outputs with one stride-1 'same' window (SPPF's) in one launch;
- pooled heads: a global average pool feeding only the linear layer after it is pooled inside the classifier's
  head launch;
- conv pairs (opt-in, `EngineOptions(conv_pairs=True)`): a 3x3 conv feeding only the 3x3 conv after it (a
  bottleneck's pair, the head's box branch, with the branch's last 1x1 conv) in one launch where the map is small
  enough (engine/lowering.py); and
  a depthwise conv feeding only the 1x1 conv after it, and that one possibly only a second 1x1 conv (the YOLO11 and
  YOLO26 heads' class branches), a separable conv in one launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from yolojet.ir import Graph, Node, pair

if TYPE_CHECKING:
    from yolojet.engine.plan import MemoryPlan


@dataclass(frozen=True)
class Fusions:
    """What lowering fuses: conv -> the upsample it reads through; conv -> the concat whose copy it reads in place;
    first maxpool -> the chain's node names; the global average pools pooled in the classifier's head; a 3x3 pair's
    first conv -> its second (and the 1x1 conv after it); a separable chain's depthwise conv -> its one or two 1x1
    convs."""

    upsample_folds: dict[str, str]
    concat_folds: dict[str, str]
    pool_chains: dict[str, list[str]]
    pooled_heads: frozenset[str]
    conv_pairs: dict[str, list[str]] = field(default_factory=dict)
    separable_chains: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchGroup:
    """The nodes one launch completes (in graph order) and the lowering that builds it: `kind` names one of
    engine/lowering.py's LOWERINGS. A "conv" group's `fold` is (upsample or None, concat) where the conv reads
    through a fold; a "concat_copy" group copies the concat's input `value` into place."""

    kind: str
    nodes: tuple[Node, ...]
    fold: tuple[Node | None, Node] | None = None
    value: str | None = None


# Ops lowered one node a launch by a lowering of their own name; the rest of the one-node ops are "simple".
_OWN_LOWERINGS = frozenset({"conv", "conv_transpose", "maxpool"})


def launch_groups(graph: Graph, plan: MemoryPlan, fusions: Fusions) -> list[LaunchGroup]:
    """The graph's launches in order, each as the nodes it completes. Splits get none (their outputs are views of
    the input), nor do concats but for the copies the plan asks of them (none where a conv reads the part in place),
    nor upsamples folded into their conv."""
    by_name = {node.name: node for node in graph.nodes}
    producer = {out: node for node in graph.nodes for out in node.outputs}
    folded_upsamples = set(fusions.upsample_folds.values())
    read_in_place = set(fusions.concat_folds.values())
    groups: list[LaunchGroup] = []
    covered: set[str] = set()
    for i, node in enumerate(graph.nodes):
        if node.name in covered or node.name in folded_upsamples or node.op == "split":
            continue
        if node.op == "concat":
            copied = [] if node.name in read_in_place else plan.copies.get(node.name, [])
            groups += [LaunchGroup("concat_copy", (node,), value=value) for value in copied]
            continue
        if node.name in fusions.upsample_folds:
            fold = (by_name[fusions.upsample_folds[node.name]], producer[node.inputs[0]])
            group = LaunchGroup("conv", (node,), fold=fold)
        elif node.name in fusions.concat_folds:
            group = LaunchGroup("conv", (node,), fold=(None, by_name[fusions.concat_folds[node.name]]))
        elif node.name in fusions.conv_pairs:
            group = LaunchGroup("conv_pair", (node, *(by_name[name] for name in fusions.conv_pairs[node.name])))
        elif node.name in fusions.separable_chains:
            chain = (node, *(by_name[name] for name in fusions.separable_chains[node.name]))
            group = LaunchGroup("separable_conv", chain)
        elif node.name in fusions.pool_chains:
            group = LaunchGroup("pool_chain", tuple(by_name[name] for name in fusions.pool_chains[node.name]))
        elif node.op == "linear" or node.name in fusions.pooled_heads:  # [pool,] linear, softmax
            group = LaunchGroup("classify_head", tuple(graph.nodes[i : i + (2 if node.op == "linear" else 3)]))
        else:
            group = LaunchGroup(node.op if node.op in _OWN_LOWERINGS else "simple", (node,))
        groups.append(group)
        covered.update(n.name for n in group.nodes)
    return groups


def decide_fusions(graph: Graph, plan: MemoryPlan, fuse: bool, pairs: bool = False) -> Fusions:
    """The fusions to make: none without `fuse`; the conv pairs only with `pairs` too."""
    if not fuse:
        return Fusions({}, {}, {}, frozenset())
    chains: dict[str, list[str]] = {}
    for i, node in enumerate(graph.nodes):
        chain = pool_chain(graph, i) if node.op == "maxpool" else []
        if len(chain) > 1 and not any(node.name in c for c in chains.values()):
            chains[node.name] = [n.name for n in chain]
    heads = frozenset(n.name for i, n in enumerate(graph.nodes) if n.op == "global_avg_pool" and pooled_head(graph, i))
    pairs_found, separable_found = (conv_pairs(graph), separable_chains(graph)) if pairs else ({}, {})
    return Fusions(dict(plan.upsample_folds), dict(plan.concat_folds), chains, heads, pairs_found, separable_found)


def _reader_counts(graph: Graph) -> dict[str, int]:
    """How many node inputs and graph outputs read each value."""
    readers: dict[str, int] = {}
    for name in [*(name for node in graph.nodes for name in node.inputs), *graph.outputs]:
        readers[name] = readers.get(name, 0) + 1
    return readers


def _two_input_conv(graph: Graph, conv: Node, cat: Node, readers: dict[str, int]) -> bool:
    """Whether `conv` is a 1x1 conv (stride 1, no padding) reading nothing but the two-part concat `cat`, which
    nothing else reads: the shape of conv that can take the concat's parts as two inputs."""
    a = conv.attrs
    return (
        conv.op == "conv"
        and cat.op == "concat"
        and [pair(a[k]) for k in ("stride", "padding", "dilation")] == [(1, 1), (0, 0), (1, 1)]
        and a["groups"] == 1
        and tuple(graph.values[conv.outputs[0]].shape[2:]) == tuple(graph.values[cat.outputs[0]].shape[2:])
        and len(cat.inputs) == 2
        and conv.inputs == cat.outputs
        and readers.get(cat.outputs[0]) == 1
    )


def upsample_folds(graph: Graph, copies: dict[str, list[str]]) -> dict[str, str]:
    """1x1 convs (stride 1, no padding) whose whole input is Concat([Upsample(x), y]) in consecutive nodes, with
    the upsample's output and the concat's read by nothing else and the upsample's output placed in the concat:
    conv name -> upsample name. The conv can read x through the upsample and y as a second input (a neck's
    Upsample → Concat → C2f/C3k2), so the upsample needs no launch."""
    readers = _reader_counts(graph)
    folds = {}
    for up, cat, conv in zip(graph.nodes, graph.nodes[1:], graph.nodes[2:], strict=False):
        upsampled = up.outputs[0]
        if (
            up.op == "upsample"
            and _two_input_conv(graph, conv, cat, readers)
            and cat.inputs[0] == upsampled
            and readers.get(upsampled) == 1
            and upsampled not in copies.get(cat.name, [])
        ):
            folds[conv.name] = up.name
    return folds


def concat_folds(graph: Graph, copies: dict[str, list[str]], upsample_folds: dict[str, str]) -> dict[str, str]:
    """1x1 convs (stride 1, no padding) whose whole input is a two-part concat that must copy its first part
    (a split's view of another buffer, as in C2PSA: Concat([split:0, PSA(split:1)])) and places its second,
    read by nothing else: conv name -> concat name. The conv can read the first part where it is and the
    concat's slice of the second as a second input, so the copy needs no launch."""
    readers = _reader_counts(graph)
    producer = {out: node for node in graph.nodes for out in node.outputs}
    folds = {}
    for conv in graph.nodes:
        cat = producer.get(conv.inputs[0]) if conv.inputs else None
        if (
            cat is not None
            and conv.name not in upsample_folds
            and _two_input_conv(graph, conv, cat, readers)
            and copies.get(cat.name) == [cat.inputs[0]]
        ):
            folds[conv.name] = cat.name
    return folds


def _plain_conv(graph: Graph, conv: Node, kernel: int) -> bool:
    """A plain conv (one group, stride 1, no dilation) with a `kernel` x `kernel` window padded to keep its input's
    size: 3x3 with padding 1, 1x1 with none."""
    a = conv.attrs
    return (
        conv.op == "conv"
        and a["groups"] == 1
        and tuple(graph.weight_shapes(conv).get("weight", ())[2:]) == (kernel, kernel)
        and [pair(a[k]) for k in ("stride", "padding", "dilation")] == [(1, 1), (kernel // 2,) * 2, (1, 1)]
    )


def _reads_only(readers: dict[str, int], first: Node, second: Node) -> bool:
    """Whether `second` reads `first`'s output as its (first) input and nothing else reads that output."""
    hidden = first.outputs[0] if first.outputs else None
    return second.inputs[0] == hidden and hidden not in second.inputs[1:] and readers.get(hidden) == 1


def _trailing_1x1(graph: Graph, readers: dict[str, int], i: int) -> list[str]:
    """[the 1x1 conv after node i] where it is the only reader of node i's output and node i adds no residual, else
    []: the conv a fused launch ending at node i may take too."""
    node, following = graph.nodes[i], graph.nodes[i + 1] if i + 1 < len(graph.nodes) else None
    if following is None or len(node.inputs) != 1 or not _plain_conv(graph, following, 1):
        return []
    return [following.name] if _reads_only(readers, node, following) else []


def conv_pairs(graph: Graph) -> dict[str, list[str]]:
    """Consecutive 3x3 convs (stride 1, padding 1) where the second reads the first's output as its input and
    nothing else reads that output, and, where the second adds no residual and only a 1x1 conv right after it reads
    its output, that conv too: first conv name -> the names of the one or two after it. The last may add a residual
    (a bottleneck's). One launch can run them, the maps between them never reaching memory the plan owns. The memory
    plan keeps the first conv's input alive while the last one's output is written: for two nodes by reserving a
    buffer from the node before its writer (`Buffer.first`), for three by counting it as read by the third (plan.py)."""
    readers = _reader_counts(graph)
    chains: dict[str, list[str]] = {}
    taken: set[str] = set()  # a conv is in one chain at most
    nodes = graph.nodes
    for i, first in enumerate(nodes[:-1]):
        second = nodes[i + 1]
        if (
            first.name in taken
            or not (_plain_conv(graph, first, 3) and _plain_conv(graph, second, 3))
            or len(first.inputs) != 1
            or not _reads_only(readers, first, second)
        ):
            continue
        chains[first.name] = [second.name, *_trailing_1x1(graph, readers, i + 1)]
        taken.update([first.name, *chains[first.name]])
    return chains


def _depthwise(graph: Graph, conv: Node) -> bool:
    """A depthwise conv (one channel a group, as many out as in) with a square kernel, one stride and one padding."""
    if conv.op != "conv" or len(conv.inputs) != 1:
        return False
    a, shape = conv.attrs, graph.weight_shapes(conv).get("weight", ())
    (sy, sx), (py, px) = pair(a["stride"]), pair(a["padding"])
    return (
        len(shape) == 4
        and shape[1] == 1
        and a["groups"] == shape[0] == graph.values[conv.inputs[0]].shape[1]
        and shape[2] == shape[3]
        and (sy, py) == (sx, px)
        and pair(a["dilation"]) == (1, 1)
    )


def separable_chains(graph: Graph) -> dict[str, list[str]]:
    """A depthwise conv followed by a 1x1 conv reading its output as its input, which nothing else reads, and, where
    that 1x1 conv adds no residual and only a second 1x1 conv after it reads its output, that one too: depthwise conv
    name -> the one or two 1x1 convs' names. The last conv may add a residual. One launch can run the chain (a
    depthwise separable conv, and a second 1x1 conv on its tile of output), nothing between them reaching memory.
    The memory plan keeps the depthwise conv's input alive until the chain's last conv (plan.py)."""
    readers = _reader_counts(graph)
    chains: dict[str, list[str]] = {}
    nodes = graph.nodes
    for i, first in enumerate(nodes[:-1]):
        second = nodes[i + 1]
        if not (_depthwise(graph, first) and _plain_conv(graph, second, 1) and _reads_only(readers, first, second)):
            continue
        chains[first.name] = [second.name, *_trailing_1x1(graph, readers, i + 1)]
    return chains


def pool_chain(graph: Graph, start: int) -> list[Node]:
    """Maxpools chained on each other's outputs with the same stride-1 'same' window: SPPF's pools."""
    first = graph.nodes[start]
    chain = [first]
    attrs = first.attrs
    if pair(attrs["stride"]) != (1, 1) or pair(attrs["padding"]) != tuple(k // 2 for k in pair(attrs["kernel"])):
        return chain
    for node in graph.nodes[start + 1 :]:
        if node.op == "maxpool" and node.attrs == attrs and node.inputs == chain[-1].outputs:
            chain.append(node)
    return chain


def pooled_head(graph: Graph, i: int) -> bool:
    """Whether node i, a global average pool, feeds only the linear layer right after it (so one classify-head
    launch can pool too)."""
    node = graph.nodes[i]
    following = graph.nodes[i + 1] if i + 1 < len(graph.nodes) else None
    return (
        following is not None
        and following.op == "linear"
        and following.inputs == node.outputs
        and node.outputs[0] not in graph.outputs
        and sum(node.outputs[0] in other.inputs for other in graph.nodes) == 1
    )
