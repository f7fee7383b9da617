"""The server and the labeling client on one GPU, from JPEG bytes and files to results and label files.

yolo11n at 640 (random weights, BatchNorm statistics measured on the shipped photos), bus.jpg (1080x810):
  unary    `yolojet serve` in its own process, bus.jpg's rectangle (640x480) built at load (`--shapes`: on a machine
           whose tuning cache has not seen a shape, its first batches would wait for tuning); the labeling client's
           bench mode (`yolojet label --bench`):
           --requests unary calls of bus.jpg's bytes with 64 in flight over --client-processes, then 8 in flight:
           img/s and latency quantiles, and the server's own queue / decode / run split; then --requests of the
           same bytes over InferStream and over InferBatchStream (16 images a message), 256 in flight
  label    `yolojet label FOLDER --server` over --files copies of bus.jpg (file reads and the JSONL written
           included), then `yolojet label FOLDER --local`; each as a user runs it, a fresh process: its own rate
           (from its summary line) and the wall time of the whole command
  workers  with --devices D: the same unary calls and `label --server` against `yolojet serve --devices D` (an engine
           worker process a device behind one front), and `yolojet label FOLDER --local --devices D`
  asyncio  with --asyncio: the same unary calls and `label --server` against `yolojet serve --event-loop
           asyncio`, beside the default server on uvloop, in the same run
  processes with --processes N: the same unary calls and `label --server` against `yolojet serve --processes N`
           (N whole servers sharing the port); with --mps, `--mps off` and `--mps on` in turns for --mps-rounds;
           with --spread-turns, the unary and stream rows with the bench's connections spread over the processes
           (as the product does) and where the kernel hands them, in turns

    python3 bench/bench_serve.py --out results/
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

PORT = 50611
DECODER: list[str] = []  # --decoder NAME for the servers and labelers, where the command line names one
SERVE_ARGS: list[str] = []  # further flags of every server (--serve-args)
LOG_DIR: list[Path] = [Path("bench/results")]  # where each label command's output goes (--out)


def start_server(
    model_dir: Path, log: Path, slo_ms: float, samples: Path | None, scale: list[str] | None = None
) -> subprocess.Popen:
    """`scale`: --devices D (worker processes behind one front) or --processes N (whole servers sharing the port)."""
    model = ["--model", f"{model_dir}:64", "--shapes", "640x480", "--slo-ms", str(slo_ms), *(scale or [])]
    command = [sys.executable, "-m", "yolojet", "serve", *model, *DECODER, *SERVE_ARGS, "--port", str(PORT)]
    if samples is not None:  # where the server's threads spend their time (bench/sampler.py)
        command[1:1] = [str(Path(__file__).with_name("sampler.py")), "--out", str(samples), "--"]
    return launch_server(command, log, 400)


def launch_server(command: list[str], log: Path, limit_s: float) -> subprocess.Popen:
    """`command` (a `yolojet serve`) started with its stderr to `log`, once it says it listens; a RuntimeError with the
    log's end where it exits first or does not listen within `limit_s`."""
    server = subprocess.Popen(command, stderr=log.open("w"), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}: {log.read_text()[-2000:]}")
        if "listening on" in log.read_text():
            return server
        time.sleep(0.5)
    server.kill()
    raise RuntimeError(f"the server did not listen within {limit_s:g} s: {log.read_text()[-2000:]}")


def stop(server: subprocess.Popen) -> int:
    server.send_signal(signal.SIGTERM)
    try:
        return server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        return -9


