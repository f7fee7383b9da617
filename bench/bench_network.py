"""Network-only benchmark on one GPU: yolojet against PyTorch peers, all in one run.

For each model (built from its ultralytics YAML with random weights and BatchNorm statistics):
export, build the engine (fp16, CUDA graphs for batch 1 and the large batch), check its outputs
against the float32 reference executor on the GPU, then time graph replays (CUDA events, median,
warm-up excluded) beside PyTorch eager fp16 (cuDNN), eager channels_last + CUDA graph and,
with --compile, torch.compile(mode="max-autotune-no-cudagraphs") + CUDA graph (--peers-only: the peers
alone, for torch.compile's one-off measurement per model and batch size). Start-up times
(cold: empty kernel and tuning caches; cached: the same caches again) are measured in fresh
processes. --pdl-off-row and --sequential-row add yolojet rows with the same tile picks: ordinary
launches instead of programmatic dependent launch, and every launch in order on one stream instead
of independent launches on parallel streams (checked bit-identical first). Prints a markdown table
last; writes JSON and the table under --out.

    python bench/bench_network.py --models yolo11n yolov8n --batches 1 64 --out results/
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support import random_model, relative_l2

import yolojet
from yolojet.engine.autotune import TuningCache
from yolojet.engine.network import TritonNetwork
from yolojet.ir import Graph
from yolojet.options import EngineOptions
from yolojet.timing import provenance, time_on_device

STARTUP_SNIPPET = """
import collections, json, os, sys, time, numpy as np, torch, triton
from yolojet.engine.engine import Engine

def cpu_seconds():  # this process's threads and its children (ptxas) together
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system

compiles = collections.defaultdict(lambda: [0, 0.0])  # stage (ir = the AST walk, then Triton's lowerings): count, s
finished = []  # (seconds from the load's start, kernel) of each compile
def listen(src, metadata, metadata_group, times, cache_hit):
    finished.append((time.perf_counter() - start, src.name))
    if not cache_hit:
        compiles["kernels"][0] += 1
        for stage, us in [("ir", times.ir_initialization), *times.lowering_stages]:
            compiles[stage][1] += us / 1e6
knobs = getattr(triton, "knobs", None)
if knobs is not None and hasattr(knobs.compilation, "listener"):
    knobs.compilation.listener = listen
torch.cuda.init()
start, cpu_start = time.perf_counter(), cpu_seconds()
engine = Engine.load(sys.argv[1], device="cuda", half=True, max_batch=1)
torch.cuda.synchronize()
loaded, cpu_loaded = time.perf_counter() - start, cpu_seconds() - cpu_start
load_compiles = {k: v[:] for k, v in compiles.items()}
engine(np.random.default_rng(0).integers(0, 256, (1080, 810, 3), dtype=np.uint8))  # the first frame captures its graph
first_result = time.perf_counter() - start
phases = engine.network.startup_seconds
began = engine.network.timing_began  # the first timing starts after the parallel compile
compiled_late = loaded if began is None else began - start
print(json.dumps({
    "load_s": loaded, "first_result_s": first_result, "load_phases_s": phases,
    "load_cpu_s": cpu_loaded, "load_compile_s": load_compiles, "first_result_compiles": compiles["kernels"][0],
    "compiled_one_by_one": collections.Counter(name for t, name in finished if t > compiled_late),
}))
"""


def graphed(fn, example: torch.Tensor):
    """Capture fn(example) in a CUDA graph; returns the replay function."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(example)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(example)
    return graph.replay


GATE = 1e-2  # fp16, the largest relative L2 error of the outputs against the fp32 reference (yolojet compare's)


