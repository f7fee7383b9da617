"""The low-latency trio's current stream, without building a torch object at each call.

At batch 1 every microsecond of host time before the graph launch is latency: the GPU waits for the launch. The
trio asks for the current stream three times a frame, and `torch.cuda.current_stream` builds a new `Stream` each
time (a lazy-initialisation check, the device's index worked out, the constructor): 3.96 us a call against 0.42
cached, and the trio 10-16 us faster with the cached stream on an H200 (bench/NOTES.md, "The trio's CUDA calls
without torch's objects").
"""

from __future__ import annotations

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
