#!/usr/bin/env bash
# One GPU session in one call: the test suite on the device (kernels at larger shapes, whole models, the predict
# path against ultralytics at 640), then the network and end-to-end benchmarks. Results land in $OUT.
#   bash bench/gpu_check.sh            # needs .whl/ from ../shared/device/wheels.sh (ultralytics) beside the code
set -uo pipefail
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
timeout "${TEST_SECONDS:-240}" python3 -m pytest tests/kernels tests/runtime tests/pipeline -q -p no:cacheprovider \
  -k "not classify_matches and not obb and not pose and not segment" 2>&1 | tee "$OUT/tests.log" | tail -8
timeout "${NETWORK_SECONDS:-300}" python3 bench/bench_network.py --models ${MODELS:-yolo11n yolov8n yolo26n} \
  --batches 1 64 --repeats 100 --out "$OUT" 2>&1 | tee "$OUT/network.log" | tail -30
timeout "${PIPELINE_SECONDS:-150}" python3 bench/bench_pipeline.py --models yolo11n --iters 100 --out "$OUT" 2>&1 \
  | tee "$OUT/pipeline.log" | tail -8
