"""A stream of images in, batches of decoded frames out: files read and decoded ahead of the engine, on threads of
their own, so that decoding the next images overlaps running the ones before.

A list (any sized collection) has one feed thread, unless its decoder's `finish` lets go of the GIL for long (below):
it prepares a chunk of up to `chunk` images (`chunk_for`: 64, or 32 for a list of at most two batches; `prepare`: the
CPU pool starts decoding them, the hardware decoder's nvImageCodec reads its JPEG files, other images are read and
their header checked), then finishes the chunk before it (`finish`: one GPU decode call, then the CPU pool's results),
so the pool always has the next chunk to work on. One thread, not two, because a decode call that lets go of the GIL
and takes it back for each image waits behind any other thread running Python each time; nvImageCodec fed this way ran
the engine's stream over 10,000 files at 5,100-7,660 img/s on an H200, two threads 6,219-7,008, in two runs whose
spread is larger than the difference (bench/NOTES.md): one thread is kept as the simpler.

A decoder whose `finish` is one long call that lets go of the GIL while the GPU's hardware decodes (the `hardware`
decoder: nvJPEG's batched call returns when the batch is decoded) has its chunks decoded on a thread of their own, so
that the next images are read and checked while a chunk decodes. A list of at most `SHORT_LIST_BATCHES` batches (one
call of `engine(paths)`) has two threads taking turns: each prepares a chunk and decodes it itself, and the other
prepares the next chunk while it decodes (on an H100 a call of 64 files spent 6 of its 15 ms preparing both chunks
before the first decode began, one thread doing both; bench/NOTES.md). A longer list, like an iterable, hands its
images over one by one, and the decode thread cuts its chunks from them.

A thread that hands over a chunk's worth of work (a chunk's worth of images queued for the decode thread, a decoded
chunk for the engine waiting on an empty queue) lets go of the GIL right after, so that the thread it woke takes the
GIL at once rather than after the interpreter's switch interval (5 ms) behind a thread that goes on running Python.

An iterable of unknown length (a camera, a network) keeps a source thread that walks it and prepares each image at
once, so a slow source does not hold up decoding, and the decode thread cuts its chunks short when no next image is
ready: a slow source gets small chunks and low latency.

The engine takes the chunks ready when it is free, as many as fit one batch of `batch` images: a long stream runs
full batches while the next ones decode, and even one call of `batch` files overlaps decoding its later chunks with
running its first. At most two batches of images are on their way at once, which bounds the memory a fast source
can take. A consumer that is done with a batch's frames hands it back (`release`), and the decoder then decodes into
its output buffers again instead of allocating new ones.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from yolojet.errors import ImageReadError
from yolojet.images import Frame, is_encoded
from yolojet.images.decoders import DecodedBatch, Decoder, Encoded, OutputPool, Pending
from yolojet.images.frames import frame_from_pixels

_END = object()
_LINGER_S = 0.002  # how long a cut of an iterable's images waits for a next image that may be on its way
_SOURCE = "yolojet-feed-source"  # the thread that walks the caller's iterable
# Images a decode call. On the H200 the hardware decoders took 1080x810 JPEGs at 5,206 / 7,365 / 9,190 / 9,684
# img/s in calls of 8 / 16 / 32 / 64 (bench/NOTES.md): 32 is near full speed and still lets a call of 64 images
# overlap decoding its second half with running its first.
CHUNK = 32
# A long stream's decode calls: there the decode thread is the limit, and each of its calls ends by taking the GIL
# back behind the other threads' Python. Over 10,000 files on H200s, calls of 64 beat calls of 32 in each of five pairs
# run in turn, by 15-34 % (8,164 against 6,084 img/s in the first; bench/NOTES.md).
LONG_CHUNK = 64
# A list of at most this many batches (one call of `engine(paths)`) is fed by two threads taking turns (above).
SHORT_LIST_BATCHES = 2


def chunk_for(images: Iterable[Any], batch: int) -> int:
    """Images a decode call for a stream of `images` in batches of `batch`: LONG_CHUNK, but CHUNK for a collection of
    at most two batches, whose first chunk then runs while the next decodes."""
    if isinstance(images, Sized) and len(images) <= 2 * batch:
        return CHUNK
    return LONG_CHUNK


@dataclass
class FedBatch:
    """A batch of the caller's images, in order: what each was (for naming it), and its frame or its error."""

    sources: list[Any]
    decoded: DecodedBatch


