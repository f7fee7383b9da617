"""The gRPC methods of `yolojet.v1.Inference` on grpc.aio: each request checked, queued for a batch with its deadline,
and answered from the runner's thread through the event loop.

A request's deadline is the one its client set (gRPC's own), else its arrival plus the server's SLO. Bad requests
are answered at once: NOT_FOUND for an unknown model, INVALID_ARGUMENT for empty bytes or an option out of range
(the image itself is checked when its batch decodes it: not an image, cut short, over the pixel limit), and
RESOURCE_EXHAUSTED when the work queued ahead would end past the deadline.
"""

from __future__ import annotations

import asyncio
import functools
import math
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Any

import grpc

from yolojet.errors import EngineConfigError
from yolojet.serve import convert
from yolojet.serve.batcher import Refused
from yolojet.serve.metrics import ServerMetrics
from yolojet.serve.models import ServedModel
from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb
from yolojet.serve.proto.yolojet.v1 import inference_pb2_grpc as pb_grpc
from yolojet.serve.runner import Job, Outcome, Runner, shown_name

STREAM_WINDOW = 512  # images of one stream in flight at once; reading the stream waits beyond this


class Problem(Exception):
    """A request answered with a status instead of results: refused before it reaches a batch, or failed in it.
    `reason`, `retry_after_s` and `model`: a refusal for load's (batcher.Refused), which clients read from the status
    details of a call or the error of a stream's reply."""

    def __init__(
        self, code: grpc.StatusCode, message: str, reason: str = "", retry_after_s: float | None = None, model: str = ""
    ) -> None:
        super().__init__(message)
        self.code, self.message = code, message
        self.reason, self.retry_after_s, self.model = reason, retry_after_s, model

    def error(self) -> pb.Error:
        delay_ms = min(math.ceil(self.retry_after_s * 1000), INT32_MAX) if self.retry_after_s is not None else 0
        return pb.Error(code=self.code.value[0], message=self.message, reason=self.reason, retry_delay_ms=delay_ms)

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        """The call's status details (grpc-status-details-bin) for a refusal for load: google.rpc.ErrorInfo and
        RetryInfo, which grpcio-status' `rpc_status.from_call` and other languages' status helpers read; none else."""
        if not self.reason:
            return ()
        return convert.status_details(self.code, self.message, self.reason, self.retry_after_s, self.model)


INT32_MAX = 2**31 - 1  # Error.retry_delay_ms's field

SHUTTING_DOWN = "the server is shutting down: the requests after those answered were not run; send them again"


def _cancelling(task: asyncio.Task | None) -> bool:
    """Whether `task` itself is being cancelled (Python 3.11's `Task.cancelling`; on 3.10, taken as not)."""
    return task is not None and bool(getattr(task, "cancelling", lambda: 0)())


