"""Whether a `yolojet serve` answers, step by step, each step bounded: a server (`--processes N`, `--decoder D`) is
started, then asked ListModels and one Infer on eight connections of their own (each reaching one of the server's
processes), then the bench's 64 calls in flight from four processes. Where a step does not finish in its time, every
process of the server and of the bench is dumped (`py-spy dump --native`) with nvidia-smi's view of the GPU, while
they still run.

    python3 bench/probe_serve.py --configs "4:auto 4:cpu 1:auto" --out $OUT

Each config's lines end in a table row: what answered, in how long, and where a dump went.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_serve import dump_stacks, launch_server, stop  # beside this script

PORT = 50631
STEP_TIMEOUT_S = 10.0
TUNE: list[bool] = []  # --tune: the servers time their tiles (the first alone), as `yolojet serve` does by default


def start(model_dir: Path, imgsz: int, processes: int, decoder: str, log: Path) -> subprocess.Popen:
    shape = f"{imgsz}x{imgsz * 3 // 4}"  # bus.jpg's rectangle
    command = [sys.executable, "-m", "yolojet", "serve", "--model", f"{model_dir}:64", "--shapes", shape]
    command += ["--port", str(PORT), "--decoder", decoder, *([] if TUNE else ["--no-tune"])]
    command += ["--processes", str(processes)] if processes > 1 else []
    return launch_server(command, log, 400)


def single_calls(bus: bytes, connections: int) -> list[str]:
    """ListModels then one Infer on each of `connections` connections of their own; a line each."""
    import grpc

    from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb
    from yolojet.serve.proto.yolojet.v1 import inference_pb2_grpc as pb_grpc

    lines = []
    for i in range(connections):
        channel = grpc.insecure_channel(
            f"127.0.0.1:{PORT}",
            options=[("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 << 20)],
        )
        stub = pb_grpc.InferenceStub(channel)
        started = time.perf_counter()
        try:
            stub.ListModels(pb.ListModelsRequest(), timeout=STEP_TIMEOUT_S)
            listed = time.perf_counter() - started
            reply = stub.Infer(pb.InferRequest(image=bus), timeout=STEP_TIMEOUT_S)
            lines.append(
                f"connection {i}: ListModels {listed * 1000:.0f} ms, Infer {(time.perf_counter() - started) * 1000:.0f}"
                f" ms ({len(reply.detections)} detections)"
            )
        except grpc.RpcError as e:  # the first failure ends the step: the next connections would wait as long
            lines.append(f"connection {i}: {e.code().name} {e.details()} after {time.perf_counter() - started:.1f} s")
            break
        finally:
            channel.close()
    return lines


def probe(model_dir: Path, imgsz: int, bus: Path, processes: int, decoder: str, out: Path) -> dict:
    from yolojet.client.remote import Connection, bench

    key = f"processes{processes}-{decoder}"
    row: dict = {"config": key}
    server = start(model_dir, imgsz, processes, decoder, out / f"probe-{key}.log")
    try:
        found: dict = {}

        def calls() -> None:
            try:
                found["single"] = single_calls(bus.read_bytes(), 8)
            except Exception as e:  # reported in the row
                found["single"] = [f"{type(e).__name__}: {e}"]

        worker = threading.Thread(target=calls, daemon=True)
        worker.start()
        worker.join(60)
        if worker.is_alive() or any("detections" not in line for line in found.get("single", [])):
            dump_stacks([server.pid, os.getpid()], out / f"probe-dump-{key}-single.txt")
            worker.join(60)
        row["single"] = found.get("single", ["did not finish"])
        print(f"{key}: " + "\n  ".join(found["single"]), flush=True)

        def benched() -> None:
            try:
                found["bench"] = bench(
                    Connection(f"127.0.0.1:{PORT}"), bus, 640, 64, 4, {}, call_timeout_s=STEP_TIMEOUT_S, limit_s=90
                )
            except Exception as e:  # reported in the row
                found["bench"] = {"error": f"{type(e).__name__}: {e}"}

        worker = threading.Thread(target=benched, daemon=True)
        started = time.perf_counter()
        worker.start()
        worker.join(45)
        if worker.is_alive():  # the bench's four processes are this one's children
            dump_stacks([server.pid, os.getpid()], out / f"probe-dump-{key}-bench.txt")
            worker.join(60)
        result = found.get("bench", {"error": "no result"})
        row["bench_s"] = time.perf_counter() - started
        row["bench"] = {k: result[k] for k in ("img_per_s", "p50_ms", "p99_ms", "codes", "error") if k in result}
        print(f"{key}: bench {row['bench']} in {row['bench_s']:.1f} s", flush=True)
        return row
    finally:
        stop(server)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="4:auto 4:cpu 1:auto", help="PROCESSES:DECODER pairs, in this order")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--tune", action="store_true", help="the servers tune their tiles (default: --no-tune)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    TUNE[:] = [True] if args.tune else []
    from support import calibrated_model
    from ultralytics.utils import ASSETS

    import yolojet

    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="probe_serve_"))
    model_dir = yolojet.export(calibrated_model("yolo11n.yaml", args.imgsz), out=work / "yolo11n", imgsz=args.imgsz)
    rows = []
    for config in args.configs.split():
        processes, decoder = config.split(":")
        try:
            rows.append(probe(model_dir, args.imgsz, Path(ASSETS) / "bus.jpg", int(processes), decoder, args.out))
        except Exception as e:
            rows.append({"config": config, "error": f"{type(e).__name__}: {e}"})
            print(rows[-1], flush=True)
        (args.out / "probe-serve.json").write_text(json.dumps(rows, indent=1))
    print("| config | single calls | bench |\n|---|---|---|")
    for row in rows:
        single = row.get("single", row.get("error", ""))
        answered = sum("detections" in line for line in single) if isinstance(single, list) else single
        print(f"| {row['config']} | {answered} of 8 | {row.get('bench', '')} |")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
