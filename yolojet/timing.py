"""Timings kept whole and read as quantiles, with what they were measured on: the one helper of the CLI's profile,
bench and pipeline commands, `yolojet report`, the engine's own timing methods and the scripts in bench/.

A median alone hides a spread (a clock that moved during the run, a cold replay among warm ones): every timing keeps
its samples and is read as p20 / p50 / p80.
"""

from __future__ import annotations

import datetime
import math
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yolojet.options import commit_given


@dataclass(frozen=True)
class Timing:
    """Seconds of each repeat of one measurement."""

    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.seconds:
            raise ValueError("a timing needs at least one sample")

    def quantile(self, q: float) -> float:
        """Seconds at quantile q, interpolated between the closest ranks (numpy's default; p50 is the median)."""
        ordered = sorted(self.seconds)
        position = q * (len(ordered) - 1)
        low, high = math.floor(position), math.ceil(position)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    @property
    def p20(self) -> float:
        return self.quantile(0.2)

    @property
    def p50(self) -> float:
        return self.quantile(0.5)

    @property
    def p80(self) -> float:
        return self.quantile(0.8)

    def summary_ms(self) -> dict[str, float]:
        """p20 / p50 / p80 in milliseconds and the repeat count, for JSON results."""
        return {
            "p20_ms": self.p20 * 1000,
            "p50_ms": self.p50 * 1000,
            "p80_ms": self.p80 * 1000,
            "repeats": len(self.seconds),
        }

    def __str__(self) -> str:
        return (
            f"p50 {self.p50 * 1000:.4f} ms (p20 {self.p20 * 1000:.4f}, p80 {self.p80 * 1000:.4f}, "
            f"{len(self.seconds)} repeats)"
        )


def time_calls(
    call: Callable[[], Any], repeats: int, warmup: int = 0, synchronize: Callable[[], None] | None = None
) -> Timing:
    """Wall time of each of `repeats` calls after `warmup` untimed ones; `synchronize` (a device's) runs before each
    timed call starts and before it is counted as ended, so the time is the device's work, not its queueing."""
    if repeats < 1:
        raise ValueError(f"repeats: {repeats}, at least one timed call is needed")
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(repeats):
        if synchronize is not None:
            synchronize()
        start = time.perf_counter()
        call()
        if synchronize is not None:
            synchronize()
        samples.append(time.perf_counter() - start)
    return Timing(tuple(samples))


def time_on_device(call: Callable[[], Any], repeats: int, warmup: int = 0, device: Any = None) -> Timing:
    """Device time of each of `repeats` calls after `warmup` untimed ones, between CUDA events recorded on the current
    stream around each call: the GPU's work without the host's launch and sync. `device`: the one to wait for before
    the first (default the current one)."""
    import torch

    if repeats < 1:
        raise ValueError(f"repeats: {repeats}, at least one timed call is needed")
    for _ in range(warmup):
        call()
    torch.cuda.synchronize(device)
    samples = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / 1000)
    return Timing(tuple(samples))


def commit() -> str:
    """The code's commit: YOLOJET_COMMIT where given, else git's short hash ("-dirty" when tracked files differ from
    it, since then the hash alone does not name the code), "?" outside a checkout."""
    given = commit_given()
    if given is not None:
        return given
    try:
        describe = ["git", "describe", "--always", "--dirty", "--abbrev=7", "--exclude=*"]
        here = Path(__file__).resolve().parent
        found = subprocess.run(describe, cwd=here, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return found.stdout.strip() if found.returncode == 0 else "?"


def provenance() -> dict[str, str]:
    """What a timing was measured on: the date, the GPU, torch's and Triton's versions, yolojet's and its commit."""
    import torch

    import yolojet

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    return {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU",
        "torch": torch.__version__,
        "triton": triton_version,
        "yolojet": getattr(yolojet, "__version__", "?"),
        "commit": commit(),
    }
