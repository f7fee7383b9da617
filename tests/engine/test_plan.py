"""The memory plan: concats cost nothing, and buffers alive at the same time never share memory."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support import random_model

from yolojet.engine import plan as plan_module
from yolojet.engine.fusion import (
    box_folds,
    concat_folds,
    decide_fusions,
    extra_folds,
    launch_groups,
    score_folds,
    upsample_folds,
)
from yolojet.engine.plan import ARENA_ALIGN, _reads_widened, plan_memory
from yolojet.export.walker import export_graph
from yolojet.ir import Graph, ModelMeta, Node, Value


@pytest.mark.parametrize("cfg", ["yolo11n.yaml", "yolov8n-seg.yaml", "yolo26n-pose.yaml", "yolov8n-cls.yaml"])
def test_plan_places_concat_inputs_and_separates_live_buffers(cfg):
    graph = export_graph(random_model(cfg), 64)
    plan = plan_memory(graph)
    for node in graph.nodes:
        if node.op != "concat":
            continue
        target = plan.placements[node.outputs[0]]
        channel = target.channel
        for value in node.inputs:
            where = plan.placements[value]
            placed = (where.buffer, where.channel) == (target.buffer, channel)
            assert placed or value in plan.copies.get(node.name, []), f"{value} is neither in place nor copied"
            channel += where.channels
    assert plan.stats["copies"] <= 1  # only C2PSA's untouched half, if the model has one

    def extent(b):
        return b.offset, b.offset + -(-b.per_image // ARENA_ALIGN) * ARENA_ALIGN

    for kind in ("feature", "head"):
        buffers = [b for b in plan.buffers if b.kind == kind]
        for i, a in enumerate(buffers):
            for b in buffers[i + 1 :]:
                if a.first <= b.last and b.first <= a.last:
                    (a0, a1), (b0, b1) = extent(a), extent(b)
                    assert a1 <= b0 or b1 <= a0, f"buffers {a.index} and {b.index} overlap while both alive"
    assert plan.feature_elements < plan.stats["feature_elements_unshared"]
    image = plan.placements[graph.inputs[0]]
    assert (image.channel, image.channels, plan.buffers[image.buffer].shape[2]) == (0, 3, 4)  # 8-byte fp16 pixels


@pytest.mark.parametrize("cfg", ["yolo11n-pose.yaml", "yolo26n-pose.yaml"])
def test_odd_channel_counts_between_convs_are_widened_for_the_kernels(cfg):
    """The keypoint branch's odd channel counts (51 in YOLO11, 85 in YOLO26), passed from conv to conv at each
    level, get rows of the next multiple of 16, and so do the 51 keypoint values each level's last conv hands
    the decode (three values a level)."""
    graph = export_graph(random_model(cfg), 64)
    plan = plan_memory(graph)
    assert len(plan.widened) == 9
    readers = {}
    for value, width in plan.widened.items():
        place = plan.placements[value]
        assert width == -(-place.channels // 16) * 16 > place.channels
        assert place.channel == 0 and plan.buffers[place.buffer].shape[2] == width
        readers[value] = {node.op for node in graph.nodes if value in node.inputs}
    assert sorted(map(sorted, readers.values())).count(["decode"]) == 3
    assert all(ops in ({"conv"}, {"decode"}) for ops in readers.values())
    assert not plan_memory(export_graph(random_model("yolo11n.yaml"), 64)).widened


def test_decode_takes_widened_score_and_extra_maps_but_not_box_maps():
    decode = Node("head/decode", "decode", ["box0", "box1", "cls0", "cls1", "kpt0", "kpt1"], ["preds"], {"levels": 2})
    assert not _reads_widened(decode, "box1")  # a box map's channels are 4·reg_max exactly
    assert _reads_widened(decode, "cls0") and _reads_widened(decode, "kpt1")
    conv = Node("c", "conv", ["kpt0"], ["y"], {"groups": 1})
    residual = Node("r", "conv", ["kpt0", "skip"], ["z"], {"groups": 1})
    assert _reads_widened(conv, "kpt0") and not _reads_widened(residual, "kpt0")


@pytest.mark.parametrize("cfg", ["yolo11n.yaml", "yolov8n-seg.yaml", "yolo26n-pose.yaml"])
def test_necks_1x1_convs_fold_their_upsample_and_keep_its_input_alive(cfg):
    """Each neck's Upsample → Concat → 1x1 conv (two of them in every P3-P5 model) folds: the conv reads the
    upsample's input itself, so that input's buffer lives until the conv and no buffer written before then may
    take its memory."""
    graph = export_graph(random_model(cfg), 64)
    plan = plan_memory(graph)
    position = {node.name: i for i, node in enumerate(graph.nodes)}
    by_name = {node.name: node for node in graph.nodes}
    assert len(plan.upsample_folds) == 2
    for conv, up in plan.upsample_folds.items():
        assert by_name[up].op == "upsample" and position[conv] == position[up] + 2
        source = plan.buffers[plan.placements[by_name[up].inputs[0]].buffer]
        assert source.last >= position[conv]
        for other in plan.buffers:
            alive_together = other.first <= position[conv] <= other.last
            if other.kind == "feature" and other.index != source.index and alive_together:
                ends = sorted([(source.offset, source.per_image), (other.offset, other.per_image)])
                assert ends[0][0] + ends[0][1] <= ends[1][0], f"buffer {other.index} overlaps the folded input"


def _neck(*, first="up", kernel_out=8, reader=None, stride=(1, 1)):
    """Upsample(p5) → Concat(·, p4) → conv, with p5 read by nothing else."""
    conv_attrs = {"stride": list(stride), "padding": [0, 0], "dilation": [1, 1], "groups": 1}
    nodes = [
        Node("u", "upsample", ["p5"], ["up"], {"scale": 2}),
        Node("c", "concat", ["up", "p4"] if first == "up" else ["p4", "up"], ["cat"]),
        Node("k", "conv", ["cat"], ["y"], conv_attrs),
    ]
    if reader:
        nodes.append(Node("r", "conv", [reader], ["z"], conv_attrs))
    shapes = {
        "p5": (1, 8, 4, 4),
        "up": (1, 8, 8, 8),
        "p4": (1, 4, 8, 8),
        "cat": (1, 12, 8, 8),
        "y": (1, 6, kernel_out, kernel_out),
        "z": (1, 6, 8, 8),
    }
    values = {name: Value(name, shape) for name, shape in shapes.items()}
    return Graph(ModelMeta("detect", {0: "a"}, (8, 8)), ["p5", "p4"], ["y"], values, nodes, {})


def test_a_folded_upsample_input_read_by_nothing_else_outlives_the_conv():
    """p5's only reader is the upsample, so without the fold's extra read its buffer would end at node 0 and the
    conv's output (written at node 2) could take its memory while the conv still reads it."""
    plan = plan_memory(_neck())
    assert plan.upsample_folds == {"k": "u"}
    source, output = (plan.buffers[plan.placements[name].buffer] for name in ("p5", "y"))
    assert source.last == 2
    spans = sorted([(source.offset, source.per_image), (output.offset, output.per_image)])
    assert spans[0][0] + spans[0][1] <= spans[1][0], "the conv's output shares memory with the input it reads"


