"""Deadline-aware dynamic batching: which requests run together, when, and which are turned away at once.

Each request has a deadline: the gRPC deadline its client set, else its arrival plus the server's SLO. Each model has
a queue and a latency model: the engine's run time for each batch bucket, measured at start-up, and an exponential
moving average of decode time per image, updated by every batch.

- Work-conserving: whenever the engine can take a batch (fewer than `depth` batches in flight), the queue whose
  oldest request's deadline is nearest gives a batch of everything it holds, up to the model's max_batch. Under light
  load that is a batch of one or two, run at once; under heavy load the queues fill while the engine is busy, so
  batches grow to max_batch by themselves. A batch takes only requests whose options can share one run (the same
  IoU threshold and class-agnostic flag; conf, max_det and classes are applied to each request's results).
- Admission: a request is refused at once (`Refused`, RESOURCE_EXHAUSTED) when its queue is full or when the work
  ahead of it (what is left of the batches in flight, the queued requests of any model with an earlier deadline, its
  own batch) would end past its deadline, rather than being left to time out. An idle server refuses only a request
  whose deadline is shorter than a run of one (judged on the time it arrived with: DEADLINE_TOO_SHORT, final), or one
  that lost so much of its time before it reached the queue that a run of one no longer fits (to be sent again at
  once), so a decode average inflated by a slow spell is corrected by the next batch.
- The estimates learn from the batches: each batch's time from being taken to being answered, against its estimate,
  moves the model's `slowdown` (an average ratio), so that admission counts what the host adds under load.
- A request whose deadline has passed while it waited is dropped from its queue (DEADLINE_EXCEEDED), never run.
- Several engines (worker processes, one a GPU: scale/) run batches side by side: `engines` of them take `depth`
  batches each, and the work ahead of a request is shared among them.

Everything here is plain logic on an injected clock, so it is tested without a server or a GPU.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DECODE_EMA = 0.2  # weight of the newest batch in the decode-time average
SLOWDOWN_EMA = 0.2  # weight of the newest batch in the average of measured / estimated batch time
# One batch's ratio counts within this range (a stall or a clock jump, bounded). Below 1 it corrects a start-up
# measurement taken under load (one on a busy 2-core machine put a batch of 4 at 1,633 ms that ran in 33); not further
# than a tenth, since a batch answered right after the one before it is timed at almost nothing.
_SLOWDOWN_RANGE = (0.1, 50.0)


@dataclass
class Request:
    """One image waiting for a batch. `key` groups the requests that may share a run."""

    model: str
    deadline: float
    arrival: float
    key: Any = None
    payload: Any = None


@dataclass
class LatencyModel:
    """Seconds a batch of n images takes: decode (per image, averaged) plus the run of its bucket, times `slowdown`,
    the average ratio of the time batches took, from taken to answered, to this estimate of them. The runs are
    measured alone at start-up; under load a batch also waits for the host (results made, replies sent, the GIL),
    which only the batches themselves measure."""

    run_seconds: dict[int, float]  # bucket size -> seconds for one run
    decode_per_image: float = 0.0
    slowdown: float = 1.0

    def bucket(self, n: int) -> int:
        fitting = [b for b in self.run_seconds if b >= n]
        return min(fitting) if fitting else max(self.run_seconds)

    def base_seconds(self, n: int) -> float:
        """The estimate before `slowdown`: decode and runs alone."""
        if n <= 0:
            return 0.0
        largest = max(self.run_seconds)
        full, rest = divmod(n, largest)
        seconds = full * self.run_seconds[largest] + (self.run_seconds[self.bucket(rest)] if rest else 0.0)
        return seconds + n * self.decode_per_image

    def batch_seconds(self, n: int) -> float:
        return self.base_seconds(n) * self.slowdown

    def observe_batch(self, estimated: float, seconds: float) -> None:
        """A batch estimated at `estimated` seconds (`base_seconds`) took `seconds` from its start to its answers."""
        if estimated > 0:
            ratio = min(max(seconds / estimated, _SLOWDOWN_RANGE[0]), _SLOWDOWN_RANGE[1])
            self.slowdown += SLOWDOWN_EMA * (ratio - self.slowdown)

    def observe_decode(self, images: int, seconds: float) -> None:
        if images > 0:
            per_image = seconds / images
            if self.decode_per_image == 0.0:
                self.decode_per_image = per_image
            else:
                self.decode_per_image += DECODE_EMA * (per_image - self.decode_per_image)


# Why a request was refused, as clients read it (google.rpc.ErrorInfo's reason; Error.reason in a stream's reply).
QUEUE_FULL = "QUEUE_FULL"  # its model's queue is at max_queue: room comes as the engines take the next batch
DEADLINE_CANNOT_BE_MET = "DEADLINE_CANNOT_BE_MET"  # the work ahead of it would end past its deadline
DEADLINE_TOO_SHORT = "DEADLINE_TOO_SHORT"  # shorter than a run of one image: the same time budget never passes


class Refused(Exception):
    """A request the server cannot serve in time, and why (the reasons above). `retry_after_s`: when the same request
    with the same time budget would be admitted, by the estimates; None where it never would (DEADLINE_TOO_SHORT)."""

    def __init__(self, message: str, reason: str, retry_after_s: float | None) -> None:
        super().__init__(message)
        self.reason, self.retry_after_s = reason, retry_after_s


@dataclass
class ModelQueue:
    max_batch: int
    latency: LatencyModel
    max_queue: int
    waiting: deque[Request] = field(default_factory=deque)
    # The earliest deadline of `waiting` (clients set their own, so not always the first's): the runner checks for
    # expired requests each pass, and a queue whose soonest deadline is ahead is not scanned.
    soonest: float = math.inf

    def take(self, keep: deque[Request]) -> None:
        self.waiting = keep
        self.soonest = min((r.deadline for r in keep), default=math.inf)


class Scheduler:
    """The queues of every model and the batches in flight; not thread-safe (the server holds a lock)."""

    def __init__(self, clock: Callable[[], float], depth: int = 2, engines: int = 1) -> None:
        self.clock = clock
        self.depth_per_engine = depth
        self.engines = engines
        self.queues: dict[str, ModelQueue] = {}
        self.in_flight: dict[int, float] = {}  # batch ticket -> its seconds, estimated
        # When the engines would be done with the batches in flight, by their estimates (re-anchored as each finishes),
        # so that a request arriving late in a batch's run counts only what is left of it.
        self._busy_until = -math.inf
        # batch ticket -> (when it was taken, its estimate before slowdown, its model), for `finished` to measure
        self._taken: dict[int, tuple[float, float, str]] = {}
        self._last_finished = -math.inf
        self._tickets = 0

    def add_model(self, name: str, max_batch: int, latency: LatencyModel, max_queue: int) -> None:
        self.queues[name] = ModelQueue(max_batch, latency, max_queue)

    def queued(self) -> int:
        return sum(len(q.waiting) for q in self.queues.values())

    @property
    def depth(self) -> int:
        """Batches in flight at most: `depth` per engine that can take work (none while every engine is down)."""
        return self.depth_per_engine * self.engines

    # -- admission ----------------------------------------------------------------------------

    def admit(self, request: Request) -> None:
        """Queue the request, or raise Refused saying why it cannot meet its deadline."""
        queue = self.queues[request.model]
        if len(queue.waiting) >= queue.max_queue:
            message = f"model {request.model}: {len(queue.waiting)} requests already queued (the limit)"
            raise Refused(message, QUEUE_FULL, self.until_a_batch_is_taken())
        # A run of one: its start-up time, or less where batches have shown it faster (never more: a transient
        # slowdown, a profiler's pauses, once left a server turning every request away for good).
        alone = queue.latency.run_seconds[queue.latency.bucket(1)] * min(1.0, queue.latency.slowdown)
        # Too short is judged on the time the request arrived with, not the time left now: the server's own pause
        # between its arrival and here (a garbage collection, the runner's lock) is a delay that passes, which the
        # checks below refuse with a time to try again, not a budget no run of one image fits.
        if request.arrival + alone > request.deadline:
            message = f"model {request.model}: the deadline is shorter than a run of one image ({alone * 1000:.1f} ms)"
            raise Refused(message, DEADLINE_TOO_SHORT, None)
        # Nothing queued or running: the request starts at once. Refusing it on the decode average would refuse
        # forever, since only batches update that average; the run of one above is all it is held to.
        now = self.clock()
        if self.idle():
            if now + alone > request.deadline:  # the time it came with went before it reached the queue
                lost = now - request.arrival
                message = (
                    f"model {request.model}: {lost * 1000:.0f} ms of the deadline went before the request reached the "
                    f"queue, and a run of one image ({alone * 1000:.1f} ms) no longer fits"
                )
                raise Refused(message, DEADLINE_CANNOT_BE_MET, 0.0)  # sent again, it is admitted at once
        elif (finish := now + self.work_ahead(request)) > request.deadline:
            late = finish - request.deadline
            message = f"model {request.model}: the work queued ahead would end {late * 1000:.0f} ms past the deadline"
            raise Refused(message, DEADLINE_CANNOT_BE_MET, late)
        queue.waiting.append(request)
        queue.soonest = min(queue.soonest, request.deadline)

    def idle(self) -> bool:
        return not self.in_flight and self.queued() == 0

    def until_a_batch_is_taken(self) -> float:
        """Seconds until the engines take another batch, by the estimates: none while fewer than `depth` batches are
        in flight, else until the first of those in flight is done."""
        if len(self.in_flight) < self.depth:
            return 0.0
        first = next(iter(self.in_flight.values()))  # taken first (dicts keep their order)
        behind = (sum(self.in_flight.values()) - first) / max(1, self.engines)
        return max(0.0, self._busy_until - self.clock() - behind)

    def work_ahead(self, request: Request) -> float:
        """Seconds until `request` would be done: what is left of the batches in flight, the queued requests served
        before it (its own queue's, and other queues' with an earlier oldest deadline), shared among the engines, and
        its own batch."""
        in_flight = max(0.0, self._busy_until - self.clock()) if self.in_flight else 0.0
        seconds = 0.0
        own = self.queues[request.model]
        for name, queue in self.queues.items():
            if name == request.model or not queue.waiting or queue.waiting[0].deadline > request.deadline:
                continue
            seconds += queue.latency.batch_seconds(len(queue.waiting))
        ahead = len(own.waiting)
        full_batches = ahead // own.max_batch  # batches that fill up before this request's
        seconds += full_batches * own.latency.batch_seconds(own.max_batch)
        own_batch = own.latency.batch_seconds(ahead - full_batches * own.max_batch + 1)
        return in_flight + seconds / max(1, self.engines) + own_batch

    # -- batches ------------------------------------------------------------------------------

    def expired(self) -> list[Request]:
        """Requests whose deadline passed while they waited, taken out of their queues."""
        now, gone = self.clock(), []
        for queue in self.queues.values():
            if queue.soonest > now:
                continue
            gone += [r for r in queue.waiting if r.deadline <= now]
            queue.take(deque(r for r in queue.waiting if r.deadline > now))
        return gone

    def discard(self, unwanted: Callable[[Request], bool]) -> list[Request]:
        """The waiting requests `unwanted` picks, taken out of their queues."""
        gone: list[Request] = []
        for queue in self.queues.values():
            if any(unwanted(r) for r in queue.waiting):
                gone += [r for r in queue.waiting if unwanted(r)]
                queue.take(deque(r for r in queue.waiting if not unwanted(r)))
        return gone

    def can_launch(self) -> bool:
        return len(self.in_flight) < self.depth and self.queued() > 0

    def next_batch(self) -> tuple[int, str, list[Request]] | None:
        """The batch to run now, as (ticket, model, requests): the model whose oldest request's deadline is nearest,
        its requests that share the oldest one's key, up to max_batch, in arrival order; None when the engine is
        busy or nothing waits. Hand the ticket to `finished` when the batch is done."""
        if not self.can_launch():
            return None
        name = min((n for n, q in self.queues.items() if q.waiting), key=lambda n: self.queues[n].waiting[0].deadline)
        queue = self.queues[name]
        key = queue.waiting[0].key
        batch: list[Request] = []
        rest: deque[Request] = deque()
        while queue.waiting:
            request = queue.waiting.popleft()
            if len(batch) < queue.max_batch and request.key == key:
                batch.append(request)
            else:
                rest.append(request)
        queue.take(rest)
        self._tickets += 1
        seconds = queue.latency.batch_seconds(len(batch))
        self.in_flight[self._tickets] = seconds
        self._busy_until = max(self.clock(), self._busy_until) + seconds / max(1, self.engines)
        self._taken[self._tickets] = (self.clock(), queue.latency.base_seconds(len(batch)), name)
        return self._tickets, name, batch

    def finished(self, ticket: int) -> None:
        """The batch of this ticket is done (its requests answered): its time goes into its model's slowdown. With
        one engine a batch starts when it was taken or when the batch before it finished, whichever is later, so a
        batch that queued behind another is not counted slow for it."""
        self.in_flight.pop(ticket, None)
        now = self.clock()
        # The batches still in flight start from now (a batch done early or late moves the ones behind it).
        self._busy_until = now + sum(self.in_flight.values()) / max(1, self.engines)
        taken = self._taken.pop(ticket, None)
        if taken is None:
            return
        started = max(taken[0], self._last_finished) if self.engines == 1 else taken[0]
        self._last_finished = now
        self.queues[taken[2]].latency.observe_batch(taken[1], now - started)

    def next_wakeup(self) -> float:
        """When the earliest queued deadline passes (for dropping it), or infinity."""
        return min((q.soonest for q in self.queues.values()), default=math.inf)
