"""Programmatic dependent launch (Hopper and later): each network kernel starts while the one before drains.

A kernel launched with ``launch_pdl=True`` may be scheduled as soon as every program of the kernel before it has
started, so its launch, program placement and index arithmetic overlap the predecessor's tail instead of following
it. It must then wait (``griddepcontrol.wait``) before touching memory that kernels write, which returns once the
predecessor has finished and its writes are visible. Every program waits unconditionally and before any such load
or store (weights and biases, which no kernel writes, may be read before): a kernel whose programs skipped the
wait could finish before its predecessor, and the kernel after it would then read unfinished data. After waiting,
a program lets the next kernel launch, so at most two kernels overlap.

Kernels take ``PDL`` as a constexpr: with it off (the CPU interpreter, older GPUs, ``YOLOJET_PDL=0``) the wait
compiles away and the launch is an ordinary one.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from yolojet.options import interpreting, pdl_off


@functools.cache
def _triton_supports_pdl() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "launch_pdl" in CUDAOptions.__dataclass_fields__ and hasattr(tl.extra.cuda, "gdc_wait")


def pdl_available(device: torch.device) -> bool:
    """Whether kernels on `device` can be launched with programmatic dependent launch.

    Needs a CUDA device of compute capability 9.0 or later and a Triton that exposes the launch option;
    ``YOLOJET_PDL=0`` turns it off (for comparing timings, or ruling it out while debugging).
    """
    if device.type != "cuda" or pdl_off() or interpreting():
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9 and _triton_supports_pdl()


def launch_options(pdl: bool) -> dict[str, bool]:
    """Keyword arguments a launcher adds to a kernel launch (nothing when PDL is off)."""
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """Call in every program before any load or store of memory kernels write, in kernels launched with
    `launch_options`.

    Every program must reach it, unconditionally (no early exit before it): a kernel that starts while its
    predecessor drains may only touch memory once every kernel it depends on has finished, and the parallel
    stream schedule (engine/streams.py) relies on that to skip waits that earlier waits already imply.
    """
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
