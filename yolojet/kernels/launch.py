"""Binding a kernel to its grid, to launch it or only to compile it, and for the network's kernels with programmatic
dependent launch.

Start-up compiles every kernel a network will launch on a pool of threads before the first launch (Triton's
compiles dominate a cold start-up), so each launcher can also stop short of launching: with `compile_only`
the same arguments go to the kernel's `warmup`, which compiles that specialization and launches nothing.

Every kernel of the network takes a `PDL` constexpr (whether it waits for the kernel before it, yolojet.kernels.pdl)
and is launched with PDL's launch option when it is on: `network_launcher` adds both to every launch, so that no
launcher can pass one without the other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from yolojet.kernels.pdl import launch_options


def launcher(kernel, grid: tuple[int, ...], compile_only: bool = False) -> Callable[..., object]:
    """`kernel[grid]`, or with `compile_only` a callable taking the same arguments that only compiles."""
    return functools.partial(kernel.warmup, grid=grid) if compile_only else kernel[grid]


def network_launcher(kernel, grid: tuple[int, ...], pdl: bool, compile_only: bool = False) -> Callable[..., object]:
    """`launcher` for a kernel of the network: its launches also get `PDL=pdl` and, with pdl, PDL's launch option."""
    launch = launcher(kernel, grid, compile_only)
    return functools.partial(launch, PDL=pdl, **launch_options(pdl))
