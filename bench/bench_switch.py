"""The image feed beside a thread running Python code, at several switch intervals: how much a thread that gives up
the GIL and takes it back (a file read, a decode call, a torch op) loses to one that never gives it up.

The feed (yolojet/engine/feed.py) reads and decodes --files copies of bus.jpg with the CPU decoder (and with the
hardware decoder where the GPU has one), alone, then beside a thread computing in Python, at each --intervals switch
interval (`sys.setswitchinterval`, ms; Python's default is 5). Runs on a machine without a GPU.

    python3 bench/bench_switch.py --files 400 --intervals 5 1 0.2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch


def feed_rate(paths: list[str], decoder) -> float:
    from yolojet.engine.feed import FrameFeed

    start, count = time.perf_counter(), 0
    for fed in FrameFeed(paths, decoder, 16):
        if torch.cuda.is_available():
            fed.decoded.wait_on(torch.cuda.current_stream())
        count += len(fed.sources)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return count / (time.perf_counter() - start)


@contextlib.contextmanager
def python_thread():
    """A thread computing in Python (never giving up the GIL of its own accord) while the block runs."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(i * i for i in range(2000))

    thread = threading.Thread(target=spin, name="python-load")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--intervals", type=float, nargs="+", default=[5.0, 1.0, 0.2], help="ms")
    parser.add_argument("--out", type=Path, default=None, help="a JSON file for the rates")
    args = parser.parse_args()

    from ultralytics.utils import ASSETS

    from yolojet.errors import EngineConfigError
    from yolojet.images.decoders import make_decoder

    work = Path(tempfile.mkdtemp(prefix="bench_switch_"))
    paths = []
    for i in range(args.files):
        paths.append(str(work / f"{i:06d}.jpg"))
        shutil.copyfile(ASSETS / "bus.jpg", paths[-1])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows: dict = {}
    for name in ("cpu", "nvimgcodec"):
        try:
            decoder = make_decoder(name, device)
        except EngineConfigError as e:
            print(f"{name}: not here ({e})", flush=True)
            continue
        feed_rate(paths[:64], decoder)  # warm: imports, first allocations
        row = {"alone": feed_rate(paths, decoder)}
        default = sys.getswitchinterval()
        for interval in args.intervals:
            sys.setswitchinterval(interval / 1e3)
            try:
                with python_thread():
                    row[f"beside a Python thread, {interval:g} ms"] = feed_rate(paths, decoder)
            finally:
                sys.setswitchinterval(default)
        decoder.close()
        rows[name] = row
        print(f"{name}: " + ", ".join(f"{k} {v:,.0f} img/s" for k, v in row.items()), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