class FrameFeed:
    """`next_batch` (or iterating) gives `FedBatch`es of the images of `images`, in order; `close` stops the threads
    (reaching the end closes too)."""

    def __init__(self, images: Iterable[Any], decoder: Decoder, batch: int, chunk: int | None = None) -> None:
        chunk = chunk_for(images, batch) if chunk is None else chunk
        self.decoder, self.batch, self.chunk = decoder, batch, max(1, min(chunk, batch))
        self._items: queue.Queue = queue.Queue(maxsize=2 * batch)
        self._chunks: queue.Queue = queue.Queue(maxsize=max(2, 2 * batch // self.chunk))
        self._stop = threading.Event()
        self._held: object | None = None  # taken but not yet handed on: a chunk for the next batch, or the end
        self._done = False
        self._in_callers_iterable = False  # the source thread waits in the caller's iterable for its next image
        self._spare = OutputPool()  # released batches' output buffers, to decode into
        # The threads' own GPU work (a float frame's conversion, a frame from another GPU, an iterable's frame copied)
        # goes on the caller's current stream: after the caller's writes of its frames, before the runs launched there.
        device = decoder.cpu.device
        self._caller_stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        # A list (nothing of it on its way slowly) has one thread and full chunks, unless its decoder's `finish` is one
        # long call that lets go of the GIL (the `hardware` decoder's), which preparing the next images overlaps.
        size = len(images) if isinstance(images, Sized) else None
        listed = size is not None
        work: list[tuple[str, Callable[..., None], tuple[Any, ...]]]
        if listed and not getattr(decoder, "blocking_finish", False):
            work = [("yolojet-feed", self._prepare_and_decode, (images,))]
        elif size is not None and size <= SHORT_LIST_BATCHES * batch:
            work = self._short_list_work(images)
        else:
            # An iterable's frames are copied as they come; a list's cannot be rewritten between its items.
            work = [
                (_SOURCE, self._walk, (images, not listed)),
                ("yolojet-feed-decode", self._decode, ()),
            ]
        self._threads = [
            threading.Thread(target=self._on_caller_stream, args=(target, *args), name=name, daemon=True)
            for name, target, args in work
        ]
        for thread in self._threads:
            thread.start()

    def _on_caller_stream(self, work: Callable[..., None], *args: Any) -> None:
        if self._caller_stream is None:
            work(*args)
            return
        # The thread's device first: leaving the stream's block would otherwise make GPU 0 current, and open a
        # context there, in a process that runs on another GPU.
        torch.cuda.set_device(self._caller_stream.device)
        with torch.cuda.stream(self._caller_stream):
            work(*args)

    def __iter__(self) -> Iterator[FedBatch]:
        try:
            while (fed := self.next_batch()) is not None:
                yield fed
        finally:
            self.close()

    def next_batch(self) -> FedBatch | None:
        """The next chunk (waiting for it), with every further chunk already decoded that fits one batch; None at
        the end. Raises what the caller's iterable raised, after the images before it."""
        first = self._held if self._held is not None else self._get(block=True)
        self._held = None
        if not isinstance(first, FedBatch):
            self._ended(first)
            return None
        parts = [first]
        size = len(first.sources)
        while size < self.batch:
            more = self._get(block=False)
            if more is None:
                break
            if not isinstance(more, FedBatch) or size + len(more.sources) > self.batch:
                self._held = more  # the end, a failure, or a chunk for the next batch
                break
            parts.append(more)
            size += len(more.sources)
        if len(parts) == 1:
            return first
        items = [i for p in parts for i in p.decoded.items]
        ready = [e for p in parts for e in p.decoded.ready]
        outputs = [o for p in parts for o in p.decoded.outputs]
        return FedBatch([s for p in parts for s in p.sources], DecodedBatch(items, ready, outputs))

    def release(self, fed: FedBatch) -> None:
        """`fed`'s frames are no longer read by anything (its batch has run and its results are made, and they keep
        no decoded pixels): the decoder may decode later images into the same buffers."""
        self._spare.give(fed.decoded.outputs)
        fed.decoded.outputs = []

    def _get(self, block: bool) -> object | None:
        """A chunk, the end marker or a failure from the decode thread; None when none is there (not blocking); the
        end marker once the feed is closed (from another thread too, while this waits)."""
        while not self._done:
            try:
                return self._chunks.get(block=block, timeout=0.1 if block else None)
            except queue.Empty:
                if not block:
                    return None
                if self._stop.is_set() and self._chunks.empty():
                    break
        return _END

    def _ended(self, marker: object | None) -> None:
        self._done = True
        if isinstance(marker, BaseException):
            raise marker

    def close(self) -> None:
        """Stop the threads (each before its next image or decode call) and wait for them; the feed then gives no
        more batches."""
        self._stop.set()
        self._done, self._held = True, None
        for q in (self._items, self._chunks):  # unblock a thread waiting to put
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        for thread in self._threads:
            if thread is threading.current_thread() or (thread.name == _SOURCE and self._in_callers_iterable):
                # A thread inside the caller's iterable (a camera's queue that waits for the next frame) cannot be
                # stopped from here, and holds nothing the feed frees: it ends, as a daemon, when the iterable answers.
                continue
            thread.join(timeout=30)

    def _put(self, q: queue.Queue, item: object) -> bool:
        while not self._stop.is_set():
            try:
                q.put(item, timeout=0.1)
            except queue.Full:
                continue
            if q.qsize() == (self.chunk if q is self._items else 1):
                # A chunk's worth of work now waits where a thread may be waiting for it (a chunk in an empty queue, a
                # chunk's worth of images): that thread, woken, must still take the GIL from this one, which
                # goes on running Python, and would wait for the switch interval (5 ms) unless the GIL is let go now.
                # bench/bench_feed_handoff.py, a stand-in for the hardware decoder on the 2-core machine: 64 images
                # through two threads in 10.1-10.6 ms against 12.8-13.1 without this, 1,280 in 145-148 against 144-148.
                time.sleep(0)
            return True
        return False

    def _walk(self, images: Iterable[Any], own_copies: bool) -> None:
        """`own_copies`: an iterable may hand out one tensor rewritten for every frame (a camera's buffer), rewritten
        here, on this thread, as soon as the next frame is asked for, while the runs read frames later."""
        try:
            iterator = iter(images)
            while True:
                self._in_callers_iterable = True
                try:
                    image = next(iterator)
                except StopIteration:
                    break
                finally:
                    self._in_callers_iterable = False
                if self._stop.is_set() or not self._put(self._items, (image, self._prepare(image, own_copies))):
                    return
        except BaseException as e:  # the caller's iterable failed: report it after the images before it
            self._put(self._items, _Failure(e))
            return
        self._put(self._items, _END)

    def _prepare(self, image: Any, own_copy: bool = False) -> Pending:
        if is_encoded(image):
            return self.decoder.prepare(Encoded.of(image))
        return Pending(Encoded(b"", ""), outcome=_in_memory(image, self.decoder, own_copy))

    def _take(self) -> tuple[list[tuple[Any, Pending]], object | None]:
        """Up to `chunk` images (waiting for the first, not for later ones that are not on their way yet), and the end
        marker or failure that followed, if any."""
        items: list[tuple[Any, Pending]] = []
        while not self._stop.is_set() and len(items) < self.chunk:
            try:
                item = self._items.get(timeout=0.1 if not items else _LINGER_S)
            except queue.Empty:
                if items:
                    break
                continue
            if item is _END or isinstance(item, _Failure):
                return items, item
            items.append(item)
        return items, None

    def _prepare_and_decode(self, images: Iterable[Any]) -> None:
        """A list's one thread: the next chunk prepared before this one is finished."""
        try:
            source = iter(images)
            ahead, failed = self._prepare_chunk(source)
            while ahead and not self._stop.is_set():
                items = ahead
                ahead, failed = self._prepare_chunk(source) if failed is None else ([], failed)
                if self._stop.is_set():
                    return
                decoded = self.decoder.finish([pending for _, pending in items], self._spare)
                if not self._put(self._chunks, FedBatch([image for image, _ in items], decoded)):
                    return
        except BaseException as e:  # a decoder's failure, or the collection's own `iter`
            self._put(self._chunks, e)
            return
        self._put(self._chunks, _END if failed is None else failed)

    def _prepare_chunk(self, source: Iterator[Any]) -> tuple[list[tuple[Any, Pending]], BaseException | None]:
        """Up to `chunk` images prepared, and what the caller's collection raised while giving the next one, if it did:
        the images given before it are kept, to be answered before the error is raised."""
        items: list[tuple[Any, Pending]] = []
        try:
            for image in itertools.islice(source, self.chunk):
                if self._stop.is_set():  # closed: no more files read
                    break
                items.append((image, self._prepare(image)))
        except BaseException as e:
            return items, e
        return items, None

    def _short_list_work(self, images: Iterable[Any]) -> list[tuple[str, Callable[..., None], tuple[Any, ...]]]:
        """A short list's two threads, taking turns (`_take_turns`)."""
        turns = _Turns(images)
        return [(f"yolojet-feed-{first}", self._take_turns, (turns, first)) for first in (0, 1)]

    def _take_turns(self, turns: _Turns, first: int) -> None:
        """One of a short list's two threads: chunks `first`, `first` + 2, ... Each chunk is prepared once the one
        before has begun decoding (its decode call lets go of the GIL: the other thread prepares meanwhile, and its
        `entering` event is the turn's end), then decoded on the thread that prepared it, and handed on once the one
        before has been. No thread waits for another to wake up and take its work: on an H100 a finishing thread fed
        prepared chunks by another began each decode 0.25-0.5 ms after its chunk was ready (bench/NOTES.md). So the
        decoder's `finish` may run on both threads at once (the second waiting for the first's long call)."""
        index = first
        while True:
            if index and not self._wait(turns.began(index - 1)):
                return
            if turns.ends_before(index):  # an earlier chunk was the list's last, or failed: its thread ends the feed
                return
            chunk: list[tuple[Any, Pending]] = []
            failed: BaseException | None = None
            decoded: DecodedBatch | None = None
            entering = turns.began(index)
            try:
                chunk, failed = self._prepare_chunk(turns.source())
                if failed is not None or len(chunk) < self.chunk:
                    turns.end_at(index)  # read by the other thread only once `entering` is set
                if chunk and not self._stop.is_set() and not turns.ends_before(index):
                    decoded = self.decoder.finish([pending for _, pending in chunk], self._spare, entering)
            except BaseException as e:  # a decoder's failure, or the collection's own `iter`
                turns.end_at(index)
                failed = e
            finally:
                entering.set()
            if index and not self._wait(turns.handed(index - 1)):
                return
            if turns.ends_before(index):  # the chunk before failed after this one began: nothing more is handed on
                return
            if decoded is not None and not self._put(self._chunks, FedBatch([image for image, _ in chunk], decoded)):
                return
            ends_here = turns.ends_before(index + 1)
            if ends_here:
                self._put(self._chunks, _END if failed is None else failed)
            turns.handed(index).set()  # also after the end: the other thread, waiting on it, then sees the end
            if ends_here:
                return
            index += 2

    def _wait(self, event: threading.Event) -> bool:
        """Whether `event` was set before the feed was closed (False once it is closed, set or not)."""
        while not event.wait(0.1):
            if self._stop.is_set():
                return False
        return not self._stop.is_set()

    def _decode(self) -> None:
        try:
            while not self._stop.is_set():
                items, last = self._take()
                if items and not self._stop.is_set():
                    decoded = self.decoder.finish([pending for _, pending in items], self._spare)
                    if not self._put(self._chunks, FedBatch([image for image, _ in items], decoded)):
                        return
                if last is not None:
                    self._put(self._chunks, last.error if isinstance(last, _Failure) else _END)
                    return
        except BaseException as e:  # a decoder's failure ends the feed: the source thread stops reading, too
            self._put(self._chunks, e)
            self._stop.set()


@dataclass
class _Failure:
    error: BaseException


class _Turns:
    """What a short list's two threads share: the list's iterator (only the thread whose turn it is to prepare
    advances it), an event a chunk for its decode having begun (the next may be prepared) and one for its having been
    handed on (the next may be), and the first chunk after which nothing follows (the list's last, or a failed one)."""

    def __init__(self, images: Iterable[Any]) -> None:
        self._images = images
        self._source: Iterator[Any] | None = None
        self._events: dict[tuple[str, int], threading.Event] = {}
        self._lock = threading.Lock()
        self._last: int | None = None

    def source(self) -> Iterator[Any]:
        if self._source is None:
            self._source = iter(self._images)
        return self._source

    def end_at(self, index: int) -> None:
        """Nothing follows chunk `index` (an earlier end stands)."""
        with self._lock:
            self._last = index if self._last is None else min(self._last, index)

    def ends_before(self, index: int) -> bool:
        """Whether an earlier chunk than `index` is the last."""
        with self._lock:
            return self._last is not None and self._last < index

    def began(self, index: int) -> threading.Event:
        return self._event("began", index)

    def handed(self, index: int) -> threading.Event:
        return self._event("handed", index)

    def _event(self, kind: str, index: int) -> threading.Event:
        with self._lock:
            return self._events.setdefault((kind, index), threading.Event())


def _in_memory(item: Any, decoder: Decoder, own_copy: bool = False) -> Frame | ImageReadError:
    """An image given as pixels, on the decoder's device (copied there from host memory on its copy stream, which
    the chunk's events cover); `own_copy`: a frame already there is copied too."""
    try:
        frame = frame_from_pixels(item)
    except ImageReadError as e:
        return e
    return to_device(frame, decoder, own_copy and _holds_callers_memory(frame, item))


def _holds_callers_memory(frame: Frame, item: Any) -> bool:
    """Whether the frame's pixels are the caller's own memory (a uint8 tensor or array used as it is), rather than
    pixels `frame_from_pixels` made (a float frame converted, a PIL image read), which nobody else can write."""
    if isinstance(item, torch.Tensor):
        return frame.pixels.untyped_storage().data_ptr() == item.untyped_storage().data_ptr()
    if isinstance(item, np.ndarray):
        return frame.pixels.device.type == "cpu" and np.may_share_memory(frame.pixels.numpy(), item)
    return isinstance(item, Frame)


def to_device(frame: Frame, decoder: Decoder, own_copy: bool = False) -> Frame:
    """The frame on the decoder's device: a CUDA frame on another GPU copied over, a host frame on the decoder's copy
    stream (its `ready_events` cover the copy). The caller may write its host buffer again once this returns: a copy
    from pageable memory has read it by then, and a pinned buffer, which the GPU would read later, is copied first.
    `own_copy`: a frame already on the device is copied as well, on the copy stream after the current stream's work
    (which wrote it), and the current stream's later work (which may write it again) waits for the copy."""
    device = decoder.cpu.device
    pixels = frame.pixels
    if pixels.device == device:
        if not own_copy:
            return frame
        copy_stream = decoder.cpu.copy_stream
        if copy_stream is None:  # the CPU: read later, on the caller's thread
            return replace(frame, pixels=pixels.clone(memory_format=torch.contiguous_format))
        current = torch.cuda.current_stream(device)
        copy_stream.wait_stream(current)
        with torch.cuda.stream(copy_stream):
            pixels = pixels.clone(memory_format=torch.contiguous_format)
        current.wait_stream(copy_stream)
        return replace(frame, pixels=pixels)
    if pixels.device.type == "cuda" or device.type != "cuda":
        pixels = pixels.to(device)
    else:
        if pixels.is_pinned():
            pixels = torch.empty(pixels.shape, dtype=pixels.dtype).copy_(pixels)
        pixels = decoder.cpu.to_device(pixels)
    return replace(frame, pixels=pixels)
