#!/usr/bin/env bash
# A whole GPU check in one command: the end-to-end benchmark of every task (each checked against the fp32
# reference backend), the test suite on the device (kernels at full shapes, whole models, the predict
# paths against ultralytics), the cold and cached start-up, then the network benchmark. Results land in $OUT. Each stage has its own
# time limit (seconds, overridable) so that one slow stage cannot cost the others' results.
#   bash bench/gpu_check.sh   # for a GPU machine without network access: the cp312 wheels of ultralytics, ultralytics-thop
#                             # and pycocotools in .whl/ beside the code (and pytest-xdist + execnet for parallel test workers;
#                             # for the server and the labeling client, grpcio 1.85.1 and protobuf 7.35.1, which the generated
#                             # code needs, grpcio-health-checking, grpcio-reflection, grpcio-status with
#                             # googleapis-common-protos, and orjson; nvidia-nvjpeg and nvidia-nvimgcodec-cu13 for the
#                             # hardware decoders; cryptography and cffi for the TLS test)
#   STAGES="tests startup" TESTS=tests/pipeline bash bench/gpu_check.sh      # stages: pipeline tests startup images reads formats switch serve overload one_to_one network compile counters
#   STAGES=counters COUNTERS_KERNEL=conv2d_nhwc COUNTERS_SKIP=4 COUNTERS_COUNT=1 bash bench/gpu_check.sh  # Nsight Compute's full set on run(64)'s fifth gathering conv
#   STAGES=one_to_one bash bench/gpu_check.sh   # bench/bench_one_to_one.py: YOLO26's one-to-one selection, torch ops vs our kernels
#   STAGES=images IMAGES_FLAGS="--stages decoders call --files 2000" bash bench/gpu_check.sh  # bench/bench_images.py
#   STAGES=compile COMPILE_JOBS="yolov8n:1 yolo26n:1" bash bench/gpu_check.sh  # torch.compile's one-off timings, one job a GPU
#   STAGES=compile COMPILE_JOBS="a:1 b:64 c:1" COMPILE_DEADLINE=530 bash bench/gpu_check.sh  # a then c on GPU 0, b on GPU 1
#   Side by side on two GPUs, each on its own cores and output folder:
#   STAGES=compile COMPILE_GPUS=1 OUT=$OUT/compile taskset -c 12-31 bash bench/gpu_check.sh &
#   CUDA_VISIBLE_DEVICES=0 STAGES="pipeline tests" OUT=$OUT/gpu0 taskset -c 0-11 bash bench/gpu_check.sh; wait
# The result files name the commit measured: pass YOLOJET_COMMIT=<hash> where the checkout is a copy without .git.
set -uo pipefail
OUT=${OUT:-bench/results/gpu}
STAGES=${STAGES:-pipeline tests network}
mkdir -p "$OUT"
# Installed once a machine: two of these scripts side by side (compile on one GPU, the rest on another) share it.
# Installed again when .whl holds other wheels than the last install (a warm machine keeps /tmp/site).
if [ "$(ls .whl 2>/dev/null)" != "$(cat /tmp/site/.wheels 2>/dev/null)" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  ls .whl > /tmp/site/.wheels
fi
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH  # py-spy
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
for stage in $STAGES; do
  case $stage in
  pipeline)
    timeout "${PIPELINE_SECONDS:-330}" python3 bench/bench_pipeline.py --iters 100 --profile ${PIPELINE_FLAGS:-} --out "$OUT" \
      --models ${PIPELINE_MODELS:-yolo11n yolo11n-seg yolo11n-pose yolo11n-obb yolo11n-cls yolov8n yolo26n} \
      > "$OUT/pipeline.log" 2>&1
    tail -14 "$OUT/pipeline.log" ;;
  tests)
    # SIGINT at the limit: pytest still prints its summary of what failed so far. A test whose code turns
    # SIGINT into an exit status (the CLI's) swallows it, so a KILL follows 30 s later; failures are printed
    # as they happen, so the log keeps them either way. Compiling kernels on a bare machine is most of a test
    # run: with pytest-xdist in .whl, TEST_WORKERS processes (16 by default, a core each) take tests as they
    # free up (worksteal: one file's tests were 500 s of a 543 s run when each file stayed on one worker), and
    # Triton's cache on disk lets a kernel compiled by one serve the others. Each process compiles its own kernels
    # (YOLOJET_COMPILE_WORKERS=0) on one thread: sixteen processes each starting a pool of sixteen compile workers
    # ran the machine at 16 times its cores (a pooling kernel's test took 177 s).
    workers=()
    if python3 -c "import xdist" 2>/dev/null; then workers=(-n "${TEST_WORKERS:-16}" --dist worksteal); fi
    # The GPU tier (make test-gpu): every kernel test at full shapes, the engine's tests, the whole-model tests for
    # the yolo11n family of each task (the other families' runs repeat the same kernels), the server and the
    # labeling client on the GPU. TESTS and TEST_K replace them.
    tier="tests/kernels tests/engine tests/pipeline tests/test_decoders.py tests/serve tests/client"
    YOLOJET_COMPILE_WORKERS=${YOLOJET_COMPILE_WORKERS:-0} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} \
      YOLOJET_NOTUNE=1 YOLOJET_LIVE_FAILURES=1 timeout -s INT -k 30 "${TEST_SECONDS:-540}" python3 -m pytest ${TESTS:-$tier} \
      -k "${TEST_K:-not yolov8n and not yolo26n and not yolo11s and not yolo11m}" \
      "${workers[@]}" -q -p no:cacheprovider --tb=short -rfE --junitxml "$OUT/tests.xml" ${TEST_FLAGS:-} > "$OUT/tests.log" 2>&1
    # Which tests ran before the limit, a line a file: a stage cut short says where to pick up.
    python3 -c "import collections, sys, xml.etree.ElementTree as et
