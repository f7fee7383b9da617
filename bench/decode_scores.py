"""The head's decode alone at batch 64 of yolo11n's head (80 classes, reg_max 16, random fp16 maps), with NMS's
best-class targets, storing the class scores into its output or not (`BestClassTargets.store_scores`), for the
640x480 rectangle and the 640x640 square; each timed as the median of seven replays of a CUDA graph of 50 launches.

    python3 bench/decode_scores.py --out DIR
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import torch

from yolojet.kernels.decode import DecodeSpec, decode_heads
from yolojet.kernels.nms import BestClassTargets
from yolojet.timing import provenance


def graph_us(launch, replays: int = 50, turns: int = 7) -> float:
    """Median time of one launch (us), from replays of a CUDA graph holding `replays` of them."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        launch()
        launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(replays):
            launch()
    times = []
    for _ in range(turns):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / replays)
    return sorted(times)[len(times) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    spec = DecodeSpec("detect", nc=80, reg_max=16, strides=(8, 16, 32))
    found: dict = {"provenance": provenance(), "batch": args.batch, "shapes": {}}
    for height, width in ((480, 640), (640, 640)):
        sizes = [(height // s, width // s) for s in spec.strides]
        maps = {
            channels: [torch.randn(args.batch, h, w, channels, device="cuda", dtype=torch.float16) for h, w in sizes]
            for channels in (4 * spec.reg_max, spec.nc)
        }
        anchors = sum(h * w for h, w in sizes)
        out = torch.full((args.batch, 4 + spec.nc, anchors), float("nan"), device="cuda")
        best_score = torch.empty(args.batch, anchors, device="cuda")
        best_class = torch.empty(args.batch, anchors, dtype=torch.int32, device="cuda")
        thresholds = torch.tensor([0.25, 0.7], device="cuda")
        row = {}
        for store in (True, False):
            targets = BestClassTargets(best_score, best_class, thresholds, None, store_scores=store)
            row["scores stored" if store else "scores not stored"] = graph_us(
                functools.partial(decode_heads, out, maps[4 * spec.reg_max], maps[spec.nc], None, spec, best=targets)
            )
        found["shapes"][f"{width}x{height}"] = row
        print(f"{width}x{height}, batch {args.batch}: " + ", ".join(f"{k} {v:.1f} us" for k, v in row.items()))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"decode-scores-b{args.batch}-{found['provenance'].get('commit', 'unknown')}.json"
    path.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
