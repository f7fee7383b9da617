"""A real server on 127.0.0.1 for the service tests: models of every task with random weights and BatchNorm
statistics measured on the shipped photos, on the CPU (reference backend, CPU decoder), served from an asyncio loop
on a thread of the test process; clients are real gRPC channels."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

import grpc
import pytest
import torch
from support import calibrated_model

import yolojet
from yolojet.engine.engine import Engine
from yolojet.serve.models import ServedModel, measure_latency, weights_version
from yolojet.serve.proto.yolojet.v1 import inference_pb2_grpc as pb_grpc
from yolojet.serve.server import ServeOptions, Server

# name: (architecture, input size)
TASK_MODELS = {
    "detect": ("yolov8n.yaml", 320),
    "segment": ("yolov8n-seg.yaml", 320),
    "pose": ("yolov8n-pose.yaml", 320),
    "obb": ("yolov8n-obb.yaml", 320),
    "classify": ("yolov8n-cls.yaml", 64),
}


class RunningServer:
    """A `Server` on an event loop of its own thread, started at once; `stop()` shuts it down gracefully."""

    def __init__(self, models: dict[str, ServedModel], options: ServeOptions) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = Server(models, options)
        self.call(self.server.start())
        self.address = f"127.0.0.1:{self.server.port}"

    def call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=120)

    def stop(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)

    def stub(self, **channel_options) -> pb_grpc.InferenceStub:
        return pb_grpc.InferenceStub(grpc.insecure_channel(self.address, **channel_options))


def served(name: str, model_dir, max_batch: int = 4, **engine_options) -> ServedModel:
    engine = Engine.load(model_dir, device="cpu", backend="reference", max_batch=max_batch, **engine_options)
    return ServedModel(name, weights_version(engine.graph), engine, measure_latency(engine, repeats=1))


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    return {task: yolojet.export(calibrated_model(cfg, size), out=root / task, imgsz=size)
            for task, (cfg, size) in TASK_MODELS.items()}  # fmt: skip


@pytest.fixture(scope="module")
def server(model_dirs):
    """Every task's model behind one server, a generous SLO (the CPU is slow)."""
    torch.set_num_threads(2)
    models = {task: served(task, path) for task, path in model_dirs.items()}
    running = RunningServer(models, replace(ServeOptions(), port=0, slo_ms=60_000, metrics_port=0, decoder="cpu"))
    yield running
    running.stop()
