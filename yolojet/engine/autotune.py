"""Per-layer tile selection by measurement, remembered on disk.

Each tunable launch offers candidate configs; each is timed on the real views with CUDA events and
the fastest kept. Winners are stored in one JSON file keyed by GPU name, Triton version, the set of
candidate tiles and the launch's shape key, so the next start-up on the same GPU skips the timing.

Compiling the candidates costs far more than timing them (a few hundred specializations at up to
seconds each), so before the timing starts every candidate of every untuned launch, and the kernel of
every other launch, is compiled: on worker processes (one a core) when there is tuning to do, then on
a pool of threads through Triton's asynchronous compile mode where the installed Triton has it, which
loads what the workers left in Triton's cache and compiles anything they did not. The timing and the
graph capture then only launch.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import torch
import triton

try:
    from triton.errors import TritonError  # compile, ptxas and shared-memory errors alike
except ImportError:  # Triton before the common base class
    from triton.compiler.errors import CompilationError as TritonError

from yolojet.engine import compile_workers
from yolojet.engine.lowering import Launch, TileConfig
from yolojet.errors import EngineConfigError
from yolojet.kernels.attention import AttentionTile, attention_tile_set_id
from yolojet.kernels.conv import ConvConfig, candidate_set_id
from yolojet.kernels.dwconv import DwConvTile, dwconv_tile_set_id
from yolojet.options import cache_dir, compile_workers_asked

_CONFIG_TYPES = {cls.__name__: cls for cls in (ConvConfig, DwConvTile, AttentionTile)}


class TuningCache:
    """A JSON file of {device|triton|candidate sets|launch key: config}; writes replace the file atomically. An
    entry this version cannot read (another format, a field since removed) counts as not tuned."""

    def __init__(self, path: Path | None = None, device_name: str | None = None) -> None:
        self.path = path or cache_dir() / "autotune.json"
        device_name = device_name or torch.cuda.get_device_name()
        tile_sets = f"{candidate_set_id()}-{dwconv_tile_set_id()}-{attention_tile_set_id()}"
        self.prefix = f"{device_name}|triton-{triton.__version__}|tiles-{tile_sets}|"
        try:
            self.entries: dict[str, dict] = json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            self.entries = {}

    def get(self, key: str) -> TileConfig | None:
        entry = self.entries.get(self.prefix + key)
        if not isinstance(entry, dict):
            return None
        fields = dict(entry)
        try:
            return _CONFIG_TYPES[fields.pop("type", "ConvConfig")](**fields)
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, key: str, config: TileConfig) -> None:
        self.entries[self.prefix + key] = {"type": type(config).__name__, **asdict(config)}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, staging = tempfile.mkstemp(dir=self.path.parent, prefix=".autotune.")
        with os.fdopen(fd, "w") as f:
            json.dump(self.entries, f, indent=0, sort_keys=True)
        os.replace(staging, self.path)


def time_launch(launch: Launch, repeats: int = 10, replays: int = 5) -> float:
    """Device milliseconds of one launch: `repeats` back-to-back copies captured in a CUDA graph, replayed.

    Timing plain launches would measure Python's launch overhead, which for these microsecond
    kernels is larger than the kernels themselves.
    """
    launch.run()  # compiles this configuration where the compile before the timing did not
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # thread_local: other threads' CUDA calls (the decoder starting beside the network, a server's threads) must
    # not invalidate the capture, as the default global mode lets them (seen on an H200: cudaErrorStreamCapture-
    # Invalidated while nvImageCodec started).
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for _ in range(repeats):
            launch.run()
    graph.replay()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / (repeats * replays)


def untuned(launches: list[Launch], cache: TuningCache) -> list[Launch]:
    """The tunable launches whose winner the cache does not hold yet."""
    return [
        launch for launch in launches if launch.tune_key and launch.configure and cache.get(launch.tune_key) is None
    ]


def compile_launches(
    to_tune: list[Launch],
    others: list[Launch],
    workers: int | None = None,
    processes: bool | None = None,
    seconds: dict[str, float] | None = None,
) -> bool:
    """Compile every candidate config of the launches `to_tune` and the kernels the `others` launch with their
    current configs (remembered picks, fixed kernels), launching nothing; False where this Triton cannot compile in
    the background (each kernel is then compiled when first launched, one after another).

    `processes` (by default: when there is tuning to do, unless YOLOJET_COMPILE_WORKERS=0; a positive number
    there sets how many workers) compiles on worker processes first (engine/compile_workers.py), the cold
    start-up's few hundred specializations on every core; the pass on threads after them loads those from
    Triton's on-disk cache. A start-up whose picks are all
    remembered mostly loads cached kernels, which does not pay for starting processes. `seconds` gets the wall
    time of each part: collecting the specializations, the workers, the pass on threads.
    """
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return False
    calls = [
        functools.partial(launch.compile, config)
        for launch in to_tune
        if launch.compile is not None
        for config in launch.candidates
    ]
    calls += [functools.partial(launch.run, compile_only=True) for launch in others]
    workers = workers or compile_workers.worker_count()
    if processes is None:
        processes = bool(to_tune) and compile_workers_asked() != 0
    seconds = {} if seconds is None else seconds
    if processes and compile_workers.available():
        start = time.perf_counter()
        with compile_workers.Workers(workers) as processes_pool:  # they start while the calls are collected
            specializations = compile_workers.collect(calls)
            seconds["compile_collect"] = time.perf_counter() - start
            processes_pool.compile(specializations)
        seconds["compile_workers"] = time.perf_counter() - start - seconds["compile_collect"]
    start = time.perf_counter()
    # Leaving AsyncCompileMode waits for every compile (identical specializations are compiled once); only then
    # is the pool shut down. A candidate that fails to compile fails again when timed, where `tune` leaves it out.
    with (
        ThreadPoolExecutor(workers, thread_name_prefix="yolojet-compile") as pool,
        AsyncCompileMode(pool, ignore_errors=True),
    ):
        for call in calls:
            call()
    seconds["compile_threads"] = time.perf_counter() - start
    return True


def _cannot_build(error: Exception) -> bool:
    """A candidate's own failure to compile or launch, not a broken device: Triton's errors, and the MLIR pass
    failures its compiler raises as plain RuntimeErrors."""
    return isinstance(error, TritonError) or "PassManager" in str(error)


def _failure_reason(error: Exception) -> str:
    """One line of the error that says what failed: a compile error's message ends with it, after the source."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    return lines[-1] if lines[0].startswith("at ") else lines[0]


