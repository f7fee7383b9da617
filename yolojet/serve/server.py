"""The server: models loaded and timed, the runner started, the gRPC service with the standard health service and
server reflection (so `grpcurl` can list and call it), optional TLS and bearer token, Prometheus metrics over HTTP,
JSON-line logs, and a graceful shutdown on SIGTERM or SIGINT that answers every request already accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from yolojet.errors import EngineConfigError
from yolojet.images import DEFAULT_MAX_PIXELS
from yolojet.options import EVENT_LOOPS, MPS_CHOICES
from yolojet.serve.batcher import Scheduler
from yolojet.serve.metrics import ServerMetrics
from yolojet.serve.models import ModelSpec, ServedModel, load_models
from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb
from yolojet.serve.proto.yolojet.v1 import inference_pb2_grpc as pb_grpc
from yolojet.serve.runner import Runner
from yolojet.serve.service import InferenceService

log = logging.getLogger("yolojet.serve")
SERVICE = pb.DESCRIPTOR.services_by_name["Inference"].full_name  # yolojet.v1.Inference


DEFAULT_SLO_MS = 50.0
# A request of a busy server waits for the batch running before its own runs. Where two runs of a model's largest
# batch take longer than DEFAULT_SLO_MS (any model on the CPU's reference backend: 64 images at 160x160 took 213 ms on
# two cores; a large model at a large batch on a GPU; yolo11n's 64 take 4-5 ms on an H200, yolo11n-seg's 13), such a
# server would refuse nearly every request. Without --slo-ms the deadline is then this many runs of that batch: room
# for the batch running, those waiting (label's default 256 images in flight are four batches of 64), its own, and
# the decoding on the CPU's threads.
SLO_RUNS = 8


def deadline_ms(slo_ms: float | None, models: dict[str, ServedModel]) -> float:
    """The deadline of a request whose client sets none: `slo_ms` where given, else DEFAULT_SLO_MS, or SLO_RUNS runs
    of the longest-running model's largest batch where two of its runs take longer."""
    if slo_ms is not None:
        return slo_ms
    longest = max((max(m.latency.run_seconds.values()) for m in models.values()), default=0.0) * 1000
    return DEFAULT_SLO_MS if 2 * longest <= DEFAULT_SLO_MS else round(SLO_RUNS * longest, 1)


