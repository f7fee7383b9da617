"""Wider tile offers against the product's, launch by launch: yolo11n's network (or another architecture's, `--model`)
of one input shape (640x480, the rectangle of a 4:3 photo, by default) at one batch is built and tuned once under each
offer, then each tuned launch's pick is timed alone (`time_launch`, as the tuner times it), the networks' raw outputs
are compared with the product's on the same random batch, and the whole predict path's `run(batch)` on staged frames
is timed in turns, so every offer is measured in the same process on the same GPU.

Offers (each widens the product's, which the tuner still chooses from):
  product      the tiles the engine offers today
  warps8       8-warp twins of the 128x128 and 128x64 tiles: the gathering GEMM's, the TMA 1x1's (persistent too) and
               the TMA patches' (half the accumulator registers a thread: the counters found most of these kernels
               at 12-18 % occupancy with 125-255 registers)
  tma-small    the TMA kernels offered from 2^14 output pixels (the 20x15 maps at batch 64), not 2^16
  persistent3  three persistent 1x1 programs an SM, with tiles whose pipelines fit three to an SM (2 stages of 128x128,
               3 of 128x64), not two
  no-eight-warp-1x1  the product's offer less its 8-warp persistent 1x1 tile (what that tile is worth)
  one-stage    the narrow GEMM tiles (32 and 64 outputs wide) also unpipelined: Triton copies a pipelined tile's 16-byte
               vectors with cp.async.cg, which bypasses L1, so each of a 3x3 conv's taps reads its input from L2 again
               (model.2.m.0.cv1 pulls ~9x its 39 MB input through L2); plain loads allocate in L1, where a tap's row
               shifted by a pixel is mostly the last tap's, and an SM's many small programs hide their latency
  patch256     TMA patches of 16x16 pixels on 8 warps (64 and 128 outputs wide): a 128-pixel patch of a 3x3 64 -> 64
               conv reads its 74 KB of weights for 128 pixels and each input pixel nine times, all through L2, which
               the counters found at 5.5-6 TB/s in these kernels; twice the pixels halve the weights' share

`run(batch)` is timed in turns of 50 runs an offer, on the device's clock (CUDA events) and the wall's; the first turn,
in which a newly captured graph runs slower, is reported apart from the median of the others.

    python3 bench/tile_offers.py --batch 64 --offers product warps8 tma-small persistent3 --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


@contextlib.contextmanager
def offer(name: str):
    """The module constants an offer widens, set for the engine built and timed inside, then restored."""
    from yolojet.kernels.conv import config, dispatch
    from yolojet.kernels.conv.config import ConvConfig, ConvKind

    patches: list[tuple[object, str, object]] = []
    if name == "warps8":
        gemm8 = (ConvConfig(128, 128, 64, 8, 3), ConvConfig(128, 64, 64, 8, 3))
        tma8 = (
            ConvConfig(128, 128, 64, 8, 3, ConvKind.TMA_1X1),
            ConvConfig(128, 128, 64, 8, 3, ConvKind.TMA_1X1, persistent=True),
            ConvConfig(128, 64, 64, 8, 3, ConvKind.TMA_1X1, persistent=True),
        )
        patch8 = tuple(replace(c, num_warps=8) for c in config._TMA_PATCH_TILES if c.block_m == 128)
        patches = [
            (config, "_CANDIDATES", config._CANDIDATES + gemm8),
            (config, "_TMA_TILES", config._TMA_TILES + tma8),
            (config, "_TMA_PATCH_TILES", config._TMA_PATCH_TILES + patch8),
        ]
    elif name == "tma-small":
        patches = [(config, "_TMA_MIN_M", 1 << 14)]
    elif name == "persistent3":
        three = (
            ConvConfig(128, 128, 64, 4, 2, ConvKind.TMA_1X1, persistent=True),
            ConvConfig(128, 64, 64, 4, 3, ConvKind.TMA_1X1, persistent=True),
        )
        patches = [(config, "_TMA_TILES", config._TMA_TILES + three), (dispatch, "_PERSISTENT_PROGRAMS_PER_SM", 3)]
    elif name == "no-eight-warp-1x1":
        patches = [
            (config, "_TMA_TILES", tuple(c for c in config._TMA_TILES if not (c.persistent and c.num_warps == 8)))
        ]
    elif name == "one-stage":
        narrow = tuple(replace(c, num_stages=1) for c in config._CANDIDATES if c.block_n <= 64 and c.block_k <= 64)
        patches = [(config, "_CANDIDATES", config._CANDIDATES + narrow)]
    elif name == "patch256":
        wide = (
            ConvConfig(256, 64, 64, 8, 3, ConvKind.TMA_PATCH, tile_w=16),
            ConvConfig(256, 128, 64, 8, 3, ConvKind.TMA_PATCH, tile_w=16),
        )
        patches = [(config, "_TMA_PATCH_TILES", config._TMA_PATCH_TILES + wide)]
    elif name != "product":
        raise SystemExit(f"unknown offer {name!r}")
    saved = [(module, attr, getattr(module, attr)) for module, attr, _ in patches]
    for module, attr, value in patches:
        setattr(module, attr, value)
    dispatch._persistent_programs.cache_clear()
    try:
        yield
    finally:
        for module, attr, value in saved:
            setattr(module, attr, value)
        dispatch._persistent_programs.cache_clear()


def every_candidate(engine, batch: int, pattern: str) -> dict[str, list[tuple[str, float]]]:
    """Each candidate's time alone (ms, fastest first) for the tuned launches whose last node matches `pattern`; each
    launch is left on its pick."""
    from yolojet.engine.autotune import time_launch

    found = {}
    for launch in engine.network.launches[batch]:
        if launch.tune_key is None or not re.search(pattern, launch.nodes[-1]):
            continue
        pick = launch.run.__self__.tile
        times = []
        for candidate in launch.candidates:
            launch.configure(candidate)
            times.append((repr(candidate), time_launch(launch, repeats=20, replays=10)))
        launch.configure(pick)
        found[launch.nodes[-1]] = sorted(times, key=lambda t: t[1])
    return found


def tuned_picks(engine, batch: int) -> list[dict]:
    """Each tuned launch of the network at `batch`: its nodes, its pick and the pick's time alone (ms)."""
    from yolojet.engine.autotune import time_launch

    picks = []
    for launch in engine.network.launches[batch]:
        if launch.tune_key is None:
            continue
        tile = launch.run.__self__.tile
        picks.append(
            {
                "nodes": launch.nodes,
                "family": launch.family,
                "key": launch.tune_key,
                "tile": repr(tile),
                "ms": time_launch(launch, repeats=20, replays=10),
            }
        )
    return picks


