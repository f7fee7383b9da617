"""The network's launches at batch 1, counted by kernel family and output size (and by output size and the YAML module
each begins in), on any machine (no GPU: the
launches are built under Triton's interpreter, nothing is run). At batch 1 each launch costs a few microseconds of
latency whatever its work, so where the launches are says which fusions cut the most of them.

    python3 bench/launch_census.py --models yolo11n yolo26n [--imgsz 640]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def census(model: str, imgsz: int, work: Path) -> dict:
    """{family: {output size HxW: launches}} and the total, for `model` (an ultralytics YAML name) at `imgsz`."""
    from support import random_model

    import yolojet
    from yolojet.engine.engine import Engine

    model_dir = yolojet.export(random_model(f"{model}.yaml"), out=work / model, imgsz=imgsz)
    engine = Engine.load(model_dir, device="cpu", backend="triton", half=True, max_batch=1, tune=False, rect=False)
    graph = engine.network.graph
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    blocks: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    launches = engine.network.launches[1]
    for launch in launches:
        size = "x".join(str(d) for d in graph.values[launch.outputs[0]].shape[-2:])
        counts[launch.family][size] += 1
        block = ".".join(str(launch.nodes[0]).split("/")[0].split(".")[:2])  # model.N: the YAML module it begins in
        blocks[size][block] += 1
    engine.close()
    return {
        "launches": len(launches),
        "by_family": {f: dict(c.most_common()) for f, c in counts.items()},
        "by_size_and_block": {size: dict(b) for size, b in blocks.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["yolo11n"])
    parser.add_argument("--imgsz", type=int, default=640)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="launch_census_"))
    for model in args.models:
        print(json.dumps({model: census(model, args.imgsz, work)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
