"""Sharing JPEGs between the GPU's hardware JPEG decoders and the CPU pool when the hardware decoders are behind.

On an H200 the hardware decoders take ~7,000 1080x810 JPEGs a second beside the network, and a stream over files
waits for them (bench/NOTES.md): its decode thread spent 94 % of its time in their call. The CPU pool's threads, each
decoding an image in ~7 ms, are idle meanwhile. `CpuOverflow` sends an image to a free pool thread when the hardware
decoders would reach it later than that thread would finish it; otherwise it joins the hardware decoders' queue. A long
stream or a big batch so keeps both busy, while a few images at a time (a camera, a server at low load) wait for
nothing and stay on the hardware decoders, whose pixels are within a level of the pool's (OpenCV's).

The wait is the megapixels queued for the hardware decoders times their measured seconds a megapixel; a pool thread's
time is its measured seconds a megapixel. Both are running estimates of what this process sees, contention included
(several servers sharing the hardware decoders, or the pool sharing the cores, make the side they slow less chosen).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

# Seconds a megapixel before anything is measured: the H200's hardware decoders at ~7,000 1080x810 JPEGs a second
# beside the network, one pool thread ~7 ms for one of them (bench/NOTES.md, 2026-12-02).
HARDWARE_S_PER_MP = 0.16e-3
CPU_S_PER_MP = 8e-3
# Each measure's weight in the running estimates (about the last ten measures count).
_WEIGHT = 0.1
# Hardware calls under this many megapixels, and pool images under a tenth of it, are mostly their fixed cost, not
# the rate a queue drains at.
_MIN_MEASURED_MP = 4.0
_MIN_MEASURED_CPU_MP = 0.1


class Queued:
    """An image's megapixels in the hardware decoders' queue, until `release`: by its decode, or when the image is
    dropped undecoded (a stream closed early), so that a dropped image never counts as work still to do."""

    __slots__ = ("_overflow", "megapixels")

    def __init__(self, overflow: CpuOverflow, megapixels: float) -> None:
        self._overflow, self.megapixels = overflow, megapixels

    def release(self) -> None:
        if self.megapixels:
            self._overflow._dequeue(self.megapixels)
            self.megapixels = 0.0

    def __del__(self) -> None:
        self.release()


class CpuOverflow:
    """Routes each JPEG to the hardware decoders' queue (`route` gives its `Queued`) or to a pool thread (None); the
    decoders report what each side took (`hardware_decoded`, and the timer `cpu_timer` gives a pool task)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.hardware_s_per_mp = HARDWARE_S_PER_MP
        self.cpu_s_per_mp = CPU_S_PER_MP
        self._lock = threading.Lock()
        self._queued_mp = 0.0
        self._on_cpu = 0
        self.routed = {"hardware": 0, "cpu": 0}  # images sent each way so far

    @property
    def queued_megapixels(self) -> float:
        return self._queued_mp

    @property
    def on_cpu(self) -> int:
        """Images the pool is decoding for the hardware decoders now."""
        return self._on_cpu

    def route(self, megapixels: float) -> Queued | None:
        """Where an image of `megapixels` goes: None to a pool thread (counted until its timer is called), else the
        hardware decoders' queue."""
        with self._lock:
            waits = (self._queued_mp + megapixels) * self.hardware_s_per_mp
            if self._on_cpu < self.threads and waits > megapixels * self.cpu_s_per_mp:
                self._on_cpu += 1
                self.routed["cpu"] += 1
                return None
            self._queued_mp += megapixels
            self.routed["hardware"] += 1
        return Queued(self, megapixels)

    def cpu_timer(self, megapixels: float) -> Callable[[float], None]:
        """What a pool task routed here calls with its seconds when it ends (decoded or not)."""

        def decoded(seconds: float) -> None:
            with self._lock:
                self._on_cpu -= 1
                if megapixels >= _MIN_MEASURED_CPU_MP:
                    self.cpu_s_per_mp += _WEIGHT * (seconds / megapixels - self.cpu_s_per_mp)

        return decoded

    def hardware_decoded(self, seconds: float, megapixels: float) -> None:
        """A hardware call of `megapixels` took `seconds` (its images' `Queued` are released by the caller)."""
        if megapixels < _MIN_MEASURED_MP:
            return
        with self._lock:
            self.hardware_s_per_mp += _WEIGHT * (seconds / megapixels - self.hardware_s_per_mp)

    def _dequeue(self, megapixels: float) -> None:
        with self._lock:
            self._queued_mp = max(0.0, self._queued_mp - megapixels)
