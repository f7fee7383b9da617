"""The gRPC service against a real server on 127.0.0.1 with a real client: every RPC and every task answered as the
engine answers the same bytes (boxes, rotated boxes, keypoints, top-5, masks as COCO RLE that pycocotools decodes),
streams in order with their ids, health and reflection, each bad input a clear status that leaves the server
serving, overload refused at once then recovery, a bearer token, TLS and the metrics endpoint."""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import pickle
import time
import urllib.request
from dataclasses import replace

import grpc
import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils
from support import OpenStream, RunningServer, self_signed_pem, served
from ultralytics.utils import ASSETS

from yolojet.errors import EngineConfigError
from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb
from yolojet.serve.proto.yolojet.v1 import inference_pb2_grpc as pb_grpc
from yolojet.serve.server import ServeOptions

BUS = (ASSETS / "bus.jpg").read_bytes()
ZIDANE = (ASSETS / "zidane.jpg").read_bytes()
CONF = 0.001


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (30, 90, 150)).save(out, format="PNG")
    return out.getvalue()


def rows_of(reply: pb.InferReply) -> np.ndarray:
    return np.array(
        [[d.box.x1, d.box.y1, d.box.x2, d.box.y2, d.confidence, d.class_id] for d in reply.detections], dtype=np.float32
    ).reshape(-1, 6)


def assert_same_rows_across_batches(got: np.ndarray, want: np.ndarray) -> None:
    """Rows of one image run in batches of different make-up. Their sums run in another order, so coordinates
    differ by a small part of the photo's size (not of the coordinate) and scores by a small absolute amount."""
    want = np.asarray(want)
    on_gpu = torch.cuda.is_available()  # fp16 on a GPU: tiles and rounding differ with the batch
    assert got.shape == want.shape
    np.testing.assert_array_equal(got[:, 5], want[:, 5])
    np.testing.assert_allclose(got[:, :4], want[:, :4], rtol=0, atol=1.0 if on_gpu else 0.02)
    np.testing.assert_allclose(got[:, 4], want[:, 4], rtol=0, atol=2e-3 if on_gpu else 1e-4)


@pytest.mark.parametrize("task", ["detect", "segment", "pose", "obb", "classify"])
def test_infer_answers_as_the_engine_does(server, task):
    stub = server.stub()
    engine = server.server.models[task].engine
    found = 0
    for data in (BUS, ZIDANE):
        reply = stub.Infer(pb.InferRequest(id="one", model=task, image=data, conf=CONF), timeout=120)
        (want,) = engine([data], conf=CONF)
        assert (reply.id, reply.model, reply.task) == ("one", task, task)
        assert (reply.height, reply.width) == want.orig_shape
        assert reply.model_version == server.server.models[task].version
        assert reply.timings.run_ms > 0 and reply.timings.decode_ms > 0
        if task == "classify":
            assert [c.class_id for c in reply.top5] == list(want.probs.top5)
            np.testing.assert_allclose([c.confidence for c in reply.top5], want.probs.top5conf, rtol=1e-6)
            continue
        if task == "obb":
            got = np.array(
                [
                    [
                        d.rotated_box.cx,
                        d.rotated_box.cy,
                        d.rotated_box.width,
                        d.rotated_box.height,
                        d.rotated_box.angle,
                        d.confidence,
                        d.class_id,
                    ]
                    for d in reply.detections
                ]
            )
            assert len(got) == len(want.obb)
            found += len(got)
            if len(got):
                np.testing.assert_allclose(got, want.obb.data, rtol=1e-5, atol=1e-3)
            continue
        assert len(reply.detections) == len(want.boxes), task
        found += len(want.boxes)
        np.testing.assert_allclose(rows_of(reply), want.boxes.data, rtol=1e-5, atol=1e-3)
        assert all(d.class_name == want.names[d.class_id] for d in reply.detections)
        if task == "pose":
            points = np.array([[[k.x, k.y, k.visibility] for k in d.keypoints] for d in reply.detections])
            np.testing.assert_allclose(points, want.keypoints.data, rtol=1e-5, atol=1e-3)
        if task == "segment":
            for d, mask in zip(reply.detections, want.masks.data, strict=True):
                rle = {"size": [d.mask.height, d.mask.width], "counts": d.mask.counts.encode()}
                assert np.array_equal(mask_utils.decode(rle).astype(bool), mask)
    assert task == "classify" or found > 0, f"{task}: no detections to compare (random weights found none)"


def test_per_request_options_in_one_batch(server):
    """Requests with their own conf, max_det and classes, sent at once so that they share batches, each get what
    that request alone gets."""
    stub = server.stub()
    engine = server.server.models["detect"].engine
    asks = [{"conf": 0.001}, {"conf": 0.05}, {"conf": 0.001, "max_det": 3}, {"conf": 0.001, "classes": [0, 5]}]
    with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
        futures = [pool.submit(stub.Infer, pb.InferRequest(image=BUS, model="detect", **a), timeout=120) for a in asks]
        replies = [f.result() for f in futures]
    for ask, reply in zip(asks, replies, strict=True):
        (want,) = engine([BUS], **ask)  # alone, a batch of one
        assert_same_rows_across_batches(rows_of(reply), want.boxes.data)


