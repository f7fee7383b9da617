"""One `run(batch)` of yolo11n's whole predict path (640, bus.jpg's 640x480 rectangle by default), for Nsight Compute.

Builds the engine (caches warm it on the second process), stages bus.jpg in every slot, runs the path a few times,
then brackets one more run with the CUDA profiler's start and stop, so that `ncu --profile-from-start off` reads the
counters of that run's kernels alone (each kernel node of the captured graph on its own):

    ncu --profile-from-start off --clock-control none --target-processes application-only \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \\
        python3 bench/kernel_counters.py --batch 64
    ncu --profile-from-start off --clock-control none --target-processes application-only \\
        --kernel-name regex:letterbox --set full python3 bench/kernel_counters.py --batch 64

Without ncu it prints the run's wall time, so the script is checked on any GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--square", action="store_true", help="a 640x640 input for every frame (rect=False)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/kernel_counters"), help="the exported model's folder")
    args = parser.parse_args()

    from bench_images import bus_rgb_cuda, exported_model

    from yolojet.engine.engine import Engine

    model_dir = exported_model(args.work)
    engine = Engine.load(
        model_dir, device="cuda", half=True, max_batch=args.batch, buckets=[args.batch], rect=not args.square
    )
    frame = bus_rgb_cuda()
    for slot in range(args.batch):
        engine.preprocess(frame, slot)
    for _ in range(5):
        engine.run(args.batch)
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.cuda.profiler.start()
    engine.run(args.batch)
    torch.cuda.profiler.stop()
    print(
        f"run({args.batch}) of {engine.input_shape_of(tuple(frame.shape[:2]))[0]}: "
        f"{(time.perf_counter() - start) * 1e3:.3f} ms (under a profiler, its replays)",
        flush=True,
    )
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
