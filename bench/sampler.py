"""Run a Python module under a sampling profiler: where each thread's time goes, including time waiting.

Every --interval ms a thread of its own records, for every other thread, its innermost --depth frames; at exit the
most frequent stacks per thread go to --out as JSON (thread name -> [[count, "file:line function <- caller ..."]]).
The sampler needs the interpreter lock to look, so a thread that holds it for long is seen less often than it runs;
a thread blocked in C (a CUDA sync, a socket poll) is seen at the Python line that called it.

    python3 bench/sampler.py --out samples.json -- -m yolojet serve --model yolo11n.pt
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import runpy
import sys
import threading
import time
from pathlib import Path


def frames_of(frame, depth: int) -> str:
    parts = []
    while frame is not None and len(parts) < depth:
        code = frame.f_code
        parts.append(f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return " <- ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--interval", type=float, default=2.0, help="ms between samples (default 2)")
    parser.add_argument("--depth", type=int, default=4, help="frames kept of each stack (default 4)")
    parser.add_argument("--top", type=int, default=25, help="stacks kept per thread (default 25)")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="-m MODULE ARGS...")
    args = parser.parse_args()
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if rest[:1] != ["-m"] or len(rest) < 2:
        parser.error("give -- -m MODULE [ARGS...]")
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    samples = [0]

    def sample() -> None:
        me = threading.get_ident()
        while True:
            time.sleep(args.interval / 1000)
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    counts[names.get(ident, str(ident))][frames_of(frame, args.depth)] += 1
            samples[0] += 1

    def dump() -> None:
        found = {
            "samples": samples[0],
            "interval_ms": args.interval,
            "threads": {name: [[n, stack] for stack, n in c.most_common(args.top)] for name, c in counts.items()},
        }
        args.out.write_text(json.dumps(found, indent=1))

    atexit.register(dump)
    threading.Thread(target=sample, name="sampler", daemon=True).start()
    sys.argv = [rest[1], *rest[2:]]
    runpy.run_module(rest[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
