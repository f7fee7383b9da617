"""End-to-end benchmark on one GPU, every task: a raw frame in memory → results in pinned host memory.

For each model (random weights, BatchNorm statistics measured on the shipped photos so that NMS has
real work): build the engine (fp16, batch 1), check its results against the reference backend (fp32
torch ops), then time with wall clock (what a caller waits, launch and sync included), median of
--iters runs:
  - the whole path from a frame in pinned host memory, `preprocess` (its copy to the GPU) and `run` each time,
  - the whole path from a frame already on the GPU, `preprocess` (its copy into the engine's slot) and `run`,
  - the same path's graph replayed and timed with CUDA events (device time, no host launch or sync),
  - the network alone (graph replay, CUDA events), so that path (device) − network = what preprocess and
    the head add,
  - ultralytics' predict on the same GPU with the same weights (fp16),
  - PyTorch eager: the same ultralytics model in fp16 on an input already letterboxed on the GPU,
    network only (a lower bound for any eager pipeline),
  - with --sequential-row, the path again with every launch in order on one stream instead of independent
    launches on parallel streams (its results checked equal first).
The task comes from the name (yolo11n, yolo11n-seg, -pose, -obb, -cls); image sizes default to
ultralytics' (OBB 1024, classify 224, else 640). Prints a markdown table last; writes JSON under --out.

    python bench/bench_pipeline.py --models yolo11n yolo11n-seg yolo11n-pose yolo11n-obb yolo11n-cls --out results/
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support import calibrated_model, match_detections, real_photos

import yolojet
from yolojet.engine.engine import Engine
from yolojet.timing import provenance, time_calls, time_on_device

DEFAULT_IMGSZ = {"obb": 1024, "cls": 224}


def wall_ms(fn, iters: int, warmup: int = 20) -> float:
    """The median (p50) wall time of fn, in ms."""
    return time_calls(fn, iters, warmup).p50 * 1000


def agreement(ours, truth) -> dict:
    """How the engine's results differ from the reference backend's on the same frame."""
    found: dict = {}
    if ours.probs is not None:
        found["same_top5"] = list(ours.probs.top5) == list(truth.probs.top5)
        found["max_abs_dprob"] = float(np.abs(ours.probs.data - truth.probs.data).max())
        return found
    if ours.obb is not None:
        found["count"], found["reference_count"] = len(ours.obb.data), len(truth.obb.data)
        if len(ours.obb.data) == len(truth.obb.data) and len(ours.obb.data):
            found["max_abs_dxywhr_conf_cls"] = float(np.abs(ours.obb.data - truth.obb.data).max())
        return found
    found["mismatches"] = match_detections(ours.boxes.data, truth.boxes.data)
    found["count"], found["reference_count"] = len(ours.boxes.data), len(truth.boxes.data)
    same = not found["mismatches"] and len(ours.boxes.data) > 0
    if ours.masks is not None and same:
        a, b = ours.masks.data.reshape(len(ours.masks.data), -1), truth.masks.data.reshape(len(truth.masks.data), -1)
        inter, union = (a[:, None] & b[None]).sum(-1), (a[:, None] | b[None]).sum(-1)
        found["worst_best_mask_iou"] = float((inter / np.maximum(union, 1)).max(1).min())
    if ours.keypoints is not None and same:
        order = [int(np.argmin(np.abs(truth.boxes.data[:, :4] - row[:4]).sum(1))) for row in ours.boxes.data]
        found["max_keypoint_px"] = float(np.abs(ours.keypoints.xy - truth.keypoints.xy[order]).max())
    return found


def replay_ms(graph: torch.cuda.CUDAGraph, iters: int, warmup: int = 20) -> float:
    """The median (p50) device time of one replay of a captured graph, in ms, without the host's launch and sync."""
    return time_on_device(graph.replay, iters, warmup).p50 * 1000