def tune(
    launches: list[Launch],
    cache: TuningCache,
    progress: Callable[[], None] | None = None,
    timer: Callable[[Launch], float] = time_launch,
) -> dict[str, int]:
    """Give every tunable launch its fastest config; returns counts of cached and newly timed launches, and of
    candidate timings left out as unusable.

    A candidate that this Triton cannot compile, or this GPU cannot launch (a pipeline needing more shared
    memory than a smaller GPU has, say), is left out with one warning per config; a launch none of whose
    candidates runs is an EngineConfigError.
    """
    counts = {"cached": 0, "timed": 0, "unusable": 0}
    unusable: dict[TileConfig, str] = {}
    for launch in launches:
        if launch.tune_key is None or launch.configure is None:
            continue
        known = cache.get(launch.tune_key)
        if known is not None:
            launch.configure(known)
            counts["cached"] += 1
        else:
            best = None
            for config in launch.candidates:
                launch.configure(config)
                try:
                    elapsed = timer(launch)
                except (TritonError, RuntimeError) as error:
                    if not _cannot_build(error):
                        raise
                    unusable.setdefault(config, _failure_reason(error))
                    counts["unusable"] += 1
                    continue
                if best is None or elapsed < best[0]:
                    best = (elapsed, config)
            if best is None:
                reasons = "; ".join(f"{c}: {unusable[c]}" for c in launch.candidates if c in unusable)
                raise EngineConfigError(
                    f"layer {', '.join(launch.nodes)}: none of its {len(launch.candidates)} tile candidates runs "
                    f"with Triton {triton.__version__} on {cache.prefix.split('|')[0]} ({reasons or 'none offered'})"
                )
            launch.configure(best[1])
            cache.put(launch.tune_key, best[1])
            counts["timed"] += 1
        if progress is not None:
            progress()
    for config, reason in unusable.items():
        warnings.warn(f"tile {config} left out of tuning: {reason}", RuntimeWarning, stacklevel=2)
    return counts