def test_only_an_upsample_read_by_its_concat_alone_feeding_a_1x1_conv_folds():
    assert upsample_folds(_neck(), {}) == {"k": "u"}
    assert upsample_folds(_neck(first="p4"), {}) == {}  # the upsampled part must be the concat's first
    assert upsample_folds(_neck(kernel_out=6), {}) == {}  # a 3x3 conv without padding
    assert upsample_folds(_neck(stride=(2, 2)), {}) == {}
    assert upsample_folds(_neck(reader="up"), {}) == {}  # the upsampled map is read elsewhere too
    assert upsample_folds(_neck(reader="cat"), {}) == {}  # and so is the concat
    assert upsample_folds(_neck(), {"c": ["up"]}) == {}  # the upsampled map is not in the concat's buffer


@pytest.mark.parametrize("cfg", ["yolo11n.yaml", "yolo11n-cls.yaml", "yolo26n.yaml"])
def test_c2psa_concat_folds_its_copy_into_the_1x1_conv_after_it(cfg):
    """C2PSA's Concat([split:0, PSA(split:1)]) must copy split:0 (a view of cv1's output); its 1x1 conv reads it
    in place instead, so the buffer it lies in lives until that conv."""
    graph = export_graph(random_model(cfg), 64)
    plan = plan_memory(graph)
    position = {node.name: i for i, node in enumerate(graph.nodes)}
    by_name = {node.name: node for node in graph.nodes}
    assert len(plan.concat_folds) == 1
    ((conv, cat),) = plan.concat_folds.items()
    assert by_name[cat].op == "concat" and by_name[conv].inputs == by_name[cat].outputs
    assert plan.copies[cat] == [by_name[cat].inputs[0]] and by_name[cat].inputs[0].endswith("split:0")
    assert plan.buffers[plan.placements[by_name[cat].inputs[0]].buffer].last >= position[conv]


