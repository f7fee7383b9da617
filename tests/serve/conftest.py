"""A real server on 127.0.0.1 for the service tests: models of every task with random weights and BatchNorm
statistics measured on the shipped photos, on the CPU (reference backend, CPU decoder), served from an asyncio loop
on a thread of the test process; clients are real gRPC channels."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from support import RunningServer, calibrated_model, served

import yolojet
from yolojet.serve.server import ServeOptions

# name: (architecture, input size)
TASK_MODELS = {
    "detect": ("yolov8n.yaml", 320),
    "segment": ("yolov8n-seg.yaml", 320),
    "pose": ("yolov8n-pose.yaml", 320),
    "obb": ("yolov8n-obb.yaml", 320),
    "classify": ("yolov8n-cls.yaml", 64),
}


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    return {
        task: yolojet.export(calibrated_model(cfg, size), out=root / task, imgsz=size)
        for task, (cfg, size) in TASK_MODELS.items()
    }


@pytest.fixture(scope="module")
def server(model_dirs):
    """Every task's model behind one server, a generous SLO (the CPU is slow)."""
    torch.set_num_threads(2)
    models = {task: served(task, path) for task, path in model_dirs.items()}
    running = RunningServer(models, replace(ServeOptions(), port=0, slo_ms=60_000, metrics_port=0, decoder="cpu"))
    yield running
    running.stop()
