"""Independent launches on parallel CUDA streams, so that a captured graph runs them side by side.

At batch 1 most launches fill a fraction of the GPU (a 20×20 layer launches a few dozen programs on 132 SMs),
and the head's branches (box and class chains for each pyramid level, mask coefficients, keypoints) do not
depend on each other. Run one after another, their latencies add up; on parallel streams inside one CUDA
graph they overlap.

What must stay ordered is worked out from memory, not from the graph's edges alone: launch j follows launch i
(i before j in network order) when j reads what i writes (a true dependency), writes what i reads (the memory
plan lets values whose lifetimes do not overlap share memory, so a later writer may reuse a buffer an earlier
launch still reads) or writes what i writes; each split-K launch's part of the scratch counts as memory too.
`schedule_streams` puts each launch behind the deepest of its predecessors that is the last launch
of its stream so far (a chain stays on one stream; at a join, the longest branch goes on), otherwise on a new
stream, and records which launches' completion it must wait for on other streams, skipping waits already
implied by earlier ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from yolojet.engine.plan import MemoryPlan

MAX_STREAMS = 16  # capture streams come from PyTorch's pool of 32 per priority


@dataclass(frozen=True)
class Region:
    """Memory a value occupies: an arena's element range [start, stop) and, within one buffer, its channels.
    A shared resource (the split-K scratch) is a region of its own arena."""

    arena: str
    start: int
    stop: int
    buffer: int
    channels: tuple[int, int]

    def overlaps(self, other: Region) -> bool:
        if self.arena != other.arena or self.stop <= other.start or other.stop <= self.start:
            return False
        if self.buffer != other.buffer:
            return True  # two buffers sharing memory: any part may overlap
        return self.channels[0] < other.channels[1] and other.channels[0] < self.channels[1]


def scratch_region(slot: int) -> Region:
    """A split-K launch's own part of the scratch (engine/lowering.py's SplitKScratch)."""
    return Region("split-k scratch", slot, slot + 1, -1, (0, 1))


def value_region(plan: MemoryPlan, name: str) -> Region:
    place = plan.placements[name]
    buf = plan.buffers[place.buffer]
    channels = (place.channel, place.channel + plan.widened.get(name, place.channels))
    return Region(buf.kind, buf.offset, buf.offset + buf.per_image, buf.index, channels)


@dataclass(frozen=True)
class Access:
    """What one launch reads and writes."""

    reads: tuple[Region, ...]
    writes: tuple[Region, ...]


def dependencies(accesses: Sequence[Access]) -> list[set[int]]:
    """For each launch, the earlier launches it must follow: read after write, write after read, write after write."""
    deps: list[set[int]] = []
    for j, later in enumerate(accesses):
        mine = set()
        for i in range(j):
            earlier = accesses[i]
            if (
                _any_overlap(earlier.writes, later.reads)
                or _any_overlap(earlier.reads, later.writes)
                or _any_overlap(earlier.writes, later.writes)
            ):
                mine.add(i)
        deps.append(mine)
    return deps


def _any_overlap(a: Sequence[Region], b: Sequence[Region]) -> bool:
    return any(x.overlaps(y) for x in a for y in b)


@dataclass
class Schedule:
    """stream[j]: the stream launch j runs on (0 is the caller's); waits[j]: launches on other streams whose
    completion launch j waits for first. Launches on one stream run in network order."""

    stream: list[int]
    waits: list[list[int]]

    @property
    def streams(self) -> int:
        return max(self.stream, default=0) + 1

    def happens_before(self) -> list[set[int]]:
        """For each launch, every launch guaranteed complete before it starts touching memory."""
        before: list[set[int]] = []
        last_on: dict[int, int] = {}
        for j, s in enumerate(self.stream):
            done: set[int] = set()
            previous = last_on.get(s)
            if previous is not None:
                done |= before[previous] | {previous}
            for i in self.waits[j]:
                done |= before[i] | {i}
            before.append(done)
            last_on[s] = j
        return before


def schedule_streams(deps: Sequence[set[int]], max_streams: int = MAX_STREAMS) -> Schedule:
    """Chains of dependent launches on one stream each, waits only where a dependency crosses streams."""
    stream: list[int] = []
    waits: list[list[int]] = []
    tails: list[int] = []  # the last launch put on each stream
    # known[s][t]: the latest launch of stream t that stream s has (transitively) waited for, -1 for none.
    known: list[list[int]] = []
    seen_after: list[list[int]] = []  # a copy of known[stream[j]] right after launch j
    depth: list[int] = []  # launches on the longest dependency path ending at each launch
    for j, mine in enumerate(deps):
        depth.append(1 + max((depth[i] for i in mine), default=0))
        # Continue the deepest chain among the streams this launch can extend: that predecessor is likely the
        # last to finish, and a launch right behind it on its stream keeps the dependent-launch overlap, while
        # the shorter branches it joins have usually finished by then.
        extendable = [i for i in mine if tails[stream[i]] == i]
        chosen = stream[max(extendable, key=lambda i: (depth[i], i))] if extendable else None
        if chosen is None:
            if not tails:
                chosen = 0
            elif len(tails) < max_streams:
                chosen = len(tails)
            else:
                # Every stream is taken: reuse one whose last launch this launch follows anyway (no new ordering),
                # else the one whose last launch is shallowest (likely done), not the latest predecessor's stream,
                # which is busy with a sibling branch (pose cv4.2 behind cv2.2; seg proto behind the P4/P5 neck).
                ancestors: set[int] = set()
                todo = list(mine)
                while todo:
                    i = todo.pop()
                    if i not in ancestors:
                        ancestors.add(i)
                        todo.extend(deps[i])
                free = [s for s, t in enumerate(tails) if t in ancestors]
                chosen = min(free or range(len(tails)), key=lambda s: (depth[tails[s]], s))
            if chosen == len(tails):
                tails.append(-1)
                for row in known:
                    row.append(-1)
                known.append([-1] * len(tails))
                for row in seen_after:
                    row.append(-1)
        mine_waits: dict[int, int] = {}
        for i in mine:
            t = stream[i]
            if t != chosen and known[chosen][t] < i:
                mine_waits[t] = max(mine_waits.get(t, -1), i)
        for i in mine_waits.values():
            known[chosen] = [max(a, b) for a, b in zip(known[chosen], seen_after[i], strict=True)]
        known[chosen][chosen] = j
        stream.append(chosen)
        waits.append(sorted(mine_waits.values()))
        tails[chosen] = j
        seen_after.append(list(known[chosen]))
    return Schedule(stream, waits)


def capture_streams(device: torch.device) -> list[torch.cuda.Stream]:
    """A capture stream and MAX_STREAMS − 1 side streams, drawn together from PyTorch's pool (32 streams per
    priority, handed out in turn), so no side stream is the stream the graph is captured on: a branch put on
    that stream would silently run in order with the main one."""
    return [torch.cuda.Stream(device) for _ in range(MAX_STREAMS)]


class StreamRunner:
    """Runs launches on the schedule's streams, forked from and joined back into the caller's stream (stream 0);
    inside a CUDA graph capture this records the branches as parallel graph nodes. `side` are the other
    streams, at least `schedule.streams − 1` of them, none of them the caller's."""

    def __init__(
        self, runs: Sequence[Callable[[], None]], schedule: Schedule, side: Sequence[torch.cuda.Stream]
    ) -> None:
        if len(side) < schedule.streams - 1:
            raise ValueError(f"the schedule uses {schedule.streams} streams; {len(side)} side streams given")
        self.runs = list(runs)
        self.schedule = schedule
        self.side = list(side[: schedule.streams - 1])
        self.done = [torch.cuda.Event() for _ in runs]
        self.waited_for = sorted({i for waits in schedule.waits for i in waits})

    def __call__(self) -> None:
        main = torch.cuda.current_stream(self.side[0].device if self.side else None)
        streams = [main, *self.side]
        for side in self.side:
            side.wait_stream(main)
        needed = set(self.waited_for)
        for j, run in enumerate(self.runs):
            stream = streams[self.schedule.stream[j]]
            for i in self.schedule.waits[j]:
                stream.wait_event(self.done[i])
            with torch.cuda.stream(stream):
                run()
            if j in needed:
                self.done[j].record(stream)
        for side in self.side:
            main.wait_stream(side)