def _psa(*, between: bool = True, reader: str | None = None, copied_second: bool = False):
    """Split(x) → (a, b); b → conv → b2; Concat([a, b2]) → 1x1 conv, with (between) an unrelated conv after the
    concat, so that without the fold's extra read a's buffer would end at the concat."""
    conv_attrs = {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1}
    nodes = [
        Node("s", "split", ["x"], ["a", "b"], {"sizes": [4, 4]}),
        Node("p", "conv", ["b"], ["b2"], conv_attrs),
        Node("c", "concat", ["a", "b2"] if not copied_second else ["b2", "a"], ["cat"]),
    ]
    if between:
        nodes.append(Node("q", "conv", ["w"], ["z"], conv_attrs))
    nodes.append(Node("k", "conv", ["cat"], ["y"], conv_attrs))
    if reader:
        nodes.append(Node("r", "conv", [reader], ["v"], conv_attrs))
    shapes = {
        "x": (1, 8, 8, 8),
        "a": (1, 4, 8, 8),
        "b": (1, 4, 8, 8),
        "b2": (1, 4, 8, 8),
        "cat": (1, 8, 8, 8),
        "w": (1, 8, 8, 8),
        "z": (1, 8, 8, 8),
        "y": (1, 8, 8, 8),
        "v": (1, 8, 8, 8),
    }
    values = {name: Value(name, shape) for name, shape in shapes.items()}
    outputs = ["y", "z"] + (["v"] if reader else []) if between else ["y"] + (["v"] if reader else [])
    return Graph(ModelMeta("detect", {0: "a"}, (8, 8)), ["x", "w"], outputs, values, nodes, {})


def test_a_folded_concat_part_outlives_the_conv_that_reads_it_in_place():
    plan = plan_memory(_psa())
    assert plan.concat_folds == {"k": "c"} and plan.copies == {"c": ["a"]}
    source, output = (plan.buffers[plan.placements[name].buffer] for name in ("x", "y"))
    assert source.last == 4  # the conv k, not the concat at 2
    spans = sorted([(source.offset, source.per_image), (output.offset, output.per_image)])
    assert spans[0][0] + spans[0][1] <= spans[1][0], "the conv's output shares memory with the part it reads"


