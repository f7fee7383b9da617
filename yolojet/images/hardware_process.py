"""The hardware JPEG decoder in a process of its own (`nvimgcodec`, and `auto` where it starts).

Every call that lets go of the GIL (a file read, a socket write, nvImageCodec's decode, most torch ops) must take it
back after, and waits then while any other thread runs Python code, up to the interpreter's switch interval (5 ms).
nvImageCodec's batched call does so twice an image: on an H200 host its calls of 64 JPEGs decoded 7,646 img/s alone
and 53 img/s beside one thread running Python code (bench/NOTES.md). A stream, a server or a labeling run always has
such threads (making results, answering calls), so everything done an image at a time (reading the file, checking
its header, the decode call) runs in a child process whose only threads are its own, and this process does a few such
calls a batch: one message out (the files' paths, or the bytes given), one back (the frames of what has arrived,
packed into one GPU buffer shared through CUDA's inter-process memory), one copy of that buffer into this process's
memory (a result may outlive the child). The child's start (its library, a first decode, ~2 s) is off this process's
GIL too.

Requests go out at each batch's `finish`, or every `FLUSH` images while a batch is still being gathered, so the child
reads and decodes while the caller gathers; the child decodes up to `MAX_BATCH` of what has arrived in one call. What
the hardware does not take (other formats, progressive or CMYK JPEGs, its refusals) comes back to this process's CPU
pool; an image the child cannot read or check comes back as its error. If the child dies, its images in flight and
every later one go to the CPU pool, with one line on stderr saying so.

    python -m yolojet.images.hardware_process FD DEVICE KIND MAX_PIXELS   # the child, started by HardwareJpegProcess
"""

from __future__ import annotations

import collections
import importlib.util
import itertools
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import Future
from multiprocessing.connection import Connection

import numpy as np
import torch

from yolojet.errors import EngineConfigError, ImageReadError
from yolojet.images.codecs import EncodedInfo, check_encoded
from yolojet.images.decoders import (
    NOT_INSTALLED,
    CpuDecoder,
    DecodedBatch,
    Encoded,
    HardwareJpegDecoder,
    Pending,
    _GpuJpegDecoder,
    hardware_takes,
)
from yolojet.images.frames import Frame
from yolojet.images.sources import read_image_file

MAX_BATCH = 64  # images a decode call in the child: the batch the hardware decoder was measured fastest at
START_SECONDS = 120.0  # for the child to import torch and nvImageCodec and decode its probe image (~3 s on an H200)
FLUSH = 16  # requests gathered before they go to the child, while a batch is still being gathered


