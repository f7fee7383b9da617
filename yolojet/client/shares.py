"""Work over a labeling run's records shared among worker processes (the COCO file and the YOLO dataset): the output
is cut into line-aligned byte ranges (`records.byte_shares`), each made by a process of its own, since a record's work
is its own alone.

- Workers are spawned, never forked: the labeling process may hold a GPU context. A caller's script is imported again
  in each, as multiprocessing's spawn does, so a script calling this needs the usual `if __name__ == "__main__"`.
- The records a share has made are counted into a shared value, which moves the caller's progress bar.
- A share that fails, or a Ctrl-C (the parent's alone: workers ignore SIGINT), tells every other share to stop at its
  next count (`REPORT_EVERY` records), so the error comes back at once, not when the slowest share ends.
- A worker whose parent is gone (killed) stops: it holds the read end of a pipe only the parent writes to.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from yolojet.client.records import iter_records
from yolojet.errors import OutputPathError
from yolojet.progress import Progress

Report = Callable[[int], object]
FORMAT_WORKERS = 8
PARALLEL_FROM = 2_000  # records (counted as 300 bytes each): below, one process (a worker starts in ~0.15 s)
REPORT_EVERY = 64  # records a share makes between counts (and between looks at whether to stop)


class Stopped(Exception):
    """A share told to stop: another failed, or the run was interrupted."""


@dataclass
class _Shared:
    done: Any  # records made by every worker (multiprocessing.Value "q")
    stop: Any  # set when the shares are to stop (multiprocessing.Value "b")


_shared: _Shared | None = None  # in a worker process only


def worker_count(records: Path, workers: int | None) -> int:
    """The processes to share `records` among: `workers` where given, else one for a short output and up to
    FORMAT_WORKERS of the CPUs this process may run on."""
    if workers is not None:
        return max(1, workers)
    size = records.stat().st_size if records.is_file() else 0
    if size < PARALLEL_FROM * 300:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))  # a container's or taskset's share, not the machine's count
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return min(FORMAT_WORKERS, cpus)


def share_records(records: str, start: int, end: int, report: Report | None) -> Iterator[dict]:
    """The records of one share, each counted once the caller is done with it (the loop's next step): to `report` in
    this process, to the shared count in a worker, which stops here (`Stopped`) once told to."""
    done = 0
    for record in iter_records(Path(records), start, end) if end > start else ():
        yield record
        done += 1
        if done % REPORT_EVERY == 0:
            _count(report, REPORT_EVERY)
    _count(report, done % REPORT_EVERY)


def _count(report: Report | None, count: int) -> None:
    if report is not None:
        report(count)
    elif _shared is not None:
        with _shared.done.get_lock():
            _shared.done.value += count
        if _shared.stop.value:
            raise Stopped


def _start_worker(done: Any, stop: Any, parent: Connection) -> None:
    global _shared
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _shared = _Shared(done, stop)
    threading.Thread(target=_stop_when_orphaned, args=(parent,), daemon=True).start()


def _stop_when_orphaned(parent: Connection) -> None:
    try:
        parent.recv()  # the parent never writes: this returns when its end closes, that is when it is gone
    except (EOFError, OSError):
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def run_shares(work: Callable[..., int], shares: list[tuple], progress: Progress | None, what: str) -> list[int]:
    """`work(*share, report=...)` for each share: in this process for one, else each in a worker process of its own;
    returns each share's count. `what` names the output in the error a worker's death gives."""
    report = progress.update if progress is not None else None
    if len(shares) == 1:
        return [work(*shares[0], report=report)]
    context = multiprocessing.get_context("spawn")
    done, stop = context.Value("q", 0), context.Value("b", 0)
    alive, parent_end = context.Pipe(duplex=False)  # the workers hold the read end, this process the write end
    shown = 0
    try:
        with ProcessPoolExecutor(
            len(shares), mp_context=context, initializer=_start_worker, initargs=(done, stop, alive)
        ) as pool:
            futures = [pool.submit(work, *share, report=None) for share in shares]
            try:
                while True:
                    finished, running = wait(futures, timeout=0.25, return_when=FIRST_EXCEPTION)
                    if report is not None:
                        now = done.value
                        report(now - shown)
                        shown = now
                    if not running or any(f.exception() is not None for f in finished):
                        break
            finally:
                stop.value = 1  # a share failed, or this process was interrupted: the others stop (no-op when done)
        errors = [f.exception() for f in futures]
    except BrokenProcessPool as e:
        stopped = f"{what}: a process making it stopped ({e}); the records are kept: --resume makes it again"
        raise OutputPathError(stopped) from e
    finally:
        parent_end.close()
        alive.close()
    failure = next((e for e in errors if e is not None and not isinstance(e, Stopped)), None)
    if failure is not None:
        raise failure
    return [f.result() for f in futures]