def test_only_a_concat_copying_its_first_part_alone_feeding_a_1x1_conv_folds():
    graph = _psa()
    assert concat_folds(graph, {"c": ["a"]}, {}) == {"k": "c"}
    assert concat_folds(graph, {}, {}) == {}  # nothing to copy
    assert concat_folds(graph, {"c": ["a"]}, {"k": "u"}) == {}  # the conv already folds an upsample
    assert concat_folds(_psa(reader="cat"), {"c": ["a"]}, {}) == {}  # the concat is read elsewhere too
    assert concat_folds(_psa(copied_second=True), {"c": ["a"]}, {}) == {}  # the copied part comes second


@pytest.mark.parametrize("cfg", ["yolo11n.yaml", "yolo11n-cls.yaml"])
def test_fusions_are_decided_in_one_place_and_all_off_without_fuse(cfg):
    """SPPF's three pools form one chain, a classifier's global average pool is pooled in its head, the folds are
    the plan's; with fuse=False nothing is fused."""
    graph = export_graph(random_model(cfg), imgsz=64 if "cls" not in cfg else 32)
    plan = plan_memory(graph)
    fusions = decide_fusions(graph, plan, fuse=True)
    by_name = {n.name: n for n in graph.nodes}
    if "cls" in cfg:
        assert len(fusions.pooled_heads) == 1 and not fusions.pool_chains
        (pool,) = fusions.pooled_heads
        assert by_name[pool].op == "global_avg_pool"
    else:
        assert fusions.upsample_folds == plan.upsample_folds and len(fusions.upsample_folds) == 2
        ((first, chain),) = fusions.pool_chains.items()
        assert chain[0] == first and len(chain) == 3 and {by_name[n].op for n in chain} == {"maxpool"}
        assert not fusions.pooled_heads
        # Each level's last score and box convs (cv3.i.2, cv2.i.2) fold into the decode's work.
        (decode,) = [n for n in graph.nodes if n.op == "decode"]
        levels = decode.attrs["levels"]
        for folds, maps in (
            (fusions.score_folds, decode.inputs[levels : 2 * levels]),
            (fusions.box_folds, decode.inputs[:levels]),
        ):
            assert sorted(by_name[conv].outputs[0] for conv in folds) == sorted(maps)
            assert sorted(fold.level for fold in folds.values()) == list(range(levels))
        assert {fold.output for fold in fusions.box_folds.values()} == {decode.outputs[0]}
        assert [fold.stride for fold in sorted(fusions.box_folds.values(), key=lambda f: f.level)] == [8.0, 16.0, 32.0]
    off = decide_fusions(graph, plan, fuse=False)
    assert not (off.upsample_folds or off.concat_folds or off.pool_chains or off.pooled_heads)
    assert not (off.score_folds or off.box_folds)


def test_an_obb_heads_boxes_do_not_fold_and_a_box_conv_writes_the_decodes_output_in_the_plan():
    """An OBB head's boxes turn by its angle branch: only its scores fold. In a detector the decode's output is
    written by the box convs that may fold, so its buffer is reserved from the node before the first of them (no
    buffer live meanwhile can share its memory), not from the decode's."""
    obb = export_graph(random_model("yolo11n-obb.yaml"), imgsz=64)
    assert len(score_folds(obb)) == 3 and not box_folds(obb)
    graph = export_graph(random_model("yolo11n.yaml"), imgsz=64)
    plan = plan_memory(graph)
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    folds = box_folds(graph)
    (output,) = {fold.output for fold in folds.values()}
    preds = plan.buffers[plan.placements[output].buffer]
    assert preds.first == min(index[conv] for conv in folds) - 1


