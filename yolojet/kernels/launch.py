"""Binding a kernel to its grid, to launch it or only to compile it.

Start-up compiles every kernel a network will launch on a pool of threads before the first launch (Triton's
compiles dominate a cold start-up), so each launcher can also stop short of launching: with `compile_only`
the same arguments go to the kernel's `warmup`, which compiles that specialization and launches nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable


def launcher(kernel, grid: tuple[int, ...], compile_only: bool = False) -> Callable[..., object]:
    """`kernel[grid]`, or with `compile_only` a callable taking the same arguments that only compiles."""
    return functools.partial(kernel.warmup, grid=grid) if compile_only else kernel[grid]
