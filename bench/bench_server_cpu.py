"""The server's own CPU a request, without a GPU: `yolojet serve` with the network skipped (every image answered with
no detections as soon as it is submitted), driven by `yolojet label --bench`, each of the server's threads' CPU time
read from /proc before and after.

What it measures is everything of a request but the network: gRPC, the event loop, admission and batching, the CPU
decode of a small JPEG, the runner, the reply. On one GPU a single server is bound by its interpreter (one thread runs
Python at a time), so its CPU a request, and its main thread's above all, bounds its requests a second.

With --label N, `yolojet label FOLDER --server` over N copies of the image follows: the labeling client's own CPU an
image (file reads, requests, replies made records, the JSONL written).

    python3 bench/bench_server_cpu.py --requests 10000 --concurrency 64 [--event-loop asyncio] [--label 5000]
        [--rpc InferStream|InferBatchStream]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

PORT = 50617


def serve_without_the_network(argv: list[str], names_file: Path, profile: str) -> int:
    """`yolojet serve argv` whose engines answer every batch at once with no detections; SIGUSR1 writes each
    thread's native id and name to `names_file`; with `profile`, the main thread (the event loop) runs under cProfile,
    whose statistics are written there at the end."""
    import threading

    import numpy as np

    from yolojet import cli
    from yolojet.engine import engine as engine_module

    def answered_at_once(self, frames, options, ready=()):
        return engine_module._Run(list(frames), found=[{"boxes": np.zeros((0, 6), np.float32)} for _ in frames])

    engine_module.Engine._submit = answered_at_once  # type: ignore[method-assign]

    def write_names(*_):
        names = {str(t.native_id): re.sub(r"[_-]\d+$", "", t.name) for t in threading.enumerate()}
        names_file.write_text(json.dumps(names))

    signal.signal(signal.SIGUSR1, write_names)
    if not profile:
        return cli.main(argv)
    import cProfile

    profiler = cProfile.Profile()
    try:
        return profiler.runcall(cli.main, argv)
    finally:
        profiler.dump_stats(profile)


def thread_cpu(pid: int) -> dict[str, float]:
    """Each thread's user + system CPU seconds, by native id."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[task.name] = (int(fields[11]) + int(fields[12])) / ticks
    return found


def by_name(before: dict[str, float], after: dict[str, float], names: dict[str, str], count: int) -> dict[str, float]:
    """CPU us an item of each thread (by name; threads of one pool summed) between two `thread_cpu` readings."""
    found: collections.Counter = collections.Counter()
    for tid, cpu in after.items():
        found[names.get(tid, "other (native)")] += (cpu - before.get(tid, 0.0)) * 1e6 / count
    return dict(found.most_common())


def label_folder(image: Path, work: Path, count: int, env: dict) -> dict:
    """`yolojet label FOLDER --server` over `count` copies of `image` as a user runs it (file reads, requests,
    records written): its rate, wall time, and CPU an image of the labeling process."""
    import resource

    folder = work / "folder"
    folder.mkdir(exist_ok=True)
    for i in range(count):
        shutil.copyfile(image, folder / f"{i:06d}.jpg")
    command = [sys.executable, "-m", "yolojet", "label", str(folder), "--server", f"127.0.0.1:{PORT}"]
    command += ["--out", str(work / "labels.jsonl"), "--overwrite"]
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    said = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (now.ru_utime - used.ru_utime) + (now.ru_stime - used.ru_stime)
    rate = re.search(r"\(([\d,.]+) img/s\)", said.stdout + said.stderr)
    return {
        "images": count,
        "exit": said.returncode,
        "wall_s": seconds,
        "img_per_s": float(rate.group(1).replace(",", "")) if rate else None,
        "client_cpu_us_an_image": cpu * 1e6 / count,
        "said": (said.stdout + said.stderr)[-600:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--event-loop", default="auto", choices=("auto", "uvloop", "asyncio"))
    parser.add_argument("--rpc", default="Infer", choices=("Infer", "InferStream", "InferBatchStream"))
    parser.add_argument(
        "--image", type=Path, default=None, help="the requests' and files' image (default: a 40x30 JPEG made here)"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--profile", type=Path, default=None, help="cProfile the server's main thread into this file")
    parser.add_argument("--label", type=int, default=0, help="also `yolojet label --server` over this many files")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        names_file, profile, *argv = args.child
        return serve_without_the_network(argv, Path(names_file), profile)

    import cv2
    import numpy as np
    from support import random_model

    import yolojet

    work = Path(tempfile.mkdtemp(prefix="bench_server_cpu_"))
    model_dir = yolojet.export(random_model("yolo11n.yaml"), out=work / "m", imgsz=64)
    image = args.image
    if image is None:  # the server's CPU decode of it costs little beside the rest of a request
        image = work / "small.jpg"
        cv2.imwrite(str(image), np.random.default_rng(0).integers(0, 255, (30, 40, 3), dtype=np.uint8))
    names_file, log = work / "threads.json", work / "serve.log"
    serve = ["serve", "--model", f"{model_dir}:64", "--port", str(PORT), "--slo-ms", "1000"]
    serve += ["--event-loop", args.event_loop]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    profile = str(args.profile.resolve()) if args.profile else ""
    command = [sys.executable, __file__, "--child", str(names_file), profile, *serve]
    server = subprocess.Popen(command, stderr=log.open("w"), stdout=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 120
        while "listening on" not in log.read_text():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        bench = [sys.executable, "-m", "yolojet", "label", str(image), "--server", f"127.0.0.1:{PORT}"]
        bench += ["--bench", str(args.requests), "-c", str(args.concurrency), "--processes", "1"]
        bench += ["--bench-rpc", args.rpc]
        # Warm: the connection, the batcher's latency model (a first request may be refused while it learns).
        subprocess.run(
            [*bench[:-8], "--bench", "500", "-c", str(args.concurrency), "--processes", "1"],
            env=env,
            capture_output=True,
        )
        before, start = thread_cpu(server.pid), time.perf_counter()
        said = subprocess.run(bench, env=env, capture_output=True, text=True)
        seconds, after = time.perf_counter() - start, thread_cpu(server.pid)
        server.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        names = json.loads(names_file.read_text()) if names_file.exists() else {}
        labeler = None
        if args.label:
            label_before = thread_cpu(server.pid)
            labeler = label_folder(image, work, args.label, env)
            label_after = thread_cpu(server.pid)
            labeler["server_cpu_us_an_image_by_thread"] = by_name(label_before, label_after, names, args.label)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    by_thread = by_name(before, after, names, args.requests)
    total = sum(by_thread.values())
    rate = re.search(r"img/s\s+([\d,.]+)", said.stdout)
    answered = re.search(r"requests answered\s+(.*?)\s*$", said.stdout, re.M)
    latency = re.search(r"latency p50 / p90 / p99 / max\s+(.*?)\s*$", said.stdout, re.M)
    found = {
        "event_loop": args.event_loop,
        "rpc": args.rpc,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "wall_s": seconds,
        "client_img_per_s": float(rate.group(1).replace(",", "")) if rate else None,
        "answered": answered.group(1) if answered else said.stdout[-500:] + said.stderr[-500:],
        "latency_p50_p90_p99_max": latency.group(1) if latency else None,
        "cpu_us_a_request": total,
        "cpu_us_a_request_by_thread": by_thread,
    }
    if labeler is not None:
        found["label_server"] = labeler
    print(json.dumps(found, indent=1))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"server-cpu-{args.event_loop}-{args.rpc}.json").write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
