"""Labeling against `yolojet serve`: images streamed over InferBatchStream, several a message, with a window of
requests in flight, replies matched by id, requests refused for load (RESOURCE_EXHAUSTED, or a deadline that passed)
sent again after a pause, a broken connection reopened with backoff and its unanswered requests sent again; and the
bench mode (many copies of one image, as fast as the window allows, from several processes).

Nothing is answered twice: a request leaves the window only when its reply arrives, and only a reply writes a record.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from yolojet.errors import EngineConfigError, ImageReadError, YolojetError
from yolojet.images import read_image_file
from yolojet.images.sources import keep_freed_memory
from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb
from yolojet.serve.proto.yolojet.v1 import inference_pb2_grpc as pb_grpc

# CANCELLED too: this client never cancels a stream it still reads, so that came from the server (a server past its
# `--max-pending` turns new calls away so).
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED}
# What gRPC answers a call past the server's `--max-calls` (grpc.aio's limit on calls under way). Only that
# RESOURCE_EXHAUSTED is asked again: a message over a size limit is RESOURCE_EXHAUSTED too, and never passes.
CALL_LIMIT_DETAILS = "Concurrent RPC limit exceeded!"


def retryable(error: grpc.RpcError) -> bool:
    """Whether a call that failed so may pass if made again after a pause."""
    code = error.code()
    return code in RETRYABLE or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.details() == CALL_LIMIT_DETAILS)


# An image's reply refusing it for load, not as bad: it goes again after a pause.
LOAD_REFUSALS = {grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], grpc.StatusCode.DEADLINE_EXCEEDED.value[0]}
# Error.reason of a refusal that no pause helps (inference.proto): the server's deadline for an image sent without one
# of its own, as label sends them, is shorter than its model's run of one image.
DEADLINE_TOO_SHORT = "DEADLINE_TOO_SHORT"


# A message's images: gRPC's own cost a message (~270 us of CPU on client and server together on a 2-core machine,
# bench/NOTES.md) is most of a small image's, so images travel 16 a message; a message stops growing past 4 MiB, far
# under the server's 64 MiB limit.
IMAGES_A_MESSAGE = 16
MESSAGE_BYTES = 4 << 20
REQUEST_ROOM = 16 << 10  # a request's bytes besides its image (its id, a path; the model; options), at most
CHANNEL_MAX_MESSAGE = 64 << 20  # this client's own limit a message, each way


# Connections opened in turn to reach one given process of a server of N (`serve --processes`): each lands on one of
# the N at random, so a given one is missed 8N times in a row with odds (1 - 1/N)^(8N) < e^-8 (3 in 10,000).
REACH_TRIES_A_PROCESS = 8


class ServerUnavailable(YolojetError):
    """The server could not be reached, or went away, and did not come back within the retries."""


def lands_on(listing: pb.ListModelsReply, process: int | None) -> bool:
    """Whether the connection whose ListModels answered `listing` reached server process `process` (modulo the
    server's processes); any connection does where no process is wanted, the server is one process, or it does not
    say which it is (a server older than `process_index`)."""
    if process is None or listing.processes <= 1 or not listing.HasField("process_index"):
        return True
    return listing.process_index == process % listing.processes


def keeps(listing: pb.ListModelsReply, process: int | None, tries: int) -> bool:
    """Whether the `tries`-th connection opened to reach `process`, which ListModels answered so, is the one to keep:
    it reached it, or the tries are used up."""
    return lands_on(listing, process) or tries >= REACH_TRIES_A_PROCESS * listing.processes


@dataclass(frozen=True)
class Connection:
    """Where the server is and how to reach it."""

    address: str
    model: str = ""
    ca_file: Path | None = None  # TLS, trusting this certificate
    token: str | None = None
    retries: int = 8  # a broken connection is reopened this many times, 0.5 s, 1 s, 2 s, ... apart (2 min in all)

    def __post_init__(self) -> None:
        if not isinstance(self.retries, int) or self.retries < 0:
            raise EngineConfigError(f"retries {self.retries!r}: expected a whole number, 0 or more")

    def channel(self) -> grpc.Channel:
        """A channel on a connection of its own (gRPC shares one between a process's channels otherwise, and a server
        of several processes gets each connection to one of them)."""
        options = [
            ("grpc.max_receive_message_length", CHANNEL_MAX_MESSAGE),
            ("grpc.max_send_message_length", CHANNEL_MAX_MESSAGE),
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if self.ca_file is not None:
            credentials = grpc.ssl_channel_credentials(Path(self.ca_file).read_bytes())
            return grpc.secure_channel(self.address, credentials, options=options)
        return grpc.insecure_channel(self.address, options=options)

    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        return (("authorization", f"Bearer {self.token}"),) if self.token else None

    def reach(self, process: int | None = None) -> tuple[grpc.Channel, pb.ListModelsReply]:
        """A channel and the server's ListModels answered over it. With `process`, a server of N processes
        (`serve --processes N`) is connected to again until a connection reaches that one (modulo N), at most
        REACH_TRIES_A_PROCESS x N connections, after which the last is kept: the load spread evenly is worth a few
        connections, never a failure (`lands_on` says which it was). ListModels' errors are the caller's to retry."""
        tries = 1
        while True:
            channel = self.channel()
            try:
                listing = pb_grpc.InferenceStub(channel).ListModels(
                    pb.ListModelsRequest(), timeout=30, metadata=self.metadata()
                )
            except BaseException:
                channel.close()
                raise
            if keeps(listing, process, tries):
                return channel, listing
            channel.close()
            tries += 1


@dataclass
class _Window:
    """The requests sent and not yet answered (in order), those to send again, and the size of the window."""

    size: int
    sent: OrderedDict[str, tuple[str, bytes]] = field(default_factory=OrderedDict)
    again: deque[tuple[str, str, bytes]] = field(default_factory=deque)
    lock: threading.Condition = field(default_factory=threading.Condition)
    source_done: bool = False
    # Which stream's message generator may take images: bumped when a stream's call is over, so that its generator,
    # which gRPC may still be running, puts back what it took and stops rather than hand it to a finished call.
    generation: int = 0
    hold_until: float = 0.0  # monotonic time before which nothing is sent: the server refused for load
    refused_in_a_row: int = 0


class _EndedEarly(Exception):
    """A stream the server ended (status OK) with requests still unanswered."""


def _give_back(window: _Window, group: list[tuple[str, str, bytes]], held_over: tuple[str, str, bytes] | None) -> None:
    """Images a stream's generator took but did not send, in order, to be sent again after what was taken before them
    (under the window's lock)."""
    window.again.extend([*group, *([held_over] if held_over is not None else [])])
    window.lock.notify_all()


# The longest pause a server's own estimate sets (a refusal's Error.retry_delay_ms): the whole window waits on it, so
# one request's long estimate (a deep queue of a slow model) must not idle the stream for longer.
LONGEST_SUGGESTED_PAUSE_S = 1.0


def refusal_pause(refused_in_a_row: int, suggested_s: float = 0.0) -> float:
    """Seconds to wait before sending to a server that refused for load that many times in a row: at least 5 ms (about
    one batch of a small model) doubling to 200 ms, so that a full server is not kept busy refusing, and at least
    `suggested_s`, the server's estimate of when the request would be admitted (up to LONGEST_SUGGESTED_PAUSE_S)."""
    backoff = min(0.2, 0.005 * 2 ** min(max(refused_in_a_row - 1, 0), 6))
    return max(backoff, min(suggested_s, LONGEST_SUGGESTED_PAUSE_S))


class RemoteLabeler:
    """Label images through a server; `on_reply(path, reply)` gets each answer, `on_error(path, message)` each image
    the server refused as bad (or that could not be read here). An image refused for load (the server full, or its
    deadline passed while it waited) is sent again after a pause, until `give_up_after_s` have passed since the
    first refusal: then it is an error too, so that a server that can never take it does not hold the run."""

    give_up_after_s = 300.0

    def __init__(
        self, connection: Connection, window: int, options: dict[str, Any], process: int | None = None
    ) -> None:
        """`window` requests in flight on one stream (`label --server --streams N` runs N of these, a process each:
        scale/stream_workers.py), to server process `process` where the server is several (`Connection.reach`)."""
        keep_freed_memory()  # each file read into new memory would page-fault on every page it fills
        self.connection, self.window_size, self.options, self.process = connection, window, options, process
        self.refusals = 0  # answers refusing for load (RESOURCE_EXHAUSTED, or a deadline that passed), sent again
        self.reconnects = 0
        self.missed_process = 0  # streams opened on another server process than `process`, every try having missed
        self._first_refused: dict[str, float] = {}  # request id -> when the server first refused it

    def run(
        self, paths: Iterable[str], on_reply: Callable[[str, Any], None], on_error: Callable[[str, str], None]
    ) -> None:
        """One stream: the images of `paths`, the window in flight, reconnecting after a broken connection."""
        source = iter(paths)
        window = _Window(self.window_size)
        failures = 0
        while True:
            channel: grpc.Channel | None = None
            with window.lock:
                generation = window.generation
            try:
                channel, listing = self.connection.reach(self.process)
                self.missed_process += not lands_on(listing, self.process)
                messages = pb_grpc.InferenceStub(channel).InferBatchStream(
                    self._requests(window, generation, source, on_error, listing.max_message_bytes),
                    metadata=self.connection.metadata(),
                )
                for message in messages:
                    failures = 0
                    for reply in message.replies:
                        self._answered(window, reply, on_reply, on_error)
                with window.lock:
                    if window.source_done and not window.sent and not window.again:
                        return
                # The server ended the stream with requests unanswered: as a broken stream, they go again.
                raise _EndedEarly()
            except (grpc.RpcError, _EndedEarly) as e:
                with window.lock:
                    if window.source_done and not window.sent and not window.again:
                        return  # every image answered: the stream's end (a server shutting down) costs nothing
                code = e.code() if isinstance(e, grpc.RpcError) else grpc.StatusCode.UNAVAILABLE
                details = e.details() if isinstance(e, grpc.RpcError) else "the stream ended with images unanswered"
                again = retryable(e) if isinstance(e, grpc.RpcError) else True
                if not again or failures >= self.connection.retries:
                    done = "" if not again else f" after {failures + 1} attempts"
                    raise ServerUnavailable(f"server {self.connection.address}{done}: {code.name}: {details}") from None
                with window.lock:  # what was sent and not answered goes again, first, in order
                    window.generation += 1
                    window.again.extendleft(reversed([(i, p, d) for i, (p, d) in window.sent.items()]))
                    window.sent.clear()
                    window.lock.notify_all()
                time.sleep(0.5 * 2**failures)
                failures += 1
                self.reconnects += 1
            finally:
                with window.lock:
                    if window.generation == generation:
                        window.generation += 1
                    window.lock.notify_all()
                if channel is not None:
                    channel.close()

    def _requests(
        self,
        window: _Window,
        generation: int,
        source: Iterator[str],
        on_error: Callable[[str, str], None],
        server_max: int = 0,
    ) -> Iterator[pb.InferBatch]:
        """The messages of the stream `generation` names, up to IMAGES_A_MESSAGE images and MESSAGE_BYTES each, and
        within `server_max` bytes (the server's limit a message; 0: not said) and this client's own: what must go
        again first, then new images, never more than the window in flight; a message goes as soon as the window is
        full, the next image would take it past the limit, or no image is at hand; an image over the limit alone is
        an error of its own; the stream ends once everything is answered, or once its call is over (what it took and
        had not sent goes back to be sent again)."""
        limit = min(server_max or CHANNEL_MAX_MESSAGE, CHANNEL_MAX_MESSAGE)
        fits = limit - REQUEST_ROOM  # image bytes a message may carry
        counter = 0
        held_over: tuple[str, str, bytes] | None = None  # read for a message it would have taken past the limit
        while True:
            group: list[tuple[str, str, bytes]] = []
            size = 0
            while len(group) < IMAGES_A_MESSAGE and size < MESSAGE_BYTES:
                with window.lock:
                    while window.generation == generation and not group and self._held(window, 0):
                        # A full window waits for a reply; a held one until its hold ends, at least a moment: a hold
                        # that ended since the check above must not become a wait without end, which it would be
                        # where every image in flight was refused and no reply is to come.
                        left = window.hold_until - time.monotonic()
                        full = len(window.sent) >= window.size
                        window.lock.wait(timeout=None if full and left <= 0 else max(left, 0.001))
                    if window.generation != generation:
                        _give_back(window, group, held_over)
                        return
                    if group and self._held(window, len(group)):
                        break
                    item, held_over = held_over, None
                    if item is None and window.again:
                        item = window.again.popleft()
                    elif item is None and window.source_done:
                        if group:
                            break
                        if not window.sent:
                            return  # all answered: the stream ends here
                        window.lock.wait(timeout=0.5)
                        continue
                if item is None:
                    path = next(source, None)
                    if path is None:
                        with window.lock:
                            window.source_done = True
                            window.lock.notify_all()
                        continue
                    try:
                        data = read_image_file(path)
                    except ImageReadError as e:
                        on_error(path, str(e))
                        continue
                    if len(data) > fits:
                        on_error(
                            path,
                            f"{len(data):,} bytes: with a request's other fields ({REQUEST_ROOM:,} bytes at most), "
                            f"more than the server takes in a message ({limit:,} bytes)",
                        )
                        continue
                    counter += 1
                    item = (f"{counter}:{path}", path, data)
                if group and size + len(item[2]) > fits - REQUEST_ROOM * len(group):
                    held_over = item  # the first of the next message
                    break
                group.append(item)
                size += len(item[2])
            with window.lock:
                if window.generation != generation:  # the call ended while the message was made
                    _give_back(window, group, held_over)
                    return
                for request_id, path, data in group:
                    window.sent[request_id] = (path, data)
            message = pb.InferBatch()  # requests made in it: made apart, each would be copied into it again
            for request_id, _, data in group:
                message.requests.add(id=request_id, model=self.connection.model, image=data, **self.options)
            yield message

    @staticmethod
    def _held(window: _Window, gathered: int) -> bool:
        """No more images may go now (under the window's lock): the window is full with the `gathered` images of the
        message being made, or the server refused for load and the pause is not over."""
        return len(window.sent) + gathered >= window.size or time.monotonic() < window.hold_until

    def _answered(
        self,
        window: _Window,
        reply: pb.InferReply,
        on_reply: Callable[[str, Any], None],
        on_error: Callable[[str, str], None],
    ) -> None:
        code = reply.error.code if reply.HasField("error") else grpc.StatusCode.OK.value[0]
        refused = code in LOAD_REFUSALS and reply.error.reason != DEADLINE_TOO_SHORT
        given_up = refused and time.monotonic() - self._first_refused.setdefault(reply.id, time.monotonic()) > (
            self.give_up_after_s
        )
        with window.lock:
            path, data = window.sent.pop(reply.id)
            if refused and not given_up:
                window.again.append((reply.id, path, data))
                # The server is full: sending pauses (the replies are still read meanwhile), for as long as the server
                # says the request would wait, and longer while refusals go on.
                window.refused_in_a_row += 1
                pause = refusal_pause(window.refused_in_a_row, reply.error.retry_delay_ms / 1000)
                window.hold_until = max(window.hold_until, time.monotonic() + pause)
            elif not refused:
                window.refused_in_a_row = 0
            window.lock.notify_all()
        if refused and not given_up:
            self.refusals += 1
            return
        self._first_refused.pop(reply.id, None)
        if given_up:
            on_error(
                path, f"the server refused it for load for over {self.give_up_after_s:.0f} s ({reply.error.message})"
            )
        elif reply.HasField("error"):
            # The server names an image by its request's id (serve/runner.py), which label chose: the file's path
            # is the name its user knows.
            message = reply.error.message.replace(f"image of request {reply.id!r}", path)
            if reply.error.reason == DEADLINE_TOO_SHORT:
                message += " (label sets no deadline of its own: the server's --slo-ms is that short)"
            on_error(path, message)
        else:
            on_reply(path, reply)


# -- the bench mode --------------------------------------------------------------------------------------------


BENCH_CONNECTIONS = 4  # a bench process's connections, its calls spread over them


def bench(
    connection: Connection,
    image: Path,
    requests: int,
    concurrency: int,
    processes: int,
    options: dict[str, Any],
    rpc: str = "Infer",
    call_timeout_s: float | None = None,
    limit_s: float | None = None,
    server_processes: int = 1,
) -> dict[str, Any]:
    """`requests` requests with one image, `concurrency` in flight over `processes` processes, as unary calls (`rpc`
    Infer) or over streams (InferStream, InferBatchStream: a stream a connection): img/s, latency quantiles (a
    streamed request's from its message's send to its reply), and the server's own queue / decode / run split (its
    replies' timings, averaged). `call_timeout_s`: each unary call's gRPC deadline, which the server then keeps
    instead of its own (a call past it is counted DEADLINE_EXCEEDED); None, the server's. `limit_s`: the whole
    bench's bound, past which it ends with an error (a server that stopped answering) rather than waits; None, none.
    `server_processes`: the server's (ListModels' `processes`); with several, the connections of all the bench's
    processes are spread evenly over them (as `Connection.reach` spreads a labeler's), not left to where the kernel
    hands them."""
    processes = max(1, min(processes, concurrency))
    share = [requests // processes + (i < requests % processes) for i in range(processes)]
    inflight = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    job = {
        "address": connection.address,
        "model": connection.model,
        "token": connection.token,
        "ca_file": str(connection.ca_file) if connection.ca_file else None,
        "image": str(image),
        "options": options,
        "rpc": rpc,
        "call_timeout_s": call_timeout_s,
        "spread": server_processes > 1,
    }
    workers = []
    first_connection = 0  # the connections of all processes, numbered, are spread over the server's processes
    for n, c in zip(share, inflight, strict=True):
        work = {**job, "requests": n, "concurrency": c, "first_connection": first_connection}
        first_connection += _bench_connections(c)
        command = [sys.executable, "-m", "yolojet.client.remote", json.dumps(work)]
        workers.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=dict(os.environ)))
    end = time.monotonic() + limit_s if limit_s is not None else None
    try:
        outputs = [
            json.loads(w.communicate(timeout=max(1.0, end - time.monotonic()) if end is not None else None)[0])
            for w in workers
        ]
    except subprocess.TimeoutExpired:
        for w in workers:
            w.kill()
            w.wait()
        raise ServerUnavailable(f"bench: {requests} requests not answered within {limit_s:g} s") from None
    failed = [o["error"] for o in outputs if "error" in o]
    if failed:
        raise ServerUnavailable(f"bench: {failed[0]}")
    latencies = sorted(x for o in outputs for x in o["latencies"])
    started, finished = min(o["started"] for o in outputs), max(o["finished"] for o in outputs)
    codes: dict[str, int] = {}
    for o in outputs:
        for code, n in o["codes"].items():
            codes[code] = codes.get(code, 0) + n

    def quantile(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies else float("nan")

    timings = [t for o in outputs for t in o["timings"]]
    split = {k: sum(t[i] for t in timings) / max(1, len(timings)) for i, k in enumerate(("queue", "decode", "run"))}
    return {
        "rpc": rpc,
        "requests": requests,
        "concurrency": concurrency,
        "processes": processes,
        "answered": len(latencies),
        "codes": codes,
        "img_per_s": len(latencies) / (finished - started),
        "p50_ms": quantile(0.5),
        "p90_ms": quantile(0.9),
        "p99_ms": quantile(0.99),
        "max_ms": latencies[-1] * 1000 if latencies else 0,
        "server_ms": split,
        "started": started,  # wall-clock seconds (time.time), the first process's start to the last one's end
        "finished": finished,
        "client_cpu_s": sum(o["cpu_s"] for o in outputs),  # the bench processes' own CPU while they sent
    }


def _bench_connections(concurrency: int) -> int:
    return max(1, min(concurrency, BENCH_CONNECTIONS))


async def _bench_worker(job: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    data = Path(job["image"]).read_bytes()
    connection = Connection(
        job["address"], job["model"], Path(job["ca_file"]) if job["ca_file"] else None, job["token"]
    )
    # Connections of their own (gRPC shares one between a process's channels otherwise): a server of several
    # processes (`serve --processes`) gets each connection to one of them.
    options = [
        ("grpc.max_receive_message_length", CHANNEL_MAX_MESSAGE),
        ("grpc.max_send_message_length", CHANNEL_MAX_MESSAGE),
        ("grpc.use_local_subchannel_pool", 1),
    ]

    def plain() -> grpc.aio.Channel:
        if connection.ca_file is not None:
            credentials = grpc.ssl_channel_credentials(connection.ca_file.read_bytes())
            return grpc.aio.secure_channel(connection.address, credentials, options=options)
        return grpc.aio.insecure_channel(connection.address, options=options)

    async def reach(process: int) -> grpc.aio.Channel:
        """A connection to server process `process`, as `Connection.reach` opens one (its ListModels ends before the
        timing starts, so a server's `--max-calls` does not count it)."""
        tries = 1
        while True:
            channel = plain()
            try:
                listing = await pb_grpc.InferenceStub(channel).ListModels(
                    pb.ListModelsRequest(), timeout=60, metadata=connection.metadata(), wait_for_ready=True
                )
            except BaseException:
                await channel.close()
                raise
            if keeps(listing, process, tries):
                return channel
            await channel.close()
            tries += 1

    first, count = job["first_connection"], _bench_connections(job["concurrency"])
    # A worker is a process of its own, which ends right after: a failure here leaves no channel behind it.
    channels = [await reach(first + i) for i in range(count)] if job["spread"] else [plain() for _ in range(count)]
    for channel in channels:  # every connection up before the timing, without a call (--max-calls counts those)
        await asyncio.wait_for(channel.channel_ready(), timeout=60)
    stubs = [pb_grpc.InferenceStub(channel) for channel in channels]
    request = pb.InferRequest(model=connection.model, image=data, **job["options"])
    latencies: list[float] = []
    timings: list[tuple[float, float, float]] = []
    codes: dict[str, int] = {}
    left = job["requests"]

    def answered(reply: pb.InferReply, latency: float) -> bool:
        """A streamed reply counted; True where it refused for load."""
        if reply.HasField("error"):
            code = next((c.name for c in grpc.StatusCode if c.value[0] == reply.error.code), str(reply.error.code))
            codes[code] = codes.get(code, 0) + 1
            return reply.error.code in LOAD_REFUSALS
        latencies.append(latency)
        timings.append((reply.timings.queue_ms, reply.timings.decode_ms, reply.timings.run_ms))
        codes["OK"] = codes.get("OK", 0) + 1
        return False

    @functools.cache
    def batch_of(count: int) -> pb.InferBatch:  # made once a size: the bench's own copies would count against it
        return pb.InferBatch(requests=[request] * count)

    async def streamer(stub: pb_grpc.InferenceStub, window: int, batched: bool) -> None:
        """One stream with `window` images in flight: InferBatchStream's messages of up to IMAGES_A_MESSAGE images,
        or InferStream's of one; after a refusal for load, the next message waits `refusal_pause`."""
        call = (stub.InferBatchStream if batched else stub.InferStream)(metadata=connection.metadata())
        room = asyncio.Semaphore(window)
        sent: deque[tuple[float, int]] = deque()
        hold_until, refused_in_a_row = 0.0, 0

        async def send() -> None:
            nonlocal left
            while left > 0:
                count = min(IMAGES_A_MESSAGE if batched else 1, window, left)
                left -= count
                for _ in range(count):
                    await room.acquire()
                if (pause := hold_until - time.perf_counter()) > 0:
                    await asyncio.sleep(pause)
                sent.append((time.perf_counter(), count))
                await call.write(batch_of(count) if batched else request)
            await call.done_writing()

        writer = asyncio.ensure_future(send())
        try:
            async for message in call:
                started, count = sent.popleft()
                latency = time.perf_counter() - started
                refused = [answered(r, latency) for r in (message.replies if batched else [message])]
                refused_in_a_row = refused_in_a_row + 1 if any(refused) else 0
                if any(refused):
                    hold_until = time.perf_counter() + refusal_pause(refused_in_a_row)
                for _ in range(count):
                    room.release()
            if sent:  # the server ended the stream with requests unanswered: counted, and the sender stopped
                codes["UNANSWERED"] = codes.get("UNANSWERED", 0) + sum(count for _, count in sent)
            else:
                await writer
        finally:
            writer.cancel()

    async def caller(stub: pb_grpc.InferenceStub) -> None:
        nonlocal left
        refused_in_a_row = 0
        while left > 0:
            left -= 1
            start = time.perf_counter()
            try:
                reply = await stub.Infer(request, metadata=connection.metadata(), timeout=job["call_timeout_s"])
            except grpc.aio.AioRpcError as e:
                codes[e.code().name] = codes.get(e.code().name, 0) + 1
                if e.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED):  # wait, not hammer
                    refused_in_a_row += 1
                    await asyncio.sleep(refusal_pause(refused_in_a_row))
                continue
            refused_in_a_row = 0
            latencies.append(time.perf_counter() - start)
            timings.append((reply.timings.queue_ms, reply.timings.decode_ms, reply.timings.run_ms))
            codes["OK"] = codes.get("OK", 0) + 1

    started, cpu_started = time.time(), time.process_time()
    if job["rpc"] == "Infer":
        await asyncio.gather(*(caller(stubs[i % len(stubs)]) for i in range(job["concurrency"])))
    else:  # a stream a connection, the window shared out between them
        share = [job["concurrency"] // len(stubs) + (i < job["concurrency"] % len(stubs)) for i in range(len(stubs))]
        batched = job["rpc"] == "InferBatchStream"
        await asyncio.gather(*(streamer(stub, n, batched) for stub, n in zip(stubs, share, strict=True)))
    finished, cpu_s = time.time(), time.process_time() - cpu_started
    for channel in channels:
        await channel.close()
    return {
        "latencies": latencies,
        "timings": timings,
        "codes": codes,
        "started": started,
        "finished": finished,
        "cpu_s": cpu_s,
    }


if __name__ == "__main__":  # a bench worker: one JSON job on the command line, its measurements on stdout
    import asyncio

    try:
        print(json.dumps(asyncio.run(_bench_worker(json.loads(sys.argv[1])))))
    except grpc.RpcError as e:
        print(json.dumps({"error": f"{e.code().name}: {e.details()}"}))


def model_facts(connection: Connection) -> Any:
    """The served model's name, version, task, classes and keypoint shape (ListModels), retried like the stream."""
    from yolojet.client.label import ModelFacts

    for attempt in range(connection.retries + 1):
        try:
            channel, reply = connection.reach()
            channel.close()
            break
        except grpc.RpcError as e:
            if not (retryable(e) or e.code() == grpc.StatusCode.DEADLINE_EXCEEDED) or attempt == connection.retries:
                raise ServerUnavailable(f"server {connection.address}: {e.code().name}: {e.details()}") from None
            pause = 0.5 * 2**attempt
            # Said as it happens: the retries of a server that is not there take two minutes in all.
            print(
                f"server {connection.address}: {e.code().name}; trying again in {pause:g} s "
                f"({attempt + 1} of {connection.retries}, --retries)",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(pause)
    served = {m.name: m for m in reply.models}
    if connection.model:
        if connection.model not in served:
            raise ServerUnavailable(
                f"server {connection.address} has no model {connection.model!r} (it serves {', '.join(sorted(served))})"
            )
        info = served[connection.model]
    elif len(served) == 1:
        info = next(iter(served.values()))
    else:
        raise ServerUnavailable(f"server {connection.address} serves {', '.join(sorted(served))}: --model names one")
    names = dict(enumerate(info.class_names))
    return ModelFacts(
        info.name, info.version, info.task, names, list(info.keypoint_shape) or None, max(1, reply.processes)
    )