class InferenceService(pb_grpc.InferenceServicer):
    def __init__(
        self,
        models: dict[str, ServedModel],
        runner: Runner,
        metrics: ServerMetrics,
        slo_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_message_bytes: int = 0,
        processes: int = 1,
        process_index: int = 0,
    ) -> None:
        """`max_message_bytes`: the largest request message the server takes, `processes` the whole servers sharing
        its port and `process_index` which of them this is, all of which ListModels tells clients (0: not said)."""
        self.models, self.runner, self.metrics, self.slo_s, self.clock = models, runner, metrics, slo_s, clock
        self.max_message_bytes, self.processes, self.process_index = max_message_bytes, processes, process_index
        self._settlers: dict[asyncio.AbstractEventLoop, Settler] = {}
        self._readers: set[asyncio.Future] = set()  # the open streams' readers, which `drain` stops
        self._drained: set[asyncio.Future] = set()  # those it stopped: their streams end UNAVAILABLE
        self.draining = False

    # -- one request --------------------------------------------------------------------------

    def _model(self, name: str) -> ServedModel:
        if not name and len(self.models) == 1:
            return next(iter(self.models.values()))
        if name not in self.models:
            served = ", ".join(sorted(self.models))
            if name:
                raise Problem(grpc.StatusCode.NOT_FOUND, f"no model named {shown_name(name)} (served: {served})")
            raise Problem(grpc.StatusCode.INVALID_ARGUMENT, f"a model name is needed: this server runs {served}")
        return self.models[name]

    def _submit(
        self, request: pb.InferRequest, deadline: float, loop: asyncio.AbstractEventLoop, arrival: float
    ) -> tuple[ServedModel, asyncio.Future]:
        """Check the request and queue it (it arrived at `arrival`: the clock reading its deadline was made from); the
        future gets its `Outcome`."""
        model = self._model(request.model)
        data = request.image  # each read of a bytes field makes a new copy (upb): once
        if not data:
            raise Problem(grpc.StatusCode.INVALID_ARGUMENT, "image: empty, no image bytes in the request")
        given: dict[str, Any] = {}
        for field in ("conf", "iou", "max_det"):
            if request.HasField(field):
                given[field] = getattr(request, field)
        if request.classes:
            given["classes"] = list(request.classes)
        try:
            options = model.options(**given)
        except EngineConfigError as e:
            raise Problem(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        future: asyncio.Future = loop.create_future()
        settler = self._settlers.get(loop)
        if settler is None:
            settler = self._settlers[loop] = Settler(loop)
        job = Job(request.id, data, options, functools.partial(settler.put, future), gone=future.cancelled)
        try:
            self.runner.enqueue(model.name, job, deadline, key=(options.iou, options.agnostic), arrival=arrival)
        except Refused as e:
            raise Problem(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e), e.reason, e.retry_after_s, model.name) from None
        return model, future

    def _deadline(self, context: grpc.aio.ServicerContext | None, arrival: float) -> float:
        """The call's gRPC deadline, else `arrival` (on `clock`) plus the server's SLO."""
        stream = self._stream_deadline(context)
        return stream if stream is not None else arrival + self.slo_s

    def _stream_deadline(self, context: grpc.aio.ServicerContext | None) -> float | None:
        """The call's gRPC deadline on `clock`, None where its client set none."""
        remaining = context.time_remaining() if context is not None else None
        return self.clock() + remaining if remaining is not None else None

    def _count(self, model: str, code: grpc.StatusCode) -> None:
        # A name the server does not serve is counted as "(unknown)": clients choose it, and each label value would
        # be a series of its own, without bound.
        name = model if model in self.models else "(unknown)" if model else "-"  # "-": no name, the only model's
        self.metrics.child(self.metrics.requests, name, code.name).inc()

    # -- what the methods do, without a grpc.aio context (scale/ray_serve's replicas answer through Ray's proxy) --

    async def infer(self, request: pb.InferRequest, deadline: float, arrival: float) -> pb.InferReply:
        """One request's reply (`arrival` as `_submit`'s); raises `Problem` with the status it fails with."""
        try:
            model, future = self._submit(request, deadline, asyncio.get_running_loop(), arrival)
        except Problem as p:
            self._count(request.model, p.code)
            raise
        try:
            outcome: Outcome = await future
        except asyncio.CancelledError:  # the caller went away (cancelled, past its deadline, the server's grace over)
            future.cancel()
            self.runner.note_gone()  # its request leaves the queue, not run for nobody
            raise
        if outcome.code != grpc.StatusCode.OK:
            raise Problem(outcome.code, outcome.message)
        return _reply(outcome, model, request.id)

    def replies(
        self, request_iterator: AsyncIterator[pb.InferRequest], deadline: float | None = None
    ) -> AsyncGenerator[pb.InferReply, None]:
        """A stream's replies in request order, a failed request's as a reply carrying its error. `deadline`: the
        stream's own (its client's gRPC deadline, on `clock`), each request's; None: each request's arrival plus the
        SLO."""
        return self._answers(request_iterator, _alone, _first, deadline)

    def batch_replies(
        self, batch_iterator: AsyncIterator[pb.InferBatch], deadline: float | None = None
    ) -> AsyncGenerator[pb.InferBatchReply, None]:
        """A batched stream's replies: each message's as one message, in request order (`deadline` as `replies`)."""
        return self._answers(batch_iterator, _requests_of, _batch_reply, deadline)

    async def _answers(
        self,
        messages: AsyncIterator[Any],
        requests_of: Callable[[Any], Sequence[pb.InferRequest]],
        reply_of: Callable[[list[pb.InferReply]], Any],
        deadline: float | None,
    ) -> AsyncGenerator[Any, None]:
        """Each message's replies, in order, as `reply_of` makes one message of them once all are in; reading the
        stream waits while STREAM_WINDOW images are read ahead of the replies sent (a message is read whole). A stream
        of single requests passes through here as directly as one of batches (no generator a message between): each
        layer cost InferStream a tenth of its rate on the 2-core machine. The stream fails as its reading failed."""
        loop = asyncio.get_running_loop()
        pending: asyncio.Queue = asyncio.Queue()  # unbounded: the images in it are bounded below
        room = asyncio.Event()
        ahead = 0  # images read and not yet answered
        end = object()

        async def read() -> None:
            nonlocal ahead
            async for message in messages:
                while ahead >= STREAM_WINDOW:
                    room.clear()
                    await room.wait()
                waiting: list[tuple[str, ServedModel | None, asyncio.Future | Problem]] = []
                arrival = self.clock()  # the message's: the queueing of the requests before one is the server's time
                for request in requests_of(message):
                    try:
                        due = deadline if deadline is not None else arrival + self.slo_s
                        model, future = self._submit(request, due, loop, arrival)
                        waiting.append((request.id, model, future))
                    except Problem as p:
                        self._count(request.model, p.code)
                        waiting.append((request.id, None, p))
                ahead += len(waiting)
                pending.put_nowait(waiting)

        reader = asyncio.ensure_future(read())
        # The end is posted when the reader is done, however: a task cancelled before its first step never runs its
        # coroutine's own `finally`.
        reader.add_done_callback(lambda _: pending.put_nowait(end))
        self._readers.add(reader)
        if self.draining:  # a stream that began as the server shut down
            self._drained.add(reader)
            reader.cancel()
        waiting: Any = None
        try:
            while (waiting := await pending.get()) is not end:
                replies = []
                for request_id, model, answer in waiting:
                    if isinstance(answer, Problem):
                        replies.append(pb.InferReply(id=request_id, error=answer.error()))
                        continue
                    outcome: Outcome = await answer
                    if outcome.code != grpc.StatusCode.OK:
                        replies.append(_error_reply(request_id, outcome.code, outcome.message))
                    else:
                        assert model is not None
                        replies.append(_reply(outcome, model, request_id))
                yield reply_of(replies)
                ahead -= len(waiting)
                room.set()
            waiting = None
            try:
                await reader  # raises what ended the reading, if anything but the stream's end did
            except asyncio.CancelledError:
                if reader not in self._drained or _cancelling(asyncio.current_task()):
                    raise
                raise Problem(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN) from None
        finally:
            reader.cancel()
            self._readers.discard(reader)
            self._drained.discard(reader)
            self._cancel_unanswered(waiting, pending, end)

    def drain(self) -> None:
        """The server is shutting down: each open stream stops reading, answers what it has read, and ends
        UNAVAILABLE, so that its client sends the rest elsewhere, rather than holding the shutdown open until its
        last image or the grace period's end."""
        self.draining = True
        for reader in self._readers:
            self._drained.add(reader)
            reader.cancel()

    def _cancel_unanswered(self, waiting: Any, pending: asyncio.Queue, end: object) -> None:
        """A stream closed before its replies were sent (the client went away): the requests it read ahead are
        cancelled and taken out of the queues, not run for nobody."""
        left = list(waiting) if waiting not in (None, end) else []
        while not pending.empty():
            item = pending.get_nowait()
            if item is not end:
                left += item
        futures = [answer for _, _, answer in left if isinstance(answer, asyncio.Future) and not answer.done()]
        for future in futures:
            future.cancel()
        if futures:
            self.runner.note_gone()

    def model_list(self) -> pb.ListModelsReply:
        models = [convert.model_info(self.models[n]) for n in sorted(self.models)]
        return pb.ListModelsReply(
            models=models,
            max_message_bytes=self.max_message_bytes,
            processes=self.processes,
            process_index=self.process_index,
        )

    # -- the methods --------------------------------------------------------------------------

    async def Infer(self, request: pb.InferRequest, context: grpc.aio.ServicerContext) -> pb.InferReply:
        try:
            arrival = self.clock()
            return await self.infer(request, self._deadline(context, arrival), arrival)
        except Problem as p:
            await context.abort(p.code, p.message, p.trailing_metadata())
            raise  # abort raises; this only tells the type checker so

    async def InferStream(
        self, request_iterator: AsyncIterator[pb.InferRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.InferReply]:
        # A cancelled call ends its reader at once.
        async with aclosing(self.replies(request_iterator, self._stream_deadline(context))) as replies:
            try:
                async for reply in replies:
                    yield reply
            except Problem as p:  # a shutdown: the requests after these were not read
                await context.abort(p.code, p.message)

    async def InferBatchStream(
        self, batch_iterator: AsyncIterator[pb.InferBatch], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.InferBatchReply]:
        async with aclosing(self.batch_replies(batch_iterator, self._stream_deadline(context))) as replies:
            try:
                async for reply in replies:
                    yield reply
            except Problem as p:
                await context.abort(p.code, p.message)

    async def ListModels(self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext) -> pb.ListModelsReply:
        return self.model_list()


class Settler:
    """Outcomes handed over from the runner's thread to the event loop's futures, settled in one wake-up of the loop
    for all that arrive together (a batch's requests, answered one after another), rather than a wake-up each: each
    wake-up is a write to the loop's socket on the runner's side, and a read and a pass of the loop on its own, and
    each lets go of the GIL and waits to take it back."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._waiting: list[tuple[asyncio.Future, Outcome]] = []

    def put(self, future: asyncio.Future, outcome: Outcome) -> None:
        """From any thread: `future` gets `outcome` on the loop."""
        with self._lock:
            self._waiting.append((future, outcome))
            first = len(self._waiting) == 1  # the wake-up already asked for takes the later ones too
        if first:
            self.loop.call_soon_threadsafe(self._settle_waiting)

    def _settle_waiting(self) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for future, outcome in waiting:
            if not future.done():  # the client may have gone away (the call cancelled its future)
                future.set_result(outcome)


def _reply(outcome: Outcome, model: ServedModel, request_id: str) -> pb.InferReply:
    timings = pb.Timings(
        queue_ms=outcome.queue_s * 1000, decode_ms=outcome.decode_s * 1000, run_ms=outcome.run_s * 1000
    )
    assert outcome.result is not None
    return convert.reply(outcome.result, model, request_id, timings)


def _alone(request: pb.InferRequest) -> tuple[pb.InferRequest]:
    return (request,)


def _first(replies: list[pb.InferReply]) -> pb.InferReply:
    return replies[0]


def _requests_of(batch: pb.InferBatch) -> Sequence[pb.InferRequest]:
    return batch.requests


def _batch_reply(replies: list[pb.InferReply]) -> pb.InferBatchReply:
    return pb.InferBatchReply(replies=replies)


def _error_reply(request_id: str, code: grpc.StatusCode, message: str) -> pb.InferReply:
    return pb.InferReply(id=request_id, error=pb.Error(code=code.value[0], message=message))
