"""`yolojet serve --processes 2 --devices cpu` as a user runs it: two gRPC fronts share one engine worker process.
Calls over new connections reach both fronts and are answered as the engine in this process answers them (a bad image
with its own error); the worker runs the fronts' batches in fewer batches of its own (its metrics say so); a worker
killed outright is started again and the fronts take calls through it once more; SIGTERM stops every process."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import numpy as np
from support import calibrated_model
from test_server_processes import free_port, rows, server_children, wait_for
from ultralytics.utils import ASSETS

import yolojet
from yolojet.engine.engine import Engine
from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb
from yolojet.serve.proto.yolojet.v1 import inference_pb2_grpc as pb_grpc

BUS = (ASSETS / "bus.jpg").read_bytes()
ZIDANE = (ASSETS / "zidane.jpg").read_bytes()
CONF = 0.001


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_two_fronts_share_one_worker_that_batches_their_requests_together_and_restarts(tmp_path):
    model_dir = yolojet.export(calibrated_model("yolo11n.yaml", 64), out=tmp_path / "m", imgsz=64)
    with Engine.load(model_dir, device="cpu", backend="reference") as engine:
        want = {name: engine([data], conf=CONF)[0].boxes.data for name, data in (("bus", BUS), ("zidane", ZIDANE))}
    metrics, log = free_port(), tmp_path / "serve.log"
    command = [sys.executable, "-m", "yolojet", "serve", "--model", f"{model_dir}:4", "--port", "0"]
    command += ["--processes", "2", "--devices", "cpu", "--metrics-port", str(metrics), "--slo-ms", "120000"]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the reference executor, as above
    server = subprocess.Popen(command, stderr=log.open("w"), stdout=subprocess.DEVNULL, env=env)
    try:
        port = wait_for(log, r"listening on 127\.0\.0\.1:(\d+) \(2 processes, sharing 1 engine worker\)", server)[1]
        worker = json.loads(wait_for(log, r'\{[^\n]*"event": "engine worker serving"[^\n]*\}', server)[0])
        assert worker["metrics_port"] == metrics + 2, worker

        def infer(item: tuple[str, bytes]) -> tuple[str, pb.InferReply | grpc.StatusCode]:
            # a connection of its own each time: the kernel picks a front for it
            with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as c:
                request = pb.InferRequest(image=item[1], conf=CONF)
                try:
                    return item[0], pb_grpc.InferenceStub(c).Infer(request, timeout=120)
                except grpc.RpcError as e:
                    return item[0], e.code()

        images = [("bus", BUS), ("zidane", ZIDANE), ("bus", BUS), ("bad", b"not an image")] * 8
        with concurrent.futures.ThreadPoolExecutor(16) as calls:
            answers = list(calls.map(infer, images))
        for name, reply in answers:
            if name == "bad":
                assert reply == grpc.StatusCode.INVALID_ARGUMENT
            else:
                assert isinstance(reply, pb.InferReply), reply
                np.testing.assert_allclose(rows(reply), want[name], rtol=1e-5, atol=0.02)
        answered = [metric(metrics + i, "yolojet_requests_total") for i in (0, 1)]
        assert sum(answered) == len(images) and min(answered) > 0, answered  # both fronts took connections
        # The fronts' batches, queued together in the worker, ran as fewer, larger batches there.
        sent = sum(metric(metrics + i, "yolojet_batch_size_count") for i in (0, 1))
        ran = metric(metrics + 2, "yolojet_batch_size_count")
        assert metric(metrics + 2, "yolojet_batch_size_sum") == len(images)
        assert ran < sent, (ran, sent)

        # The worker killed outright: the parent starts it again and both fronts connect to it once more.
        os.kill(worker["pid"], signal.SIGKILL)
        wait_for(log, r'"event": "restarted", "process": "the engine worker on cpu"', server)
        with concurrent.futures.ThreadPoolExecutor(8) as calls:
            answers = list(calls.map(infer, [("bus", BUS)] * 16))
        for _, reply in answers:  # a call that reached a front before it had reconnected is refused, never lost
            assert isinstance(reply, pb.InferReply) or reply == grpc.StatusCode.UNAVAILABLE, reply
        assert sum(isinstance(reply, pb.InferReply) for _, reply in answers) > 0, answers

        children = server_children(server.pid)
        assert len(children) == 3  # two fronts and the worker
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=120) == 0
        assert all(not Path(f"/proc/{pid}").exists() for pid in children)
        # The only errors logged: the worker's death, by the parent and by each front.
        errors = [line for line in log.read_text().splitlines() if '"level": "error"' in line]
        assert len(errors) == 3 and all("worker died" in line for line in errors), errors
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