def check(engine: TritonNetwork, model_dir: Path, imgsz: int) -> float:
    """The largest relative L2 error against the fp32 reference over every batch bucket, each run full (each
    bucket has its own tile picks: the large ones TMA tiles, for example)."""
    reference = yolojet.load_reference(model_dir, device="cuda")
    worst = 0.0
    for bucket in sorted(set(engine.buckets)):
        x = torch.rand(bucket, 3, imgsz, imgsz, device="cuda")
        engine.poison()
        ours, expected = engine.raw(x), reference(x)
        ours = ours if isinstance(ours, tuple) else (ours,)
        expected = expected if isinstance(expected, tuple) else (expected,)
        errors = [relative_l2(o, e) for o, e in zip(ours, expected, strict=True)]
        if any(math.isnan(error) for error in errors):
            return math.nan  # an output left unwritten (NaN from the poisoned buffers); max() would drop it
        worst = max(worst, *errors)
    return worst


def same_outputs(a: TritonNetwork, b: TritonNetwork, imgsz: int, batch: int) -> bool:
    """Whether two builds of one network give bit-identical outputs on the same random batch."""
    x = torch.rand(batch, 3, imgsz, imgsz, device="cuda")
    a.poison()
    b.poison()
    ours, theirs = a.raw(x), b.raw(x)
    ours = ours if isinstance(ours, tuple) else (ours,)
    theirs = theirs if isinstance(theirs, tuple) else (theirs,)
    return all(torch.equal(o, t) for o, t in zip(ours, theirs, strict=True))


