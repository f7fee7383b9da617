"""Independent launches on parallel streams: the schedule keeps every memory conflict ordered, finds the head's
branches, and a network run in the most reordered way the schedule allows gives the sequential run's outputs
bit for bit (under the interpreter on the CPU); on a GPU, graphs captured with parallel streams give the same
outputs as sequential graphs."""

from __future__ import annotations

import functools
import itertools
import random

import pytest
import torch
from support import assert_identical_replays, random_model

import yolojet
from yolojet.engine import plan as plan_module
from yolojet.engine.engine import Engine
from yolojet.engine.network import TritonNetwork
from yolojet.engine.plan import ARENA_ALIGN, plan_memory
from yolojet.engine.streams import Access, Region, dependencies, schedule_streams
from yolojet.errors import EngineConfigError
from yolojet.export.walker import export_graph
from yolojet.ir import Graph
from yolojet.options import EngineOptions

UNTUNED = EngineOptions(tune=False)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def region(buffer: int, start: int = 0, stop: int = 10, channels: tuple[int, int] = (0, 8)) -> Region:
    return Region("feature", start, stop, buffer, channels)


def test_regions_overlap_by_memory_and_channels():
    assert region(0).overlaps(region(0))
    assert not region(0, channels=(0, 4)).overlaps(region(0, channels=(4, 8)))  # two slices of one concat buffer
    assert region(0, channels=(0, 4)).overlaps(region(1, channels=(4, 8)))  # two buffers sharing memory
    assert not region(0, 0, 10).overlaps(region(1, 10, 20))
    assert not region(0).overlaps(Region("head", 0, 10, 0, (0, 8)))


def test_dependencies_cover_read_and_write_hazards():
    a, b, c = region(0, channels=(0, 4)), region(0, channels=(4, 8)), region(1, 20, 30)
    accesses = [
        Access(reads=(), writes=(a,)),  # 0 writes a
        Access(reads=(), writes=(b,)),  # 1 writes b: another slice, independent of 0
        Access(reads=(a, b), writes=(c,)),  # 2 reads both: after 0 and 1
        Access(reads=(), writes=(a,)),  # 3 overwrites a: after 0 (write after write) and 2 (write after read)
    ]
    assert dependencies(accesses) == [set(), set(), {0, 1}, {0, 2}]


def test_chains_stay_on_a_stream_and_joins_wait():
    # 0 → 1 → 2 and 0 → 3 → 4, joined by 5.
    deps = [set(), {0}, {1}, {0}, {3}, {2, 4}]
    schedule = schedule_streams(deps)
    assert schedule.stream[:3] == [0, 0, 0] and schedule.stream[3] == schedule.stream[4] != 0
    assert schedule.waits == [[], [], [], [0], [], [2]]
    assert all(d <= before for d, before in zip(deps, schedule.happens_before(), strict=True))


def test_with_every_stream_taken_a_branch_avoids_a_busy_sibling():
    """Two streams, both taken. Launch 5 follows 3 only; the stream of 3 is busy with 4, a sibling of 5, while the
    other stream ends in 1, which 5 follows anyway: 5 goes there, adding no ordering. Launch 7 follows 0 only and
    goes behind the shallower of the two stream tails (4, four launches deep, not 6, five deep)."""
    deps = [set(), {0}, {0}, {1, 2}, {3}, {3}, {5}, {0}]
    schedule = schedule_streams(deps, max_streams=2)
    assert schedule.stream[3] == schedule.stream[4] == 1
    assert schedule.stream[5] == schedule.stream[6] == 0 and schedule.stream[7] == 1
    assert all(d <= before for d, before in zip(deps, schedule.happens_before(), strict=True))


@pytest.mark.parametrize("max_streams", [1, 2, 3, 8, 16])
def test_random_dependencies_are_all_kept(max_streams):
    rng = random.Random(max_streams)
    for _ in range(50):
        n = rng.randint(1, 40)
        deps = [{i for i in range(j) if rng.random() < 0.08} for j in range(n)]
        schedule = schedule_streams(deps, max_streams)
        assert schedule.streams <= max_streams
        for j, before in enumerate(schedule.happens_before()):
            assert deps[j] <= before, f"launch {j} may start before {deps[j] - before}"
        # A wait that stream order or an earlier wait already implies is never issued twice.
        for waits in schedule.waits:
            assert len({schedule.stream[i] for i in waits}) == len(waits)


