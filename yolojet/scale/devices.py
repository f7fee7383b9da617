"""`--devices`: which devices the worker processes of `serve` and `label --local` run on."""

from __future__ import annotations

from typing import Any

from yolojet.errors import EngineConfigError


def parse_devices(text: str, cuda_count: int | None = None) -> list[str]:
    """`all` (every CUDA device), CUDA indices `0,1` or device names `cpu,cuda:1` (a device may be named twice) →
    torch device names; checked against the `cuda_count` devices here (default: torch's count)."""
    if cuda_count is None:
        cuda_count = cuda_device_count()
    text = text.strip()
    if text == "all":
        if cuda_count == 0:
            raise EngineConfigError("--devices all: no CUDA device; name devices, e.g. --devices cpu,cpu")
        return [f"cuda:{i}" for i in range(cuda_count)]
    expected = "expected all, CUDA indices (0,1) or device names (cpu,cuda:1)"
    devices = []
    for part in (p.strip() for p in text.split(",")):
        if part.isdigit():
            index = int(part)
        elif part == "cpu":
            devices.append("cpu")
            continue
        elif part == "cuda":
            index = 0
        elif part.startswith("cuda:") and part[5:].isdigit():
            index = int(part[5:])
        else:
            raise EngineConfigError(f"--devices {text}: {part!r} is no device ({expected})")
        if index >= cuda_count:
            here = f"this machine has {cuda_count} (0..{cuda_count - 1})" if cuda_count else "this machine has none"
            raise EngineConfigError(f"--devices {text}: no CUDA device {index} ({here})")
        devices.append(f"cuda:{index}")
    return devices


def default_device() -> str:
    """The device an engine loads on when none is named: the first GPU where there is one, else the CPU."""
    return "cuda:0" if cuda_device_count() > 0 else "cpu"


def cuda_device_count() -> int:
    """The CUDA devices this process may use (CUDA_VISIBLE_DEVICES honoured), asked of the driver itself: a front
    that only starts worker processes then never imports torch, whose import (2-3 s) would come before every
    worker's start. 0 where there is no driver."""
    import ctypes
    import sys

    if sys.platform != "linux":  # the driver's library under another name: torch knows it
        import torch

        return torch.cuda.device_count()
    driver = cuda_driver()
    if driver is None:
        return 0
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def cuda_driver() -> Any:
    """The CUDA driver's library (ctypes), or None where there is none (Linux's name for it)."""
    import ctypes

    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def select_device(device: str) -> None:
    """Make a worker's GPU its process's current device before anything touches CUDA: work that names no device
    (a library's default stream, a pinned buffer's context) then lands on the worker's GPU, not on GPU 0."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.set_device(torch.device(device))