def startup_seconds(model_dir: Path, env: dict[str, str]) -> dict:
    """Seconds from a fresh process's `Engine.load` (batch 1) to the engine being ready, and to its first result;
    the load's phases, its CPU seconds (threads and child processes together) and what its Triton compiles cost."""
    result = subprocess.run(
        [sys.executable, "-c", STARTUP_SNIPPET, str(model_dir)], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def device_ms(fn, repeats: int) -> float:
    """The median (p50) device time of fn, in ms, after 10 untimed calls."""
    return time_on_device(fn, repeats, warmup=10).p50 * 1000


def time_peers(
    name: str,
    fused: torch.nn.Module,
    batch: int,
    imgsz: int,
    repeats: int,
    use_compile: bool,
    row: dict,
    yolojet_ms: float | None,
) -> dict[str, float]:
    """Milliseconds per batch of the PyTorch peers: eager fp16, eager channels_last + CUDA graph and, with
    `use_compile`, torch.compile max-autotune + CUDA graph (its build time goes into row["compile_s"])."""
    x = torch.rand(batch, 3, imgsz, imgsz, device="cuda", dtype=torch.float16)
    times = {}
    with torch.inference_mode():
        times["eager"] = device_ms(lambda: fused(x), repeats)
        fused_cl = fused.to(memory_format=torch.channels_last)
        x_cl = x.contiguous(memory_format=torch.channels_last)
        times["eager_cl_graph"] = device_ms(graphed(fused_cl, x_cl), repeats)
        if use_compile:
            start = time.perf_counter()
            compiled = torch.compile(fused_cl, mode="max-autotune-no-cudagraphs")
            replay = graphed(compiled, x_cl)
            row.setdefault("compile_s", {})[batch] = time.perf_counter() - start
            times["compile_graph"] = device_ms(replay, repeats)
            # Printed at once: the compile takes minutes, and a run cut short by its time limit still has it.
            against = "" if yolojet_ms is None else f" (yolojet {yolojet_ms:.3f} ms)"
            print(
                f"{name} batch {batch}: torch.compile max-autotune built in {row['compile_s'][batch]:.0f} s, "
                f"{times['compile_graph']:.3f} ms per batch{against}",
                flush=True,
            )
        fused.to(memory_format=torch.contiguous_format)
    return times


def bench_model(
    name: str,
    batches: list[int],
    imgsz: int,
    repeats: int,
    use_compile: bool,
    extra_rows: set[str],
    work: Path,
    peers_only: bool = False,
) -> dict:
    model = random_model(f"{name}.yaml")
    model_dir = yolojet.export(model, out=work / name, imgsz=imgsz)
    graph = Graph.load(model_dir)
    row: dict = {"model": name, "imgsz": imgsz, "gflops": graph.flops() / 1e9, "batches": {}}
    if peers_only:
        fused = model.fuse().half().cuda().eval() if hasattr(model, "fuse") else model.half().cuda().eval()
        for batch in batches:
            row["batches"][batch] = time_peers(name, fused, batch, imgsz, repeats, use_compile, row, None)
        return row

    start = time.perf_counter()
    engine = TritonNetwork(graph, torch.device("cuda"), half=True, max_batch=max(batches), buckets=batches)
    row["engine_build_s"] = time.perf_counter() - start
    row["tuning"] = engine.tuning
    row["max_rel_l2_vs_reference"] = check(engine, model_dir, imgsz)
    row["over_gate"] = not row["max_rel_l2_vs_reference"] <= GATE  # NaN (an unwritten output) fails too
    if row["over_gate"]:
        # A wrong network's speed means nothing: recorded, not timed, and the run ends with a failure.
        print(
            f"{name}: relative L2 error {row['max_rel_l2_vs_reference']:.2e} against the fp32 reference is over "
            f"the gate {GATE:.0e}; not timed",
            flush=True,
        )
        return row
    row["launches"] = {b: len(engine.launch_list(b)) for b in batches}
    row["pdl"] = engine.pdl
    row["streams"] = {b: engine.schedule(b).streams for b in batches}
    # Variants with the same tile picks (from the tuning cache just written): ordinary launches (what PDL itself
    # buys), and every launch in order on one stream (what overlapping the branches buys).
    variants: dict[str, TritonNetwork] = {}
    build = functools.partial(TritonNetwork, graph, torch.device("cuda"), half=True, max_batch=max(batches))
    if "no-pdl" in extra_rows and engine.pdl:
        variants["yolojet_no_pdl"] = build(buckets=batches, options=EngineOptions(pdl=False))
    if "sequential" in extra_rows and engine.branches:
        sequential = variants["yolojet_sequential"] = build(buckets=batches, options=EngineOptions(branches=False))
        row["sequential_identical"] = same_outputs(engine, sequential, imgsz, max(batches))

    fused = model.fuse().half().cuda().eval() if hasattr(model, "fuse") else model.half().cuda().eval()
    for batch in batches:
        times = {"yolojet": device_ms(lambda b=batch: engine.execute(b), repeats)}
        for label, variant in variants.items():
            times[label] = device_ms(lambda b=batch, v=variant: v.execute(b), repeats)
        row["batches"][batch] = times | time_peers(
            name, fused, batch, imgsz, repeats, use_compile, row, times["yolojet"]
        )
    # Where the time goes at every batch size: launches timed one by one, by kernel family and slowest first.
    row["profiles"] = {b: [vars(p) for p in engine.profile(b)] for b in batches}
    picks = TuningCache()
    row["launch_times"] = {
        b: [
            {
                "nodes": launch.nodes,
                "family": launch.family,
                "ms": ms,
                "shape": launch.tune_key,
                "config": str(picks.get(launch.tune_key)) if launch.tune_key else None,
            }
            for launch, ms in engine.launch_times(b)
        ]
        for b in batches
    }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["yolov8n", "yolo11n", "yolo26n", "yolo11s", "yolo11m"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 64])
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile max-autotune (minutes)")
    parser.add_argument(
        "--peers-only",
        action="store_true",
        help="time only the PyTorch peers (with --compile: torch.compile's one-off measurement, no yolojet build)",
    )
    parser.add_argument("--pdl-off-row", action="store_true", help="also time yolojet with ordinary launches")
    parser.add_argument(
        "--sequential-row", action="store_true", help="also time yolojet with every launch in order on one stream"
    )
    parser.add_argument("--startup", action="store_true", help="time cold and cached engine start-up (first model)")
    parser.add_argument("--startup-only", action="store_true", help="time start-up, then stop")
    parser.add_argument(
        "--tuning-cache",
        type=Path,
        default=None,
        help="read and fill this tuning cache instead of a fresh one (two commits' tables in one run then time the "
        "same tile picks)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    fresh = Path(tempfile.mkdtemp(prefix="yolojet-bench-"))
    os.environ["YOLOJET_CACHE"] = str(args.tuning_cache or fresh / "yolojet")
    os.environ["TRITON_CACHE_DIR"] = str(fresh / "triton")
    report = provenance() | {"models": []}
    if args.startup or args.startup_only:
        model_dir = yolojet.export(random_model(f"{args.models[0]}.yaml"), out=fresh / "startup", imgsz=args.imgsz)
        env = dict(os.environ, YOLOJET_CACHE=str(fresh / "startup-cache"), TRITON_CACHE_DIR=str(fresh / "st"))
        report["startup_s"] = {"cold": startup_seconds(model_dir, env), "cached": startup_seconds(model_dir, env)}
        print(f"start-up {args.models[0]} batch 1: {report['startup_s']}", flush=True)
        (args.out / "startup.json").write_text(json.dumps(report, indent=1, default=str))
        if args.startup_only:
            return
    for name in args.models:
        extra_rows = {
            label for label, wanted in (("no-pdl", args.pdl_off_row), ("sequential", args.sequential_row)) if wanted
        }
        row = bench_model(
            name, args.batches, args.imgsz, args.repeats, args.compile, extra_rows, fresh, peers_only=args.peers_only
        )
        torch.cuda.empty_cache()
        report["models"].append(row)
        (args.out / "bench.json").write_text(json.dumps(report, indent=1, default=str))
        if not args.peers_only:
            print(
                f"{name}: built in {row['engine_build_s']:.1f}s, rel L2 {row['max_rel_l2_vs_reference']:.2e}",
                flush=True,
            )
        if "sequential_identical" in row:
            print(f"{name}: streams {row['streams']}, identical to sequential: {row['sequential_identical']}")

    lines = [
        f"{report['gpu']}, torch {report['torch']}, triton {report['triton']}, {report['date']}, fp16 {args.imgsz}²",
        "",
        "| model | batch | runtime | ms/batch | img/s | yolojet speed-up |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["models"]:
        for batch, times in row["batches"].items():
            for runtime, ms in times.items():
                ratio = f"{ms / times['yolojet']:.2f}x" if "yolojet" in times else "—"
                lines.append(
                    f"| {row['model']} | {batch} | {runtime} | {ms:.3f} | {batch * 1000 / ms:,.0f} | {ratio} |"
                )
    for row in report["models"]:
        for batch, profile in row.get("profiles", {}).items():
            lines += [
                "",
                f"profile {row['model']} batch {batch} (ms):",
                "| family | count | total | % | mean | min | max |",
                "|---|---|---|---|---|---|---|",
            ]
            total = sum(p["total_ms"] for p in profile)
            for p in profile:
                lines.append(
                    f"| {p['family']} | {p['count']} | {p['total_ms']:.4f} | {100 * p['total_ms'] / total:.1f} "
                    f"| {p['mean_ms']:.4f} | {p['min_ms']:.4f} | {p['max_ms']:.4f} |"
                )
    for row in report["models"]:
        for batch, launches in row.get("launch_times", {}).items():
            slowest = sorted(launches, key=lambda r: -r["ms"])[: 25 if batch == min(args.batches) else 12]
            lines += ["", f"slowest launches {row['model']} batch {batch} (us):"]
            lines += [f"{1000 * r['ms']:7.2f} {r['family']:<8} {r['shape']} {r['config']}" for r in slowest]
    table = "\n".join(lines)
    (args.out / "bench.md").write_text(table + "\n")
    print(table)
    wrong = [row["model"] for row in report["models"] if row.get("over_gate")]
    if wrong:
        sys.exit(f"over the error gate, not timed: {', '.join(wrong)}")


if __name__ == "__main__":
    main()