def kernel_profile(run, iters: int = 20) -> list[dict]:
    """Device time per kernel (or copy) name inside `run`'s graph, summed over `iters` runs, per run, largest first."""
    from torch.profiler import ProfilerActivity, profile

    run()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            run()
    totals: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type.name == "CUDA":
            totals.setdefault(event.name, []).append(
                event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
            )
    rows = [{"name": k[:90], "per_run_us": sum(v) / iters, "calls_per_run": len(v) / iters} for k, v in totals.items()]
    return sorted(rows, key=lambda r: -r["per_run_us"])


def timeline(run, replays: int = 5) -> dict:
    """Where one run's device time goes: each kernel and copy of the last of `replays` profiled runs, with its
    start (µs from the first), duration and the idle time before it (no other launch of the run busy), plus
    the run's span, the time some launch was busy, and the idle gaps summed."""
    from torch.profiler import ProfilerActivity, profile

    run()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            run()
            torch.cuda.synchronize()
    device = [e for e in prof.events() if e.device_type.name == "CUDA"]
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in device)
    per_run = len(spans) // replays
    spans = spans[-per_run:]  # the last run's launches (every run has the same ones)
    origin, busy_until, busy, rows = spans[0][0], spans[0][0], 0.0, []
    for start, end, name in spans:
        idle = max(0.0, start - busy_until)
        busy += max(0.0, end - max(start, busy_until))
        busy_until = max(busy_until, end)
        rows.append({"name": name[:60], "start_us": start - origin, "us": end - start, "idle_before_us": idle})
    span = busy_until - origin
    return {"span_us": span, "busy_us": busy, "idle_us": span - busy, "launches": rows}


def whole_path_ms(engine: Engine, frame: np.ndarray, iters: int) -> dict[str, float]:
    """`preprocess` and `run` of one BGR frame, wall clock, from pinned host memory and from the GPU. Each timed call
    stages the frame and runs, as a caller does: the frame's copy into the engine is in the path."""
    rgb = torch.from_numpy(frame[..., ::-1].copy())
    timed = {}
    for where, pixels in (("host", rgb.pin_memory()), ("gpu", rgb.cuda())):
        timed[f"{where}_frame_ms"] = wall_ms(lambda pixels=pixels: (engine.preprocess(pixels, 0), engine.run(1)), iters)
    return timed


def time_sequential(model_dir: Path, frame: np.ndarray, parallel_result, conf: float, iters: int) -> dict:
    """The same path with every launch in order on one stream (same tile picks, from the tuning cache): its
    results must equal those of the engine with parallel streams; then its timings."""
    engine = Engine.load(model_dir, device="cuda", half=True, max_batch=1, buckets=[1], branches=False)
    found = {"same_results": engine(frame, conf=conf)[0].to_json() == parallel_result.to_json()}
    engine.configure(conf=conf)
    found.update(whole_path_ms(engine, frame, iters))
    found["network_ms"] = engine.time_network(1, repeats=iters).p50 * 1000
    return found


