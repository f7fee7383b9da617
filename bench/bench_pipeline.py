"""End-to-end benchmark on one GPU: a raw frame in memory → boxes in pinned host memory, in one run.

For each model (random weights, BatchNorm statistics measured on the shipped photos so that NMS has
real work): build the engine (fp16, batch 1), check its detections against the reference backend,
then time with wall clock (what a caller waits, launch and sync included), median of --iters runs:
  - the whole path from a frame in pinned host memory (H2D copy inside the graph),
  - the whole path from a frame already on the GPU,
  - the network alone (graph replay, CUDA events), so that path − network = what preprocess and the
    head add,
  - ultralytics' predict on the same GPU with the same weights, for reference.
Prints a markdown table last; writes JSON under --out.

    python bench/bench_pipeline.py --models yolo11n --out results/
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support import calibrated_model, match_detections, real_photos

import yolojet
from yolojet.runtime.engine import Engine


def wall_ms(fn, iters: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def bench(name: str, iters: int, conf: float, work: Path) -> dict:
    from copy import deepcopy

    from ultralytics import YOLO

    model = calibrated_model(f"{name}.yaml")
    model_dir = yolojet.export(model, out=work / name, imgsz=640)
    engine = Engine.load(model_dir, device="cuda", half=True, max_batch=1, buckets=[1])
    reference = Engine.load(model_dir, device="cuda", backend="reference")
    frame = real_photos()["bus.jpg"]  # 1080 x 810, BGR
    ours, truth = engine(frame, conf=conf)[0], reference(frame, conf=conf)[0]
    row = {"model": name, "frame": list(frame.shape), "detections": len(ours)}
    row["mismatches_vs_reference_fp32"] = match_detections(ours.boxes.data, truth.boxes.data)

    engine.configure(conf=conf)
    engine.preprocess(frame, 0)
    row["host_frame_ms"] = wall_ms(lambda: engine.run(1), iters)
    engine.preprocess(torch.from_numpy(frame[..., ::-1].copy()).cuda(), 0)
    row["gpu_frame_ms"] = wall_ms(lambda: engine.run(1), iters)
    replays = engine.network.time_replay(1, repeats=iters)
    row["network_ms"] = statistics.median(replays)

    wrapper = YOLO(f"{name}.yaml", verbose=False)
    wrapper.model = deepcopy(model).cuda()
    row["ultralytics_predict_ms"] = wall_ms(
        lambda: wrapper.predict(frame, imgsz=640, conf=conf, half=True, verbose=False), max(iters // 4, 10)
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["yolo11n", "yolov8n", "yolo26n"])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--conf", type=float, default=0.25)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models:
        rows.append(bench(name, args.iters, args.conf, args.out / "models"))
        (args.out / "pipeline.json").write_text(json.dumps(rows, indent=1))
    lines = [
        f"{torch.cuda.get_device_name()}, fp16, batch 1, 810x1080 frame, conf {args.conf}, median ms (wall clock)",
        "",
        "| model | frame in pinned host memory | frame on GPU | network only | added by pre+head | ultralytics |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['host_frame_ms']:.3f} | {r['gpu_frame_ms']:.3f} | {r['network_ms']:.3f} "
            f"| {r['gpu_frame_ms'] - r['network_ms']:.3f} | {r['ultralytics_predict_ms']:.2f} |"
        )
    table = "\n".join(lines)
    (args.out / "pipeline.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
