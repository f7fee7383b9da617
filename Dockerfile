# yolojet serve on an NVIDIA GPU (the host needs the NVIDIA container toolkit and a CUDA 13 driver):
#   docker build -t yolojet .
#   docker run --gpus all --stop-timeout 40 -p 50051:50051 -p 9090:9090 -v yolojet-cache:/cache yolojet --model yolo11n.pt:64
# Models named like yolo11n.pt are fetched by ultralytics at start-up into /cache (the volume, so once); mount a folder
# of model directories or checkpoints instead where the container has no internet (-v /models:/models ... --model
# /models/best.pt). SIGTERM drains: calls in flight get --grace-s (30 s), so give `docker stop` longer than that.
FROM nvidia/cuda:13.0.0-base-ubuntu24.04
# gcc and the Python headers: Triton compiles its kernel launcher when the engine first runs. libgl1 and libglib2.0:
# opencv-python's own libraries. tini: PID 1 that passes SIGTERM on and reaps `--processes`' workers.
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev \
        libgl1 libglib2.0-0 tini \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/yolojet && useradd --create-home --uid 10001 yolojet \
    && mkdir /cache && chown yolojet /cache
ENV PATH=/opt/yolojet/bin:$PATH PYTHONUNBUFFERED=1
WORKDIR /opt/yolojet/src
COPY pyproject.toml README.md constraints.txt ./
COPY yolojet ./yolojet
RUN pip install --no-cache-dir -c constraints.txt ".[export]"
# The kernel and tuning caches and fetched checkpoints, kept in a volume so that a restarted container starts in
# seconds.
ENV YOLOJET_CACHE=/cache TRITON_CACHE_DIR=/cache/triton
VOLUME /cache
WORKDIR /cache
USER yolojet
EXPOSE 50051 9090
HEALTHCHECK --start-period=300s CMD python3 -c "import grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; \
    s = g.HealthStub(grpc.insecure_channel('127.0.0.1:50051')).Check(h.HealthCheckRequest(), timeout=5).status; \
    raise SystemExit(s != h.HealthCheckResponse.SERVING)"
ENTRYPOINT ["tini", "--", "yolojet", "serve", "--host", "0.0.0.0", "--metrics-port", "9090"]
CMD ["--model", "yolo11n.pt:64"]