def bare_host(host: str) -> str:
    """`host` without the brackets an IPv6 address may be given in (`[::1]`): what sockets and HTTP servers take."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def host_port(host: str, port: int) -> str:
    """HOST:PORT as gRPC and clients read it: an IPv6 address in brackets (`[::1]:50051`)."""
    bare = bare_host(host)
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"


def check_ports_free(host: str, ports: dict[str, int]) -> None:
    """Fail before any model loads (a minute on a cold GPU) where a port the server would listen on is taken or
    cannot be bound at any of the host's addresses: gRPC would say so only once the models are loaded (and listens
    where it can, so one address that binds is enough, as `localhost`'s ::1 on a machine without IPv6). Probed with
    SO_REUSEADDR, as gRPC binds, so that a port a closed server left in TIME_WAIT is not taken for one in use. Ports
    past 65535, and one port given twice, are refused; a host that does not resolve is left to gRPC's own error."""
    seen: dict[int, str] = {}
    for flag, port in ports.items():
        if port > 65535:
            raise EngineConfigError(f"{flag} {port}: a port is a number from 0 to 65535")
        if port == 0:
            continue
        if port in seen:
            raise EngineConfigError(f"{flag} {port}: the same port as {seen[port]}")
        seen[port] = flag
        try:
            addresses = socket.getaddrinfo(bare_host(host), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except OSError:
            continue
        failures = []
        for family, kind, protocol, _, address in addresses:
            try:
                with socket.socket(family, kind, protocol) as probe:
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    probe.bind(address)
            except OSError as e:
                failures.append(e)
        if failures and len(failures) == len(addresses):
            raise EngineConfigError(f"{flag} {port}: cannot listen there ({failures[0].strerror})")


@dataclass(frozen=True)
class ServeOptions:
    """How `yolojet serve` runs (its flags)."""

    host: str = "127.0.0.1"
    port: int = 50051
    slo_ms: float | None = None  # None: `deadline_ms`'s default, from the models' measured run times
    max_queue: int = 1024
    # Calls gRPC's core holds before the event loop takes them (its pending-request limit); past it new calls are
    # cancelled there, without the loop. None: gRPC's own limit.
    max_pending: int | None = None
    # Calls under way at once (gRPC's maximum_concurrent_rpcs): past it gRPC answers new ones RESOURCE_EXHAUSTED before
    # the service reads them. None: no limit.
    max_calls: int | None = None
    max_message_bytes: int = 64 << 20
    max_pixels: int = DEFAULT_MAX_PIXELS
    device: str | None = None
    half: bool = True
    decoder: str = "auto"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    token: str | None = None
    metrics_port: int | None = None
    # Health checks alone on a port of their own (plain gRPC: probes such as Kubernetes' speak no TLS), outside
    # `max_calls` and the bearer token: a liveness probe is answered while every call the limit allows is under way,
    # which on --port it is not. None: health on --port only; 0: any free port.
    health_port: int | None = None
    grace_s: float = 30.0
    # On SIGTERM, seconds of serving on as before with health NOT_SERVING, so that a load balancer polling it takes
    # this server out before its listener closes (Kubernetes' endpoints lag the signal by a second or more).
    drain_delay_s: float = 0.0
    engine: dict[str, Any] = field(default_factory=dict)  # further Engine.load arguments (the engine switches)
    # Share the port with other servers (`serve --processes`: SO_REUSEPORT). Off, a port in use is an error rather
    # than silently shared (gRPC's own default on Linux is to share).
    reuse_port: bool = False
    processes: int = 1  # the whole servers sharing the port (`serve --processes`), which ListModels tells clients
    process_index: int = 0  # which of them this one is (0 to processes - 1), which ListModels tells clients too
    event_loop: str = "auto"  # EVENT_LOOPS: the asyncio loop the server runs on (`run_server`)
    mps: str = "auto"  # MPS_CHOICES: `serve --processes` as clients of an MPS daemon of their own (scale/mps.py)

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):  # a key alone would serve in the clear
            raise EngineConfigError("tls_cert and tls_key go together (--tls-cert and --tls-key): give both or neither")
        if self.event_loop not in EVENT_LOOPS:
            raise EngineConfigError(f"event loop {self.event_loop!r}: expected one of {', '.join(EVENT_LOOPS)}")
        if self.mps not in MPS_CHOICES:
            raise EngineConfigError(f"--mps {self.mps!r}: expected one of {', '.join(MPS_CHOICES)}")
        for flag, seconds in (("--grace-s", self.grace_s), ("--drain-delay-s", self.drain_delay_s)):
            if not 0 <= seconds < float("inf"):  # NaN too: the event loop cannot wait for it
                raise EngineConfigError(f"{flag} {seconds!r}: expected seconds, 0 or more")


# The server's event loop (options.EVENT_LOOPS): uvloop where it is installed ("auto"), or asyncio's own. On the 2-core
# test machine a server answering every image at once (the network skipped) took 2,287-2,497 requests a second on
# uvloop against 1,784-2,170 on asyncio's loop, at 450-484 against 528-620 us of CPU a request, three runs in turn
# (bench/NOTES.md).
def event_loop_name(choice: str) -> str:
    """The loop `choice` runs on here: "uvloop" or "asyncio" ("auto": uvloop where it imports)."""
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise EngineConfigError("--event-loop uvloop: uvloop is not installed (pip install uvloop)") from None
        return "asyncio"
    return "uvloop"


def run_server(main: Coroutine[Any, Any, None], choice: str) -> None:
    """Run the server's coroutine to its end on the event loop `choice` names (EVENT_LOOPS)."""
    if event_loop_name(choice) == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


class _BearerToken(grpc.aio.ServerInterceptor):
    """Every call but health checks and reflection must carry `authorization: Bearer <token>`."""

    OPEN = ("/grpc.health.v1.Health/", "/grpc.reflection.")
    STREAMS = ("/InferStream", "/InferBatchStream")  # refused with a handler of their kind

    def __init__(self, token: str) -> None:
        self._token = token

        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token (authorization)")

        self._refuse = grpc.unary_unary_rpc_method_handler(refuse)
        self._refuse_stream = grpc.stream_stream_rpc_method_handler(refuse)

    async def intercept_service(
        self, continuation: Callable[..., Awaitable[Any]], details: grpc.HandlerCallDetails
    ) -> Any:
        if details.method.startswith(self.OPEN):
            return await continuation(details)
        scheme, _, given = str(dict(details.invocation_metadata or ()).get("authorization", "")).partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), self._token.encode()):  # RFC 7235
            return await continuation(details)
        return self._refuse_stream if details.method.endswith(self.STREAMS) else self._refuse