def label(source: Path, out: Path, where: list[str], spy: Path | None = None) -> dict:
    """One `yolojet label` command, timed as a whole; its own rate from its summary line. With `spy`, py-spy records
    it from its start to its end, every thread with its idle time, as a speedscope timeline (its worker processes
    too, where it starts some)."""
    command = [sys.executable, "-m", "yolojet", "label", str(source), "--out", str(out), "--quiet", *where]
    command += DECODER if "--local" in where else []  # against a server, the server decodes
    found = shutil.which("py-spy") if spy is not None else None
    if found is not None:
        record = [found, "record", "--rate", "100", "--idle", "--threads", "--nonblocking", "--format", "speedscope"]
        record += ["--subprocesses"] if "--workers" in where or "--devices" in where else []
        command = [*record, "--output", str(spy), "--", *command]
    # Its output goes to a file beside the results as it comes, so a stage cut short by its time limit still says
    # how far each command got.
    log = LOG_DIR[0] / f"label-{out.stem}.log"
    print(f"[{time.strftime('%H:%M:%S')}] label {out.stem}: {' '.join(where)}", flush=True)
    start = time.perf_counter()
    with log.open("w") as sink:
        done = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, text=True, timeout=500)
    wall = time.perf_counter() - start
    said = log.read_text(errors="replace")
    rate = re.search(r"(\d+) images labeled \(([\d,.]+) img/s\)", said)
    records = sum(1 for _ in out.open()) if out.exists() else 0
    error_log = out.with_name(out.name + ".errors.jsonl")  # what --quiet keeps off the terminal: why images failed
    errors = error_log.read_text(errors="replace").splitlines()[:5] if error_log.exists() else []
    return {
        "exit": done.returncode,
        "wall_s": wall,
        "records": records,
        "labeled": int(rate[1]) if rate else 0,
        "img_per_s": float(rate[2].replace(",", "")) if rate else 0.0,
        "said": said[-1500:],
        "first_errors": errors,
    }


def dump_stacks(pids: list[int], out: Path) -> None:
    """nvidia-smi's view of the GPU and its decoders, then every thread's stack (Python and native frames, by py-spy)
    of each process in `pids` and of its children, each named by its command line, into `out`."""
    found = shutil.which("py-spy")
    if found is None:
        return
    everyone: list[str] = []
    for pid in pids:
        everyone.append(str(pid))
        everyone += subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    with out.open("a") as dump:
        # What the GPU and its JPEG decoders are doing meanwhile (a stall waiting on the device shows as busy or idle).
        for query in (["nvidia-smi"], ["nvidia-smi", "-q", "-d", "UTILIZATION"]):
            dump.write(f"== {' '.join(query)}\n")
            dump.flush()
            subprocess.run(query, stdout=dump, stderr=subprocess.STDOUT, timeout=60, check=False)
        for process in everyone:
            try:
                line = Path(f"/proc/{process}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:  # gone meanwhile
                continue
            dump.write(f"== process {process}: {line[:300]}\n")
            dump.flush()
            command = [found, "dump", "--pid", process, "--native"]
            subprocess.run(command, stdout=dump, stderr=subprocess.STDOUT, timeout=120, check=False)


def py_spy(pid: int, out: Path, seconds: float) -> subprocess.Popen | None:
    """py-spy recording the server's every thread, Python and native frames, as collapsed stacks (None without it)."""
    found = shutil.which("py-spy")
    if found is None:
        print("--py-spy: no py-spy on PATH", flush=True)
        return None
    command = [
        found,
        "record",
        "--pid",
        str(pid),
        "--subprocesses",
        "--duration",
        str(seconds),
        "--rate",
        "100",
        "--threads",
        "--nonblocking",  # pausing the server to unwind native frames starved it (its decode average blew up)
        "--format",
        "raw",
        "--output",
        str(out),
    ]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


STREAM_RPCS = ("InferStream", "InferBatchStream")
STREAM_IN_FLIGHT = 256  # over a stream a connection of each client process: 4 messages of 16 a stream in flight


WARM_CALL_TIMEOUT_S = 15.0  # a warm-up call's deadline (the buckets' graphs are captured at load)
# Each bench's bound: a server that stops answering fails the stage, while its processes are there for the stack dump.
BENCH_LIMIT_S = 300.0


def cpu_now(root: int) -> tuple[float, float, float]:
    """Seconds of CPU so far: the machine's busy and all (every core, /proc/stat), and `root`'s and its descendants'
    (the server's processes)."""
    tick = os.sysconf("SC_CLK_TCK")
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    parents: dict[int, int] = {}
    used: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            after_name = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # a process that ended meanwhile
            continue
        pid = int(stat.parent.name)
        parents[pid], used[pid] = int(after_name[1]), int(after_name[11]) + int(after_name[12])
    family, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in family} - family
        family |= more
        grew = bool(more)
    return (sum(fields) - idle) / tick, sum(fields) / tick, sum(used.get(pid, 0) for pid in family) / tick


