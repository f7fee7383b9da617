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

Workers are plain subprocesses of this module (`python -m yolojet.engine.compile_workers`) fed one JSON line a
specialization, not multiprocessing children, so an embedding script needs no `__main__` guard.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import triton
from triton.runtime.jit import JITFunction

from yolojet.options import compile_workers_asked


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
    """How many workers: YOLOJET_COMPILE_WORKERS when it is a positive number, else the cores this process may
    run on (its affinity, not the machine's count), at most 32."""
    asked = compile_workers_asked()
    if asked:
        return asked
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        cores = os.cpu_count() or 1
    return max(1, min(32, cores))


def available() -> bool:
    """Whether this Triton reports specializations before compiling them and can rebuild them from their data, and
    whether what workers leave in the on-disk cache is used (not with TRITON_ALWAYS_COMPILE)."""
    knobs = getattr(triton, "knobs", None)
    return (
        knobs is not None
        and hasattr(knobs.runtime, "jit_cache_hook")
        and hasattr(JITFunction, "preload")
        and not knobs.compilation.always_compile
    )


_collecting = threading.Lock()


def collect(calls: Sequence[Callable[[], object]]) -> list[Specialization]:
    """The specializations `calls` would compile, each once, largest first (a large tile's compile started last
    would keep every other worker waiting). `calls` are compile-only calls (launchers with compile_only=True,
    `JITFunction.warmup`): none of them compiles here. A call that fails to report (its specialization does not
    serialize) is left out: the compile pass after the workers builds it.

    Triton's hook is the process's: while this runs, it skips compiles of this thread only, and hands other
    threads' (an engine's first predict elsewhere, say) to whatever hook was set before; collections take turns.
    """
    found: dict[tuple[str, str, str], Specialization] = {}
    collector = threading.get_ident()
    knobs = triton.knobs
    with _collecting:
        previous = knobs.runtime.jit_cache_hook

        def report(**kwargs) -> bool | None:
            if threading.get_ident() != collector:
                return previous(**kwargs) if previous is not None else None
            fn, compile = kwargs["fn"], kwargs["compile"]
            identity = (fn.module, fn.name, str(kwargs["key"]))
            if identity not in found:
                size = _size(fn.jit_function, compile)
                found[identity] = Specialization(fn.module, fn.name, compile["specialization_data"], size)
            return True  # skip this compile

        knobs.runtime.jit_cache_hook = report
        try:
            for call in calls:
                with contextlib.suppress(Exception):
                    call()
        finally:
            knobs.runtime.jit_cache_hook = previous
    return sorted(found.values(), key=lambda item: -item.size)


def _worker_environment() -> dict[str, str]:
    """This process's environment, plus what a worker must share with it: Triton's cache directory (which may have
    been set in code, not in the environment) and where this yolojet is imported from."""
    import yolojet

    env = dict(os.environ, TRITON_CACHE_DIR=str(triton.knobs.cache.dir))
    home = str(Path(yolojet.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (home, env.get("PYTHONPATH", "")) if p)
    return env


class Workers:
    """Worker processes, all started at once (each imports torch and Triton while the caller collects what to
    compile); `compile` hands them specializations; leaving the `with` block ends them. Each worker is the leader
    of its own process group, so that killing it also kills the ptxas it may be running."""

    # A compile that takes longer is taken to hang: its worker is killed, and the compile pass after the workers
    # compiles that specialization in this process.
    seconds_per_compile = 300.0

    def __init__(self, count: int | None = None) -> None:
        self.processes: list[subprocess.Popen] = []
        self.answered = 0  # answers received, compiled or not
        env = _worker_environment()
        for _ in range(count or worker_count()):
            try:
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", __name__],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL,
                        text=True,
                        env=env,
                        start_new_session=True,
                    )
                )
            except OSError:  # no more processes: fewer workers
                break
        self.busy: set[int] = set()  # workers given work: the others are still importing, or idle

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def _kill(self, process: subprocess.Popen) -> None:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)

    def close(self) -> None:
        """End every worker: one given work ends when its input does (after the compile it may be finishing);
        one never given work is killed at once rather than waited for while it imports torch."""
        for index, process in enumerate(self.processes):
            if index in self.busy and process.stdin is not None:
                with contextlib.suppress(OSError):
                    process.stdin.close()
            else:
                self._kill(process)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._kill(process)
                process.wait()
            for stream in (process.stdin, process.stdout):
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()
        self.processes = []

    def compile(self, specializations: list[Specialization]) -> int:
        """Compile `specializations` into Triton's on-disk cache, each worker taking the next as it finishes the
        last; returns how many the workers compiled."""
        pending: queue.SimpleQueue[Specialization] = queue.SimpleQueue()
        for item in specializations:
            pending.put(item)
        compiled = [0] * len(self.processes)
        answered = [0] * len(self.processes)

        def feed(index: int) -> None:
            process = self.processes[index]
            requests, answers = process.stdin, process.stdout
            assert requests is not None and answers is not None  # workers start with both piped
            while True:
                try:
                    item = pending.get_nowait()
                except queue.Empty:
                    return
                self.busy.add(index)
                watchdog = threading.Timer(self.seconds_per_compile, self._kill, args=(process,))
                watchdog.daemon = True
                try:
                    requests.write(json.dumps([item.module, item.name, item.data]) + "\n")
                    requests.flush()
                    watchdog.start()
                    answer = answers.readline()
                except (OSError, ValueError):  # a broken pipe to a worker that died
                    return
                finally:
                    watchdog.cancel()
                if not answer:  # the worker died or was killed: the others, or the pass after, take the rest
                    return
                answered[index] += 1
                compiled[index] += answer.strip() == "ok"

        threads = [threading.Thread(target=feed, args=(i,), daemon=True) for i in range(len(self.processes))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.answered += sum(answered)
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
    # Answers go out on a descriptor of their own, which no child inherits; stdout becomes stderr, so that
    # what Triton prints (a failed ptxas's reproducer) and the ptxas it runs never write into the answers.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    import torch  # noqa: F401  (Triton's CUDA driver needs it: imported while the parent collects the work)

    for line in sys.stdin:
        try:
            module, name, data = json.loads(line)
            _kernel(module, name).preload(data)
            answer = "ok"
        except Exception as error:  # reported, not raised: the parent compiles it itself
            answer = f"failed: {type(error).__name__}: {error}".replace("\n", " ")
        answers.write(answer + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
