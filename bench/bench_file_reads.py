"""Reading image files into new bytes objects, as the hardware decoder's prepare does (`read_cached_file`), with
glibc's malloc as it starts and after `keep_freed_memory`, each in a fresh process, on the main thread and on another;
beside `os.preadv` into one reused buffer (what no allocation costs). Any machine.

    python3 bench/bench_file_reads.py [--files 640] [--batch 64] [--passes 5] [--out results/]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def timed_reads(folder: Path, batch: int, passes: int, how: str) -> dict[str, list[float]]:
    """us a file of each pass, `batch` files' bytes alive at a time: `how` is 'default', 'kept' or 'buffer'."""
    from yolojet.images.sources import keep_freed_memory, read_cached_file

    if how == "kept":
        keep_freed_memory()
    paths = sorted(str(p) for p in folder.iterdir())
    buffer = memoryview(bytearray(batch * max(os.path.getsize(p) for p in paths)))

    def one_pass() -> float:
        start = time.perf_counter()
        for at in range(0, len(paths), batch):
            if how == "buffer":
                offset = 0
                for path in paths[at : at + batch]:
                    handle = os.open(path, os.O_RDONLY)
                    offset += os.preadv(handle, [buffer[offset:]], 0)
                    os.close(handle)
            else:
                held = [read_cached_file(path) for path in paths[at : at + batch]]
                assert all(held), "a file was not wholly in the page cache"
                del held
        return (time.perf_counter() - start) / len(paths) * 1e6

    found: dict[str, list[float]] = {"main": [one_pass() for _ in range(passes)]}
    if how != "buffer":
        other: list[float] = []
        thread = threading.Thread(target=lambda: other.extend(one_pass() for _ in range(passes)))
        thread.start()
        thread.join()
        found["thread"] = other
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=640)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        folder, batch, passes, how = args.child
        print(json.dumps(timed_reads(Path(folder), int(batch), int(passes), how)))
        return 0

    from ultralytics.utils import ASSETS

    folder = Path(tempfile.mkdtemp(prefix="bench_file_reads_"))
    try:
        for i in range(args.files):
            shutil.copyfile(Path(ASSETS) / "bus.jpg", folder / f"{i:05d}.jpg")
        found = {}
        for how in ("default", "kept", "buffer"):
            command = [sys.executable, __file__, "--child", str(folder), str(args.batch), str(args.passes), how]
            found[how] = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    finally:
        shutil.rmtree(folder)
    print(f"| {args.files} copies of bus.jpg, {args.batch} alive at a time | main thread, us a file | another thread |")
    print("|---|---|---|")
    names = {"default": "glibc's defaults", "kept": "keep_freed_memory", "buffer": "os.preadv into one buffer"}
    for how, row in found.items():
        cells = [" ".join(f"{x:.1f}" for x in row[where]) if where in row else "" for where in ("main", "thread")]
        print(f"| {names[how]} | {cells[0]} | {cells[1]} |")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "file-reads.json").write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, **found}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