class CpuSampler:
    """`cpu_now` every `every_s` on a thread of its own, with the wall-clock time of each, so that a bench row's
    cores are read over its measured window only (the bench's client processes start for seconds before it)."""

    def __init__(self, root: int, every_s: float = 0.1) -> None:
        import threading

        self.root, self.every_s = root, every_s
        self.samples: list[tuple[float, tuple[float, float, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), cpu_now(self.root)))
            self._stop.wait(self.every_s)

    def cores(self, row: dict) -> dict:
        """Cores busy over the row's window (`started`..`finished`): the machine's (of os.cpu_count()), the
        server's processes', and the bench clients' (their own CPU while they sent)."""
        self._stop.set()
        self._thread.join()
        start, end = row["started"] - self.every_s, row["finished"] + self.every_s
        inside = [(t, c) for t, c in self.samples if start <= t <= end]
        if len(inside) < 2:
            return {}
        (t0, first), (t1, last) = inside[0], inside[-1]
        cores = os.cpu_count() or 1
        return {
            "machine_busy_cores": round((last[0] - first[0]) / (last[1] - first[1]) * cores, 2),
            "server_cores": round((last[2] - first[2]) / (t1 - t0), 2),
            "client_cores": round(row["client_cpu_s"] / (row["finished"] - row["started"]), 2),
            "cores": cores,
        }


