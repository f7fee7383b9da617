"""`yolojet serve --ray [ADDRESS]`: the inference service as a Ray Serve application, behind Ray Serve's own gRPC
proxy.

Ray Serve starts a proxy on each node that runs replicas, listening for gRPC on `--port` on every interface; it knows
`yolojet.v1.Inference` from the servicer function it is given (`SERVICER`), decodes each request, and calls the
replica method named like the gRPC method (`Infer`, `InferStream`, `InferBatchStream`, `ListModels`) on a replica of
its choice. Each replica (`InferenceReplica`, a GPU each where the cluster has GPUs, else a CPU) loads every served
model and runs the same deadline-aware batching as `yolojet serve`: the requests Ray routes to it go through the
service's request checks into the `Scheduler`, its `Runner` thread decodes and runs the batches, and each answer comes
back through the replica's event loop. A request's deadline is its arrival at the replica plus `--slo-ms`: Ray's proxy
does not pass the client's gRPC deadline on (the client's deadline still ends its call at the proxy).

Ray Serve scales the replicas on queue depth, between one and a GPU each (or `--ray-replicas`). Ray is imported only
when `--ray` is used (as in ray_label.py).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from yolojet.errors import EngineConfigError
from yolojet.scale.ray_cluster import connect
from yolojet.serve.batcher import Scheduler
from yolojet.serve.metrics import ServerMetrics
from yolojet.serve.models import ModelSpec, ServedModel, load_models
from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb
from yolojet.serve.runner import Runner
from yolojet.serve.server import ServeOptions, deadline_ms
from yolojet.serve.service import InferenceService, Problem

log = logging.getLogger("yolojet.serve")
APP = "yolojet"  # the Serve application's name: clients of a cluster with other applications send it as `application`
SERVICER = "yolojet.serve.proto.yolojet.v1.inference_pb2_grpc.add_InferenceServicer_to_server"
# Ongoing requests a replica, in largest max_batches: its runner keeps two batches in flight, so two batches' worth is
# a replica working flat out (Serve scales up past it), and a third forming is the most it can use (Serve holds the
# rest at the proxy for whichever replica frees first, or one that scaling adds).
SCALE_UP_AT_BATCHES = 2
HOLD_AT_MOST_BATCHES = 3


class InferenceReplica:
    """A replica of the deployment: every model loaded on its device, its requests batched by the scheduler and runner
    of `yolojet serve`. Ray's gRPC proxy calls its methods by the gRPC method names, with the call's context as
    `grpc_context` (a status is set there: Ray's context cannot abort)."""

    def __init__(
        self, specs: list[ModelSpec], engine_options: dict[str, Any], slo_ms: float | None, max_queue: int
    ) -> None:
        self.models: dict[str, ServedModel] = {}  # set before loading: __del__ runs after a failed __init__ too
        self.runner: Runner | None = None
        self.models = load_models(specs, **engine_options)
        metrics = ServerMetrics()  # the runner counts into it; Ray Serve has metrics of its own for the cluster
        scheduler = Scheduler(time.monotonic)
        for name, model in self.models.items():
            scheduler.add_model(name, model.max_batch, model.latency, max_queue)
        self.runner = Runner(self.models, scheduler, metrics)
        self.runner.start()
        self.service = InferenceService(self.models, self.runner, metrics, deadline_ms(slo_ms, self.models) / 1000)

    async def Infer(self, request: pb.InferRequest, grpc_context: Any) -> pb.InferReply:
        try:
            arrival = self.service.clock()
            return await self.service.infer(request, arrival + self.service.slo_s, arrival)
        except Problem as p:
            grpc_context.set_code(p.code)
            grpc_context.set_details(p.message)
            if p.reason:  # Ray's context adds the list given to its own request-id list
                grpc_context.set_trailing_metadata(list(p.trailing_metadata()))
            return pb.InferReply()

    async def InferStream(
        self, request_stream: AsyncIterator[pb.InferRequest], grpc_context: Any
    ) -> AsyncIterator[pb.InferReply]:
        async with aclosing(self.service.replies(request_stream)) as replies:
            async for reply in replies:
                yield reply

    async def InferBatchStream(
        self, batch_stream: AsyncIterator[pb.InferBatch], grpc_context: Any
    ) -> AsyncIterator[pb.InferBatchReply]:
        async with aclosing(self.service.batch_replies(batch_stream)) as replies:
            async for reply in replies:
                yield reply

    async def ListModels(self, request: pb.ListModelsRequest, grpc_context: Any) -> pb.ListModelsReply:
        return self.service.model_list()

    def __del__(self) -> None:
        """Answer every queued request, then free the engines (Ray Serve calls this when it stops the replica)."""
        runner, self.runner = self.runner, None
        if runner is not None:
            runner.stop()
        models, self.models = self.models, {}
        for model in models.values():
            if model.engine is not None:
                model.engine.close()


def _ray() -> tuple[Any, Any]:
    try:
        import ray
        from ray import serve
    except ImportError as e:
        raise EngineConfigError(f"--ray needs Ray Serve ({e}): pip install 'yolojet[ray]'") from None
    return ray, serve


class RayService:
    """The deployment on a Ray cluster: `start()` joins the cluster (or starts a local one), starts Serve with its gRPC
    proxy on `options.port` and deploys the replicas; `stop()` shuts Serve down (and the local cluster it started)."""

    def __init__(
        self,
        specs: list[ModelSpec],
        options: ServeOptions,
        address: str = "",
        replicas: int | None = None,
        http_port: int = 8000,
    ) -> None:
        """`address`: a Ray head's HOST:PORT, `auto` (the one running on this machine), or '' (RAY_ADDRESS's cluster,
        else a new local one); a process already connected to Ray deploys on its cluster. `replicas`: the most replicas
        (default: a GPU each, one on a cluster without GPUs). `http_port`: Ray Serve's HTTP proxy, which it always
        starts (yolojet serves nothing over HTTP)."""
        if not specs:
            raise EngineConfigError("--model: give at least one model to serve")
        if replicas is not None and replicas < 1:
            raise EngineConfigError(f"--ray-replicas {replicas}: at least 1")
        for flag, given in (
            ("--tls-cert", options.tls_cert),
            ("--token-file or YOLOJET_TOKEN", options.token),
            ("--metrics-port", options.metrics_port),
            ("--health-port", options.health_port),
            ("--max-pending", options.max_pending),
            ("--max-calls", options.max_calls),
        ):
            if given is not None:
                why = "Ray Serve's own gRPC proxy takes the calls (plain gRPC, no bearer token; metrics of its own)"
                raise EngineConfigError(f"{flag} is not available with --ray: {why}")
        if options.drain_delay_s:
            raise EngineConfigError(
                "--drain-delay-s is not available with --ray: Ray Serve's proxy and replicas shut down on its own terms"
            )
        if options.port < 1:
            raise EngineConfigError(f"--port {options.port}: Ray Serve's gRPC proxy needs a fixed port (not 0)")
        self.specs, self.options, self.address, self.replicas = specs, options, address, replicas
        self.port, self.http_port = options.port, http_port
        self.gpus = 0
        self._serve: Any = None
        self._ray: Any = None
        self._own_ray = False

    def start(self) -> None:
        ray, serve = _ray()
        from ray.serve.config import gRPCOptions

        self._ray = ray
        self._own_ray = connect(self.address)
        try:
            running = serve.status()
            if running.proxies or running.applications:
                apps = ", ".join(sorted(running.applications)) or "none"
                why = (
                    "its gRPC proxy's port and services were fixed when it started, so yolojet's service cannot "
                    "be added; stop it (`serve shutdown`) or use a cluster of its own"
                )
                raise EngineConfigError(f"Ray Serve already runs on this cluster (applications: {apps}): {why}")
            self.gpus = int(ray.cluster_resources().get("GPU", 0))
            self._serve = serve  # from here on, stop() shuts down the Serve this started
            serve.start(
                http_options={"port": self.http_port},
                grpc_options=gRPCOptions(port=self.port, grpc_servicer_functions=[SERVICER]),
            )
            try:  # a route prefix: Serve's proxies route only to applications that have one
                serve.run(self._application(serve), name=APP, route_prefix=f"/{APP}")
            except RuntimeError:
                raise EngineConfigError(f"the Ray Serve replicas could not load the models: {_why(serve)}") from None
        except BaseException:
            self.stop()
            raise
        log.info(
            json.dumps(
                {
                    "event": "serving on ray",
                    "port": self.port,
                    "gpus": self.gpus,
                    "models": sorted(s.name for s in self.specs),
                }
            )
        )

    def _application(self, serve: Any) -> Any:
        o = self.options
        largest = max(s.max_batch for s in self.specs)
        most = self.replicas or max(1, self.gpus)
        engine_options = {
            "device": "cuda" if self.gpus else "cpu",
            "half": o.half,
            "decoder": o.decoder,
            "max_pixels": o.max_pixels,
            **o.engine,
        }
        deployment = serve.deployment(
            InferenceReplica,
            name="InferenceReplica",
            ray_actor_options={"num_gpus": 1} if self.gpus else {"num_cpus": 1},
            autoscaling_config={
                "min_replicas": 1,
                "initial_replicas": 1,
                "max_replicas": most,
                "target_ongoing_requests": SCALE_UP_AT_BATCHES * largest,
            },
            max_ongoing_requests=HOLD_AT_MOST_BATCHES * largest,
            graceful_shutdown_timeout_s=o.grace_s,
            max_constructor_retry_count=1,  # a model that cannot load fails the same way again: say so at once
        )
        return deployment.bind(self.specs, engine_options, o.slo_ms, o.max_queue)

    def stop(self) -> None:
        serve, self._serve = self._serve, None
        if serve is not None:
            serve.shutdown()
        if self._own_ray and self._ray is not None:
            self._ray.shutdown()
            self._own_ray = False


def serve_on_ray(specs: list[ModelSpec], options: ServeOptions, address: str, replicas: int | None) -> None:
    """`yolojet serve --ray`: deploy, serve until SIGTERM or SIGINT, then shut Serve down."""
    service = RayService(specs, options, address, replicas)
    try:
        service.start()  # Ctrl-C while the replicas load interrupts it; the finally shuts down what started
        stopping = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stopping.set())
        print(
            f"yolojet serve: Ray Serve's gRPC proxy listening on port {service.port} of each node with a replica "
            f"(every interface), application {APP!r}",
            file=sys.stderr,
            flush=True,
        )
        while not stopping.wait(1.0):
            pass
    finally:
        service.stop()


def _why(serve: Any) -> str:
    """The last line of the replica's error that failed the deployment (the exception, e.g. a model not found)."""
    application = serve.status().applications.get(APP)
    messages = [d.message for d in application.deployments.values()] if application is not None else []
    lines = [line.strip() for m in messages for line in m.splitlines() if line.strip()]
    return lines[-1] if lines else "(Ray Serve gives no reason; the replica's log on its node has it)"
