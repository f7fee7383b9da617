"""Compiling a start-up's Triton kernels in worker processes, into Triton's on-disk cache.

A cold start-up compiles a few hundred kernel specializations (every tile candidate of every layer). Triton's
compiler holds the GIL for much of each compile (walking the kernel's AST, driving its passes), so threads in one
process keep only a few cores busy. Here the specializations are first collected without compiling them (Triton's
`jit_cache_hook` reports each one and, returning True, skips its compile), then compiled by worker processes, one
per core, each taking the next specialization as it finishes the last. The workers rebuild each specialization
from Triton's own serialized form (`JITFunction.preload`) and leave the result in the on-disk cache, so the
start-up's own compile pass afterwards only loads them. Whatever a worker could not compile (a worker that failed
to start, a specialization that does not serialize) is compiled by that pass as before: the workers only ever
save time.

Workers are plain subprocesses of this module (`python -m yolojet.runtime.compile_workers`) fed one JSON line a
specialization, not multiprocessing children, so an embedding script needs no `__main__` guard.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

import triton
from triton.runtime.jit import JITFunction


@dataclass(frozen=True)
class Specialization:
    """One kernel specialization as Triton serializes it: the kernel's module and name, and `preload`'s data.
    `size` (warps x stages x the BLOCK_* sizes) orders the compiles, largest first, as a proxy for their cost."""

    module: str
    name: str
    data: str
    size: int = 0


def _size(fn: JITFunction, compile: dict) -> int:
    size = compile.get("num_warps", 1) * compile.get("num_stages", 1)
    for path, value in compile.get("constants", {}).items():
        value = getattr(value, "value", value)
        if len(path) == 1 and fn.arg_names[path[0]].startswith("BLOCK") and isinstance(value, int):
            size *= value
    return size


def worker_count() -> int:
    """The cores this process may run on (its affinity, not the machine's count), at most 32."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        cores = os.cpu_count() or 1
    return max(1, min(32, cores))


def available() -> bool:
    """Whether this Triton reports specializations before compiling them and can rebuild them from their data."""
    knobs = getattr(triton, "knobs", None)
    return knobs is not None and hasattr(knobs.runtime, "jit_cache_hook") and hasattr(JITFunction, "preload")


def collect(calls: list[Callable[[], object]]) -> list[Specialization]:
    """The specializations `calls` (kernel launches or warm-ups) would compile, each once, largest first (a
    large tile's compile started last would keep every other worker waiting); none is compiled and nothing is
    launched. A call that fails to report (its specialization does not serialize) is left out: the compile pass
    after the workers builds it."""
    found: dict[tuple[str, str, str], Specialization] = {}

    def report(*, key, fn, compile, **_) -> bool:
        identity = (fn.module, fn.name, str(key))
        if identity not in found:
            size = _size(fn.jit_function, compile)
            found[identity] = Specialization(fn.module, fn.name, compile["specialization_data"], size)
        return True  # skip this compile (and the launch after it)

    knobs = triton.knobs
    previous, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, report
    try:
        for call in calls:
            with contextlib.suppress(Exception):
                call()
    finally:
        knobs.runtime.jit_cache_hook = previous
    return sorted(found.values(), key=lambda item: -item.size)


class Workers:
    """Worker processes, all started at once (each imports torch and Triton while the caller collects what to
    compile); `compile` hands them specializations; leaving the `with` block ends them. Workers inherit this
    process's environment (TRITON_CACHE_DIR, the visible GPUs)."""

    # A compile that takes longer is taken to hang: its worker is killed, and the compile pass after the workers
    # compiles that specialization itself (and reports what is wrong with it).
    seconds_per_compile = 300.0

    def __init__(self, count: int | None = None) -> None:
        self.processes: list[subprocess.Popen] = []
        for _ in range(count or worker_count()):
            try:
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", __name__],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL,
                        text=True,
                    )
                )
            except OSError:  # no more processes: fewer workers
                break

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def close(self) -> None:
        for process in self.processes:
            with contextlib.suppress(OSError):
                process.stdin.close()  # a worker ends when its input does
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            process.stdout.close()
        self.processes = []

    def compile(self, specializations: list[Specialization]) -> int:
        """Compile `specializations` into Triton's on-disk cache, each worker taking the next as it finishes the
        last; returns how many the workers compiled."""
        pending: queue.SimpleQueue[Specialization] = queue.SimpleQueue()
        for item in specializations:
            pending.put(item)
        compiled = [0] * len(self.processes)

        def feed(index: int) -> None:
            process = self.processes[index]
            try:
                while True:
                    try:
                        item = pending.get_nowait()
                    except queue.Empty:
                        return
                    process.stdin.write(json.dumps([item.module, item.name, item.data]) + "\n")
                    process.stdin.flush()
                    watchdog = threading.Timer(self.seconds_per_compile, process.kill)
                    watchdog.start()
                    answer = process.stdout.readline()
                    watchdog.cancel()
                    if not answer:  # the worker died: the others, or the compile pass after, take the rest
                        return
                    compiled[index] += answer.strip() == "ok"
            except (OSError, ValueError):  # a broken pipe to a worker that died
                return

        threads = [threading.Thread(target=feed, args=(i,), daemon=True) for i in range(len(self.processes))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(compiled)


def compile_in_workers(specializations: list[Specialization], workers: int | None = None) -> int:
    """Compile `specializations` into Triton's on-disk cache on `workers` worker processes (one a core by
    default); returns how many they compiled."""
    if not specializations:
        return 0
    with Workers(min(workers or worker_count(), len(specializations))) as pool:
        return pool.compile(specializations)


def _kernel(module: str, name: str) -> JITFunction:
    target = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    if not isinstance(target, JITFunction):
        raise TypeError(f"{module}.{name} is not a Triton kernel")
    return target


def main() -> None:
    """A worker: compile each specialization read from stdin, answering one line each ("ok" or the error)."""
    import torch  # noqa: F401  (Triton's CUDA driver needs it: imported while the parent collects the work)

    for line in sys.stdin:
        try:
            module, name, data = json.loads(line)
            _kernel(module, name).preload(data)
            answer = "ok"
        except Exception as error:  # reported, not raised: the parent compiles it itself
            answer = f"failed: {type(error).__name__}: {error}".replace("\n", " ")
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
