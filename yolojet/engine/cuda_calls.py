"""The low-latency trio's CUDA calls, made without building torch objects at each call.

At batch 1 every microsecond of host time before the graph launch is latency: the GPU waits for the launch. The
trio asks for the current stream three times a frame, and `torch.cuda.current_stream` builds a new `Stream` each
time (a lazy-initialisation check, the device's index worked out, the constructor: 6.2 us of a 454 us trio on an
H100 host, bench/NOTES.md "Answers running late"). Staging a frame from the device copies it into the slot's own
buffer, and `Tensor.copy_` builds a TensorIterator before its one `cudaMemcpyAsync` (15.9 us on that host): here it
is one driver call through cuda-bindings.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

# Distinct streams a process uses are few (the default stream, a camera thread's, a server's runner); a program
# that makes streams by the thousand only refills this.
_MAX_KNOWN_STREAMS = 64


class CurrentStream:
    """The calling thread's current stream on one CUDA device: its identity asked of torch (a tuple of ints), and
    the one `torch.cuda.Stream` made for that identity handed back. Streams of one identity are the same stream,
    so the object may be shared by threads."""

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError(f"CurrentStream: {device} is not a CUDA device")
        self.device = device
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self._known: dict[Any, torch.cuda.Stream] = {}
        # Private, but what torch.cuda.current_stream itself calls; torch's public call where it is gone.
        self._identity = getattr(torch._C, "_cuda_getCurrentStream", None)

    def __call__(self) -> torch.cuda.Stream:
        if self._identity is None:
            return torch.cuda.current_stream(self.device)
        identity = self._identity(self.index)
        stream = self._known.get(identity)
        if stream is None:
            if len(self._known) >= _MAX_KNOWN_STREAMS:
                self._known.clear()
            stream_id, device_index, device_type = identity
            stream = torch.cuda.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)
            self._known[identity] = stream
        return stream


@cache
def _driver() -> Any:
    """cuda-bindings' driver API (a dependency of torch's CUDA 13 wheels), or None where it is not installed."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    return driver


def copy_on_stream(dst: torch.Tensor, src: torch.Tensor, stream: torch.cuda.Stream) -> None:
    """`dst[...] = src`, ordered on `stream` (the caller's current one): one cuMemcpyDtoDAsync where both are
    contiguous tensors of one dtype and shape on a CUDA device and the driver takes it; `Tensor.copy_` otherwise
    (the driver refuses a stream of another context than the thread's current one, for instance)."""
    driver = _driver()
    if (
        driver is not None
        and dst.is_cuda
        and src.is_cuda
        and dst.dtype == src.dtype
        and dst.shape == src.shape
        and dst.is_contiguous()
        and src.is_contiguous()
    ):
        try:
            (error,) = driver.cuMemcpyDtoDAsync(dst.data_ptr(), src.data_ptr(), src.nbytes, stream.cuda_stream)
        except Exception:  # a cuda-bindings release that takes other arguments: torch's copy, which any torch takes
            error = None
        if error == driver.CUresult.CUDA_SUCCESS:
            return
    dst.copy_(src)
