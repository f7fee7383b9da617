"""The first replays of a newly built network against the later ones: each of the first `--replays` run(batch) on
staged frames timed alone on the device's clock (CUDA events), right after Engine.load, for each decoder asked for
(the decoder starts on a thread of its own while the network is built, and a GPU decoder's start may outlast the
load), then the same after `--idle` seconds without work.

    python3 bench/first_replays.py --decoders auto cpu [--batch 64] [--replays 200]
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
sys.path.insert(0, str(Path(__file__).resolve().parent))


def replay_times(engine, batch: int, replays: int) -> list[float]:
    """Device ms of each of `replays` back-to-back run(batch)."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(replays + 1)]
    events[0].record()
    for i in range(replays):
        engine.run_async(batch)
        events[i + 1].record()
    engine.sync()
    events[-1].synchronize()
    return [events[i].elapsed_time(events[i + 1]) for i in range(replays)]


def summary(times: list[float]) -> str:
    parts = [times[:10], times[10:50], times[50:100], times[100:]]
    return ", ".join(f"{statistics.median(p):.3f}" for p in parts if p)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--imgsz", type=int, nargs=2, default=(640, 480), metavar=("H", "W"))
    parser.add_argument("--decoders", nargs="+", default=["auto", "cpu"])
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--idle", type=float, default=3.0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/tile_offers"))
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()

    from bench_images import bus_rgb_cuda, exported_model

    from yolojet.engine.engine import Engine
    from yolojet.timing import provenance

    model_dir = exported_model(args.work)
    frame = bus_rgb_cuda()
    found: dict = {"provenance": provenance(), "batch": args.batch, "decoders": {}}
    print("median device ms of replays 1-10, 11-50, 51-100, 101-")
    for turn, decoder in enumerate(args.decoders):
        engine = Engine.load(
            model_dir, device="cuda", half=True, max_batch=args.batch, buckets=[args.batch], imgsz=tuple(args.imgsz),
            rect=False, decoder=decoder,
        )  # fmt: skip
        loaded = time.perf_counter()
        for slot in range(args.batch):
            engine.preprocess(frame, slot)
        first = replay_times(engine, args.batch, args.replays)
        after_load = time.perf_counter() - loaded
        time.sleep(args.idle)
        again = replay_times(engine, args.batch, args.replays)
        found["decoders"][f"{turn + 1}. {decoder}"] = {"first": first, "after_idle": again, "first_took_s": after_load}
        name = f"{turn + 1}. {decoder}"
        print(f"{name}: right after the load {summary(first)}; {args.idle:.0f} s idle later {summary(again)}")
        engine.close()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"first-replays-b{args.batch}-{found['provenance'].get('commit', 'unknown')}.json"
    path.write_text(json.dumps(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