ran = collections.Counter(c.get('classname') or '(cut short)' for c in et.parse(sys.argv[1]).iter('testcase'))
print('\n'.join(f'{n:5d} {name}' for name, n in sorted(ran.items())))" "$OUT/tests.xml" > "$OUT/tests-ran.txt" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -25 ;;
  startup)
    timeout "${STARTUP_SECONDS:-200}" python3 bench/bench_network.py --models yolo11n --startup-only --out "$OUT" \
      > "$OUT/startup.log" 2>&1
    tail -3 "$OUT/startup.log" ;;
  compile)
    # torch.compile max-autotune takes minutes a model and batch size: the peers alone (no yolojet build), one job
    # a GPU at a time, each with its own time limit and output folder. A compile can outlast one run: inductor
    # records each autotuned kernel's timings as it goes (cache/ under its cache dir), kept per job under
    # .inductor-autotune/ and packed into $OUT/inductor-autotune.tgz (unpack it in the checkout's root before the next
    # run), so the next run's compile of the same job skips what was timed.
    # COMPILE_GPUS: the GPU indices the jobs share (all by default). Job i goes to GPU i mod their count, and each GPU
    # runs its jobs one after another, so a short job never holds a long one back. COMPILE_DEADLINE (seconds from
    # the stage's start) ends every job by then, however many are queued, so the archive below is always written
    # within the caller's time limit; a job left with under a minute does not start.
    read -ra gpu_list <<< "${COMPILE_GPUS:-$(seq -s ' ' 0 $(($(nvidia-smi -L | wc -l) - 1)))}"
    read -ra jobs <<< "${COMPILE_JOBS:-yolo11n:64}"
    stage_end=$((SECONDS + ${COMPILE_DEADLINE:-100000}))
    for lane in "${!gpu_list[@]}"; do
      (
        for ((i = lane; i < ${#jobs[@]}; i += ${#gpu_list[@]})); do
          job=${jobs[$i]} model=${jobs[$i]%%:*} batch=${jobs[$i]##*:}
          limit=$((stage_end - SECONDS))
          if [ "$limit" -gt "${COMPILE_SECONDS:-540}" ]; then limit=${COMPILE_SECONDS:-540}; fi
          if [ "$limit" -lt 60 ]; then echo "$job: not started, $limit s were left" > "$OUT/compile-$model-$batch.log"; continue; fi
          mkdir -p ".inductor-autotune/$model-$batch"
          TORCHINDUCTOR_CACHE_DIR="$PWD/.inductor-autotune/$model-$batch" CUDA_VISIBLE_DEVICES=${gpu_list[$lane]} \
            timeout "$limit" python3 bench/bench_network.py --models "$model" --batches "$batch" \
            --repeats 100 --compile --peers-only --out "$OUT/compile-$model-$batch" > "$OUT/compile-$model-$batch.log" 2>&1
          echo "$job: exit status $?, limit $limit s" >> "$OUT/compile-$model-$batch.log"
        done
      ) &
    done
    wait
    for job in "${jobs[@]}"; do
      model=${job%%:*} batch=${job##*:}
      log="$OUT/compile-$model-$batch.log"
      echo "$job: $(grep -c '^AUTOTUNE' "$log") kernels autotuned in this run, from $(grep -m1 '^AUTOTUNE' "$log")"
    done
    # One archive: nested folders are awkward to copy back from a remote machine.
    tar czf "$OUT/inductor-autotune.tgz" .inductor-autotune/*/cache 2>/dev/null
    grep -h "torch.compile" "$OUT"/compile-*.log ;;
  images)
    # Decoders, engine(list of paths), the stream over files on disk, batch-1 latency, agreement, start-up.
    timeout "${IMAGES_SECONDS:-400}" python3 bench/bench_images.py --out "$OUT" ${IMAGES_FLAGS:-} > "$OUT/images.log" 2>&1
    [ -f "$OUT/pyspy-startup.txt" ] && gzip -f "$OUT/pyspy-startup.txt"  # collapsed stacks: tens of MB unpacked
    tail -22 "$OUT/images.log" ;;
  reads)
    # A JPEG file's read into new bytes with glibc's defaults and with keep_freed_memory (bench/bench_file_reads.py).
    timeout "${READS_SECONDS:-60}" python3 bench/bench_file_reads.py --out "$OUT" > "$OUT/reads.log" 2>&1
    tail -5 "$OUT/reads.log" ;;
  formats)
    # label's formats pass (COCO, YOLO dataset) on this machine's disk and cores (bench/bench_label_formats.py).
    timeout "${FORMATS_SECONDS:-240}" python3 bench/bench_label_formats.py --records 100000 --workers 1 0 \
      > "$OUT/formats.json" 2> "$OUT/formats.log"
    timeout "${FORMATS_SECONDS:-240}" python3 bench/bench_label_formats.py --records 10000 --task segment --workers 1 0 \
      > "$OUT/formats-segment.json" 2>> "$OUT/formats.log"
    cat "$OUT/formats.json" "$OUT/formats-segment.json" | grep -E '"(coco|yolo) |seconds' ;;
  switch)
    # The feed beside a thread running Python code at several switch intervals (bench/bench_switch.py).
    timeout "${SWITCH_SECONDS:-120}" python3 bench/bench_switch.py --files 2000 --out "$OUT/switch.json" > "$OUT/switch.log" 2>&1
    tail -3 "$OUT/switch.log" ;;
  serve)
    # The gRPC server and the labeling client end to end (bench/bench_serve.py; SERVE_FLAGS="--devices 0" adds the
    # worker-process server and labeler).
    timeout "${SERVE_SECONDS:-400}" python3 bench/bench_serve.py --out "$OUT" ${SERVE_FLAGS:-} > "$OUT/serve.log" 2>&1
    tail -12 "$OUT/serve.log" ;;
  overload)
    # One server with two models under an open-loop load: 0.8x, 2x and 0.5x the rate it sustains (bench/bench_overload.py).
    timeout "${OVERLOAD_SECONDS:-400}" python3 bench/bench_overload.py --out "$OUT" ${OVERLOAD_FLAGS:-} > "$OUT/overload.log" 2>&1
    tail -12 "$OUT/overload.log" ;;
  one_to_one)
    # YOLO26's one-to-one selection alone: the torch ops against our kernels (bench/bench_one_to_one.py).
    timeout "${ONE_TO_ONE_SECONDS:-300}" python3 bench/bench_one_to_one.py --profile ${ONE_TO_ONE_FLAGS:-} \
      --out "$OUT/one_to_one.json" > "$OUT/one_to_one.log" 2>&1
    tail -12 "$OUT/one_to_one.log" ;;
  counters)
    # Nsight Compute's full set (stall reasons, occupancy, memory) on COUNTERS_COUNT launches of kernels matching
    # COUNTERS_KERNEL in one run(COUNTERS_BATCH) of yolo11n's 640x480 path, after COUNTERS_SKIP matching ones
    # (bench/kernel_counters.py), as CSV; without ncu on the machine, a line saying so.
    ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
    if [ -z "$ncu_bin" ]; then
      echo "counters: no ncu on this machine" | tee "$OUT/counters.log"
    else
      timeout "${COUNTERS_SECONDS:-300}" "$ncu_bin" --profile-from-start off --clock-control none \
        --target-processes application-only --kernel-name "regex:${COUNTERS_KERNEL:-conv2d_nhwc}" \
        --launch-skip "${COUNTERS_SKIP:-0}" --launch-count "${COUNTERS_COUNT:-1}" --set full --csv --page details \
        python3 bench/kernel_counters.py --batch "${COUNTERS_BATCH:-64}" > "$OUT/counters.csv" 2> "$OUT/counters.log"
      tail -3 "$OUT/counters.log"
      # Quoted fields: 5 the kernel, 13 the metric, 15 its value.
      grep -E '"(Duration|Achieved Occupancy|Warp Cycles Per Issued Instruction|Registers Per Thread)"' \
        "$OUT/counters.csv" | awk -F'","' '{print $1 "\t" $5 "\t" $13 "\t" $15}' | head -40
    fi ;;
  network)
    timeout "${NETWORK_SECONDS:-300}" python3 bench/bench_network.py --models ${MODELS:-yolo11n yolov8n yolo26n} \
      --batches ${BATCHES:-1 64} --repeats 100 ${NETWORK_FLAGS:-} --out "$OUT" > "$OUT/network.log" 2>&1
    tail -30 "$OUT/network.log" ;;
  esac
done
# More than PACK_AT result files (8: what one call brings back from a remote machine) go into one archive. A call that
# runs this script several times, each with an OUT of its own below the call's, sets PACK_AT=1: one archive each.
if [ "$(find "$OUT" -type f | wc -l)" -gt "${PACK_AT:-8}" ]; then
  tar czf /tmp/all.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/all.tgz "$OUT/all.tgz"
fi