class HardwareJpegProcess(_GpuJpegDecoder):
    """JPEGs on the GPU's hardware JPEG decoders, read, checked and decoded by a child process (the module says why);
    the rest on the CPU pool (`cpu`). `kind` is the child's decoder: `nvimgcodec`, or `cpu` (the same process
    machinery with OpenCV's pixels, where there is no GPU)."""

    name = "nvimgcodec"

    def __init__(self, cpu: CpuDecoder, kind: str = "nvimgcodec") -> None:
        if kind == "nvimgcodec" and importlib.util.find_spec("nvidia.nvimgcodec") is None:
            raise EngineConfigError(NOT_INSTALLED)  # said before a process is started for nothing
        self.cpu, self.device, self.kind = cpu, cpu.device, kind
        # The copies out of the child's buffers (none for a CPU engine, whose child sends its pixels in the reply).
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None  # type: ignore[assignment]
        self._ids = itertools.count()
        self._waiting: dict[int, tuple[Future, Encoded]] = {}
        self._outbox: list[tuple[int, str | bytes]] = []
        self._lock = threading.Lock()  # `_waiting`, `_outbox` and `_alive`
        self._sending = threading.Lock()  # one message at a time on the socket
        self._alive = False
        self._copying: collections.deque[tuple[torch.cuda.Event, torch.Tensor]] = collections.deque()
        self._socket, theirs = socket.socketpair()
        index = 0
        if self.device.type == "cuda":
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # CUDA cannot share memory of expandable segments between processes
        env.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
        command = [sys.executable, "-m", "yolojet.images.hardware_process", str(theirs.fileno()), str(index), kind]
        with theirs:
            self._child = subprocess.Popen(
                [*command, str(cpu.max_pixels)], pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL
            )
        self._conn = Connection(os.dup(self._socket.fileno()))
        cannot = self._started()
        if cannot is not None:
            self._end_child()
            raise EngineConfigError(cannot)
        self._alive = True
        self._receiver = threading.Thread(target=self._receive, name="yolojet-decoder-receive", daemon=True)
        self._receiver.start()

    def _started(self) -> str | None:
        """None once the child says it is ready, else why it cannot start (the child's own EngineConfigError)."""
        try:
            if not self._conn.poll(START_SECONDS):
                self._child.kill()
                said = ("failed", f"its process did not start within {START_SECONDS:.0f} s")
            else:
                said = self._conn.recv()
        except (EOFError, OSError):
            said = ("failed", f"its process ended (exit code {self._child.wait()})")
        if said[0] == "ready":
            return None
        reason = str(said[1])
        return reason if reason.startswith("decoder ") else f"decoder 'nvimgcodec': could not start here ({reason})"

    def describe(self) -> str:
        if not self._alive:
            return f"nvimgcodec, whose process has ended: every image on {self.cpu.describe()}"
        if self.kind == "cpu":
            return f"cpu in a process of its own for JPEGs (other images on {self.cpu.describe()})"
        return f"nvimgcodec (hardware JPEG decoders, in a process of its own; other images on {self.cpu.describe()})"

    def _takes(self, info: EncodedInfo) -> bool:
        return hardware_takes(info)

    def prepare(self, item: Encoded) -> Pending:
        """A file goes to the child as its path (read there); bytes are checked here, and go to the child if they are
        a JPEG the hardware takes."""
        if isinstance(item.source, (str, os.PathLike)):
            request: str | bytes = str(item.source)
        else:
            pending = super().prepare(item)
            if pending.data is None or pending.outcome is not None or pending.future is not None:
                return pending  # an error already, or on the CPU pool
            request = pending.data
        future: Future = Future()
        with self._lock:
            if not self._alive:
                return self.cpu.submit(item)
            number = next(self._ids)
            self._waiting[number] = (future, item)
            self._outbox.append((number, request))
            full = len(self._outbox) >= FLUSH
        if full:
            self._flush()
        return Pending(item, future=future)

    def _flush(self) -> None:
        with self._lock:
            requests, self._outbox = self._outbox, []
        if not requests:
            return
        try:
            with self._sending:
                self._conn.send_bytes(pickle.dumps(requests, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:  # the child has gone: its receiver sends what was waiting to the CPU pool
            pass

    def finish(self, pending: list[Pending]) -> DecodedBatch:
        self._flush()
        outcomes = [p.result() for p in pending]
        ready = self.cpu.ready_events()
        if self.stream is not None:  # after every copy out of the child's buffers queued so far
            event = torch.cuda.Event()
            event.record(self.stream)
            ready.append(event)
        return DecodedBatch(outcomes, ready)

    def _receive(self) -> None:
        """Replies from the child, on a thread of this process: each batch's frames copied into this process's memory,
        then each image's future completed (what the child leaves to the CPU pool sent there)."""
        try:
            while True:
                replies, packed = self._conn.recv()
                pixels = self._own_copy(packed)
                del packed
                offset = 0
                for number, kind, value in replies:
                    with self._lock:
                        future, item = self._waiting.pop(number)
                    if kind == "frame":
                        size = int(np.prod(value))
                        frame = pixels[offset : offset + size].view(*value)
                        offset += size
                        if isinstance(item.source, bytes):
                            future.set_result(Frame(frame, bgr=False, path=item.path, encoded=item.source))
                        else:  # the child read the file: read again for the original image, if asked for
                            future.set_result(Frame(frame, bgr=False, path=item.path, from_file=True))
                    elif kind == "error":
                        future.set_result(ImageReadError(value))
                    else:
                        self._to_cpu_pool(future, item)
        except (EOFError, OSError):
            pass
        with self._lock:
            was_alive, self._alive = self._alive, False
            orphans = list(self._waiting.values())
            self._waiting.clear()
        if was_alive:
            print(
                f"yolojet: the hardware JPEG decoder's process ended (exit code {self._child.wait()}); JPEGs are "
                "decoded on the CPU from here",
                file=sys.stderr,
            )
        for future, item in orphans:
            self._to_cpu_pool(future, item)

    def _own_copy(self, packed: torch.Tensor | np.ndarray | None) -> torch.Tensor:
        """The child's buffer copied into this process's memory on `stream` (a batch waits for it through `finish`'s
        event). The child's buffer is held until its copy has run, then given back to the child."""
        if packed is None:
            return torch.empty(0, dtype=torch.uint8, device=self.device)
        if isinstance(packed, np.ndarray):
            return self.cpu.to_device(torch.from_numpy(packed))
        assert self.stream is not None
        with torch.cuda.stream(self.stream):
            own = torch.empty_like(packed)
            own.copy_(packed)
            copied = torch.cuda.Event()
            copied.record(self.stream)
        # Not a wait for the copy here: a thread that lets go of the GIL to wait must take it back after (the module's
        # docstring).
        while self._copying and self._copying[0][0].query():
            self._copying.popleft()
        self._copying.append((copied, packed))
        return own

    def _to_cpu_pool(self, future: Future, item: Encoded) -> None:
        on_pool = self.cpu.submit(item).future
        assert on_pool is not None

        def forward(done: Future) -> None:
            error = done.exception()
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(done.result())

        on_pool.add_done_callback(forward)

    def _end_child(self) -> None:
        try:
            self._child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()

    def close(self) -> None:
        """The child decodes what it has, answers and ends at the end of its input; then the CPU pool closes."""
        self._flush()
        with self._lock:
            self._alive = False
        try:
            self._socket.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._end_child()
        if hasattr(self, "_receiver"):
            self._receiver.join(timeout=30)
        if self.stream is not None:
            self.stream.synchronize()
        self._copying.clear()
        self._conn.close()
        self._socket.close()
        self.cpu.close()


def _child_decoder(kind: str, device_index: int):
    """The child's decoder: `decode(datas)` → a tensor (H, W, 3) RGB or None (refused) an image, and its CUDA stream
    (None on the CPU)."""
    if kind == "cpu":
        from yolojet.images.codecs import decode_cpu

        def on_cpu(datas: list[bytes]) -> list[torch.Tensor | None]:
            out: list[torch.Tensor | None] = []
            for data in datas:
                try:
                    out.append(decode_cpu(data, "image"))
                except ImageReadError:
                    out.append(None)
            return out

        return on_cpu, None
    torch.cuda.set_device(device_index)
    decoder = HardwareJpegDecoder(CpuDecoder(torch.device("cuda", device_index), threads=1))
    return (lambda datas: decoder._decode_jpegs(datas, [1] * len(datas))), decoder.stream


def _checked(request: tuple[int, str | bytes], max_pixels: int) -> tuple[int, str, object]:
    """A request read (a path) and checked: (number, "jpeg", bytes) for the hardware, else (number, "error", why) or
    (number, "cpu", None) for the parent's CPU pool."""
    number, source = request
    try:
        if isinstance(source, str):
            data, name = read_image_file(source), source
        else:
            data, name = source, f"<{len(source)} bytes>"
        info = check_encoded(data, name, max_pixels)
    except ImageReadError as e:
        return number, "error", str(e)
    return (number, "jpeg", data) if hardware_takes(info) else (number, "cpu", None)


def _child(fd: int, device_index: int, kind: str, max_pixels: int) -> None:
    """The child's loop: requests read and checked on a thread (so that the parent's sends never wait for a decode,
    and the next files are read during the decode call), decoded a batch of what has arrived at a time on the main
    thread, one reply a batch."""
    import queue

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's Ctrl-C ends the parent; this ends with its input
    conn = Connection(fd)
    try:
        decode, stream = _child_decoder(kind, device_index)
    except Exception as e:  # every reason it cannot start is the parent's error message
        conn.send(("failed", str(e)))
        return
    conn.send(("ready", kind))
    arrived: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        try:
            while True:
                for request in pickle.loads(conn.recv_bytes()):
                    arrived.put(_checked(request, max_pixels))
        except (EOFError, OSError):
            arrived.put(None)

    threading.Thread(target=read, name="requests", daemon=True).start()
    ended = False
    while not ended:
        batch = [arrived.get()]
        while len(batch) < MAX_BATCH and not arrived.empty():
            batch.append(arrived.get())
        if batch[-1] is None:
            ended = True
            batch.pop()
        if not batch:
            continue
        jpegs = [entry for entry in batch if entry[1] == "jpeg"]
        decoded = dict(zip([n for n, _, _ in jpegs], decode([d for _, _, d in jpegs]), strict=True))
        replies = []
        for number, what, value in batch:
            if what != "jpeg":
                replies.append((number, what, value))
            elif decoded[number] is None:
                replies.append((number, "cpu", None))
            else:
                replies.append((number, "frame", tuple(decoded[number].shape)))
        kept = [decoded[n].reshape(-1) for n, what, _ in replies if what == "frame"]
        packed: torch.Tensor | np.ndarray | None = None
        if kept:
            if stream is not None:
                with torch.cuda.stream(stream):
                    packed = torch.cat(kept)
                stream.synchronize()
            else:
                packed = torch.cat(kept).numpy()
        try:
            conn.send((replies, packed))
        except OSError:  # the parent has gone
            return
        del packed, kept, decoded
        if stream is not None:
            torch.cuda.ipc_collect()  # buffers the parent has finished with, back to this process's allocator
    conn.close()


if __name__ == "__main__":
    _child(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