def test_stream_keeps_order_and_ids_and_answers_bad_requests_in_place(server):
    stub = server.stub()
    images = [BUS, b"", ZIDANE, b"not an image", png(64, 48), BUS]
    requests = [pb.InferRequest(id=f"r{i}", model="detect", image=data, conf=CONF) for i, data in enumerate(images)]
    replies = list(stub.InferStream(iter(requests), timeout=300))
    assert [r.id for r in replies] == [f"r{i}" for i in range(len(images))]
    codes = [grpc.StatusCode.OK.value[0] if not r.HasField("error") else r.error.code for r in replies]
    invalid = grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert codes == [0, invalid, 0, invalid, 0, 0]
    assert "empty" in replies[1].error.message and "cannot decode" in replies[3].error.message
    assert (replies[4].width, replies[4].height) == (64, 48)
    assert_same_rows_across_batches(rows_of(replies[0]), rows_of(replies[5]))


def test_a_stream_closed_early_leaves_its_read_ahead_images_unrun(server):
    """A client that goes away with 96 images read ahead: those not yet taken by a batch are never run (on the CPU
    they would hold the next caller for seconds)."""
    import time

    registry = server.server.metrics.registry

    def images_run() -> float:
        return registry.get_sample_value("yolojet_batch_size_sum", {"model": "detect"}) or 0.0

    before = images_run()
    batches = [
        pb.InferBatch(requests=[pb.InferRequest(id=f"{m}-{i}", model="detect", image=BUS) for i in range(16)])
        for m in range(6)
    ]
    call = server.stub().InferBatchStream(iter(batches), timeout=300)
    assert len(next(call).replies) == 16
    call.cancel()
    scheduler = server.server.runner.scheduler
    deadline = time.monotonic() + 60
    while (scheduler.queued() or scheduler.in_flight) and time.monotonic() < deadline:
        time.sleep(0.01)
    # The first message, and the batches already taken when it closed (two in flight, four images each): not 96.
    assert images_run() - before <= 16 + 3 * 4
    assert server.stub().Infer(pb.InferRequest(model="detect", image=BUS), timeout=60).width == 810


def test_batched_stream_answers_each_message_in_order_with_bad_requests_in_place(server):
    """InferBatchStream: a reply message a request message, its replies in the order of its requests, each the
    results InferStream gives the same image; a bad image, an empty one and an unknown model answered in place."""
    stub = server.stub()
    messages = [
        [BUS, b"", ZIDANE],
        [b"not an image"],
        [png(64, 48), BUS, ZIDANE, BUS],
    ]
    batches, n = [], 0
    for images in messages:
        requests = []
        for data in images:
            requests.append(pb.InferRequest(id=f"r{n}", model="detect", image=data, conf=CONF))
            n += 1
        batches.append(pb.InferBatch(requests=requests))
    batches.append(pb.InferBatch(requests=[pb.InferRequest(id="lost", model="nope", image=BUS)]))
    replies = list(stub.InferBatchStream(iter(batches), timeout=300))
    assert [len(r.replies) for r in replies] == [3, 1, 4, 1]
    flat = [reply for message in replies for reply in message.replies]
    assert [r.id for r in flat] == [f"r{i}" for i in range(n)] + ["lost"]
    invalid, ok = grpc.StatusCode.INVALID_ARGUMENT.value[0], grpc.StatusCode.OK.value[0]
    codes = [r.error.code if r.HasField("error") else ok for r in flat]
    assert codes == [ok, invalid, ok, invalid, ok, ok, ok, ok, grpc.StatusCode.NOT_FOUND.value[0]]
    assert "empty" in flat[1].error.message and "cannot decode" in flat[3].error.message
    assert "nope" in flat[8].error.message
    assert (flat[4].width, flat[4].height) == (64, 48)
    single = list(stub.InferStream(iter([pb.InferRequest(model="detect", image=BUS, conf=CONF)]), timeout=300))
    for same in (flat[0], flat[5], flat[7]):
        assert_same_rows_across_batches(rows_of(same), rows_of(single[0]))
    assert_same_rows_across_batches(rows_of(flat[2]), rows_of(flat[6]))


def test_list_models(server):
    reply = server.stub().ListModels(pb.ListModelsRequest(), timeout=30)
    info = {m.name: m for m in reply.models}
    assert sorted(info) == ["classify", "detect", "obb", "pose", "segment"]
    assert info["detect"].task == "detect" and info["detect"].max_batch == 4 and info["detect"].height == 320
    assert info["detect"].backend == "reference" and info["detect"].decoder == "cpu"
    assert len(info["detect"].class_names) == 80
    assert reply.max_message_bytes == ServeOptions().max_message_bytes == 64 << 20
    assert reply.processes == 1  # one whole server at this address


PROTO_FILE = "yolojet/serve/proto/yolojet/v1/inference.proto"


def test_health_and_reflection(server):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    channel = grpc.insecure_channel(server.address)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "yolojet.v1.Inference"):
        status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    assert {"yolojet.v1.Inference", "grpc.health.v1.Health"} <= services
    described = database.FindFileContainingSymbol("yolojet.v1.Inference")
    assert [m.name for m in described.service[0].method] == ["Infer", "InferStream", "InferBatchStream", "ListModels"]
    # Known by the name every language's code is generated under (yolojet/serve/proto/README.md), which is also the
    # Python module's path: the generated classes are found (and pickled, as Ray does) by it.
    assert described.name == PROTO_FILE
    assert database.FindFileByName(PROTO_FILE).package == "yolojet.v1"
    request = pb.InferRequest(id="a", image=b"b", conf=0.5)
    assert pickle.loads(pickle.dumps(request)) == request