class Server:
    """A running server: `start()` binds it (its port is `port`), `stop()` shuts it down gracefully."""

    def __init__(
        self,
        models: dict[str, ServedModel],
        options: ServeOptions,
        runner: Callable[[dict[str, ServedModel], Scheduler, ServerMetrics], Runner] = Runner,
    ) -> None:
        """`runner`: what runs the batches (this process's engines; scale/'s worker processes)."""
        self.models, self.options = models, options
        self.slo_ms = deadline_ms(options.slo_ms, models)
        self.metrics = ServerMetrics()
        self.metrics.watch_gpu_memory(sorted({torch.device(m.card.device) for m in models.values()}, key=str))
        self.scheduler = Scheduler(time.monotonic)
        for name, model in models.items():
            self.scheduler.add_model(name, model.max_batch, model.latency, options.max_queue)
        self.runner = runner(models, self.scheduler, self.metrics)
        self.health = health.aio.HealthServicer()
        self.port = 0
        self.metrics_port: int | None = None
        self.health_port: int | None = None
        self._health_grpc: grpc.aio.Server | None = None
        self._grpc: grpc.aio.Server | None = None
        self.service: InferenceService | None = None
        self._http: Any = None
        self._drain_cut = asyncio.Event()

    def cut_drain(self) -> None:
        """End the drain delay now (a second signal, or Ctrl-C: an operator who wants the server gone)."""
        self._drain_cut.set()

    async def start(self) -> None:
        o = self.options
        interceptors = [_BearerToken(o.token)] if o.token else []
        server = grpc.aio.server(
            interceptors=interceptors,
            maximum_concurrent_rpcs=o.max_calls,
            options=[
                ("grpc.max_receive_message_length", o.max_message_bytes),
                # Replies are as large as their results (a segment model's masks on a large photo run to MBs): a limit
                # on them would end a whole stream at the first large one, so only requests are limited.
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", int(o.reuse_port)),
                *(
                    [
                        ("grpc.server.max_pending_requests", o.max_pending),
                        ("grpc.server.max_pending_requests_hard_limit", o.max_pending),
                    ]
                    if o.max_pending is not None
                    else []
                ),
            ],
        )
        service = self.service = InferenceService(
            self.models,
            self.runner,
            self.metrics,
            self.slo_ms / 1000,
            max_message_bytes=o.max_message_bytes,
            processes=o.processes,
            process_index=o.process_index,
        )
        pb_grpc.add_InferenceServicer_to_server(service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
        )
        address = host_port(o.host, o.port)
        try:
            if o.tls_cert is not None and o.tls_key is not None:  # both or neither (ServeOptions checks)
                pair = (Path(o.tls_key).read_bytes(), Path(o.tls_cert).read_bytes())
                self.port = server.add_secure_port(address, grpc.ssl_server_credentials([pair]))
            else:
                self.port = server.add_insecure_port(address)
        except RuntimeError as e:  # gRPC's "Failed to bind", or a PEM it cannot read
            raise EngineConfigError(f"--host {o.host} --port {o.port}: cannot listen there ({e})") from e
        if self.port == 0:
            raise EngineConfigError(f"--host {o.host} --port {o.port}: cannot listen there (in use, or no such host)")
        if o.health_port is not None:
            self._health_grpc = self._health_server(o, o.health_port)
        await server.start()
        self._grpc = server
        if self._health_grpc is not None:
            await self._health_grpc.start()
        if o.metrics_port is not None:
            try:
                self._http = self.metrics.serve_http(bare_host(o.host), o.metrics_port)
            except OSError as e:
                # gRPC lets a port go only once its server has started and stopped; the runner has not started yet,
                # so no thread is left behind. (A call taken meanwhile is cancelled by the stop.)
                await server.stop(None)
                if self._health_grpc is not None:
                    await self._health_grpc.stop(None)
                self._grpc = self._health_grpc = None
                raise EngineConfigError(f"--metrics-port {o.metrics_port}: cannot listen there ({e.strerror})") from e
            self.metrics_port = self._http.server_port
        self.runner.start()
        for name in ("", SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            json.dumps(
                {
                    "event": "serving",
                    "address": host_port(o.host, self.port),
                    "tls": o.tls_cert is not None,
                    "metrics_port": self.metrics_port,
                    "health_port": self.health_port,
                    "models": sorted(self.models),
                    "slo_ms": self.slo_ms,
                    "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
                }
            )
        )

    def _health_server(self, o: ServeOptions, port: int) -> grpc.aio.Server:
        """The health service alone, on `port` (bound here: a port it cannot have is an error before the runner
        starts), sharing the main server's statuses."""
        server = grpc.aio.server(options=[("grpc.so_reuseport", int(o.reuse_port))])
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        try:
            self.health_port = server.add_insecure_port(host_port(o.host, port))
        except RuntimeError as e:
            raise EngineConfigError(f"--health-port {port}: cannot listen there ({e})") from e
        if self.health_port == 0:
            raise EngineConfigError(f"--health-port {port}: cannot listen there (in use, or no such host)")
        return server

    async def stop(self) -> None:
        """Stop taking calls (health says NOT_SERVING first, `drain_delay_s` before), answer every accepted request,
        close the engines."""
        if self._grpc is None:
            return
        o = self.options
        log.info(json.dumps({"event": "shutting down", "grace_s": o.grace_s, "drain_delay_s": o.drain_delay_s}))
        await self.health.enter_graceful_shutdown()
        # Calls are still taken meanwhile, from clients that have not yet looked. (asyncio's TimeoutError: on Python
        # 3.10 it is not yet the builtin one.)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._drain_cut.wait(), o.drain_delay_s)
        stopping = asyncio.ensure_future(self._grpc.stop(o.grace_s))  # no new calls from here on
        await asyncio.sleep(0)
        assert self.service is not None  # made with the grpc server
        self.service.drain()
        await stopping
        if self._health_grpc is not None:  # NOT_SERVING there until the calls were answered
            await self._health_grpc.stop(None)
        # Past the grace every call is ended: what is still queued has no one to answer, and running it would hold the
        # process for as long (259 queued images, 15 s on a 2-core machine, against a grace of 1 s).
        self.runner.forget_queued()
        await asyncio.get_running_loop().run_in_executor(None, self.runner.stop)
        if self._http is not None:
            self._http.shutdown()
        for model in self.models.values():
            if model.engine is not None:
                model.engine.close()
        self._grpc = None
        log.info(json.dumps({"event": "stopped"}))

    async def wait(self) -> None:
        if self._grpc is not None:
            await self._grpc.wait_for_termination()


