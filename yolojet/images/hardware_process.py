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

    python -m yolojet.images.hardware_process FD RING_FD RING_BYTES DEVICE KIND MAX_PIXELS   # the child, started here
"""

from __future__ import annotations

import collections
import importlib.util
import itertools
import mmap
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
DECODE_THREADS = 2  # decode calls in flight in the child: two decoders on two threads decoded 9,851-11,054 img/s
# against one's 7,857-8,979 on an H200 (bench/NOTES.md, the overlap stage), and the child has no other thread to stall
RING_BYTES = 64 << 20  # shared memory for the bytes callers give (~470 photos of 137 KB in flight); beyond, inline
INLINE_BYTES = 1024  # smaller images go in the message itself


class _Ring:
    """Bytes handed to the child through shared memory (a copy here, no system call), not through the socket, whose
    every write would take the GIL back (the module's docstring). Spans are taken in order and given back as the
    child answers (in any order); a span is reused once every span taken before it has been given back."""

    def __init__(self, size: int) -> None:
        self.fd = os.memfd_create("yolojet-jpegs")
        os.ftruncate(self.fd, size)
        self.memory = mmap.mmap(self.fd, size)
        self.size, self.head = size, 0
        self.wrapped = False  # the newest spans lie before the oldest: the room left is [head, oldest's start)
        self.spans: collections.deque[list] = collections.deque()  # [start, end, given back], in the order taken

    def put(self, data: bytes) -> tuple[int, int, list] | None:
        """Where `data` is now (offset, length, its span to give back), or None where there is no room for it."""
        oldest = self.spans[0][0] if self.spans else 0
        while self.spans and self.spans[0][2]:
            self.spans.popleft()
        if not self.spans:
            self.head, self.wrapped = 0, False
        elif self.wrapped and self.spans[0][0] < oldest:
            self.wrapped = False  # the oldest span left is one taken after the wrap
        size, start = len(data), None
        if not self.spans:
            start = 0 if size <= self.size else None
        elif self.wrapped:
            start = self.head if self.head + size <= self.spans[0][0] else None
        elif self.head + size <= self.size:
            start = self.head
        elif size <= self.spans[0][0]:
            start, self.wrapped = 0, True
        if start is None:
            return None
        self.memory[start : start + size] = data
        self.head = start + size
        span = [start, start + size, False]
        self.spans.append(span)
        return start, size, span

    def close(self) -> None:
        self.memory.close()
        os.close(self.fd)


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
        self._waiting: dict[int, tuple[Future, Encoded, list | None]] = {}  # future, image, its ring span
        self._outbox: list[tuple[int, object]] = []
        self._lock = threading.Lock()  # `_waiting`, `_outbox` and `_alive`
        self._sending = threading.Lock()  # one message at a time on the socket
        self._alive = self._closed = False
        self._copying: collections.deque[tuple[torch.cuda.Event, torch.Tensor]] = collections.deque()
        self._ring = _Ring(RING_BYTES)
        self._socket, theirs = socket.socketpair()
        index = 0
        if self.device.type == "cuda":
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # CUDA cannot share memory of expandable segments between processes
        env.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
        fds = (theirs.fileno(), self._ring.fd)
        command = [sys.executable, "-m", "yolojet.images.hardware_process", *map(str, fds), str(RING_BYTES)]
        with theirs:
            self._child = subprocess.Popen(
                [*command, str(index), kind, str(cpu.max_pixels)], pass_fds=fds, env=env, stdin=subprocess.DEVNULL
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
        """The image goes to the child as its path (read there) or its bytes (through the shared ring); the child checks
        it. Nothing here makes a system call: the requests go out a batch at a time."""
        future: Future = Future()
        with self._lock:
            if not self._alive:
                return self.cpu.submit(item)
            number, span = next(self._ids), None
            request: object = str(item.source) if isinstance(item.source, (str, os.PathLike)) else item.source
            if isinstance(request, bytes) and len(request) > INLINE_BYTES:
                placed = self._ring.put(request)
                if placed is not None:
                    request, span = (placed[0], placed[1]), placed[2]
            self._waiting[number] = (future, item, span)
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
                        future, item, span = self._waiting.pop(number)
                        if span is not None:
                            span[2] = True  # the child has read it
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
            orphans = [(future, item) for future, item, _ in self._waiting.values()]
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
        """The child decodes what it has, answers and ends at the end of its input; then the CPU pool closes. Once."""
        if self._closed:
            return
        self._closed = True
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
        self._ring.close()
        self.cpu.close()


def _child_decoders(kind: str, device_index: int, count: int) -> list:
    """The child's decoders: each `decode(datas)` → a tensor (H, W, 3) RGB or None (refused) an image, with its CUDA
    stream (None on the CPU)."""
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

        return [(on_cpu, None)] * count
    torch.cuda.set_device(device_index)
    made = []
    for _ in range(count):
        decoder = HardwareJpegDecoder(CpuDecoder(torch.device("cuda", device_index), threads=1))
        made.append((lambda datas, d=decoder: d._decode_jpegs(datas, [1] * len(datas)), decoder.stream))
    return made


def _checked(request: tuple[int, object], ring: mmap.mmap, max_pixels: int) -> tuple[int, str, object]:
    """A request read (a path, or its span of the ring) and checked: (number, "jpeg", bytes) for the hardware, else
    (number, "error", why) or (number, "cpu", None) for the parent's CPU pool."""
    number, source = request
    try:
        if isinstance(source, str):
            data, name = read_image_file(source), source
        else:
            if isinstance(source, tuple):
                offset, size = source
                source = ring[offset : offset + size]
            assert isinstance(source, bytes)
            data, name = source, f"<{len(source)} bytes>"
        info = check_encoded(data, name, max_pixels)
    except ImageReadError as e:
        return number, "error", str(e)
    return (number, "jpeg", data) if hardware_takes(info) else (number, "cpu", None)


def _child(fd: int, ring_fd: int, ring_size: int, device_index: int, kind: str, max_pixels: int) -> None:
    """The child's loop: requests read and checked on a thread (so that the parent's sends never wait for a decode, and
    the next files are read during the decode calls), decoded on `DECODE_THREADS` threads a batch of what has
    arrived at a time, one reply a batch."""
    import queue

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's Ctrl-C ends the parent; this ends with its input
    conn = Connection(fd)
    ring = mmap.mmap(ring_fd, ring_size, access=mmap.ACCESS_READ)
    try:
        decoders = _child_decoders(kind, device_index, DECODE_THREADS)
    except Exception as e:  # every reason it cannot start is the parent's error message
        conn.send(("failed", str(e)))
        return
    conn.send(("ready", kind))
    arrived: queue.SimpleQueue = queue.SimpleQueue()
    sending = threading.Lock()

    def read() -> None:
        try:
            while True:
                for request in pickle.loads(conn.recv_bytes()):
                    arrived.put(_checked(request, ring, max_pixels))
        except (EOFError, OSError):
            arrived.put(None)

    def decode_batches(decode, stream) -> None:
        if stream is not None:
            torch.cuda.set_device(device_index)  # a thread's current device is its own
        while True:
            batch = [arrived.get()]
            while len(batch) < MAX_BATCH and batch[-1] is not None and not arrived.empty():
                batch.append(arrived.get())
            ended = batch[-1] is None
            if ended:
                batch.pop()
                arrived.put(None)  # for the other decode threads
            if batch and not _answer(batch, decode, stream, conn, sending):
                return
            if ended:
                return

    threading.Thread(target=read, name="requests", daemon=True).start()
    workers = [threading.Thread(target=decode_batches, args=pair, name="decode") for pair in decoders]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    conn.close()


def _answer(batch: list, decode, stream, conn: Connection, sending: threading.Lock) -> bool:
    """One batch decoded, packed and answered; False where the parent has gone."""
    jpegs = [entry for entry in batch if entry[1] == "jpeg"]
    decoded = dict(zip([n for n, _, _ in jpegs], decode([d for _, _, d in jpegs]) if jpegs else [], strict=True))
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
        with sending:
            conn.send((replies, packed))
            del packed, kept, decoded
            if stream is not None:
                torch.cuda.ipc_collect()  # buffers the parent has finished with, back to this process's allocator
    except OSError:  # the parent has gone
        return False
    return True


if __name__ == "__main__":
    fd, ring_fd, ring_size, device_index, kind, max_pixels = sys.argv[1:7]
    _child(int(fd), int(ring_fd), int(ring_size), int(device_index), kind, int(max_pixels))
