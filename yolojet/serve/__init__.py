"""`yolojet serve`: a gRPC inference server (yolojet/serve/proto/yolojet/v1/inference.proto) over engines.

- `models.py`: the served models (name, version, engine, latency measured at start-up);
- `batcher.py`: the deadline-aware dynamic batching and admission control, on an injected clock;
- `runner.py`: the thread that decodes and runs batches on the engines, two in flight;
- `convert.py`: results as protobuf replies;
- `service.py`: the gRPC methods (Infer, InferStream, InferBatchStream, ListModels);
- `metrics.py`: Prometheus metrics;
- `server.py`: the server itself: options, health, reflection, TLS, a bearer token, graceful shutdown.
"""
