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
- score folds: a detection head's last class-score conv (1x1, read by the decode alone) can write NMS's best-class
  pass itself (kernels/conv/scores.py) wherever the decode would (inside the network's `writing_best_class`
  block); the decode then reads none of that level's scores;
- box folds: likewise a head's last box conv (not OBB's) can write its level's decoded boxes into the decode's
  output itself (kernels/conv/boxes.py); the decode then reads none of that level's box map, and a detector whose
  every level folds both has no decode launch left. The memory plan counts such a conv as a writer of the decode's
  output;
- extra folds: likewise a segment head's last mask-coefficient conv and a pose head's last keypoint conv write their
  level's rows of the decode's output (kernels/conv/extras.py), so that such a head whose every level folds every
  way has no decode launch left either; an OBB head's angle conv does not fold (its boxes need the angles).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from yolojet.ir import Graph, Node, pair
from yolojet.kernels.conv.boxes import MOST_BOX_CHANNELS
from yolojet.kernels.conv.extras import MOST_EXTRA_CHANNELS
from yolojet.kernels.conv.scores import MOST_SCORE_CHANNELS

if TYPE_CHECKING:
    from yolojet.engine.plan import MemoryPlan


@dataclass(frozen=True)
class ScoreFold:
    """A head's score conv that can write its level's part of NMS's best-class pass: the level, the decode's box
    inputs (whose maps' sizes place the level's anchors) and the head's classes."""

    level: int
    box_values: tuple[str, ...]
    nc: int


@dataclass(frozen=True)
class BoxFold:
    """A head's box conv that can decode its level's boxes into the decode's `output` itself: the level, the decode's
    box inputs (whose maps' sizes place the level's anchors), the level's stride and the box encoding."""

    level: int
    box_values: tuple[str, ...]
    output: str
    stride: float
    reg_max: int
    xywh: bool


@dataclass(frozen=True)
class ExtraFold:
    """A segment or pose head's extra conv that can write its level's extras into the decode's `output` itself: the
    level, the decode's box inputs (whose maps' sizes place the level's anchors), the output's first extra row and
    its extra channels, the level's stride, and for keypoints their values a keypoint (None for mask coefficients)
    and whether they take YOLO26's offsets."""

    level: int
    box_values: tuple[str, ...]
    output: str
    first_row: int
    extra: int
    stride: float
    keypoint_dim: int | None
    keypoints_v26: bool


# A head conv's fold: what it writes in the decode's stead.
HeadFold = ScoreFold | BoxFold | ExtraFold


@dataclass(frozen=True)
class Fusions:
    """What lowering fuses: conv -> the upsample it reads through; conv -> the concat whose copy it reads in place;
    first maxpool -> the chain's node names; the global average pools pooled in the classifier's head; score conv ->
    its ScoreFold; box conv -> its BoxFold; extra conv -> its ExtraFold."""

    upsample_folds: dict[str, str]
    concat_folds: dict[str, str]
    pool_chains: dict[str, list[str]]
    pooled_heads: frozenset[str]
    score_folds: dict[str, ScoreFold]
    box_folds: dict[str, BoxFold]
    extra_folds: dict[str, ExtraFold]

    def head_fold(self, conv: str) -> HeadFold | None:
        """The fold of head conv `conv`, if it has one."""
        return self.score_folds.get(conv) or self.box_folds.get(conv) or self.extra_folds.get(conv)


@dataclass(frozen=True)
class LaunchGroup:
    """The nodes one launch completes (in graph order) and the lowering that builds it: `kind` names one of
    engine/lowering.py's LOWERINGS. A "conv" group's `fold` is (upsample or None, concat) where the conv reads
    through a fold, its `head_fold` what it can write in the decode's stead (the best-class pass, its boxes or its
    extras); a "decode" group's `folded_scores`, `folded_boxes` and `folded_extras` are the levels whose score, box
    and extra convs can; a "concat_copy" group copies the concat's input `value` into place."""

    kind: str
    nodes: tuple[Node, ...]
    fold: tuple[Node | None, Node] | None = None
    value: str | None = None
    head_fold: HeadFold | None = None
    folded_scores: frozenset[int] = frozenset()
    folded_boxes: frozenset[int] = frozenset()
    folded_extras: frozenset[int] = frozenset()

    def folded(self) -> tuple[frozenset[int], frozenset[int], frozenset[int]]:
        """A decode group's levels folded: (scores, boxes, extras)."""
        return self.folded_scores, self.folded_boxes, self.folded_extras


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
        elif node.name in fusions.pool_chains:
            group = LaunchGroup("pool_chain", tuple(by_name[name] for name in fusions.pool_chains[node.name]))
        elif node.op == "linear" or node.name in fusions.pooled_heads:  # [pool,] linear, softmax
            group = LaunchGroup("classify_head", tuple(graph.nodes[i : i + (2 if node.op == "linear" else 3)]))
        elif fusions.head_fold(node.name) is not None:
            group = LaunchGroup("conv", (node,), head_fold=fusions.head_fold(node.name))
        elif node.op == "decode":
            group = LaunchGroup(
                "decode",
                (node,),
                folded_scores=_folded_levels(node, 1, fusions.score_folds, by_name),
                folded_boxes=_folded_levels(node, 0, fusions.box_folds, by_name),
                folded_extras=_folded_levels(node, 2, fusions.extra_folds, by_name),
            )
        else:
            group = LaunchGroup(node.op if node.op in _OWN_LOWERINGS else "simple", (node,))
        groups.append(group)
        covered.update(n.name for n in group.nodes)
    return groups


