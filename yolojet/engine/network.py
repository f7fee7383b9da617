"""The network on our kernels: memory plan + Triton launches + per-layer autotuning + CUDA graphs per batch bucket.

`TritonNetwork` plans memory (one NHWC activation arena, one float32 head arena, both sized for
`max_batch`), packs the weights, lowers every node to a kernel launch bound to its views for each
batch bucket (1, 2, 4, ..., max_batch), times candidate tile configs per conv (cached on disk), and
captures each bucket's launches into a CUDA graph (with `branches`, independent launches on parallel
streams inside it). `raw(x)` copies the batch in, replays the
smallest bucket's graph that fits, and returns the head outputs in the reference executor's form.

With `TRITON_INTERPRET=1` and a CPU device, the same kernels run through Triton's interpreter
(no tuning, no graph): the path the CPU test suite takes.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch

from yolojet.engine.autotune import TuningCache, compile_launches, time_launch, tune, untuned
from yolojet.engine.lowering import Launch, PackedWeights, SplitKScratch, ViewFn, lower
from yolojet.engine.plan import MemoryPlan, plan_memory
from yolojet.engine.streams import (
    Access,
    Schedule,
    StreamRunner,
    capture_streams,
    dependencies,
    schedule_streams,
    scratch_region,
    value_region,
)
from yolojet.errors import EngineConfigError
from yolojet.ir import Graph, ModelMeta
from yolojet.kernels.nms import BestClassTargets
from yolojet.kernels.pdl import pdl_available
from yolojet.options import EngineOptions, branches_off
from yolojet.timing import Timing, time_on_device


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, ... below max_batch, then max_batch: a batch runs in the smallest bucket that holds it."""
    buckets, b = [], 1
    while b < max_batch:
        buckets.append(b)
        b *= 2
    return [*buckets, max_batch]


