# yolojet serve on an NVIDIA GPU (the host needs the NVIDIA container toolkit and a CUDA 13 driver):
#   docker build -t yolojet .
#   docker run --gpus all -p 50051:50051 -p 9090:9090 yolojet --model yolo11n.pt:64
# Models named like yolo11n.pt are fetched by ultralytics at start-up; mount a folder of model directories or
# checkpoints instead where the container has no internet (-v /models:/models ... --model /models/best.pt).
FROM nvidia/cuda:13.0.0-base-ubuntu24.04
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/yolojet
ENV PATH=/opt/yolojet/bin:$PATH PYTHONUNBUFFERED=1
WORKDIR /opt/yolojet/src
COPY pyproject.toml README.md constraints.txt ./
COPY yolojet ./yolojet
RUN pip install --no-cache-dir ".[export]"
# The kernel and tuning caches, kept in a volume so that a restarted container starts in seconds.
ENV YOLOJET_CACHE=/cache TRITON_CACHE_DIR=/cache/triton
VOLUME /cache
EXPOSE 50051 9090
ENTRYPOINT ["yolojet", "serve", "--host", "0.0.0.0", "--metrics-port", "9090"]
CMD ["--model", "yolo11n.pt:64"]