def unary_calls(
    found: dict,
    key: str,
    bus: Path,
    requests: int,
    clients: int,
    profile: tuple[int, Path] | None = None,
    server_pid: int | None = None,
    server_processes: int = 1,
) -> None:
    """Unary calls of bus.jpg's bytes, 64 in flight over `clients` processes then 8 over 2, after a warm-up that
    reaches every bucket; then the same bytes over streams (`STREAM_RPCS`, `STREAM_IN_FLIGHT` images in flight);
    `profile` (the server's pid, a file): py-spy records the server for the first seconds of the 64 in flight. With
    `server_pid`, each row says how many cores the machine, the server's processes and the bench's clients kept busy
    (`cpu`): whether the host's cores, rather than the GPU, bound a row. `server_processes` > 1: the bench's
    connections spread evenly over the server's processes (`Connection.reach`), else where the kernel hands them."""
    from yolojet.client.remote import Connection, bench

    connection = Connection(f"127.0.0.1:{PORT}")
    # The warm-up's calls have a short deadline: a server that stops answering fails the stage within seconds, while
    # its processes are still there for the stack dump.
    # A first round of 64 calls alone: a server that answers none fails the stage one deadline later, not after the
    # warm-up's every round has waited out its own.
    for count in (64, min(2000, requests // 10)):
        warm = bench(
            connection,
            bus,
            count,
            64,
            clients,
            {},
            call_timeout_s=WARM_CALL_TIMEOUT_S,
            limit_s=BENCH_LIMIT_S,
            server_processes=server_processes,
        )
        if warm["codes"].get("DEADLINE_EXCEEDED"):
            raise RuntimeError(f"warm-up: calls not answered within {WARM_CALL_TIMEOUT_S:g} s: {warm['codes']}")
    for concurrency, processes in ((64, clients), (8, 2)):
        spy = py_spy(profile[0], profile[1], 5) if profile is not None and concurrency == 64 else None
        count = requests if concurrency == 64 else requests // 4
        sampler = CpuSampler(server_pid) if server_pid is not None else None
        row = bench(
            connection, bus, count, concurrency, processes, {}, limit_s=BENCH_LIMIT_S, server_processes=server_processes
        )
        if sampler is not None:
            row["cpu"] = sampler.cores(row)
        if spy is not None:
            spy.wait(timeout=60)
        found[f"{key}_{concurrency}"] = row
        print(
            f"{key}, {concurrency} in flight: {row['img_per_s']:,.0f} img/s, p50 {row['p50_ms']:.2f} ms, "
            f"p99 {row['p99_ms']:.2f} ms, {row['codes']}, server {row['server_ms']}, cpu {row.get('cpu')}",
            flush=True,
        )
    for rpc in STREAM_RPCS:
        sampler = CpuSampler(server_pid) if server_pid is not None else None
        row = bench(
            connection,
            bus,
            requests,
            STREAM_IN_FLIGHT,
            clients,
            {},
            rpc,
            limit_s=BENCH_LIMIT_S,
            server_processes=server_processes,
        )
        if sampler is not None:
            row["cpu"] = sampler.cores(row)
        found[f"{key}_{rpc}"] = row
        print(
            f"{key}, {rpc}, {STREAM_IN_FLIGHT} in flight: {row['img_per_s']:,.0f} img/s, p50 {row['p50_ms']:.2f} ms, "
            f"p99 {row['p99_ms']:.2f} ms, {row['codes']}, server {row['server_ms']}, cpu {row.get('cpu')}",
            flush=True,
        )


def server_stage(
    found: dict,
    args: argparse.Namespace,
    key: str,
    scale: list[str],
    model_dir: Path,
    bus: Path,
    files: Path,
    work: Path,
    streams: int = 1,
    samples: Path | None = None,
) -> None:
    """`yolojet serve` with `scale`'s flags: the unary calls, then `yolojet label --server --streams` against it; its
    results under `key` in `found`."""
    server = None
    try:
        start = time.perf_counter()
        server = start_server(model_dir, args.out / f"serve-{key}.log", args.slo_ms, samples, scale)
        found[f"{key}_server_start_s"] = time.perf_counter() - start
        profile = (server.pid, args.out / f"pyspy-{key}.txt") if args.py_spy else None
        # With --spread-turns, the bench's connections where the kernel hands them (`-kernel`, as every bench before
        # the spreading) and spread over the processes, in turns, each round in the other order.
        spread = [("", streams), ("-kernel", 1)] if args.spread_turns and streams > 1 else [("", streams)]
        for turn in range(args.spread_turns if len(spread) > 1 else 1):
            for suffix, server_processes in spread if turn % 2 == 0 else spread[::-1]:
                unary_calls(
                    found,
                    key + suffix + (f"-t{turn + 1}" if turn else ""),
                    bus,
                    args.requests,
                    args.client_processes,
                    profile if turn == 0 and not suffix else None,  # py-spy's file once a server
                    server_pid=server.pid,
                    server_processes=server_processes,
                )
        if not args.no_label:
            where = ["--server", f"127.0.0.1:{PORT}", "--streams", str(streams)]
            found[f"label_server_{key}"] = label(files, work / f"server-{key}.jsonl", where)
            print(f"label --server ({key}): {found[f'label_server_{key}']}", flush=True)
            for window in args.label_windows:
                row = label(files, work / f"server-{key}-c{window}.jsonl", [*where, "-c", str(window)])
                found[f"label_server_{key}_c{window}"] = row
                print(f"label --server -c {window} ({key}): {row}", flush=True)
    except Exception:
        found.setdefault("failures", []).append(traceback.format_exc())
        print(traceback.format_exc(), flush=True)
        if server is not None:  # where each of the server's processes is, while it still is there
            dump_stacks([server.pid], args.out / f"pyspy-dump-{key}.txt")
    finally:
        if server is not None:
            found[f"{key}_server_exit"] = stop(server)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--files", type=int, default=10000)
    parser.add_argument("--slo-ms", type=float, default=50.0, help="the server's deadline for requests without one")
    parser.add_argument("--sample", action="store_true", help="run the server under bench/sampler.py")
    parser.add_argument(
        "--py-spy",
        action="store_true",
        help="py-spy records each server at 64 in flight (5 s), and a second `label --local` from start to end",
    )
    parser.add_argument(
        "--client-processes", type=int, default=4, help="the bench client's processes for the 64 calls in flight"
    )
    parser.add_argument("--no-label", action="store_true", help="the unary calls only")
    parser.add_argument(
        "--no-single", action="store_true", help="no single server's stage (only those of --processes, --asyncio)"
    )
    parser.add_argument("--no-local", action="store_true", help="no `label --local` run (the servers' rows only)")
    parser.add_argument(
        "--label-windows",
        type=int,
        nargs="+",
        default=[],
        metavar="C",
        help="also `label --server -c C` for each C given (its window of images in flight; default 64)",
    )
    parser.add_argument("--asyncio", action="store_true", help="also measure a server on asyncio's event loop")
    parser.add_argument("--devices", default=None, help="also measure the worker-process server and labeler on these")
    parser.add_argument(
        "--processes", type=int, nargs="+", default=[], help="also measure `serve --processes N` for each N given"
    )
    parser.add_argument(
        "--label-workers",
        type=int,
        nargs="+",
        default=[],
        help="also measure `label --local --workers N` for each N given (with --py-spy, the last under py-spy too)",
    )
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="YOLOJET_SWITCH_INTERVAL_MS for the servers and labelers started (default: the interpreter's 5 ms)",
    )
    parser.add_argument(
        "--decoder", default=None, help="--decoder for every server and labeler started (default: theirs, auto)"
    )
    parser.add_argument(
        "--serve-args", default="", help="further flags of every server, one argument: --serve-args='--max-queue 256'"
    )
    parser.add_argument(
        "--mps",
        action="store_true",
        help="measure each --processes N with `--mps off` and `--mps on` in turns, and each --label-workers N with "
        "both (without it: the default, auto)",
    )
    parser.add_argument(
        "--mps-rounds", type=int, default=2, help="--mps: rounds of the two settings, each in the other order"
    )
    parser.add_argument(
        "--spread-turns",
        type=int,
        default=0,
        metavar="N",
        help="against each --processes N: the bench's calls with their connections spread over the processes and "
        "where the kernel hands them, in turns, N rounds",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    LOG_DIR[:] = [args.out]
    if args.decoder is not None:
        DECODER[:] = ["--decoder", args.decoder]
    SERVE_ARGS[:] = shlex.split(args.serve_args)
    if args.switch_interval_ms is not None:  # inherited by every server and labeler process started below
        os.environ["YOLOJET_SWITCH_INTERVAL_MS"] = f"{args.switch_interval_ms:g}"

    from support import calibrated_model
    from ultralytics.utils import ASSETS

    import yolojet
    from yolojet.timing import provenance

    args.out.mkdir(parents=True, exist_ok=True)
    found: dict = {"provenance": provenance(), "slo_ms": args.slo_ms, "switch_interval_ms": args.switch_interval_ms}
    switch = "" if args.switch_interval_ms is None else f"-switch{args.switch_interval_ms:g}ms"
    out_file = args.out / f"serve-{found['provenance']['commit']}{switch}.json"
    work = Path(tempfile.mkdtemp(prefix="bench_serve_"))
    model_dir = yolojet.export(calibrated_model("yolo11n.yaml", 640), out=work / "yolo11n", imgsz=640)
    bus = Path(ASSETS) / "bus.jpg"
    files = work / "jpegs"
    files.mkdir()
    for i in range(args.files):
        shutil.copyfile(bus, files / f"{i:06d}.jpg")
    samples = args.out / "server-samples.json" if args.sample else None
    if not args.no_single:
        server_stage(found, args, "unary", [], model_dir, bus, files, work, samples=samples)
        out_file.write_text(json.dumps(found, indent=1))
    if args.asyncio:
        server_stage(found, args, "asyncio", ["--event-loop", "asyncio"], model_dir, bus, files, work)
        out_file.write_text(json.dumps(found, indent=1))
    for processes in args.processes:
        # With --mps, the servers without and with `--mps on` in turns, each round in the other order (a row timed
        # later in a run has come out faster than the same setting timed earlier).
        variants = [("", ["--mps", "off"]), ("-mps", ["--mps", "on"])] if args.mps else [("", [])]
        for turn in range(args.mps_rounds if args.mps else 1):
            for suffix, flags in variants if turn % 2 == 0 else variants[::-1]:
                key = f"processes{processes}{suffix}" + (f"-r{turn + 1}" if turn else "")
                scale = ["--processes", str(processes), *flags]
                server_stage(found, args, key, scale, model_dir, bus, files, work, streams=processes)
                out_file.write_text(json.dumps(found, indent=1))
    try:
        if not args.no_label and not args.no_local:
            found["label_local"] = label(files, work / "local.jsonl", ["--local", "--model", str(model_dir)])
            print(f"label --local: {found['label_local']}", flush=True)
            if args.py_spy:  # once more under py-spy: where the whole command's time goes
                spy = args.out / "pyspy-label-local.json"
                found["label_local_py_spy"] = label(
                    files, work / "local-spied.jsonl", ["--local", "--model", str(model_dir), "--overwrite"], spy
                )
                print(f"label --local under py-spy: {found['label_local_py_spy']}", flush=True)
    except Exception:
        found.setdefault("failures", []).append(traceback.format_exc())
    out_file.write_text(json.dumps(found, indent=1))
    if args.devices is not None:
        server_stage(found, args, "workers", ["--devices", args.devices], model_dir, bus, files, work)
        if not args.no_label:
            where = ["--local", "--model", str(model_dir), "--devices", args.devices]
            found["label_local_workers"] = label(files, work / "local-workers.jsonl", where)
            print(f"label --local --devices: {found['label_local_workers']}", flush=True)
        out_file.write_text(json.dumps(found, indent=1))
    for workers in args.label_workers if not args.no_label else []:
        # With --mps, without and with an MPS daemon for the workers sharing the GPU, one after the other.
        for suffix, flags in [("", ["--mps", "off"]), ("_mps", ["--mps", "on"])] if args.mps else [("", [])]:
            where = ["--local", "--model", str(model_dir), "--workers", str(workers), "--overwrite", *flags]
            key = f"label_local_workers{workers}{suffix}"
            found[key] = label(files, work / f"local-workers{workers}{suffix}.jsonl", where)
            print(f"label --local --workers {workers} {' '.join(flags)}: {found[key]}", flush=True)
            out_file.write_text(json.dumps(found, indent=1))
    if args.py_spy and args.label_workers and not args.no_label:
        workers = args.label_workers[-1]
        where = ["--local", "--model", str(model_dir), "--workers", str(workers), "--overwrite"]
        spy = args.out / f"pyspy-label-workers{workers}.json"
        found["label_local_workers_py_spy"] = label(files, work / "local-workers-spied.jsonl", where, spy)
        print(f"label --local --workers {workers} under py-spy: {found['label_local_workers_py_spy']}", flush=True)
    print_table(found, args.files, args.processes, args.label_workers)
    return 1 if found.get("failures") else 0


def print_table(found: dict, files: int, processes: list[int], label_workers: list[int]) -> None:
    interval = found.get("switch_interval_ms")
    print(f"\nswitch interval: {'5 ms (the default)' if interval is None else f'{interval:g} ms'}")
    print("| measure | value |\n|---|---|")
    fronts = [
        (
            key,
            "Infer, serve --processes "
            + key.removeprefix("processes")
            .replace("-mps", " --mps on")
            .replace("-r", ", round ")
            .replace("-kernel", ", connections where the kernel put them")
            .replace("-t", ", turn "),
        )
        for key in dict.fromkeys(k.removesuffix("_64") for k in found if re.fullmatch(r"processes\d+[-\w]*_64", k))
    ]
    servers = (
        ("unary", "Infer"),
        ("asyncio", "Infer, serve --event-loop asyncio"),
        ("workers", "Infer, serve --devices"),
    )
    for key, name in (*servers, *fronts):
        for concurrency in (64, 8):
            row = found.get(f"{key}_{concurrency}")
            if row:
                print(
                    f"| {name}, {concurrency} in flight | {row['img_per_s']:,.0f} img/s, p50 {row['p50_ms']:.2f} ms, "
                    f"p99 {row['p99_ms']:.2f} ms, {row['codes']} |"
                )
        for rpc in STREAM_RPCS:
            row = found.get(f"{key}_{rpc}")
            if row:
                print(
                    f"| {name.replace('Infer', rpc, 1)}, {STREAM_IN_FLIGHT} in flight | {row['img_per_s']:,.0f} "
                    f"img/s, p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms, {row['codes']} |"
                )
    labels = (
        ("label_server_unary", "label --server"),
        ("label_server_asyncio", "label --server, asyncio's loop"),
        ("label_local", "label --local"),
        ("label_local_workers", "label --local --devices"),
        *((f"label_local_workers{n}", f"label --local --workers {n}") for n in label_workers),
        *((f"label_local_workers{n}_mps", f"label --local --workers {n} --mps on") for n in label_workers),
        ("label_server_workers", "label --server, --devices"),
        *((f"label_server_processes{n}", f"label --server --streams {n}, --processes {n}") for n in processes),
    )
    for key in found:  # the windows given, against each server
        window = re.fullmatch(r"label_server_(\w+)_c(\d+)", key)
        if window:
            labels += ((key, f"label --server -c {window[2]} ({window[1]})"),)
    for key, name in labels:
        row = found.get(key)
        if row:
            print(
                f"| {name}, {files} files | {row['img_per_s']:,.0f} img/s ({row['records']} records, whole command "
                f"{row['wall_s']:.1f} s, exit {row['exit']}) |"
            )
    if found.get("failures"):
        print("| failures | see the JSON |")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