class Arenas:
    """Activation and head memory shared by the networks of one engine, one per input shape: they run one at a time,
    in stream order, so each may use the same buffer. The first network (the largest: the model's own input size)
    sets its size; a later network that needs more gets a buffer of its own, since captured graphs hold the shared
    one's address."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def take(self, kind: str, elements: int, dtype: torch.dtype) -> torch.Tensor:
        shared = self._buffers.get((kind, dtype))
        if shared is None:
            shared = self._buffers[(kind, dtype)] = torch.empty(elements, dtype=dtype, device=self.device)
        if shared.numel() < elements:
            return torch.empty(elements, dtype=dtype, device=self.device)
        return shared[:elements]


DEFAULT_OPTIONS = EngineOptions()  # every switch where the machine allows it


@dataclass
class FamilyProfile:
    family: str
    count: int
    total_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float


class TritonNetwork:
    """A graph bound to our kernels on one device, ready to run batches of up to `max_batch` images."""

    def __init__(
        self,
        graph: Graph,
        device: torch.device,
        half: bool = True,
        max_batch: int = 1,
        options: EngineOptions = DEFAULT_OPTIONS,
        verbose: bool = False,
        buckets: list[int] | None = None,
        weights: PackedWeights | None = None,
        arenas: Arenas | None = None,
    ) -> None:
        """`weights` and `arenas`: another network's of the same model (for another input size), shared."""
        if max_batch < 1:
            raise EngineConfigError(f"max_batch {max_batch}: must be at least 1")
        buckets = sorted(set(buckets)) if buckets else batch_buckets(max_batch)
        if buckets[0] < 1 or buckets[-1] != max_batch:
            raise EngineConfigError(f"buckets {buckets}: must be positive and end at max_batch={max_batch}")
        self.graph, self.device, self.max_batch = graph, device, max_batch
        self.dtype = torch.float16 if half else torch.float32
        self.plan: MemoryPlan = plan_memory(graph)
        self.arenas = arenas if arenas is not None else Arenas(device)
        self.features = self.arenas.take("feature", self.plan.arena_elements("feature", max_batch), self.dtype)
        self.heads = self.arenas.take("head", self.plan.arena_elements("head", max_batch), torch.float32)
        self.weights = weights if weights is not None else PackedWeights(graph, device, self.dtype, self.plan.widened)
        # What a network of the same model for another input size is built with (`sibling`).
        self._siblings: dict[str, Any] = {
            "half": half,
            "max_batch": max_batch,
            "options": options,
            "verbose": verbose,
            "buckets": buckets,
        }
        self.buckets = buckets
        pdl, branches = options.pdl, options.branches
        # None: wherever the GPU and Triton support it (off under the interpreter and with YOLOJET_PDL=0).
        if pdl and not pdl_available(device):
            raise EngineConfigError(
                f"pdl=True: programmatic dependent launch needs a CUDA GPU of compute capability 9.0 or later and a "
                f"Triton that supports it, not {device} (or YOLOJET_PDL=0 is set); pass pdl=None to use it where it can"
            )
        self.pdl = pdl_available(device) if pdl is None else pdl
        # None: on for a CUDA device unless YOLOJET_BRANCHES=0 (independent branches on parallel streams,
        # engine/streams.py); the interpreter on the CPU runs launches in order.
        if branches is None:
            branches = device.type == "cuda" and not branches_off()
        self.branches = branches
        if self.branches and device.type != "cuda":
            raise EngineConfigError(f"branches=True: parallel streams need a CUDA device, not {device}")
        self.runners: dict[int, StreamRunner] = {}
        # Graphs are captured on streams[0] (the network's and the predict paths'), branches run on the others.
        self.streams = capture_streams(device) if device.type == "cuda" else []
        self.captures = 0  # how many times the graphs were captured: graphs around the network follow it
        self.split_scratch = SplitKScratch(device)
        # The switches as this device resolves them: what lowering and every launch follow.
        self.options = replace(options, tune=options.tuning(), pdl=self.pdl, branches=self.branches)
        self.launches = {
            b: lower(graph, self._viewer(b), self.weights, self.plan, self.split_scratch, self.options)
            for b in self.buckets
        }
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.tuning: dict[str, int] = {}
        # Wall seconds of the start-up's phases (compiling the candidates, timing them, capturing the graphs).
        self.startup_seconds: dict[str, float] = {}
        # When the start-up's timing of tiles began (time.perf_counter()): kernels compiled after it were not part of
        # the compile before it (bench_network.py counts them).
        self.timing_began: float | None = None
        if device.type == "cuda":
            if self.options.tune:
                self._tune(verbose)
            else:
                start = time.perf_counter()
                compile_launches(
                    [], [launch for b in self.buckets for launch in self.launches[b]], seconds=self.startup_seconds
                )
                self.startup_seconds["compile"] = time.perf_counter() - start
            start = time.perf_counter()
            self._capture()
            self.startup_seconds["capture"] = time.perf_counter() - start

    # -- construction -------------------------------------------------------------------------

    def sibling(self, height: int, width: int) -> TritonNetwork:
        """The same model for another input size: its own plan, launches, tiles (tuned or from the cache) and graphs,
        this network's packed weights and memory."""
        graph = self.graph.resized(height, width)
        weights = self.weights if plan_memory(graph).widened == self.plan.widened else None
        return TritonNetwork(graph, self.device, weights=weights, arenas=self.arenas, **self._siblings)

    def _viewer(self, batch: int) -> ViewFn:
        def view(name: str, widened: bool = False) -> torch.Tensor:
            return self.value_view(name, batch, widened)

        return view

    def value_view(self, name: str, batch: int, widened: bool = False) -> torch.Tensor:
        """The device view holding value `name` when running `batch` images: NHWC for feature maps. `widened`:
        with the extra channels the convs around it work on (plan.widened), where it has any."""
        place = self.plan.placements[name]
        buf = self.plan.buffers[place.buffer]
        start = buf.offset * self.max_batch
        if buf.kind == "feature":
            h, w, row = buf.shape
            region = self.features[start : start + batch * buf.per_image].view(batch, h, w, row)
            channels = self.plan.widened.get(name, place.channels) if widened else place.channels
            return region[..., place.channel : place.channel + channels]
        return self.heads[start : start + batch * buf.per_image].view(batch, *buf.shape)

    def _tune(self, verbose: bool) -> None:
        cache = TuningCache()
        tunable = sum(1 for b in self.buckets for launch in self.launches[b] if launch.tune_key)
        done = [0]

        def progress() -> None:
            done[0] += 1
            if verbose:
                print(f"\rtuning tiles {done[0]}/{tunable}", end="", file=sys.stderr, flush=True)

        launches = [launch for b in self.buckets for launch in self.launches[b]]
        for launch in launches:  # remembered picks first, so that the compile below builds them
            known = cache.get(launch.tune_key) if launch.tune_key else None
            if known is not None and launch.configure is not None:
                launch.configure(known)
        pending = untuned(launches, cache)
        start = time.perf_counter()
        if pending and verbose:
            candidates = sum(len(launch.candidates) for launch in pending)
            print(f"compiling {candidates} tile candidates of {len(pending)} launches", file=sys.stderr, flush=True)
        timed = {id(launch) for launch in pending}
        compile_launches(
            pending, [launch for launch in launches if id(launch) not in timed], seconds=self.startup_seconds
        )
        self.startup_seconds["compile"] = time.perf_counter() - start
        start = self.timing_began = time.perf_counter()
        totals: dict[str, int] = defaultdict(int)
        for b in self.buckets:
            for key, value in tune(self.launches[b], cache, progress).items():
                totals[key] += value
        if verbose and tunable:
            print(file=sys.stderr)
        cache.save()
        self.tuning = dict(totals)
        self.startup_seconds["tune"] = time.perf_counter() - start

    def accesses(self, bucket: int) -> list[Access]:
        """What each launch of a bucket reads and writes, as memory regions of the plan (and the split-K scratch
        for launches whose tile splits K)."""
        result = []
        for launch in self.launches[bucket]:
            reads = tuple(value_region(self.plan, v) for v in launch.reads)
            writes = tuple(value_region(self.plan, v) for v in launch.writes)
            if launch.split_need()[1]:
                writes += (scratch_region(launch.split_slot),)
            result.append(Access(reads, writes))
        return result

    def schedule(self, bucket: int) -> Schedule:
        """The bucket's launches on parallel streams, ordered wherever their memory says they must be."""
        return schedule_streams(dependencies(self.accesses(bucket)))

    def _capture(self) -> None:
        # After tuning: a launch's tile decides whether it splits K, and the graphs hold the scratch addresses.
        needs = {launch.split_slot: launch.split_need() for b in self.buckets for launch in self.launches[b]}
        self.split_scratch.lay_out({slot: need for slot, need in needs.items() if need[1]})
        if self.branches:
            for b in self.buckets:
                runs = [launch.run for launch in self.launches[b]]
                self.runners[b] = StreamRunner(runs, self.schedule(b), self.streams[1:])
        pool = torch.cuda.graph_pool_handle()
        side = self.capture_stream  # the warm-up too: no new stream from the pool, none of the branch streams
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for b in self.buckets:  # compile every kernel before any capture
                self._run_eager(b)
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        for b in self.buckets:
            graph = torch.cuda.CUDAGraph()
            # Thread-local: an engine's decoder starts on another thread meanwhile (its CUDA calls are not captured).
            with torch.cuda.graph(graph, pool=pool, stream=self.capture_stream, capture_error_mode="thread_local"):
                self.run_launches(b)
            self.graphs[b] = graph
        torch.cuda.synchronize(self.device)
        self.captures += 1

    @property
    def capture_stream(self) -> torch.cuda.Stream:
        """The stream every graph holding the network's launches is captured on (none of the branch streams)."""
        return self.streams[0]

    # -- running ------------------------------------------------------------------------------

    @property
    def meta(self) -> ModelMeta:
        return self.graph.meta

    def bucket_for(self, batch: int) -> int:
        return next(b for b in self.buckets if b >= batch)

    def _run_eager(self, bucket: int) -> None:
        for launch in self.launches[bucket]:
            launch.run()

    def run_launches(self, bucket: int) -> None:
        """Every launch of the bucket on the current stream, or forked onto parallel streams and joined back into
        it with `branches`: what a captured graph (the network's, or a predict path's around it) records."""
        runner = self.runners.get(bucket)
        if runner is not None:
            runner()
        else:
            self._run_eager(bucket)

    def execute(self, bucket: int) -> None:
        """Run the network on whatever the bucket's input view holds: one graph replay on a GPU."""
        graph = self.graphs.get(bucket)
        if graph is not None:
            graph.replay()
        else:
            self._run_eager(bucket)

    @contextlib.contextmanager
    def copying_output(self, bucket: int, name: str, target: torch.Tensor | None) -> Iterator[bool]:
        """Within the block, the bucket's launch that writes output `name` also writes it to `target` (pinned host
        memory shaped as `value_view(name, bucket)`): a graph captured inside records that store. Yields False,
        changing nothing, when `target` is None or that launch cannot (copy the output after the network then).
        Outside the block no launch writes `target`, so dumps, timings and the network's own graphs leave it be."""
        writer = next((launch for launch in self.launches[bucket] if name in launch.outputs), None)
        if target is None or name not in self.graph.outputs or writer is None or writer.copy_output is None:
            yield False
            return
        if target.shape != self.value_view(name, bucket).shape:
            raise EngineConfigError(
                f"copy of output {name}: shape {tuple(target.shape)}, "
                f"expected {tuple(self.value_view(name, bucket).shape)}"
            )
        writer.copy_output(target)
        try:
            yield True
        finally:
            writer.copy_output(None)

    @contextlib.contextmanager
    def writing_best_class(self, bucket: int, targets: BestClassTargets) -> Iterator[bool]:
        """Within the block, the bucket's decode launch also writes NMS's best-class pass into `targets` (rows for the
        bucket's images), so that NMS skips that pass (`best_ready`): a graph captured inside records it. Where
        `targets` store no scores, the head's score convs that can (fusion.score_folds) write their levels' part of
        the pass themselves, its box and extra convs that can (fusion.box_folds, fusion.extra_folds) their levels'
        boxes and extras, and the decode reads none of their maps. Yields False, changing nothing, where no launch
        can (a classifier). Outside the block the decode writes only its output."""
        writes = [launch.best_class_output for launch in self.launches[bucket] if launch.best_class_output]
        if not writes:
            yield False
            return
        for write in writes:
            write(targets)
        try:
            yield True
        finally:
            for write in writes:
                write(None)

    def input_view(self, batch: int) -> torch.Tensor:
        return self.value_view(self.graph.inputs[0], batch)

    def _check_input(self, x: torch.Tensor) -> None:
        h, w = self.meta.imgsz
        expected = (self.meta.channels, h, w)
        if not isinstance(x, torch.Tensor) or x.ndim != 4 or tuple(x.shape[1:]) != expected:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise EngineConfigError(f"input {shape}: expected a float (N, {expected[0]}, {h}, {w}) tensor in [0, 1]")
        if not x.is_floating_point():
            raise EngineConfigError(f"input dtype {x.dtype}: expected a floating-point tensor in [0, 1]")

    def _read(self, name: str, batch: int) -> torch.Tensor:
        value = self.value_view(name, batch)
        if self.plan.buffers[self.plan.placements[name].buffer].kind == "feature":
            return value.permute(0, 3, 1, 2).float().contiguous()
        return value.clone()

    def raw(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Raw head outputs for a float NCHW batch in [0, 1], in the reference executor's form (float32)."""
        self._check_input(x)
        chunks = []
        for part in x.split(self.max_batch):
            batch = part.shape[0]
            bucket = self.bucket_for(batch)
            self.input_view(bucket)[:batch].copy_(part.permute(0, 2, 3, 1))
            self.execute(bucket)
            chunks.append([self._read(name, bucket)[:batch] for name in self.graph.outputs])
        outputs = tuple(torch.cat(parts) for parts in zip(*chunks, strict=True))
        return outputs[0] if len(outputs) == 1 else outputs

    def poison(self) -> None:
        """Fill every activation and head buffer with NaN: a value some kernel fails to write then shows."""
        self.features.fill_(float("nan"))
        self.heads.fill_(float("nan"))

    def dump(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every value a launch writes, snapshotted right after that launch (NCHW float32 for feature maps). The
        buffers are NaN before the run (`poison`): a value its launch leaves unwritten, or a read of memory nothing
        wrote, shows as NaN rather than as a plausible earlier result."""
        self._check_input(x)
        batch = x.shape[0]
        if batch > self.max_batch:
            raise EngineConfigError(f"dump takes at most max_batch={self.max_batch} images, got {batch}")
        bucket = self.bucket_for(batch)
        self.poison()
        self.input_view(bucket)[:batch].copy_(x.permute(0, 2, 3, 1))
        values = {self.graph.inputs[0]: self._read(self.graph.inputs[0], bucket)[:batch]}
        for launch in self.launches[bucket]:
            launch.run()
            for name in launch.outputs:
                values[name] = self._read(name, bucket)[:batch]
        return values

    # -- measuring ----------------------------------------------------------------------------

    def time_replay(self, batch: int, repeats: int = 200, warmup: int = 20) -> Timing:
        """Device time of each of `repeats` graph replays at `batch` images."""
        bucket = self.bucket_for(batch)
        return time_on_device(partial(self.execute, bucket), repeats, warmup, self.device)

    def launch_times(self, batch: int = 1) -> list[tuple[Launch, float]]:
        """Each launch of the bucket for `batch` with its device milliseconds, timed alone, in network order."""
        if self.device.type != "cuda":
            raise EngineConfigError("profile needs a CUDA device")
        return [(launch, time_launch(launch)) for launch in self.launches[self.bucket_for(batch)]]

    def profile(self, batch: int = 1) -> list[FamilyProfile]:
        """Device time per launch, grouped by kernel family, most expensive family first."""
        per_family: dict[str, list[float]] = defaultdict(list)
        for launch, ms in self.launch_times(batch):
            per_family[launch.family].append(ms)
        rows = [FamilyProfile(f, len(t), sum(t), sum(t) / len(t), min(t), max(t)) for f, t in per_family.items()]
        return sorted(rows, key=lambda r: -r.total_ms)

    def launch_list(self, batch: int = 1) -> list[Launch]:
        return self.launches[self.bucket_for(batch)]
