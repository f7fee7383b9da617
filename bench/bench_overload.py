"""`yolojet serve` under a load it does not pace (open loop): two models at once, twice the rate it sustains, then half.

One server with two models (yolo11n and yolo11n-seg at 640 by default, random weights with BatchNorm statistics
measured on the shipped photos), bus.jpg's bytes in every request, each request with a gRPC deadline of --slo-ms (the
client's own deadline, which the server's batcher honours). Client processes send at a fixed rate whatever the
replies, alternating the two models:
  sustained  closed loop first (the bench client, 64 in flight over both models): the rate R the server sustains
  two        0.8 R for --seconds, half to each model: each one's img/s, p50 / p99, and share answered in time
  overload   2 R: of the requests the server admitted, the share answered within their deadline; those it refused
             early (RESOURCE_EXHAUSTED from the server, CANCELLED from gRPC's core past --max-pending), and how long
             each kind of answer took
  recovery   0.5 R: the share answered in time, and img/s against the rate offered

    python3 bench/bench_overload.py --out results/ [--max-calls 32 --max-pending 32]
    # without a GPU: the server's front alone (each image answered once submitted), one model, one client process
    python3 bench/bench_overload.py --no-network --models yolo11n.yaml --imgsz 64 --shapes "" --client-processes 1
    python3 bench/bench_overload.py --worker JOB   # one client process (the script starts these itself)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import launch_server, py_spy  # beside this script

PORT = 50612
TICK_S = 0.002  # how often a client process sends what has fallen due
REFUSALS = ("RESOURCE_EXHAUSTED", "CANCELLED")
OUTSTANDING_MAX = 4000  # a client process's calls in flight at most: past this it counts sends it could not make


async def _open_loop(job: dict) -> dict:
    """One client process: `rate` requests a second for `seconds`, the models in turn, each with its deadline."""
    import grpc

    from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb
    from yolojet.serve.proto.yolojet.v1 import inference_pb2_grpc as pb_grpc

    data = Path(job["image"]).read_bytes()
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(job["address"], options=options) for _ in range(4)]
    stubs = [pb_grpc.InferenceStub(c) for c in channels]
    for channel in channels:  # connected before the clock starts, without a call (a server's --max-calls counts those)
        await asyncio.wait_for(channel.channel_ready(), timeout=60)
    requests = [pb.InferRequest(model=m, image=data) for m in job["models"]]
    outcomes: list[tuple[str, str, float]] = []  # model, code, seconds to the reply
    pending: set[asyncio.Task] = set()
    unsent = 0

    async def call(n: int) -> None:
        request = requests[n % len(requests)]
        start = time.perf_counter()
        try:
            await stubs[n % len(stubs)].Infer(request, timeout=job["deadline_s"])
            code = "OK"
        except grpc.aio.AioRpcError as e:
            code = e.code().name
        outcomes.append((request.model, code, time.perf_counter() - start))

    start = time.perf_counter()
    sent = 0
    while (now := time.perf_counter() - start) < job["seconds"]:
        for _ in range(int(now * job["rate"]) - sent):
            if len(pending) >= OUTSTANDING_MAX:
                unsent += 1
            else:
                task = asyncio.create_task(call(sent))
                pending.add(task)
                task.add_done_callback(pending.discard)
            sent += 1
        await asyncio.sleep(TICK_S)
    offered_s = time.perf_counter() - start
    if pending:
        await asyncio.wait(pending, timeout=job["deadline_s"] + 30)
    for channel in channels:
        await channel.close()
    return {"outcomes": outcomes, "unsent": unsent, "offered_s": offered_s}


def offer(rate: float, seconds: float, models: list[str], deadline_ms: float, image: Path, processes: int) -> dict:
    """`rate` requests a second over `processes` client processes; what came back, by model."""
    job = {"address": f"127.0.0.1:{PORT}", "models": models, "deadline_s": deadline_ms / 1000, "image": str(image)}
    job["seconds"] = seconds
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", json.dumps({**job, "rate": rate / processes})],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    results = [json.loads(w.communicate(timeout=seconds + 120)[0]) for w in workers]
    outcomes = [o for r in results for o in r["outcomes"]]
    row: dict = {"offered_per_s": rate, "seconds": seconds, "unsent": sum(r["unsent"] for r in results)}
    for model in [*models, "all"]:
        mine = [o for o in outcomes if model in ("all", o[0])]
        answered = sorted(t for _, code, t in mine if code == "OK")
        # Refused: by the server (RESOURCE_EXHAUSTED), or by gRPC's core past the server's --max-pending (CANCELLED:
        # nothing else cancels a call here).
        refused = [t for _, code, t in mine if code in REFUSALS]
        admitted = len(mine) - len(refused)
        in_time = sum(1 for t in answered if t * 1000 <= deadline_ms)
        row[model] = {
            "sent": len(mine),
            "codes": {c: sum(1 for o in mine if o[1] == c) for c in sorted({o[1] for o in mine})},
            "code_p99_ms": {
                c: _p99([t for _, code, t in mine if code == c]) * 1000 for c in sorted({o[1] for o in mine})
            },
            "img_per_s": len(answered) / seconds,
            "p50_ms": answered[len(answered) // 2] * 1000 if answered else None,
            "p99_ms": _p99(answered) * 1000 if answered else None,
            "admitted_in_time": in_time / admitted if admitted else None,
            "refused": len(refused),
            "refusal_p99_ms": _p99(refused) * 1000 if refused else None,
        }
    return row


def _p99(seconds: list[float]) -> float:
    return sorted(seconds)[int(0.99 * (len(seconds) - 1))]


def start_server(
    models: dict[str, Path],
    slo_ms: float,
    log: Path,
    shapes: str | None,
    max_pending: int | None,
    max_calls: int | None,
    no_network: bool = False,
    serve_args: str = "",
) -> subprocess.Popen:
    command = [sys.executable, "-m", "yolojet", "serve", "--port", str(PORT), "--slo-ms", str(slo_ms)]
    if no_network:  # bench_server_cpu.py's server: every image answered as soon as it is submitted
        names = log.with_suffix(".threads.json")
        command[1:3] = [str(Path(__file__).with_name("bench_server_cpu.py")), "--child", str(names), ""]
    command += ["--max-pending", str(max_pending)] if max_pending else []
    command += ["--max-calls", str(max_calls)] if max_calls else []
    for path in models.values():
        command += ["--model", f"{path}:64"]
    command += ["--shapes", shapes] if shapes else []
    command += shlex.split(serve_args)
    return launch_server(command, log, 600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--models", nargs="+", default=["yolo11n.yaml", "yolo11n-seg.yaml"])
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument(
        "--shapes", default="640x480", help="--shapes for the server (bus.jpg's rectangle at 640; '' for none)"
    )
    parser.add_argument("--slo-ms", type=float, default=50.0, help="each request's gRPC deadline, and the server's")
    parser.add_argument("--seconds", type=float, default=10.0, help="each open-loop phase's length")
    parser.add_argument("--overload", type=float, default=2.0, help="the overload phase's rate, times the sustained")
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument("--requests", type=int, default=4000, help="the closed-loop measure of the sustained rate")
    parser.add_argument("--max-pending", type=int, default=None, help="the server's --max-pending (default: its own)")
    parser.add_argument("--max-calls", type=int, default=None, help="the server's --max-calls (default: none)")
    parser.add_argument(
        "--image",
        type=Path,
        default=None,
        help="the JPEG every request carries (default: bus.jpg; with --no-network, at 160x120)",
    )
    parser.add_argument(
        "--no-network",
        action="store_true",
        help="the server answers each image once submitted (bench_server_cpu.py's): its front alone, no GPU needed",
    )
    parser.add_argument("--py-spy", action="store_true", help="py-spy records the server for 5 s of the overload phase")
    parser.add_argument(
        "--serve-args", default="", help="further flags of the server, one argument: --serve-args='--max-queue 256'"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(asyncio.run(_open_loop(json.loads(args.worker)))))
        return 0

    from support import calibrated_model
    from ultralytics.utils import ASSETS

    import yolojet
    from yolojet.client.remote import Connection, bench
    from yolojet.timing import provenance

    args.out.mkdir(parents=True, exist_ok=True)
    found: dict = {"provenance": provenance(), "slo_ms": args.slo_ms, "models": args.models}
    found["max_pending"], found["max_calls"] = args.max_pending, args.max_calls
    found["serve_args"] = args.serve_args
    work = Path(tempfile.mkdtemp(prefix="bench_overload_"))
    dirs = {}
    for cfg in args.models:
        name = Path(cfg).stem
        dirs[name] = yolojet.export(calibrated_model(cfg, args.imgsz), out=work / name, imgsz=args.imgsz)
    image = args.image or Path(ASSETS) / "bus.jpg"
    if args.no_network and args.image is None:
        # Without a GPU the server decodes on its CPU: bus.jpg at 160x120 (10 KB) keeps its decode from being the limit.
        import cv2

        image = work / "bus-160x120.jpg"
        small = cv2.resize(cv2.imread(str(Path(ASSETS) / "bus.jpg")), (160, 120), interpolation=cv2.INTER_AREA)
        cv2.imwrite(str(image), small, [cv2.IMWRITE_JPEG_QUALITY, 90])
    names = list(dirs)
    server = start_server(
        dirs,
        args.slo_ms,
        args.out / "serve-overload.log",
        args.shapes,
        args.max_pending,
        args.max_calls,
        args.no_network,
        args.serve_args,
    )
    try:
        # The rate sustained, closed loop: each model alone with 64 in flight; the mix's rate, an image of each in
        # turn, is their harmonic mean (its time an image is the mean of theirs).
        rates = []
        for name in names:
            connection = Connection(f"127.0.0.1:{PORT}", name)
            bench(connection, image, min(500, args.requests // 4), 64, args.client_processes, {})  # warm
            row = bench(connection, image, args.requests, 64, args.client_processes, {})
            found[f"closed_loop_{name}"] = row
            rates.append(row["img_per_s"])
        sustained = len(rates) / sum(1 / r for r in rates)
        found["sustained_per_s"] = sustained
        print(f"sustained (closed loop, 64 in flight): {sustained:,.0f} img/s", flush=True)
        for phase, factor in (("two", 0.8), ("overload", args.overload), ("recovery", 0.5)):
            # Where the server's threads spend an overload: started with the clients, it records their first seconds.
            spied = args.py_spy and phase == "overload"
            spy = py_spy(server.pid, args.out / "pyspy-overload.txt", 5) if spied else None
            found[phase] = offer(factor * sustained, args.seconds, names, args.slo_ms, image, args.client_processes)
            if spy is not None:
                spy.wait(timeout=60)
            print(f"{phase} at {factor:g} x: {json.dumps(found[phase])}", flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            found["server_exit"] = server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(work, ignore_errors=True)
    out_file = args.out / f"overload-{found['provenance']['commit']}.json"
    out_file.write_text(json.dumps(found, indent=1))
    print("\n| phase | model | offered | img/s | p50 / p99 ms | admitted in time | refused (p99 ms) | codes (p99 ms) |")
    print("|---|---|---|---|---|---|---|---|")
    for phase in ("two", "overload", "recovery"):
        row = found[phase]
        for name in [*names, "all"]:
            r = row[name]
            p50 = f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f}" if r["p50_ms"] is not None else "-"
            in_time = f"{r['admitted_in_time']:.2%}" if r["admitted_in_time"] is not None else "-"
            refusal = f"{r['refused']} ({r['refusal_p99_ms']:.1f})" if r["refused"] else "0"
            offered = row["offered_per_s"] / (1 if name == "all" else len(names))
            codes = ", ".join(f"{c} {n} ({r['code_p99_ms'][c]:.1f})" for c, n in r["codes"].items())
            cells = [phase, name, f"{offered:,.0f}/s", f"{r['img_per_s']:,.0f}", p50, in_time, refusal, codes]
            print(f"| {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
