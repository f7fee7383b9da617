"""`yolojet serve --devices`: engine worker processes behind one front, with a real server on 127.0.0.1 and a real
gRPC client. Two workers on the CPU (the reference backend) share the requests and answer as an engine in this process
does; killing one mid-load, or stopping one so that it hangs, loses no accepted request (its batches go to the other)
and it is started again."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
from support import RunningServer, calibrated_model
from ultralytics.utils import ASSETS

import yolojet
from yolojet.engine.engine import Engine
from yolojet.errors import EngineConfigError
from yolojet.scale import server_workers
from yolojet.scale.devices import parse_devices
from yolojet.scale.server_workers import PoolRunner, WorkerPool
from yolojet.serve.models import ModelSpec
from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb
from yolojet.serve.server import ServeOptions

BUS = (ASSETS / "bus.jpg").read_bytes()
ZIDANE = (ASSETS / "zidane.jpg").read_bytes()
CONF = 0.001


def rows(reply: pb.InferReply) -> np.ndarray:
    return np.array(
        [[d.box.x1, d.box.y1, d.box.x2, d.box.y2, d.confidence, d.class_id] for d in reply.detections], dtype=np.float32
    ).reshape(-1, 6)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return yolojet.export(calibrated_model("yolo11n.yaml", 64), out=tmp_path_factory.mktemp("workers") / "m", imgsz=64)


def test_two_workers_answer_as_the_engine_and_a_killed_or_hung_one_loses_no_request(model_dir, monkeypatch):
    pool = WorkerPool(
        [ModelSpec(str(model_dir), 2)], parse_devices("cpu,cpu"), {"backend": "reference", "decoder": "cpu"}
    )
    models = pool.start()
    runner = partial(PoolRunner, pool=pool)
    running = RunningServer(models, replace(ServeOptions(), port=0, slo_ms=120_000, decoder="cpu"), runner=runner)
    try:
        stub = running.stub()
        with Engine.load(model_dir, device="cpu", backend="reference") as engine:
            want = {name: engine([data], conf=CONF)[0].boxes.data for name, data in (("bus", BUS), ("zidane", ZIDANE))}
        images = [("bus", BUS), ("zidane", ZIDANE)] * 8

        def infer(item):
            return item[0], stub.Infer(pb.InferRequest(image=item[1], conf=CONF), timeout=120)

        with concurrent.futures.ThreadPoolExecutor(8) as calls:
            for name, reply in calls.map(infer, images):
                np.testing.assert_allclose(rows(reply), want[name], rtol=1e-5, atol=0.02)
        assert all(w.batches > 0 for w in pool.workers), [w.batches for w in pool.workers]

        victim = pool.workers[0]
        with concurrent.futures.ThreadPoolExecutor(8) as calls:
            pending = [calls.submit(infer, item) for item in images * 2]
            deadline = time.monotonic() + 60
            while not victim.in_flight and time.monotonic() < deadline:
                time.sleep(0.005)
            assert victim.in_flight, "the worker never held a batch"
            os.kill(victim.process.pid, signal.SIGKILL)
            for future in pending:  # every accepted request answered, by the other worker or after the restart
                name, reply = future.result(timeout=180)
                np.testing.assert_allclose(rows(reply), want[name], rtol=1e-5, atol=0.02)
        assert running.server.runner.retried >= 1
        deadline = time.monotonic() + 120
        while victim.restarts == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert victim.restarts == 1 and victim.live
        assert len(stub.Infer(pb.InferRequest(image=BUS, conf=CONF), timeout=60).detections) == len(want["bus"])

        # A worker that stops answering (stopped, not dead: its pipe stays open) is killed once it has held a batch
        # for HUNG_AFTER_S, and its batches go to the other.
        monkeypatch.setattr(server_workers, "HUNG_AFTER_S", 3.0)
        stuck = pool.workers[1]
        os.kill(stuck.process.pid, signal.SIGSTOP)
        with concurrent.futures.ThreadPoolExecutor(8) as calls:
            for name, reply in calls.map(infer, images):
                np.testing.assert_allclose(rows(reply), want[name], rtol=1e-5, atol=0.02)
        deadline = time.monotonic() + 120
        while stuck.restarts == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stuck.restarts == 1 and stuck.live
    finally:
        running.stop()
    assert all(not w.process.is_alive() for w in pool.workers)


def test_devices_are_checked_before_any_worker_starts():
    assert parse_devices("cpu,cpu") == ["cpu", "cpu"]
    for text, reason in (("gpu7", "is no device"), ("7", "no CUDA device 7"), ("", "is no device")):
        with pytest.raises(EngineConfigError, match=reason):
            parse_devices(text)
    if not __import__("torch").cuda.is_available():
        with pytest.raises(EngineConfigError, match="no CUDA device"):
            parse_devices("all")
