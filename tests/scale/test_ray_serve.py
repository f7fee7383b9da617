"""`yolojet serve --ray`: the service deployed with Ray Serve on a real local Ray cluster (one CPU replica, the
reference backend), called through Ray Serve's own gRPC proxy by a real gRPC client: Infer answers as an engine in this
process does, a bad image is INVALID_ARGUMENT, InferStream answers in order with each failure in its reply, ListModels
names the model; and the errors of an unreachable head and flags that do not go together."""

from __future__ import annotations

import concurrent.futures
import socket
from dataclasses import replace

import grpc
import numpy as np
import pytest
import ray
from support import calibrated_model, run_cli
from ultralytics.utils import ASSETS

import yolojet
from yolojet.engine.engine import Engine
from yolojet.errors import EngineConfigError
from yolojet.scale.ray_serve import APP, RayService
from yolojet.serve.models import ModelSpec
from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb
from yolojet.serve.proto.yolojet.v1 import inference_pb2_grpc as pb_grpc
from yolojet.serve.server import ServeOptions

BUS = (ASSETS / "bus.jpg").read_bytes()
ZIDANE = (ASSETS / "zidane.jpg").read_bytes()
CONF = 0.001
ROUTE = (("application", APP),)  # what Ray's proxy routes by when the cluster runs more than one application


def rows(reply: pb.InferReply) -> np.ndarray:
    return np.array(
        [[d.box.x1, d.box.y1, d.box.x2, d.box.y2, d.confidence, d.class_id] for d in reply.detections], dtype=np.float32
    ).reshape(-1, 6)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """The model, and a stub on the proxy of the deployment on a local two-CPU cluster (started once: about a minute
    here, most of it Ray's and the replica's start-up)."""
    model_dir = yolojet.export(
        calibrated_model("yolo11n.yaml", 64), out=tmp_path_factory.mktemp("ray_serve") / "m", imgsz=64
    )
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False)
    options = replace(ServeOptions(), port=free_port(), slo_ms=120_000, decoder="cpu", engine={"backend": "reference"})
    service = RayService([ModelSpec(str(model_dir), 2)], options, http_port=free_port())
    try:
        service.start()
        with grpc.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            yield model_dir, pb_grpc.InferenceStub(channel)
    finally:
        service.stop()
        if started:
            ray.shutdown()


def test_an_unreachable_head_and_flags_that_do_not_go_together_are_refused(capsys, tmp_path):
    """(Before the deployment's test: its cluster is up until the module ends.)"""
    closed = free_port()  # nothing listens there: refused at once, rather than ray.init's wait without end
    options = replace(ServeOptions(), port=free_port())
    service = RayService([ModelSpec(str(tmp_path), 2)], options, f"127.0.0.1:{closed}")
    if not ray.is_initialized():  # a process already on a cluster deploys there and never dials the address
        with pytest.raises(EngineConfigError, match="cannot reach the Ray cluster there"):
            service.start()
    for front_only in ({"token": "secret"}, {"max_calls": 8}, {"max_pending": 8}, {"drain_delay_s": 5.0}):
        with pytest.raises(EngineConfigError, match="not available with --ray"):
            RayService([ModelSpec(str(tmp_path), 2)], replace(ServeOptions(), **front_only))
    for argv, reason in (
        (("--ray", "--devices", "cpu"), "--ray and --devices"),
        (("--ray", "--device", "cpu"), "--device and --ray"),
        (("--ray", "--host", "127.0.0.1"), "--host 127.0.0.1 is not available with --ray"),
        (
            (
                "--ray-replicas",
                "2",
            ),
            "--ray-replicas goes with --ray",
        ),
    ):
        code, _, err = run_cli(capsys, "serve", "--model", str(tmp_path), *argv)
        assert code != 0 and reason in err, err


def test_the_deployment_answers_as_the_engine_through_rays_grpc_proxy(deployed):
    model_dir, stub = deployed
    with Engine.load(model_dir, device="cpu", backend="reference") as engine:
        want = {name: engine([data], conf=CONF)[0].boxes.data for name, data in (("bus", BUS), ("zidane", ZIDANE))}

    def infer(item):
        return item[0], stub.Infer(pb.InferRequest(image=item[1], conf=CONF), metadata=ROUTE, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(4) as calls:  # at once, so that the replica may batch them
        for name, reply in calls.map(infer, [("bus", BUS), ("zidane", ZIDANE)] * 2):
            np.testing.assert_allclose(rows(reply), want[name], rtol=1e-5, atol=0.02)
            assert reply.model == model_dir.name and reply.timings.run_ms > 0

    with pytest.raises(grpc.RpcError) as bad:
        stub.Infer(pb.InferRequest(image=b"\xff\xd8 not really a jpeg"), metadata=ROUTE, timeout=60)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad.value.details()
    with pytest.raises(grpc.RpcError) as unknown:
        stub.Infer(pb.InferRequest(image=BUS, model="nope"), metadata=ROUTE, timeout=60)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in unknown.value.details()

    requests = [pb.InferRequest(id=i, image=data, conf=CONF) for i, data in (("a", BUS), ("b", b"junk"), ("c", ZIDANE))]
    replies = list(stub.InferStream(iter(requests), metadata=ROUTE, timeout=60))
    assert [r.id for r in replies] == ["a", "b", "c"]
    assert replies[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    np.testing.assert_allclose(rows(replies[0]), want["bus"], rtol=1e-5, atol=0.02)
    np.testing.assert_allclose(rows(replies[2]), want["zidane"], rtol=1e-5, atol=0.02)
    batches = [pb.InferBatch(requests=requests[:2]), pb.InferBatch(requests=requests[2:])]
    (first, second) = stub.InferBatchStream(iter(batches), metadata=ROUTE, timeout=60)
    assert [r.id for r in first.replies] == ["a", "b"] and [r.id for r in second.replies] == ["c"]
    assert first.replies[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    np.testing.assert_allclose(rows(first.replies[0]), want["bus"], rtol=1e-5, atol=0.02)

    listed = stub.ListModels(pb.ListModelsRequest(), metadata=ROUTE, timeout=60)
    assert [m.name for m in listed.models] == [model_dir.name]
    assert listed.models[0].backend == "reference" and listed.models[0].max_batch == 2