def configure_logging() -> None:
    """JSON lines on stderr for the server's own events (the CLI's choice; nothing is configured on import)."""

    class JsonLines(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            message = record.getMessage()
            try:
                body = json.loads(message)
            except ValueError:
                body = {"message": message}
            entry = {"time": round(record.created, 3), "level": record.levelname.lower(), **body}
            if record.exc_info:
                entry["error"] = self.formatException(record.exc_info)
            return json.dumps(entry)

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    logger = logging.getLogger("yolojet.serve")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False


def build_models(specs: list[ModelSpec], options: ServeOptions) -> dict[str, ServedModel]:
    models = load_models(
        specs,
        device=options.device,
        half=options.half,
        decoder=options.decoder,
        max_pixels=options.max_pixels,
        **options.engine,
    )
    for model in models.values():
        latency = {b: round(s * 1000, 3) for b, s in model.latency.run_seconds.items()}
        log.info(
            json.dumps(
                {
                    "event": "model loaded",
                    "name": model.name,
                    "version": model.version,
                    "task": model.meta.task,
                    "max_batch": model.max_batch,
                    "backend": model.card.backend,
                    "decoder": model.card.decoder,
                    "run_ms_by_batch": latency,
                }
            )
        )
        fastest = min(latency.values())
        # Admission would refuse every request that sets no deadline of its own (a default one is never this short).
        if options.slo_ms is not None and fastest > options.slo_ms:
            log.warning(
                json.dumps(
                    {
                        "event": "slo below the run time",
                        "name": model.name,
                        "slo_ms": options.slo_ms,
                        "fastest_run_ms": fastest,
                        "hint": f"requests without a deadline of their own will be refused: --slo-ms above {fastest}",
                    }
                )
            )
    return models


async def serve_forever(
    models: dict[str, ServedModel],
    options: ServeOptions,
    runner: Callable[[dict[str, ServedModel], Scheduler, ServerMetrics], Runner] = Runner,
    started: Callable[[int], None] | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully. `started` is told the port once the server listens
    (one of `serve --processes`); without it the server says so on stderr."""
    server = Server(models, options, runner)
    await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:  # SIGTERM drains first (--drain-delay-s); SIGINT, or a second one, not
        if stopping.is_set() or sig == signal.SIGINT:
            server.cut_drain()
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    if started is not None:
        started(server.port)
    else:
        print(f"yolojet serve: listening on {host_port(options.host, server.port)}", file=sys.stderr, flush=True)
    await stopping.wait()
    await server.stop()
