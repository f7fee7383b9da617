"""What a refused gRPC call costs the server, on any machine: a bare grpc.aio server whose one method refuses every call
with RESOURCE_EXHAUSTED, either by `context.abort` (an exception through gRPC's handler) or by setting the code and
details and returning, driven by a client process with a window of calls in flight; the server process's CPU a call
read from /proc. Says whether a cheaper refusal would let an overloaded `yolojet serve` turn away more calls.

    python3 bench/bench_refusal_cpu.py [--calls 6000] [--concurrency 32] [--payload 137000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import time

PORT = 50777
DETAILS = "queue full: the work ahead ends past the deadline"


def _same(data: bytes) -> bytes:
    return data


def _serve(way: str, ready) -> None:
    import grpc

    async def refuse(request: bytes, context) -> bytes:
        if way == "abort":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, DETAILS)
        context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
        context.set_details(DETAILS)
        return b""

    async def main() -> None:
        server = grpc.aio.server()
        method = grpc.unary_unary_rpc_method_handler(refuse, _same, _same)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Refuse", {"Call": method}),))
        server.add_insecure_port(f"127.0.0.1:{PORT}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


async def _drive(calls: int, concurrency: int, payload: bytes) -> dict[str, int]:
    import grpc

    codes: dict[str, int] = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{PORT}") as channel:
        call = channel.unary_unary("/bench.Refuse/Call", request_serializer=_same, response_deserializer=_same)
        window = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with window:
                try:
                    await call(payload)
                    outcome = "OK"
                except grpc.aio.AioRpcError as error:
                    outcome = f"{error.code().name}: {error.details()}"
                codes[outcome] = codes.get(outcome, 0) + 1

        await asyncio.gather(*(one() for _ in range(calls)))
    return codes


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def measure(way: str, calls: int, concurrency: int, payload: bytes) -> dict:
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    server = context.Process(target=_serve, args=(way, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the server did not start within 30 s")
        asyncio.run(_drive(min(500, calls), concurrency, payload))  # warm-up
        cpu, start = _cpu_seconds(server.pid), time.perf_counter()
        codes = asyncio.run(_drive(calls, concurrency, payload))
        cpu, wall = _cpu_seconds(server.pid) - cpu, time.perf_counter() - start
    finally:
        server.terminate()
        server.join(10)
    return {"way": way, "server_cpu_us_a_call": 1e6 * cpu / calls, "calls_a_second": calls / wall, "codes": codes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=6000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--payload", type=int, default=137_000, help="request bytes (bus.jpg is 137 KB)")
    parser.add_argument("--rounds", type=int, default=2, help="each way this many times, in turn")
    args = parser.parse_args()
    payload = os.urandom(args.payload)
    ways = [way for _ in range(args.rounds) for way in ("abort", "code")]
    rows = [measure(way, args.calls, args.concurrency, payload) for way in ways]
    print(json.dumps(rows, indent=1))
    for row in rows:
        cpu, rate = row["server_cpu_us_a_call"], row["calls_a_second"]
        print(f"{row['way']:>6}: {cpu:.0f} us of server CPU a call, {rate:,.0f} calls/s")


if __name__ == "__main__":
    main()