def bench(name: str, iters: int, conf: float, work: Path, profile: bool, sequential_row: bool) -> dict:
    from copy import deepcopy

    from ultralytics import YOLO

    task = name.rsplit("-", 1)[1] if "-" in name else "detect"
    imgsz = DEFAULT_IMGSZ.get(task, 640)
    model = calibrated_model(f"{name}.yaml", imgsz=imgsz)
    model_dir = yolojet.export(model, out=work / name, imgsz=imgsz)
    start = time.perf_counter()
    engine = Engine.load(model_dir, device="cuda", half=True, max_batch=1, buckets=[1])
    row = {"model": name, "imgsz": imgsz, "build_s": time.perf_counter() - start}
    reference = Engine.load(model_dir, device="cuda", backend="reference")
    frame = real_photos()["bus.jpg"]  # 1080 x 810, BGR
    ours, truth = engine(frame, conf=conf)[0], reference(frame, conf=conf)[0]
    row["frame"] = list(frame.shape)
    row["vs_reference_fp32"] = agreement(ours, truth)

    engine.configure(conf=conf)
    row.update(whole_path_ms(engine, frame, iters))
    path_graph = next(reversed(engine._path.graphs.values()))[0]  # the graph the last run replayed
    row["gpu_frame_device_ms"] = replay_ms(path_graph, iters)
    row["network_ms"] = engine.time_network(1, repeats=iters).p50 * 1000
    if profile:
        try:
            row["kernels"] = kernel_profile(lambda: engine.run(1))
        except Exception as e:  # the profile is extra information; never lose the timings over it
            row["kernels"] = [{"name": f"profile failed: {type(e).__name__}: {e}", "per_run_us": 0, "calls_per_run": 0}]
        print(f"{name}: device time per run by kernel (us)", flush=True)
        for k in row["kernels"][:25]:
            print(f"  {k['per_run_us']:8.2f}  x{k['calls_per_run']:<5.1f} {k['name']}", flush=True)
        try:
            row["timeline"] = timeline(lambda: engine.run(1))
            t = row["timeline"]
            print(
                f"{name}: one run under the profiler: span {t['span_us']:.1f} us, busy {t['busy_us']:.1f}, "
                f"idle {t['idle_us']:.1f} over {len(t['launches'])} launches",
                flush=True,
            )
            for r in sorted(t["launches"], key=lambda r: -r["idle_before_us"])[:8]:
                print(f"  idle {r['idle_before_us']:6.2f} us before {r['name']} at {r['start_us']:.1f}", flush=True)
        except Exception as e:
            row["timeline"] = {"error": f"{type(e).__name__}: {e}"}

    row["streams"] = engine.network.schedule(1).streams
    if sequential_row:
        row["sequential"] = time_sequential(model_dir, frame, ours, conf, iters)
        print(f"{name}: {row['streams']} streams; on one stream {row['sequential']}", flush=True)

    wrapper = YOLO(f"{name}.yaml", verbose=False)
    wrapper.model = deepcopy(model).cuda()
    predict = lambda: wrapper.predict(frame, imgsz=imgsz, conf=conf, half=True, verbose=False)  # noqa: E731
    row["ultralytics_predict_ms"] = wall_ms(predict, max(iters // 4, 10), warmup=5)
    eager = deepcopy(model).cuda().half().eval()
    x = torch.rand(1, 3, imgsz, imgsz, device="cuda", dtype=torch.half)

    def eager_forward() -> None:
        with torch.inference_mode():
            eager(x)
        torch.cuda.synchronize()

    row["eager_network_ms"] = wall_ms(eager_forward, max(iters // 4, 10), warmup=5)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["yolo11n", "yolov8n", "yolo26n"])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--conf", type=float, default=0.01, help="low enough that random weights give NMS real work")
    parser.add_argument("--profile", action="store_true", help="also print device time per kernel of the whole path")
    parser.add_argument(
        "--sequential-row", action="store_true", help="also time the path with every launch in order on one stream"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    work = Path(tempfile.mkdtemp(prefix="yolojet-bench-"))  # exported models stay out of the results folder
    for name in args.models:
        try:
            rows.append(bench(name, args.iters, args.conf, work, args.profile, args.sequential_row))
        except Exception as e:  # one model failing must not cost the others' numbers
            traceback.print_exc()
            rows.append({"model": name, "error": f"{type(e).__name__}: {e}"})
        (args.out / "pipeline.json").write_text(json.dumps(provenance() | {"models": rows}, indent=1))
    lines = [
        f"{torch.cuda.get_device_name()}, fp16, batch 1, 810x1080 frame, conf {args.conf}, median ms (wall clock)",
        "",
        "| model | imgsz | frame in pinned host memory | frame on GPU | same, device time | network only "
        "| added by pre+head (device) "
        "| ultralytics predict | PyTorch eager network | agreement with fp32 reference |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | failed: {r['error'][:200]} |")
            continue
        lines.append(
            f"| {r['model']} | {r['imgsz']} | {r['host_frame_ms']:.3f} | {r['gpu_frame_ms']:.3f} "
            f"| {r['gpu_frame_device_ms']:.3f} | {r['network_ms']:.3f} "
            f"| {r['gpu_frame_device_ms'] - r['network_ms']:.3f} | {r['ultralytics_predict_ms']:.2f} "
            f"| {r['eager_network_ms']:.2f} | {json.dumps(r['vs_reference_fp32'])[:160]} |"
        )
    table = "\n".join(lines)
    (args.out / "pipeline.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
