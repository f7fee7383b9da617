"""The thread that runs the server's batches: it asks the scheduler for the next batch, has it decoded with the model's
decoder, hands it to the engine, and answers each request when the engine is done, with two batches in flight: batch
k + 1 decodes on a thread of its own while the GPU runs batch k and this thread answers batch k's requests. Once a
batch's requests are answered (their results keep the request's bytes, never the decoded pixels), the hardware decoder
decodes a later batch of the same model into that batch's output images rather than allocating new ones.

Requests reach it through `enqueue` (from the gRPC event loop's thread); each one's answer goes to its `done`
callback, once, from this thread: a `Results` with its timings, or a status code and message (a bad image, a
deadline that passed while it waited, an engine failure).

A watchdog thread looks at how long the runner has been waiting on a batch's decode or its results (not its launch,
which builds the network of a shape not seen before). Past `hung_after_s` the work it waits for will not end (a GPU
or driver that no longer answers: four servers on an H100 once waited for ever on a batch's device work with the GPU
idle, bench/NOTES.md); nor will requests be answered once the runner's thread has ended on an error it did not
expect. Either way every request waiting or in flight is answered UNAVAILABLE, and the process ends
(`HUNG_EXIT_CODE`), so that whatever runs it (`serve --processes`, Ray, a container) starts it again, rather than a
server that takes calls and never answers them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc

from yolojet.engine.engine import Submitted
from yolojet.engine.predict_path import PredictOptions
from yolojet.errors import ImageReadError
from yolojet.images.decoders import DecodedBatch, Encoded, OutputPool
from yolojet.serve.batcher import Request, Scheduler
from yolojet.serve.metrics import ServerMetrics
from yolojet.serve.models import ServedModel
from yolojet.tasks import Results

log = logging.getLogger("yolojet.serve")
# A batch's step takes milliseconds; a shape not built yet costs seconds (10.7 s with its tiles never tuned, H200),
# a cold compile tens. A runner waiting far longer than that waits on work that will not end. On a slow backend (the
# CPU's reference executor) the bound is at least HUNG_AFTER_RUNS of the model's slowest measured batch.
HUNG_AFTER_S = 180.0
HUNG_AFTER_RUNS = 50
HUNG_EXIT_CODE = 70  # EX_SOFTWARE: a process whose engine hung, ended so that its supervisor starts it again


def exit_hung(message: str) -> None:
    """What a hung runner does by default: a second for the replies just given to leave, then the process ends without
    its teardown (which would wait on the same device work)."""
    time.sleep(1.0)
    os._exit(HUNG_EXIT_CODE)


@dataclass
class Outcome:
    """A request's answer: its results, or the status code and message it failed with; and where its time went."""

    result: Results | None = None
    code: grpc.StatusCode = grpc.StatusCode.OK
    message: str = ""
    queue_s: float = 0.0
    decode_s: float = 0.0
    run_s: float = 0.0


@dataclass
class Job:
    """What a request carries to the runner."""

    request_id: str
    data: bytes
    options: PredictOptions
    done: Callable[[Outcome], None]
    gone: Callable[[], bool] = lambda: False  # whether its caller went away (a closed stream): never run


@dataclass
class _Decoded:
    """A batch decoded (or the decoder's failure, which is the whole batch's), waiting to be launched."""

    ticket: int
    name: str
    requests: list[Request]
    started: float
    decoded: DecodedBatch | None
    failure: str = ""
    decode_s: float = 0.0


@dataclass
class _Launched:
    ticket: int
    model: ServedModel
    requests: list[Request]
    submitted: Submitted | None
    started: float
    decode_s: float
    run_started: float
    outputs: list[Any] = field(default_factory=list)  # the decoder's output images, free once answered