@pytest.mark.parametrize(
    ("request_fields", "code", "fragment"),
    [
        ({"image": b""}, grpc.StatusCode.INVALID_ARGUMENT, "empty"),
        ({"image": b"\x00" * 100}, grpc.StatusCode.INVALID_ARGUMENT, "cannot decode as an image"),
        ({"image": BUS[: len(BUS) // 2]}, grpc.StatusCode.INVALID_ARGUMENT, "cut short"),
        ({"image": BUS, "model": "nope"}, grpc.StatusCode.NOT_FOUND, "no model named 'nope'"),
        ({"image": BUS, "model": ""}, grpc.StatusCode.INVALID_ARGUMENT, "a model name is needed"),
        ({"image": BUS, "conf": 1.5}, grpc.StatusCode.INVALID_ARGUMENT, "conf 1.5"),
        ({"image": BUS, "iou": -0.1}, grpc.StatusCode.INVALID_ARGUMENT, "iou -0.1"),
        ({"image": BUS, "max_det": 0}, grpc.StatusCode.INVALID_ARGUMENT, "max_det 0"),
        ({"image": BUS, "max_det": 301}, grpc.StatusCode.INVALID_ARGUMENT, "max_det 301"),
        ({"image": BUS, "classes": [80]}, grpc.StatusCode.INVALID_ARGUMENT, "class ids are ints from 0 to 79"),
        # Names sent back in an error are cut: an error travels in gRPC's metadata, 16 KiB at most.
        ({"image": BUS, "model": "m" * 100_000}, grpc.StatusCode.NOT_FOUND, "... (100000 characters)"),
        ({"image": b"\x00" * 100, "id": "i" * 20_000}, grpc.StatusCode.INVALID_ARGUMENT, "... (20000 characters)"),
    ],
)
def test_bad_requests_get_a_clear_status_and_the_server_keeps_serving(server, request_fields, code, fragment):
    stub = server.stub()
    fields = {"model": "detect", **request_fields}
    with pytest.raises(grpc.RpcError) as info:
        stub.Infer(pb.InferRequest(**fields), timeout=60)
    assert info.value.code() == code and fragment in info.value.details(), info.value.details()
    assert stub.Infer(pb.InferRequest(model="detect", image=ZIDANE), timeout=60).width == 1280


def test_an_image_over_the_pixel_limit(model_dirs):
    running = RunningServer(
        {"detect": served("detect", model_dirs["detect"], max_pixels=100 * 100)},
        replace(ServeOptions(), port=0, slo_ms=60_000),
    )
    try:
        stub = running.stub()
        with pytest.raises(grpc.RpcError) as info:
            stub.Infer(pb.InferRequest(image=png(101, 100)), timeout=60)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "over the limit of 10,000" in info.value.details()
        assert stub.Infer(pb.InferRequest(image=png(100, 100)), timeout=60).width == 100
    finally:
        running.stop()


def test_overload_is_refused_at_once_then_the_server_recovers(model_dirs):
    """A queue of two: of many requests sent at once, those beyond what can wait are refused with
    RESOURCE_EXHAUSTED without waiting, the rest answered; afterwards requests are served again. Each refusal says
    why and when to try again in gRPC's rich status (ErrorInfo and RetryInfo), read as another client would."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    running = RunningServer(
        {"detect": served("detect", model_dirs["detect"], max_batch=1)},
        replace(ServeOptions(), port=0, slo_ms=60_000, max_queue=2),
    )
    try:
        stub = running.stub()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futures = [
                pool.submit(stub.Infer.future(pb.InferRequest(image=BUS), timeout=120).exception) for _ in range(16)
            ]
            errors = [f.result() for f in futures]
        refused = [e for e in errors if e is not None]
        assert refused and all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in refused)
        assert "already queued" in refused[0].details()
        assert len(refused) < 16
        for error in refused:
            status = rpc_status.from_call(error)
            assert status is not None and status.message == error.details()
            info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
            assert [status.details[0].Unpack(info), status.details[1].Unpack(retry)] == [True, True]
            assert (info.reason, info.domain, dict(info.metadata)) == ("QUEUE_FULL", "yolojet", {"model": "detect"})
            assert 0 <= retry.retry_delay.ToNanoseconds() < 60e9  # until the batch in flight is done
        assert stub.Infer(pb.InferRequest(image=ZIDANE), timeout=60).width == 1280
    finally:
        running.stop()


def test_without_slo_ms_a_slow_device_gets_a_deadline_its_batches_can_meet(model_dirs):
    """No --slo-ms on a CPU, where a batch of sixteen runs past 25 ms: the default deadline is eight such runs, so a
    burst of two batches' requests without deadlines of their own is answered; with 50 ms most of it is refused."""
    from yolojet.serve.server import DEFAULT_SLO_MS, SLO_RUNS, deadline_ms

    models = {"detect": served("detect", model_dirs["detect"], max_batch=16)}
    longest_ms = max(models["detect"].latency.run_seconds.values()) * 1000
    assert deadline_ms(70.0, models) == 70.0
    if 2 * longest_ms <= DEFAULT_SLO_MS:  # a CPU fast enough for 50 ms keeps it
        assert deadline_ms(None, models) == DEFAULT_SLO_MS
        return
    assert deadline_ms(None, models) == round(SLO_RUNS * longest_ms, 1)
    for slo_ms, answered_all in ((None, True), (DEFAULT_SLO_MS, False)):
        # A server's stop closes its engines: each server its own.
        models = models or {"detect": served("detect", model_dirs["detect"], max_batch=16)}
        running = RunningServer(models, replace(ServeOptions(), port=0, slo_ms=slo_ms))
        try:
            assert running.server.slo_ms == (round(SLO_RUNS * longest_ms, 1) if slo_ms is None else slo_ms)
            calls = [running.stub().Infer.future(pb.InferRequest(image=BUS)) for _ in range(32)]
            errors = [call.exception() for call in calls]
            refused = [e for e in errors if e is not None]
            late = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED)  # refused, or dropped late
            assert all(e.code() in late for e in refused), [(e.code(), e.details()) for e in refused]
            assert (not refused) == answered_all, (slo_ms, len(refused))
        finally:
            running.stop()
            models = {}


def test_a_streams_deadline_is_its_requests_deadline(model_dirs):
    """A stream's requests are due at the stream's gRPC deadline where its client set one, as a unary call's is at
    its own, and at arrival plus the SLO where it set none: with a 1 ms SLO the same 24 images are refused in part
    over a stream without a deadline, and all answered over one of two minutes (either stream kind)."""
    models = {"detect": served("detect", model_dirs["detect"], max_batch=4)}
    running = RunningServer(models, replace(ServeOptions(), port=0, slo_ms=1.0))
    try:
        stub = running.stub()
        requests = [pb.InferRequest(id=str(i), image=BUS, conf=CONF) for i in range(24)]
        for timeout, all_answered in ((None, False), (120, True)):
            replies = list(stub.InferStream(iter(requests), timeout=timeout))
            refused = [r for r in replies if r.HasField("error")]
            assert [r.id for r in replies] == [r.id for r in requests]
            assert (not refused) == all_answered, (timeout, len(refused), refused[:1])
            assert all(r.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] for r in refused)
            # Shorter than a run of one (on a CPU): only a longer deadline passes, and no delay is given.
            assert all(
                (r.error.reason, r.error.retry_delay_ms > 0)
                in {("DEADLINE_TOO_SHORT", False), ("DEADLINE_CANNOT_BE_MET", True)}
                for r in refused
            ), refused[:1]
        batched = list(stub.InferBatchStream(iter([pb.InferBatch(requests=requests)]), timeout=120))
        assert not [r for reply in batched for r in reply.replies if r.HasField("error")]
    finally:
        running.stop()


def test_a_drain_delay_serves_on_with_health_not_serving_before_calls_are_refused(model_dirs):
    """`drain_delay_s`: on shutdown health turns NOT_SERVING at once, and a call made after that, while a load
    balancer would still be catching up, is answered (without the delay, the listener closes at once); once the delay
    is over new calls are refused."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    running = RunningServer(
        {"detect": served("detect", model_dirs["detect"])},
        replace(ServeOptions(), port=0, slo_ms=60_000, drain_delay_s=3.0),
    )
    try:
        channel = grpc.insecure_channel(running.address)
        stub, health = pb_grpc.InferenceStub(channel), health_pb2_grpc.HealthStub(channel)
        assert stub.Infer(pb.InferRequest(image=BUS), timeout=60).width == 810
        stopping = asyncio.run_coroutine_threadsafe(running.server.stop(), running.loop)
        while (
            health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
        ):
            time.sleep(0.01)
        assert stub.Infer(pb.InferRequest(image=ZIDANE), timeout=60).width == 1280
        stopping.result(timeout=120)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Infer(pb.InferRequest(image=BUS), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        channel.close()
    finally:
        running.stop()


def test_a_stream_opened_while_the_server_drains_ends_unavailable_at_once(model_dirs):
    """A stream that reaches the service after shutdown began draining the open ones is drained too: it ends
    UNAVAILABLE at once, not held open until the grace period's end (its reader is cancelled before it first runs)."""
    from yolojet.serve.service import SHUTTING_DOWN

    running = RunningServer({"detect": served("detect", model_dirs["detect"])}, replace(ServeOptions(), port=0))
    try:

        async def drain() -> None:
            running.server.service.drain()

        running.call(drain())
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            list(running.stub().InferStream(iter([pb.InferRequest(id="0", image=BUS)]), timeout=60))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE and info.value.details() == SHUTTING_DOWN
        assert time.monotonic() - started < 10
    finally:
        running.stop()


def test_a_deadline_shorter_than_a_run_is_refused_at_once_without_a_retry_delay(model_dirs):
    """Less than one run can never be met: refused at once, its ErrorInfo saying so and no RetryInfo (only a longer
    deadline passes)."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    running = RunningServer(
        {"detect": served("detect", model_dirs["detect"], max_batch=1)}, replace(ServeOptions(), port=0, slo_ms=60_000)
    )
    try:
        stub = running.stub()
        run_s = running.server.models["detect"].latency.run_seconds[1]
        with pytest.raises(grpc.RpcError) as info:
            stub.Infer(pb.InferRequest(image=BUS), timeout=run_s / 2)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
        assert "shorter than a run of one image" in info.value.details()
        status, reason = rpc_status.from_call(info.value), error_details_pb2.ErrorInfo()
        assert status is not None and len(status.details) == 1 and status.details[0].Unpack(reason)
        assert reason.reason == "DEADLINE_TOO_SHORT"
        assert stub.Infer(pb.InferRequest(image=BUS), timeout=60).width == 810
    finally:
        running.stop()


def test_calls_past_max_pending_are_turned_away_at_once_while_the_event_loop_is_busy(model_dirs):
    """gRPC's core holds calls until the server's event loop takes them; past `max_pending` it turns new ones away
    itself (CANCELLED) at once, so a loop that cannot keep up does not let every call wait past its deadline."""
    import asyncio
    import time

    running = RunningServer(
        {"detect": served("detect", model_dirs["detect"], max_batch=4)},
        replace(ServeOptions(), port=0, slo_ms=60_000, max_pending=2),
    )
    try:
        stub = running.stub()
        assert stub.Infer(pb.InferRequest(image=BUS), timeout=60).width == 810  # connected and warm

        async def busy() -> None:
            time.sleep(2.0)  # the loop does nothing else meanwhile

        blocked = asyncio.run_coroutine_threadsafe(busy(), running.loop)
        time.sleep(0.2)
        start = time.monotonic()
        calls = [stub.Infer.future(pb.InferRequest(image=BUS), timeout=60) for _ in range(12)]
        ended: dict[int, float] = {}
        for i, call in enumerate(calls):
            call.add_done_callback(lambda _, i=i: ended.setdefault(i, time.monotonic() - start))
        blocked.result(timeout=10)  # the loop free again after 1.8 s
        for call in calls:
            call.exception(timeout=60)
        turned_away = [i for i, c in enumerate(calls) if c.exception() is not None]
        assert len(turned_away) >= 8, [c.exception() for c in calls]  # 12 calls, 2 held
        assert all(calls[i].exception().code() == grpc.StatusCode.CANCELLED for i in turned_away)
        assert all(ended[i] < 1.0 for i in turned_away), ended  # while the loop was still busy
        answered = [c.result() for c in calls if c.exception() is None]
        assert answered and all(r.width == 810 for r in answered)
    finally:
        running.stop()


def test_each_request_arrives_at_the_clock_reading_its_deadline_was_made_from(model_dirs):
    """The service hands the runner the reading it made a request's deadline from (arrival + --slo-ms), one for all
    the requests of a stream's message: time the server loses before admitting a request is then never taken for a
    deadline too short (which is final), but refused with a time to try again."""
    running = RunningServer(
        {"detect": served("detect", model_dirs["detect"])}, replace(ServeOptions(), port=0, slo_ms=60_000)
    )
    queued: dict[str, tuple[float, float | None]] = {}
    runner = running.server.runner
    enqueue = runner.enqueue

    def recording(model, job, deadline, key, arrival=None):
        queued[job.request_id] = (deadline, arrival)
        return enqueue(model, job, deadline, key, arrival=arrival)

    runner.enqueue = recording
    try:
        stub = running.stub()
        # No gRPC deadlines (the calls' own would be the requests'); the waits here are bounded instead.
        assert stub.Infer.future(pb.InferRequest(id="unary", image=BUS)).result(timeout=120).width == 810
        message = pb.InferBatch(requests=[pb.InferRequest(id=f"m{i}", image=BUS) for i in range(3)])
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            (reply,) = pool.submit(lambda: list(stub.InferBatchStream(iter([message])))).result(timeout=300)
        assert [r.id for r in reply.replies] == ["m0", "m1", "m2"]
    finally:
        running.stop()
    assert sorted(queued) == ["m0", "m1", "m2", "unary"]
    for deadline, arrival in queued.values():
        assert arrival is not None and deadline - arrival == pytest.approx(60.0)
    assert len({queued[f"m{i}"][1] for i in range(3)}) == 1


def test_calls_past_max_calls_are_turned_away_at_once_with_resource_exhausted(model_dirs):
    """With `max_calls` calls under way, gRPC turns new ones away at once (RESOURCE_EXHAUSTED) before the service reads
    them; once a call ends its place is free again."""
    import time

    running = RunningServer(
        {"detect": served("detect", model_dirs["detect"], max_batch=4)},
        replace(ServeOptions(), port=0, slo_ms=60_000, max_calls=2),
    )
    try:
        stub = running.stub()
        assert stub.Infer(pb.InferRequest(image=BUS), timeout=60).width == 810  # connected and warm

        def once_a_place_is_free(call):
            """gRPC frees a finished call's place just after the client sees it end: a call made at once may find it
            still taken, and is made again."""
            for _ in range(50):
                try:
                    return call()
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        raise
                    time.sleep(0.05)
            return call()

        # Two open streams are the two calls under way.
        streams = [once_a_place_is_free(lambda: OpenStream(stub, BUS)) for _ in range(2)]
        start = time.monotonic()
        for _ in range(4):
            with pytest.raises(grpc.RpcError) as info:
                stub.Infer(pb.InferRequest(image=BUS), timeout=60)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
            assert info.value.details() == "Concurrent RPC limit exceeded!"  # gRPC's, before the service is called
        assert time.monotonic() - start < 2.0  # at once, not after the calls under way
        streams[0].close()  # one stream ends, and its place with it
        next_reply = once_a_place_is_free(lambda: stub.Infer(pb.InferRequest(id="next", image=BUS), timeout=60))
        assert next_reply.id == "next"
        streams[1].ask(pb.InferRequest(id="still open", image=BUS))
        streams[1].close()
    finally:
        running.stop()


def test_a_health_port_answers_probes_while_every_call_the_limit_allows_is_under_way(model_dirs):
    """With `max_calls` calls under way a health check on the main port is turned away like any call, so a liveness
    probe would fail a server that is only busy; on `health_port` it is answered, SERVING, for the server and for the
    service by name; it closes with the server."""
    import time

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    running = RunningServer(
        {"detect": served("detect", model_dirs["detect"])},
        replace(ServeOptions(), port=0, slo_ms=60_000, max_calls=1, health_port=0),
    )
    try:
        assert running.server.health_port not in (None, 0, running.server.port)
        main = health_pb2_grpc.HealthStub(grpc.insecure_channel(running.address))
        assert main.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
        for _ in range(50):  # gRPC frees the check's place just after the client sees it end
            try:
                stream = OpenStream(running.stub(), BUS)  # the one call the limit allows
                break
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                time.sleep(0.05)
        with pytest.raises(grpc.RpcError) as info:
            main.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        side = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{running.server.health_port}"))
        for service in ("", "yolojet.v1.Inference"):
            reply = side.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
        stream.close()
    finally:
        running.stop()
    with pytest.raises(grpc.RpcError) as gone:  # closed with the server
        side.Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert gone.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_server_that_cannot_start_lets_its_health_port_go(model_dirs):
    """The metrics port taken once the main and health ports are bound: the start fails naming it, no runner thread is
    left behind, and the health port is free again (the server it was bound for is gone), as the main port is."""
    import socket
    import threading

    def runners() -> int:
        return sum(thread.name == "yolojet-serve-runner" for thread in threading.enumerate())

    from yolojet.errors import EngineConfigError

    with socket.socket() as taken, socket.socket() as probe:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        probe.bind(("127.0.0.1", 0))
        health_port = probe.getsockname()[1]
        probe.close()
        options = replace(ServeOptions(), port=0, metrics_port=taken.getsockname()[1], health_port=health_port)
        before = runners()
        with pytest.raises(EngineConfigError, match=r"--metrics-port \d+: cannot listen there"):
            RunningServer({"detect": served("detect", model_dirs["detect"])}, options)
        assert runners() == before
        with socket.socket() as again:
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            again.bind(("127.0.0.1", health_port))


def test_a_bearer_token_is_required_where_set_but_not_for_health(model_dirs):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    running = RunningServer(
        {"detect": served("detect", model_dirs["detect"])},
        replace(ServeOptions(), port=0, slo_ms=60_000, token="s3cret"),
    )
    try:
        stub = running.stub()
        for metadata in (None, (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.RpcError) as info:
                stub.Infer(pb.InferRequest(image=BUS), timeout=30, metadata=metadata)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as streamed:
                batch = pb.InferBatch(requests=[pb.InferRequest(image=BUS)])
                list(stub.InferBatchStream(iter([batch]), timeout=30, metadata=metadata))
            assert streamed.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for scheme in ("Bearer", "bearer"):  # the scheme's case is the client's (RFC 7235), the token's is not
            metadata = (("authorization", f"{scheme} s3cret"),)
            assert stub.Infer(pb.InferRequest(image=BUS), timeout=60, metadata=metadata).width == 810
        with pytest.raises(grpc.RpcError) as info:
            stub.Infer(pb.InferRequest(image=BUS), timeout=30, metadata=(("authorization", "Bearer S3CRET"),))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        channel = grpc.insecure_channel(running.address)
        assert health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status == 1
    finally:
        running.stop()


def test_tls(model_dirs, tmp_path):
    cert, key = self_signed_pem(tmp_path, "server")
    cert_pem = cert.read_bytes()
    for alone in ({"tls_key": key}, {"tls_cert": cert}):  # never in the clear
        with pytest.raises(EngineConfigError, match="go together"):
            ServeOptions(**alone)
    options = replace(ServeOptions(), port=0, slo_ms=60_000, tls_cert=cert, tls_key=key)
    running = RunningServer({"detect": served("detect", model_dirs["detect"])}, options)
    try:
        channel = grpc.secure_channel(f"localhost:{running.server.port}", grpc.ssl_channel_credentials(cert_pem))
        assert pb_grpc.InferenceStub(channel).Infer(pb.InferRequest(image=BUS), timeout=60).width == 810
        with pytest.raises(grpc.RpcError):  # plaintext to a TLS port
            running.stub().Infer(pb.InferRequest(image=BUS), timeout=10)
    finally:
        running.stop()


def test_metrics(server):
    server.stub().Infer(pb.InferRequest(model="detect", image=BUS), timeout=60)
    with pytest.raises(grpc.RpcError):
        server.stub().Infer(pb.InferRequest(model="detect", image=b"junk"), timeout=60)
    for name in ("nope-1", "nope-2"):  # names a client makes up share one series
        with pytest.raises(grpc.RpcError):
            server.stub().Infer(pb.InferRequest(model=name, image=BUS), timeout=60)
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.server.metrics_port}/metrics", timeout=10).read().decode()
    assert 'yolojet_requests_total{code="OK",model="detect"}' in text
    assert 'yolojet_requests_total{code="INVALID_ARGUMENT",model="detect"}' in text
    assert 'yolojet_requests_total{code="NOT_FOUND",model="(unknown)"}' in text and "nope" not in text
    assert "yolojet_batch_size_bucket" in text and 'stage="decode"' in text and "yolojet_queue_depth" in text


class _LendingDecoder:
    """The CPU decoder, whose batches also lend out a buffer an image (a token naming its request), as the hardware
    decoder lends its output images; records the buffers handed back, and any handed back before their request was
    answered."""

    def __init__(self, inner, answered: set[str], lock) -> None:
        self.inner, self.cpu, self.name = inner, inner.cpu, "lending"
        self.answered, self.lock = answered, lock
        self.reused: list[str] = []
        self.early: list[str] = []

    def decode(self, items, pool=None):
        from yolojet.images.decoders import DecodedBatch

        reuse = pool.take_images(len(pool)) if pool is not None else []  # every token handed back so far
        with self.lock:
            self.reused += reuse
            self.early += [token for token in reuse if token.split("#")[0] not in self.answered]
        decoded = self.inner.decode(items)
        return DecodedBatch(decoded.items, decoded.ready, [f"{item.name}#{i}" for i, item in enumerate(items)])

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_answered_batches_lend_their_decoded_images_to_later_ones(model_dirs, monkeypatch):
    """The runner hands a batch's decoded images back to the decoder only once every request of the batch is
    answered, and later batches decode into them; the replies are still each image's own."""
    import threading

    from yolojet.serve.runner import Runner

    answered: set[str] = set()
    lock = threading.Lock()
    answer = Runner._answer

    def recording_answer(runner, request, outcome):
        answer(runner, request, outcome)
        with lock:
            answered.add(f"image of request {request.payload.request_id!r}")

    monkeypatch.setattr(Runner, "_answer", recording_answer)
    running = RunningServer(
        {"detect": served("detect", model_dirs["detect"])}, replace(ServeOptions(), port=0, slo_ms=60_000)
    )
    engine = running.server.models["detect"].engine
    lending = _LendingDecoder(engine.decoder, answered, lock)
    engine.decoder = lending
    try:
        images = [BUS, ZIDANE] * 6
        requests = [pb.InferRequest(id=f"r{i}", model="detect", image=data, conf=CONF) for i, data in enumerate(images)]
        replies = list(running.stub().InferStream(iter(requests), timeout=300))
        assert [(r.width, r.height) for r in replies] == [(810, 1080), (1280, 720)] * 6
        for reply in replies[2:]:
            assert_same_rows_across_batches(rows_of(reply), rows_of(replies[int(reply.id[1:]) % 2]))
        assert lending.reused and lending.early == []
    finally:
        engine.decoder = lending.inner
        running.stop()


@pytest.mark.gpu(reason="the hardware decoder needs a CUDA GPU")
@pytest.mark.parametrize("decoder", ["nvimgcodec", "hardware"])
def test_the_hardware_decoder_decodes_requests_into_answered_batches_images(model_dirs, decoder):
    """On the GPU: two photos of different sizes in turn over a stream, many batches long, each batch decoded into
    the images of batches answered before it; every reply is its photo's own."""
    from yolojet.engine.engine import Engine
    from yolojet.serve.models import ServedModel, measure_latency

    try:
        engine = Engine.load(model_dirs["detect"], max_batch=8, decoder=decoder)
    except EngineConfigError as e:
        pytest.skip(str(e))
    model = ServedModel.of("detect", engine, measure_latency(engine, repeats=1))
    running = RunningServer({"detect": model}, replace(ServeOptions(), port=0, slo_ms=60_000, decoder=decoder))
    try:
        alone = [rows_of(running.stub().Infer(pb.InferRequest(image=d, conf=CONF), timeout=60)) for d in (BUS, ZIDANE)]
        images = [BUS, ZIDANE] * 40
        requests = [pb.InferRequest(id=f"r{i}", model="detect", image=data, conf=CONF) for i, data in enumerate(images)]
        replies = list(running.stub().InferStream(iter(requests), timeout=300))
        assert [r.id for r in replies] == [f"r{i}" for i in range(len(images))]
        for i, reply in enumerate(replies):
            assert not reply.HasField("error"), reply.error.message
            assert_same_rows_across_batches(rows_of(reply), alone[i % 2])
    finally:
        running.stop()


def test_unary_calls_gone_and_calls_past_the_grace_leave_nothing_to_run(model_dirs):
    """A unary call its client cancels, or one still queued when the server's grace ends, is taken out of the queue,
    not run for nobody: far fewer batches run than calls were queued, and a shutdown does not run the queue first."""
    options = replace(ServeOptions(), port=0, slo_ms=600_000, grace_s=0.2)
    running = RunningServer({"detect": served("detect", model_dirs["detect"], max_batch=1)}, options)
    registry = running.server.metrics.registry

    def sample(name: str) -> float:
        return registry.get_sample_value(name, {"model": "detect"}) or 0.0

    def queue_reaches(depth: int, above: bool) -> None:
        end = time.monotonic() + 60
        while (sample("yolojet_queue_depth") >= depth) != above:
            assert time.monotonic() < end, f"queue depth {sample('yolojet_queue_depth')}"
            time.sleep(0.02)

    stopped = False
    try:
        stub = running.stub()
        calls = [stub.Infer.future(pb.InferRequest(model="detect", image=BUS), timeout=600) for _ in range(40)]
        queue_reaches(20, above=True)
        for call in calls:
            call.cancel()
        queue_reaches(1, above=False)
        time.sleep(0.5)  # anything left queued would run now
        assert sample("yolojet_batch_size_count") < 20
        calls = [stub.Infer.future(pb.InferRequest(model="detect", image=BUS), timeout=600) for _ in range(40)]
        queue_reaches(20, above=True)
        before = sample("yolojet_batch_size_count")
        running.stop()
        stopped = True
        assert sample("yolojet_batch_size_count") - before < 20
        assert sum(call.exception() is None for call in calls) < 20
    finally:
        if not stopped:
            running.stop()


def test_a_caller_gone_costs_the_event_loop_a_flag_and_the_runner_drops_its_request(model_dirs):
    """`note_gone`, called on the event loop's thread, neither scans the queues nor waits for the runner's lock (here
    held by another thread, as while the runner takes a batch); the runner takes the gone request out before its next
    batch, so it is never answered, and the others are."""
    import threading

    from yolojet.engine.predict_path import PredictOptions
    from yolojet.serve.batcher import Scheduler
    from yolojet.serve.metrics import ServerMetrics
    from yolojet.serve.runner import Job, Outcome, Runner

    model = served("detect", model_dirs["detect"], max_batch=4)
    scheduler = Scheduler(time.monotonic)
    scheduler.add_model("detect", model.max_batch, model.latency, 64)
    runner = Runner({"detect": model}, scheduler, ServerMetrics())
    outcomes: dict[str, Outcome] = {}
    answered = threading.Event()
    gone: set[str] = set()

    def job(name: str) -> Job:
        def done(outcome: Outcome) -> None:
            outcomes[name] = outcome
            if {"r0", "r2"} <= set(outcomes):
                answered.set()

        return Job(name, BUS, PredictOptions(conf=CONF), done, gone=lambda: name in gone)

    for name in ("r0", "r1", "r2"):
        runner.enqueue("detect", job(name), time.monotonic() + 600, key=None)
    taking, release = threading.Event(), threading.Event()

    def hold_the_runners_lock() -> None:
        with runner._cond:
            taking.set()
            release.wait(60)

    holder = threading.Thread(target=hold_the_runners_lock)
    holder.start()
    try:
        assert taking.wait(10)
        gone.add("r1")
        noting = threading.Thread(target=runner.note_gone)
        noting.start()
        noting.join(10)
        assert not noting.is_alive(), "note_gone waited for the runner's lock"
        assert len(scheduler.queues["detect"].waiting) == 3  # nothing scanned on the caller's thread
    finally:
        release.set()
        holder.join()
    runner.start()
    try:
        assert answered.wait(120), sorted(outcomes)
        time.sleep(0.3)  # a batch holding r1 would be answered by now
        assert sorted(outcomes) == ["r0", "r2"] and all(o.code == grpc.StatusCode.OK for o in outcomes.values())
        assert not scheduler.queues["detect"].waiting
    finally:
        runner.stop(timeout=60)


def test_replies_are_not_held_to_the_request_limit_and_an_ipv6_host_serves_grpc_and_metrics(model_dirs):
    """A reply larger than the request limit (many detections of a small image, here 300 of a PNG under 5 KB against
    a 5 KB limit) is sent whole, the stream going on; and `--host ::1` or `[::1]` listens there, metrics too (where the
    machine has an IPv6 loopback: 127.0.0.1 alone otherwise)."""
    import socket

    from yolojet.serve.server import bare_host, host_port

    assert host_port("::1", 5) == host_port("[::1]", 5) == "[::1]:5" and host_port("127.0.0.1", 5) == "127.0.0.1:5"
    hosts = ["127.0.0.1"]
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        hosts += ["::1", "[::1]"]
    except OSError:
        pass
    rng = np.random.default_rng(3)
    small = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(small, format="PNG")
    assert len(small.getvalue()) < 5120
    for host in hosts:
        options = replace(ServeOptions(), host=host, port=0, metrics_port=0, slo_ms=600_000, max_message_bytes=5120)
        running = RunningServer({"detect": served("detect", model_dirs["detect"])}, options)
        try:
            stub = pb_grpc.InferenceStub(grpc.insecure_channel(host_port(host, running.server.port)))
            asked = [
                pb.InferRequest(model="detect", image=small.getvalue(), conf=0.0, iou=1.0, max_det=300, id=str(i))
                for i in range(3)
            ]
            replies = list(stub.InferStream(iter(asked), timeout=120))
            assert [r.id for r in replies] == ["0", "1", "2"] and not any(r.HasField("error") for r in replies)
            assert min(r.ByteSize() for r in replies) > 5120 and len(replies[0].detections) == 300
            url = f"http://{host_port(bare_host(host), running.server.metrics_port)}/metrics"
            assert b"yolojet_requests_total" in urllib.request.urlopen(url, timeout=10).read()
        finally:
            running.stop()