@pytest.mark.parametrize("cfg", ["yolo11n-seg.yaml", "yolo11n-pose.yaml"])
def test_a_segment_or_pose_heads_extra_convs_write_the_decodes_output_in_the_plan(cfg, monkeypatch):
    """Each level's last mask-coefficient or keypoint conv folds into the decode's work: it writes the decode's rows
    after the boxes and classes, keypoints decoded on its level's stride. The decode's output is reserved from the
    node before the first box or extra conv, and the decode's group names every level folded every way."""
    graph = export_graph(random_model(cfg), imgsz=64)
    (decode,) = [n for n in graph.nodes if n.op == "decode"]
    a = decode.attrs
    levels, by_name = a["levels"], {n.name: n for n in graph.nodes}
    folds = extra_folds(graph)
    assert sorted(by_name[conv].outputs[0] for conv in folds) == sorted(decode.inputs[2 * levels :])
    ordered = sorted(folds.values(), key=lambda f: f.level)
    assert [f.level for f in ordered] == list(range(levels)) and [f.stride for f in ordered] == [8.0, 16.0, 32.0]
    keypoint_dim = 3 if "pose" in cfg else None
    for fold in ordered:
        assert (fold.output, fold.first_row, fold.extra) == (decode.outputs[0], 4 + a["nc"], a["extra_channels"])
        assert fold.keypoint_dim == keypoint_dim and not fold.keypoints_v26
    plan = plan_memory(graph)
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    writers = [index[conv] for conv in (*box_folds(graph), *folds)]
    assert plan.buffers[plan.placements[decode.outputs[0]].buffer].first == min(writers) - 1
    # The extra convs come after the box convs here: with no box fold, the first extra conv sets the reservation.
    monkeypatch.setattr(plan_module, "box_folds", lambda graph: {})
    alone = plan_memory(graph)
    assert alone.buffers[alone.placements[decode.outputs[0]].buffer].first == min(index[conv] for conv in folds) - 1
    (group,) = [g for g in launch_groups(graph, plan, decide_fusions(graph, plan, True)) if g.kind == "decode"]
    assert group.folded() == (frozenset(range(levels)),) * 3
    assert not extra_folds(export_graph(random_model("yolo11n-obb.yaml"), imgsz=64)), "an OBB head's angles fold"
    graph.meta = replace(graph.meta, end2end=True)  # YOLO26's one-to-one selection reads every row: nothing folds
    assert not (score_folds(graph) or box_folds(graph) or extra_folds(graph))


@pytest.mark.parametrize("fuse", [True, False])
def test_launch_groups_cover_every_node_once_in_graph_order(fuse):
    """The grouping pass: every node but splits, copy-free concats and folded upsamples is completed by exactly one
    launch group, groups follow the graph's order, and each fusion decided shows up as its kind of group."""
    graph = export_graph(random_model("yolo11n-cls.yaml"), 64)
    detect = export_graph(random_model("yolo11n.yaml"), 64)
    for g in (graph, detect):
        plan = plan_memory(g)
        fusions = decide_fusions(g, plan, fuse)
        groups = launch_groups(g, plan, fusions)
        position = {node.name: i for i, node in enumerate(g.nodes)}
        completed = [n.name for group in groups if group.kind != "concat_copy" for n in group.nodes]
        assert len(completed) == len(set(completed))
        folded = set(fusions.upsample_folds.values())
        launched = {n.name for n in g.nodes if n.op not in ("split", "concat") and n.name not in folded}
        assert set(completed) == launched
        firsts = [position[group.nodes[0].name] for group in groups]
        assert firsts == sorted(firsts)
        copies = [(group.nodes[0].name, group.value) for group in groups if group.kind == "concat_copy"]
        read_in_place = set(fusions.concat_folds.values())
        assert copies == [(c, v) for c, values in plan.copies.items() if c not in read_in_place for v in values]
        kinds = {group.kind for group in groups}
        if fuse and g is detect:  # SPPF's pools, both neck folds and C2PSA's concat
            assert "pool_chain" in kinds
            assert sum(group.fold is not None for group in groups) == 3
        if g is graph:  # the pooled head in one launch with the linear layer and softmax, or the linear alone
            (head,) = [group for group in groups if group.kind == "classify_head"]
            assert [n.op for n in head.nodes] == (["global_avg_pool"] if fuse else []) + ["linear", "softmax"]
        if not fuse:
            assert "pool_chain" not in kinds and all(group.fold is None for group in groups)
