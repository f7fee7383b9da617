"""The server's Prometheus metrics, in a registry of its own (served over HTTP at `--metrics-port`)."""

from __future__ import annotations

from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Seconds: from well under a millisecond (a run of one image) to the slowest deadline a client might set.
_STAGE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "yolojet_requests",
            "Requests answered, by model and gRPC status code",
            ["model", "code"],
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "yolojet_batch_size",
            "Images a batch",
            ["model"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "yolojet_queue_depth", "Requests waiting for a batch", ["model"], registry=self.registry
        )
        self.stage_seconds = Histogram(
            "yolojet_stage_seconds",
            "Seconds a request spent in each stage",
            ["model", "stage"],
            buckets=_STAGE_BUCKETS,
            registry=self.registry,
        )
        self.gpu_memory = Gauge(
            "yolojet_gpu_memory_bytes",
            "GPU memory held by the process's allocator",
            ["device", "kind"],
            registry=self.registry,
        )
        self._children: dict[tuple, Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, kept: prometheus-client checks the labels and takes a lock on each call (2-3 us,
        several times a request), a dict lookup is a tenth of that."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def watch_gpu_memory(self, devices: list[Any]) -> None:
        """GPU memory read when scraped: allocated and reserved by torch's allocator, per CUDA device."""
        import torch

        for device in devices:
            if device.type != "cuda":
                continue
            name = str(device)
            self.gpu_memory.labels(name, "allocated").set_function(partial(torch.cuda.memory_allocated, device))
            self.gpu_memory.labels(name, "reserved").set_function(partial(torch.cuda.memory_reserved, device))

    def serve_http(self, host: str, port: int) -> Any:
        """Serve /metrics on host:port (port 0: any free port); returns the HTTP server (its port is
        server.server_port)."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return server