def _folded_levels(decode: Node, part: int, folds: dict[str, Any], by_name: dict[str, Node]) -> frozenset[int]:
    """The levels of the decode's `part` (0: box maps, 1: score maps, 2: extra maps) whose conv folds."""
    levels = decode.attrs["levels"]
    maps = set(decode.inputs[part * levels : (part + 1) * levels])
    return frozenset(fold.level for conv, fold in folds.items() if by_name[conv].outputs[0] in maps)


def decide_fusions(graph: Graph, plan: MemoryPlan, fuse: bool) -> Fusions:
    if not fuse:
        return Fusions({}, {}, {}, frozenset(), {}, {}, {})
    chains: dict[str, list[str]] = {}
    for i, node in enumerate(graph.nodes):
        chain = pool_chain(graph, i) if node.op == "maxpool" else []
        if len(chain) > 1 and not any(node.name in c for c in chains.values()):
            chains[node.name] = [n.name for n in chain]
    heads = frozenset(n.name for i, n in enumerate(graph.nodes) if n.op == "global_avg_pool" and pooled_head(graph, i))
    # A conv reading through an upsample or concat fold launches as that fold: it cannot also fold its scores, boxes
    # or extras, and the decode must then read that level's map.
    unfolded = plan.upsample_folds.keys() | plan.concat_folds.keys()
    scores = {conv: fold for conv, fold in score_folds(graph).items() if conv not in unfolded}
    boxes = {conv: fold for conv, fold in box_folds(graph).items() if conv not in unfolded}
    extras = {conv: fold for conv, fold in extra_folds(graph).items() if conv not in unfolded}
    return Fusions(dict(plan.upsample_folds), dict(plan.concat_folds), chains, heads, scores, boxes, extras)


def _head_convs(graph: Graph, first: int, most_channels: int) -> list[tuple[Node, int, Node]]:
    """(decode node, level, conv) for each level's map among a decode node's inputs `first`·levels onward (0: box
    maps, 1: score maps, 2: extra maps) that a conv produces which can fold into its epilogue what the decode does
    with it: a 1x1 conv (stride 1, no padding, no residual, ungrouped) of at most `most_channels` outputs whose map
    the decode alone reads. None of an end-to-end head's: the predict path's one-to-one selection reads every row of
    the decode's output and takes no best-class pass, so its folds would never run."""
    if graph.meta.end2end:
        return []
    readers = _reader_counts(graph)
    producer = {value: node for node in graph.nodes for value in node.outputs}
    found = []
    for decode in (node for node in graph.nodes if node.op == "decode"):
        levels = decode.attrs["levels"]
        for level, value in enumerate(decode.inputs[first * levels : (first + 1) * levels]):
            conv = producer.get(value)
            if conv is None or conv.op != "conv" or len(conv.inputs) != 1 or readers.get(value) != 1:
                continue
            a = conv.attrs
            if (
                tuple(graph.weight_shapes(conv)["weight"][2:]) == (1, 1)
                and [pair(a[k]) for k in ("stride", "padding", "dilation")] == [(1, 1), (0, 0), (1, 1)]
                and a["groups"] == 1
                and int(graph.values[value].shape[1]) <= most_channels
                and value not in graph.outputs
            ):
                found.append((decode, level, conv))
    return found


def score_folds(graph: Graph) -> dict[str, ScoreFold]:
    """The head's score convs that can write NMS's best-class pass themselves (`_head_convs`, at most
    MOST_SCORE_CHANNELS outputs)."""
    return {
        conv.name: ScoreFold(level, tuple(decode.inputs[: decode.attrs["levels"]]), int(decode.attrs["nc"]))
        for decode, level, conv in _head_convs(graph, 1, MOST_SCORE_CHANNELS)
    }


def box_folds(graph: Graph) -> dict[str, BoxFold]:
    """The head's box convs that can decode their level's boxes themselves (`_head_convs`): not an OBB head's (its
    boxes turn by the angle of another branch), and a reg_max of 1 or a power of two whose 4·reg_max outputs fit
    MOST_BOX_CHANNELS."""
    folds = {}
    for decode, level, conv in _head_convs(graph, 0, MOST_BOX_CHANNELS):
        a = decode.attrs
        reg_max = int(a["reg_max"])
        if a["task"] == "obb" or reg_max & (reg_max - 1) or graph.values[conv.outputs[0]].shape[1] != 4 * reg_max:
            continue
        boxes = tuple(decode.inputs[: a["levels"]])
        xywh = a.get("box_format", "xywh") == "xywh"
        folds[conv.name] = BoxFold(level, boxes, decode.outputs[0], float(a["strides"][level]), reg_max, xywh)
    return folds


def extra_folds(graph: Graph) -> dict[str, ExtraFold]:
    """The segment and pose heads' extra convs that can write their level's extras themselves (`_head_convs`, at
    most MOST_EXTRA_CHANNELS outputs): not an OBB head's angle conv, whose angles its boxes need."""
    folds = {}
    for decode, level, conv in _head_convs(graph, 2, MOST_EXTRA_CHANNELS):
        a = decode.attrs
        if a["task"] not in ("segment", "pose"):
            continue
        keypoint_dim = int((a.get("kpt_shape") or (0, 3))[1]) if a["task"] == "pose" else None
        folds[conv.name] = ExtraFold(
            level,
            tuple(decode.inputs[: a["levels"]]),
            decode.outputs[0],
            4 + int(a["nc"]),
            int(a["extra_channels"]),
            float(a["strides"][level]),
            keypoint_dim,
            a.get("kpt_offset") == "v26",
        )
    return folds


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
