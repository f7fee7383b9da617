"""The formats pass of `yolojet label` (`--coco`, `--yolo-txt`) over a labeling run's records, on any machine: N
synthetic records (a box detector's, five boxes an image by default, or masks with --task segment) are written as
`label` writes them, then each format is made from the file in a fresh process, which reports its time and its peak
memory (ru_maxrss: the process's own, not its workers').

    python3 bench/bench_label_formats.py --records 100000 [--boxes 5] [--task detect|segment] [--workers 1 2 0]
        [--under DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

NAMES = {i: f"class{i}" for i in range(80)}


def write_records(path: Path, count: int, boxes: int, task: str) -> None:
    from yolojet.tasks.segment import encode_rle

    rng = random.Random(0)
    masks = {}
    with open(path, "wb") as f:
        for i in range(count):
            w, h = 1080, 810
            detections = []
            for _ in range(boxes):
                x1, y1 = rng.uniform(0, w / 2), rng.uniform(0, h / 2)
                x2, y2 = x1 + rng.uniform(8, w / 2), y1 + rng.uniform(8, h / 2)
                c = rng.randrange(80)
                d = {"class": c, "name": NAMES[c], "confidence": round(rng.random(), 5)}
                d["box"] = [round(x1, 2), round(y1, 2), round(x2, 2), round(y2, 2)]
                if task == "segment":  # a few mask shapes, reused: the records' size is what matters
                    key = rng.randrange(8)
                    if key not in masks:
                        mask = np.zeros((h, w), bool)
                        mask[100 + 20 * key : 300 + 30 * key, 200 + 10 * key : 500 + 40 * key] = True
                        masks[key] = encode_rle(mask)
                    d["mask"] = masks[key]
                detections.append(d)
            record = {"path": f"/data/photos/{i % 100:02d}/{i}.jpg", "width": w, "height": h, "model": "m"}
            record.update({"model_version": "v", "task": task, "detections": detections})
            f.write(orjson.dumps(record) + b"\n")


def one_format(records: str, kind: str, out: str, task: str, workers: int | None) -> dict:
    """Run in a fresh process: one format made from the records file."""
    from yolojet.client.formats import write_coco, write_yolo_dataset

    start = time.perf_counter()
    if kind == "coco":
        write_coco(Path(out) / "coco.json", Path(records), NAMES, workers=workers)
    else:
        write_yolo_dataset(Path(out) / "dataset", Path(records), NAMES, task, workers=workers)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"seconds": round(seconds, 3), "peak_rss_mib": round(peak)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--boxes", type=int, default=5)
    parser.add_argument("--task", choices=["detect", "segment"], default="detect")
    parser.add_argument("--under", type=Path, help="the folder to make the temporary files in (a disk other than /tmp)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0], help="worker processes; 0: the default")
    parser.add_argument("--one", nargs=5, help=argparse.SUPPRESS)  # records kind out task workers: the child
    args = parser.parse_args()
    if args.one:
        records, kind, out, task, workers = args.one
        print(json.dumps(one_format(records, kind, out, task, int(workers) or None)))
        return
    with tempfile.TemporaryDirectory(dir=args.under) as folder:
        records = Path(folder) / "labels.jsonl"
        write_records(records, args.records, args.boxes, args.task)
        found = {"records": args.records, "boxes": args.boxes, "task": args.task, "bytes": records.stat().st_size}
        for workers in args.workers:
            for kind in ("coco", "yolo"):
                out = Path(folder) / f"{kind}-{workers}"
                out.mkdir()
                child = [sys.executable, __file__, "--one", str(records), kind, str(out), args.task, str(workers)]
                result = json.loads(subprocess.run(child, check=True, capture_output=True, text=True).stdout)
                result["us_a_record"] = round(result["seconds"] / args.records * 1e6, 1)
                found[f"{kind} workers={workers or 'default'}"] = result
    print(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