def shown_name(text: str, limit: int = 100) -> str:
    """A name the client sent (a model's, a request id), quoted, its first `limit` characters where it is longer: an
    error travels in gRPC's metadata (16 KiB at most), and one quoting a 20 KB id became a metadata-size failure."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


class Runner:
    watched = True  # a watchdog ends the process when the runner hangs (PoolRunner: its workers are watched instead)

    def __init__(
        self,
        models: dict[str, ServedModel],
        scheduler: Scheduler,
        metrics: ServerMetrics,
        clock: Callable[[], float] = time.monotonic,
        on_hung: Callable[[str], None] = exit_hung,
    ) -> None:
        """`on_hung`: called with the reason once the runner is found hung and its requests are answered (by
        default the process ends)."""
        self.models, self.scheduler, self.metrics, self.clock = models, scheduler, metrics, clock
        self._cond = threading.Condition()
        self._stopping = False
        self._someone_gone = False  # a caller went away since the runner last looked (`note_gone`)
        self._refusal = "the server is shutting down"  # what a request gets once stopping
        # Each model's answered batches' output images, taken by its next decode (a thread of its own).
        self._spare = {name: OutputPool() for name in models}  # released batches' decode buffers, a model's
        self._thread = threading.Thread(target=self._loop, name="yolojet-serve-runner", daemon=True)
        # The batches taken from the scheduler and not yet answered (ticket -> requests), and since when the runner
        # has waited on a batch's step (None while it is not waiting on one): what the watchdog reads.
        self._held: dict[int, list[Request]] = {}
        self._waiting_since: float | None = None
        slowest = max((max(m.latency.run_seconds.values(), default=0.0) for m in models.values()), default=0.0)
        self.hung_after_s = max(HUNG_AFTER_S, HUNG_AFTER_RUNS * slowest)
        self._on_hung = on_hung
        self._unwatched = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="yolojet-serve-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if self.watched:
            self._watchdog.start()

    def enqueue(self, model: str, job: Job, deadline: float, key: Any, arrival: float | None = None) -> None:
        """Queue a request for `model` that arrived at `arrival` (now where None; on `clock`), due at `deadline` (raises
        `Refused` when it cannot meet it)."""
        arrival = self.clock() if arrival is None else arrival
        with self._cond:
            if self._stopping:
                job.done(Outcome(code=grpc.StatusCode.UNAVAILABLE, message=self._refusal))
                return
            self.scheduler.admit(Request(model, deadline, arrival, key, job))
            self.metrics.child(self.metrics.queue_depth, model).set(len(self.scheduler.queues[model].waiting))
            self._cond.notify()

    def note_gone(self) -> None:
        """A caller went away (a stream closed with images read ahead: up to STREAM_WINDOW of them, seconds of work the
        next caller would wait behind; a unary call cancelled or past its deadline): its requests leave the queues at
        the runner's next look, before it takes a batch. Called from the event loop's thread, which a scan of every
        queue (1,024 requests a model) for each call that goes away would hold up, so the runner's thread scans once
        for all the calls gone since its last look."""
        self._someone_gone = True

    def forget_queued(self) -> None:
        """Take every queued request out of the queues (a shutdown past its grace, whose calls are all ended)."""
        with self._cond:
            self.scheduler.discard(lambda request: True)
            self._show_queue_depths()

    def _show_queue_depths(self) -> None:
        for name, queue in self.scheduler.queues.items():
            self.metrics.child(self.metrics.queue_depth, name).set(len(queue.waiting))

    def stop(self, timeout: float | None = None) -> None:
        """Answer every queued request, then end the thread (the watchdog stays until it has ended)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self._unwatched.set()

    # -- the watchdog -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _waiting_on_a_batch(self) -> Iterator[None]:
        self._waiting_since = self.clock()
        try:
            yield
        finally:
            self._waiting_since = None

    def _watch(self) -> None:
        while not self._unwatched.wait(min(5.0, self.hung_after_s / 4)):
            since = self._waiting_since
            if since is not None and self.clock() - since > self.hung_after_s:
                waited = self.clock() - since
                self._hung(
                    f"a batch has waited {waited:.0f} s on its decode or device work (a GPU or driver that no longer "
                    "answers)",
                    {"event": "engine hung", "waited_s": round(waited, 1), "limit_s": self.hung_after_s},
                )
                return
            if not self._thread.is_alive() and not self._stopping:  # an error the loop did not expect ended it
                self._hung("its runner thread ended", {"event": "runner ended"})
                return

    def _hung(self, why: str, event: dict[str, Any]) -> None:
        """Every request waiting or in flight answered UNAVAILABLE, new ones refused, and `on_hung` told why."""
        message = f"the server's engine stopped answering: {why}; the server process ends so that it is started again"
        log.error(json.dumps(event))
        with self._cond:
            self._stopping = True
            self._refusal = message
            waiting = self.scheduler.discard(lambda request: True)
            held = [request for requests in self._held.values() for request in requests]
        # Some held requests may have been answered already (a bad image, or a batch finishing just now): their
        # futures keep the first answer, and the process is about to end, so a second count in the metrics is moot.
        for request in held + waiting:
            self._answer(request, Outcome(code=grpc.StatusCode.UNAVAILABLE, message=message))
        self._on_hung(message)

    # -- the loop -----------------------------------------------------------------------------

    def _loop(self) -> None:
        in_flight: deque[_Launched] = deque()
        # The next batch decodes on this thread of its own while the batch before is answered here: the decode call
        # runs with the GIL released (hardware decoders, or the CPU pool), and answering is Python. Decoding then
        # answering on one thread took half and a sixth of its time under load (a profile of four servers, H200).
        decoding = ThreadPoolExecutor(1, thread_name_prefix="yolojet-serve-decode")
        try:
            while True:
                with self._cond:
                    self._drop_unwanted()
                    chosen = self.scheduler.next_batch()
                    if chosen is None and not in_flight:
                        if self._stopping and self.scheduler.queued() == 0:
                            return
                        wait = min(1.0, max(0.0, self.scheduler.next_wakeup() - self.clock()))
                        self._cond.wait(timeout=wait)
                        continue
                    self._show_queue_depths()
                    if chosen is not None:
                        self._held[chosen[0]] = chosen[2]
                pending = decoding.submit(self._decode, *chosen) if chosen is not None else None
                # The batch that makes the scheduler's depth is answered while the next one decodes.
                if in_flight and (pending is None or len(in_flight) + 1 >= self.scheduler.depth):
                    with self._waiting_on_a_batch():
                        self._finish(in_flight.popleft())
                if pending is not None:
                    with self._waiting_on_a_batch():
                        decoded = pending.result()
                    # The launch is not watched: it builds the network of each shape the engine has not seen yet (10.7 s
                    # a shape with its tiles never tuned, H200), and a batch may bring several.
                    in_flight.append(self._launch(decoded))
        except Exception:  # the thread ends here; the watchdog answers what it held and ends the process
            log.exception("the server's runner stopped on an error")
        finally:
            decoding.shutdown(wait=True)

    def _drop_unwanted(self) -> None:
        """Take out of the queues the requests whose callers went away since the last look, and answer
        DEADLINE_EXCEEDED to every request whose deadline passed while it waited (under the lock)."""
        if self._someone_gone:
            self._someone_gone = False  # cleared first: a call going away during the scan is seen at the next look
            if self.scheduler.discard(lambda request: request.payload.gone()):
                self._show_queue_depths()
        for request in self.scheduler.expired():
            late = (self.clock() - request.deadline) * 1000
            self._answer(
                request,
                Outcome(
                    code=grpc.StatusCode.DEADLINE_EXCEEDED,
                    message=f"the deadline passed {late:.0f} ms before a batch could take it",
                ),
            )

    def _decode(self, ticket: int, name: str, requests: list[Request]) -> _Decoded:
        """A batch's images decoded (on the decode thread: nothing is answered there)."""
        engine = self.models[name].engine
        assert engine is not None  # this runner serves the engines of its own process
        started = self.clock()
        items = [Encoded(r.payload.data, f"image of request {shown_name(r.payload.request_id)}") for r in requests]
        try:
            decoded = engine.decoder.decode(items, self._spare[name])
        except Exception as e:  # a decoder failure, not a bad image: every request of the batch gets it
            log.exception("decoding a batch of %s failed", name)
            return _Decoded(ticket, name, requests, started, None, f"decoding failed: {e}")
        return _Decoded(ticket, name, requests, started, decoded, decode_s=self.clock() - started)

    def _launch(self, batch: _Decoded) -> _Launched:
        """A decoded batch's bad images answered, the rest handed to the engine."""
        model = self.models[batch.name]
        engine = model.engine
        assert engine is not None
        if batch.decoded is None:
            return self._failed(batch.ticket, model, batch.requests, batch.started, batch.failure)
        model.latency.observe_decode(len(batch.requests), batch.decode_s)
        kept, frames = [], []
        for request, item in zip(batch.requests, batch.decoded.items, strict=True):
            if isinstance(item, ImageReadError):
                self._answer(
                    request,
                    Outcome(
                        code=grpc.StatusCode.INVALID_ARGUMENT,
                        message=str(item),
                        queue_s=batch.started - request.arrival,
                        decode_s=batch.decode_s,
                    ),
                )
            else:
                kept.append(request)
                frames.append(item)
        self.metrics.child(self.metrics.batch_size, batch.name).observe(len(batch.requests))
        run_started = self.clock()
        submitted = None
        if frames:
            try:
                submitted = engine.submit(frames, [r.payload.options for r in kept], ready=batch.decoded.ready)
            except Exception as e:
                log.exception("running a batch of %s failed", batch.name)
                return self._failed(batch.ticket, model, kept, batch.started, f"the engine failed: {e}")
        launched = _Launched(batch.ticket, model, kept, submitted, batch.started, batch.decode_s, run_started)
        launched.outputs, batch.decoded.outputs = batch.decoded.outputs, []
        return launched

    def _failed(
        self, ticket: int, model: ServedModel, requests: list[Request], started: float, message: str
    ) -> _Launched:
        for request in requests:
            self._answer(request, Outcome(code=grpc.StatusCode.INTERNAL, message=message))
        return _Launched(ticket, model, [], None, started, 0.0, started)

    def _finish(self, launched: _Launched) -> None:
        try:
            results = launched.submitted.results() if launched.submitted is not None else []
            failure = None
        except Exception as e:
            log.exception("a batch of %s failed", launched.model.name)
            results, failure = [], f"the engine failed: {e}"
        run_s = self.clock() - launched.run_started
        for i, request in enumerate(launched.requests):
            queue_s = launched.started - request.arrival
            if failure is not None:
                outcome = Outcome(code=grpc.StatusCode.INTERNAL, message=failure)
            else:
                outcome = Outcome(results[i], queue_s=queue_s, decode_s=launched.decode_s, run_s=run_s)
            self._answer(request, outcome)
        if failure is None:  # a failed run may not be done with them
            self._spare[launched.model.name].give(launched.outputs)
        with self._cond:
            self.scheduler.finished(launched.ticket)
            self._held.pop(launched.ticket, None)

    def _answer(self, request: Request, outcome: Outcome) -> None:
        name = request.model
        self.metrics.child(self.metrics.requests, name, outcome.code.name).inc()
        if outcome.code == grpc.StatusCode.OK:
            metrics, stages = self.metrics, self.metrics.stage_seconds
            metrics.child(stages, name, "queue").observe(outcome.queue_s)
            metrics.child(stages, name, "decode").observe(outcome.decode_s)
            metrics.child(stages, name, "run").observe(outcome.run_s)
        try:
            request.payload.done(outcome)
        except Exception:  # a caller's callback must never stop the runner
            log.exception("answering request %s failed", request.payload.request_id)