@pytest.mark.parametrize("cfg", ["yolo11n.yaml", "yolov8n-seg.yaml", "yolo26n-pose.yaml", "yolo11n-obb.yaml"])
def test_plan_shares_memory_only_between_graph_ordered_buffers(cfg):
    """Buffers in the same memory are used one after the other in the graph itself, not merely in launch order."""
    graph = export_graph(random_model(cfg), 64)
    plan = plan_memory(graph)
    producers = {out: i for i, node in enumerate(graph.nodes) for out in node.outputs}
    ancestors: list[set[int]] = []
    for node in graph.nodes:
        mine = set()
        for name in node.inputs:
            if name in producers:
                mine |= ancestors[producers[name]] | {producers[name]}
        ancestors.append(mine)
    touching: dict[int, set[int]] = {b.index: set() for b in plan.buffers}
    writers: dict[int, set[int]] = {b.index: set() for b in plan.buffers}
    for i, node in enumerate(graph.nodes):
        for name in node.inputs:
            touching[plan.placements[name].buffer].add(i)
        for name in node.outputs:
            touching[plan.placements[name].buffer].add(i)
            writers[plan.placements[name].buffer].add(i)

    def before(a: int, b: int) -> bool:
        return bool(writers[b]) and all(touching[a] <= ancestors[w] for w in writers[b])

    shared = 0
    for kind in ("feature", "head"):
        buffers = [b for b in plan.buffers if b.kind == kind]
        for i, a in enumerate(buffers):
            for b in buffers[i + 1 :]:
                a_end = a.offset + -(-a.per_image // ARENA_ALIGN) * ARENA_ALIGN
                b_end = b.offset + -(-b.per_image // ARENA_ALIGN) * ARENA_ALIGN
                if a.offset < b_end and b.offset < a_end:
                    shared += 1
                    assert before(a.index, b.index) or before(b.index, a.index), f"{a.index} and {b.index}"
    assert shared > 0, "memory is still reused along chains"


@pytest.fixture(scope="module")
def seg_graph(tmp_path_factory):
    """yolo11n-seg at 64: C3k's parallel branches, the head's six chains, and the proto branch beside them."""
    model_dir = yolojet.export(random_model("yolo11n-seg.yaml"), out=tmp_path_factory.mktemp("streams") / "m", imgsz=64)
    return Graph.load(model_dir)


@pytest.fixture(scope="module")
def seg_network(seg_graph):
    """Through the interpreter on the CPU, the device on a GPU."""
    return TritonNetwork(seg_graph, torch.device(DEVICE), half=False, max_batch=2, options=UNTUNED)


def test_schedule_orders_every_conflict_and_finds_the_head_branches(seg_network):
    network = seg_network
    for bucket in network.buckets:
        launches = network.launch_list(bucket)
        deps = dependencies(network.accesses(bucket))
        schedule = network.schedule(bucket)
        for j, before in enumerate(schedule.happens_before()):
            assert deps[j] <= before, f"{launches[j].nodes}: may start before {sorted(deps[j] - before)}"
        head_streams = {
            schedule.stream[j]
            for j, launch in enumerate(launches)
            if ".cv2." in launch.nodes[0] and "23." in launch.nodes[0]
        }
        assert len(head_streams) >= 3, "the box branches of the three levels should run side by side"
        assert schedule.streams >= 4


@pytest.mark.parametrize("plan", ["graph-ordered", "launch-ordered"])
def test_most_reordered_run_matches_the_sequential_run(seg_graph, seg_network, plan, monkeypatch):
    """Every launch as early as the schedule lets it run (the latest ready launch first): a write that reuses
    memory another launch still reads, or a read of a value not yet written, would change the outputs. The
    launch-ordered plan shares memory between independent branches (as a plan by lifetimes in launch order
    would), so there the schedule's write-after-read ordering is what keeps the outputs right."""
    network = seg_network
    if plan == "launch-ordered":
        monkeypatch.setattr(plan_module, "_ordered_pairs", lambda *args: lambda a, b: True)
        network = TritonNetwork(seg_graph, torch.device(DEVICE), half=False, max_batch=2, options=UNTUNED)
        assert network.plan.feature_elements < seg_network.plan.feature_elements
    bucket = network.buckets[-1]
    launches = network.launch_list(bucket)
    before = network.schedule(bucket).happens_before()
    x = torch.rand(bucket, 3, 64, 64, device=DEVICE)

    def outputs() -> list[torch.Tensor]:
        return [network.value_view(name, bucket).clone() for name in network.graph.outputs]

    network.poison()
    network.input_view(bucket).copy_(x.permute(0, 2, 3, 1))
    for launch in launches:
        launch.run()
    sequential = outputs()

    network.poison()
    network.input_view(bucket).copy_(x.permute(0, 2, 3, 1))
    done: set[int] = set()
    order = []
    while len(done) < len(launches):
        ready = [j for j in range(len(launches)) if j not in done and before[j] <= done]
        j = max(ready)
        launches[j].run()
        done.add(j)
        order.append(j)
    assert order != sorted(order), "the schedule allows no reordering at all"
    for a, b in zip(outputs(), sequential, strict=True):
        assert torch.equal(a, b)


def test_split_k_launches_each_get_their_own_scratch(seg_graph):
    """With every launch that can split K given a split tile, the scratch adds no ordering: each split-K launch
    writes its own part, so the dependencies are those of the feature memory alone; once laid out, the parts
    are disjoint and sized for each launch's tile."""
    network = TritonNetwork(seg_graph, torch.device("cpu"), half=False, max_batch=1, options=UNTUNED)
    split = []
    for launch in network.launch_list(1):
        splits = [c for c in launch.candidates if launch.family == "conv" and c.split_k > 1]
        if splits:
            launch.configure(max(splits, key=lambda c: c.split_k))
            split.append(launch)
    assert len(split) >= 10
    accesses = network.accesses(1)
    without_scratch = [Access(a.reads, tuple(r for r in a.writes if r.arena != "split-k scratch")) for a in accesses]
    assert dependencies(accesses) == dependencies(without_scratch)
    network.split_scratch.lay_out({launch.split_slot: launch.split_need() for launch in split})
    spans = sorted((part.start, part.stop) for part, _ in network.split_scratch.parts.values())
    assert len(spans) == len(split) and all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    for launch in split:
        partials, arrivals = network.split_scratch.views(launch.split_slot)
        assert (partials.numel(), arrivals.numel()) == launch.split_need()
        # 16-byte aligned, as the tiles were compiled and timed (Triton specializes on pointer alignment)
        assert partials.data_ptr() % 16 == 0 and arrivals.data_ptr() % 16 == 0


def test_branches_need_a_gpu(seg_graph):
    """Parallel streams on a CPU device are a clear error, on any machine."""
    with pytest.raises(EngineConfigError, match="branches=True: parallel streams need a CUDA device"):
        TritonNetwork(
            seg_graph, torch.device("cpu"), half=False, max_batch=1, options=EngineOptions(tune=False, branches=True)
        )


def test_branches_default_follows_the_device(seg_graph, monkeypatch):
    """Parallel streams are the default on a CUDA device (YOLOJET_BRANCHES=0 turns them off); the interpreter on
    the CPU runs launches in order."""
    monkeypatch.delenv("YOLOJET_BRANCHES", raising=False)
    cpu = TritonNetwork(seg_graph, torch.device("cpu"), half=False, max_batch=1, options=UNTUNED)
    assert cpu.branches is False and not cpu.runners
    if DEVICE == "cuda":
        make = functools.partial(TritonNetwork, seg_graph, torch.device("cuda"), max_batch=1, options=UNTUNED)
        assert make().branches is True
        monkeypatch.setenv("YOLOJET_BRANCHES", "0")
        assert make().branches is False


@pytest.mark.gpu(reason="parallel streams in a CUDA graph need a GPU")
@pytest.mark.parametrize("cfg", ["yolo11n.yaml", "yolov8n-seg.yaml", "yolo11n-pose.yaml"])
def test_parallel_branch_graphs_change_no_value(tmp_path, cfg):
    """Graph replays with the branches on parallel streams give bit-identical outputs to sequential graphs."""
    model_dir = yolojet.export(random_model(cfg), out=tmp_path / "m", imgsz=320)
    engines = [
        Engine.load(model_dir, device=DEVICE, half=True, max_batch=4, tune=False, branches=branches)
        for branches in (True, False)
    ]
    assert engines[0].network.schedule(4).streams >= 4 and engines[0].network.runners
    assert_identical_replays(*engines, batch=4, imgsz=320)


@pytest.mark.gpu(reason="parallel streams in a CUDA graph need a GPU")
def test_parallel_branches_with_split_k_tiles_change_no_value(tmp_path):
    """Split-K launches share one scratch area: with every layer that can split given its largest split, the
    schedule must keep them apart on parallel streams too."""
    model_dir = yolojet.export(random_model("yolo11n.yaml"), out=tmp_path / "m", imgsz=320)
    engines = [
        Engine.load(model_dir, device=DEVICE, half=True, max_batch=2, tune=False, branches=branches)
        for branches in (True, False)
    ]
    for engine in engines:
        split = 0
        for bucket in engine.network.buckets:
            for launch in engine.network.launch_list(bucket):
                splits = [c for c in launch.candidates if launch.family == "conv" and c.split_k > 1]
                if splits:
                    launch.configure(max(splits, key=lambda c: c.split_k))
                    split += 1
        assert split >= 10
        engine.network._capture()  # the schedule and the graphs follow the new tiles
    assert_identical_replays(*engines, batch=2, imgsz=320, replays=10)
    assert int(engines[0].network.split_scratch.arrivals.abs().sum()) == 0


@pytest.mark.gpu(reason="parallel streams in a CUDA graph need a GPU")
@pytest.mark.parametrize("cfg", ["yolo11n.yaml", "yolo11n-seg.yaml", "yolo11n-cls.yaml"])
def test_predict_path_with_parallel_branches_gives_the_same_results(tmp_path, cfg):
    """The predict path captures the network's launches inside its own graph: the same results either way."""
    from support import real_photos

    model_dir = yolojet.export(random_model(cfg), out=tmp_path / "m", imgsz=320)
    photos = list(real_photos().values())[:3]
    results = [
        Engine.load(model_dir, device=DEVICE, half=True, max_batch=2, tune=False, branches=branches)(photos, conf=0.01)
        for branches in (True, False)
    ]
    for parallel, sequential in zip(*results, strict=True):
        assert parallel.to_json() == sequential.to_json()


@pytest.mark.gpu(reason="captured graphs need a GPU")
def test_predict_graphs_follow_a_new_network_capture(tmp_path):
    """A new capture of the network may move the split-K scratch (its parts are laid out again): the predict path
    drops the graphs it captured around the old one and captures new ones, with the same results."""
    from support import real_photos

    model_dir = yolojet.export(random_model("yolo11n.yaml"), out=tmp_path / "m", imgsz=320)
    engine = Engine.load(model_dir, device=DEVICE, half=True, max_batch=1, tune=False, rect=False)  # engine.network's
    photo = real_photos()["bus.jpg"]
    before = engine(photo, conf=0.01)[0].to_json()
    old_graphs = [graph for graph, _ in engine._path.graphs.values()]
    engine.network._capture()
    assert engine(photo, conf=0.01)[0].to_json() == before
    assert engine._path.captured_with == engine.network.captures
    assert all(graph not in old_graphs for graph, _ in engine._path.graphs.values())


@pytest.mark.gpu(reason="CUDA streams need a CUDA GPU")
def test_current_stream_follows_the_callers_stream_in_every_thread():
    """The cached current stream is torch's current stream: the default one, a stream entered with
    `torch.cuda.stream`, another thread's own; one object per stream."""
    from concurrent.futures import ThreadPoolExecutor

    from yolojet.engine.cuda_calls import CurrentStream

    current = CurrentStream(torch.device("cuda"))
    assert current() == torch.cuda.current_stream() and current() is current()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert current() == side != torch.cuda.default_stream()
    assert current() == torch.cuda.current_stream()

    def in_thread() -> bool:
        own = torch.cuda.Stream()
        with torch.cuda.stream(own):
            return current() == own and current().cuda_stream == own.cuda_stream

    with ThreadPoolExecutor(2) as pool:
        assert all(pool.map(lambda _: in_thread(), range(4)))