def timed_turn(engine, batch: int, runs: int = 50) -> dict[str, float]:
    """img/s of `runs` back-to-back run(batch) on the frames staged, by the wall's clock and the device's."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    began = time.perf_counter()
    start.record()
    for _ in range(runs):
        engine.run_async(batch)
    stop.record()
    engine.sync()
    stop.synchronize()
    wall = time.perf_counter() - began
    return {"wall": batch * runs / wall, "device": batch * runs / (start.elapsed_time(stop) / 1e3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--model", default="yolo11n", help="an ultralytics architecture: yolo11n-seg, yolov8n-pose")
    parser.add_argument("--imgsz", type=int, nargs=2, default=(640, 480), metavar=("H", "W"))
    parser.add_argument("--offers", nargs="+", default=["product", "warps8", "tma-small", "persistent3"])
    parser.add_argument("--rounds", type=int, default=6, help="turns of 50 run(batch) an offer")
    parser.add_argument(
        "--explain", metavar="REGEX", help="also time every candidate of the launches whose node matches, per offer"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/tile_offers"))
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()

    from bench_images import bus_rgb_cuda, exported_model

    from yolojet.engine.engine import Engine
    from yolojet.timing import provenance

    model_dir = exported_model(args.work, args.model)
    torch.manual_seed(0)
    x = torch.rand(args.batch, 3, *args.imgsz, device="cuda")
    found: dict = {
        "provenance": provenance(), "model": args.model, "batch": args.batch, "imgsz": list(args.imgsz), "offers": {}
    }  # fmt: skip
    engines = {}
    reference = None
    for name in args.offers:
        started = time.perf_counter()
        with offer(name):
            engine = Engine.load(
                model_dir, device="cuda", half=True, max_batch=args.batch, buckets=[args.batch],
                imgsz=tuple(args.imgsz), rect=False,
            )  # fmt: skip
            built = time.perf_counter() - started
            picks = tuned_picks(engine, args.batch)
            explained = every_candidate(engine, args.batch, args.explain) if args.explain else {}
            raw = engine.raw(x)
        raw = raw[0] if isinstance(raw, tuple) else raw
        if reference is None:
            reference = raw
        error = float((raw - reference).norm() / reference.norm())
        engines[name] = engine
        found["offers"][name] = {"build_s": built, "picks": picks, "raw_rel_l2_vs_first": error, "explained": explained}
        for node, times in explained.items():
            print(f"{name}, {node}: every candidate alone, fastest first")
            for tile, ms in times:
                print(f"  {ms * 1e3:8.1f} us  {tile}")
        total = sum(p["ms"] for p in picks)
        print(f"{name}: built and tuned in {built:.0f} s; tuned launches alone {total:.3f} ms; raw rel. L2 {error:.1e}")
    frame = bus_rgb_cuda()
    for name, engine in engines.items():
        for slot in range(args.batch):
            engine.preprocess(frame, slot)
        engine.run(args.batch)
        found["offers"][name]["turns"] = []
    for _ in range(args.rounds):
        for name, engine in engines.items():
            found["offers"][name]["turns"].append(timed_turn(engine, args.batch))
    first_picks = found["offers"][args.offers[0]]["picks"]
    for name in args.offers[1:]:
        print(f"\n{name} against {args.offers[0]}, the launches whose pick changed (ms alone):")
        for a, b in zip(first_picks, found["offers"][name]["picks"], strict=True):
            if a["tile"] != b["tile"]:
                print(f"  {a['ms']:.4f} -> {b['ms']:.4f}  {','.join(a['nodes'])}: {a['tile']} -> {b['tile']}")
    print(f"\n| offer | tuned launches alone (ms) | run({args.batch}) img/s: first turn, median of the rest (device) "
          "| raw rel. L2 |")  # fmt: skip
    print("|---|---|---|---|")
    for name, row in found["offers"].items():
        first, rest = row["turns"][0], row["turns"][1:]
        wall, device = (statistics.median(t[key] for t in rest) for key in ("wall", "device"))
        print(
            f"| {name} | {sum(p['ms'] for p in row['picks']):.3f} | {first['wall']:,.0f}, **{wall:,.0f}** "
            f"({device:,.0f}) | {row['raw_rel_l2_vs_first']:.1e} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    model = "" if args.model == "yolo11n" else f"{args.model}-"
    path = args.out / f"tile-offers-{model}b{args.batch}-{found['provenance'].get('commit', 'unknown')}.json"
    path.write_text(json.dumps(found, indent=1))
    for engine in engines.values():
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
