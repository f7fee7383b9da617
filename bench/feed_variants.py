"""Other ways of feeding a short list to a blocking decoder, kept for the benchmarks to time beside the product.

`handed_over` (the product from 2026-12-06 until two threads took turns): one thread prepares a short list's chunks
and hands each whole to a finishing thread, then waits, the GIL let go, until the finishing thread is inside the
decoder's long call. `together` (a candidate): two threads prepare the list's images between them, image by image,
and whichever finds the next chunk prepared decodes it, so that both prepare while neither decodes (the first
chunk). `short_list_fed(name)` puts one in place of `FrameFeed._short_list_work` for a `with` block;
`preparing_without_the_gil(decoder)` makes the file read and nvJPEG's header check let go of the GIL, so that two
threads preparing may overlap them.
"""

from __future__ import annotations

import contextlib
import ctypes
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import yolojet.images.sources as sources_module
from yolojet.engine.feed import _END, FedBatch, FrameFeed, _Failure


def _handed_over_work(feed: FrameFeed, images: Iterable[Any]) -> list:
    prepared: queue.Queue = queue.Queue(maxsize=2)

    def prepare_chunks() -> None:
        try:
            source = iter(images)
        except BaseException as e:
            feed._put(prepared, _Failure(e))
            return
        while True:
            chunk, failed = feed._prepare_chunk(source)
            if chunk:
                entering = threading.Event()
                if not feed._put(prepared, (chunk, entering)):
                    return
                while not entering.wait(0.1):
                    if feed._stop.is_set():
                        return
            if failed is not None:
                feed._put(prepared, _Failure(failed))
                return
            if not chunk:
                break
        feed._put(prepared, _END)

    def finish_chunks() -> None:
        try:
            while not feed._stop.is_set():
                try:
                    taken = prepared.get(timeout=0.1)
                except queue.Empty:
                    continue
                if taken is _END or isinstance(taken, _Failure):
                    feed._put(feed._chunks, taken.error if isinstance(taken, _Failure) else _END)
                    return
                chunk, entering = taken
                try:
                    decoded = feed.decoder.finish([pending for _, pending in chunk], feed._spares(), entering)
                finally:
                    entering.set()
                if not feed._put(feed._chunks, FedBatch([image for image, _ in chunk], decoded)):
                    return
        except BaseException as e:
            feed._put(feed._chunks, e)

    return [("yolojet-feed", prepare_chunks, ()), ("yolojet-feed-finish", finish_chunks, ())]


class _Together:
    """What the two threads of `together` share: the list's iterator (advanced under the lock), the prepared images
    by index, the next chunk to decode, and an event a chunk for its decode having begun and for its having been
    handed on."""

    def __init__(self, feed: FrameFeed, images: Iterable[Any]) -> None:
        self.feed, self.images = feed, images
        self.source: Iterator[Any] | None = None
        self.cond = threading.Condition()
        self.taken = 0
        self.items: dict[int, tuple[Any, Any]] = {}
        self.total: int | None = None  # the images before the list's end or failure, once met
        self.failure: BaseException | None = None
        self.next_decode = 0
        self.done = False  # the end or a failure claimed: nothing more to do
        self.events: dict[tuple[str, int], threading.Event] = {}

    def event(self, kind: str, index: int) -> threading.Event:
        with self.cond:
            return self.events.setdefault((kind, index), threading.Event())

    def _wait(self, event: threading.Event) -> bool:
        while not event.wait(0.1):
            if self.feed._stop.is_set():
                return False
        return not self.feed._stop.is_set()

    def _claim(self) -> tuple:
        """The next thing to do (under the lock): ("decode", c, items), ("end", c), ("prepare", i, image), ("stop",)."""
        size = self.feed.chunk
        while True:
            if self.feed._stop.is_set() or self.done:
                return ("stop",)
            c = self.next_decode
            start = c * size
            if self.total is not None and start >= self.total:
                self.done = True  # the end is handed on by this thread, after the chunk before
                return ("end", c)
            end = start + size if self.total is None else min(start + size, self.total)
            if all(i in self.items for i in range(start, end)):
                self.next_decode += 1
                return ("decode", c, [self.items.pop(i) for i in range(start, end)])
            if self.total is None and self.taken < (self.next_decode + 2) * size:
                index = self.taken
                try:
                    if self.source is None:
                        self.source = iter(self.images)
                    image = next(self.source)
                except StopIteration:
                    self.total = index
                    continue
                except BaseException as e:
                    self.total, self.failure = index, e
                    continue
                self.taken += 1
                return ("prepare", index, image)
            self.cond.wait(0.1)

    def run(self) -> None:
        feed = self.feed
        while True:
            with self.cond:
                action = self._claim()
            if action[0] == "stop":
                return
            if action[0] == "prepare":
                _, index, image = action
                try:
                    pending = feed._prepare(image)
                except BaseException as e:  # a decoder's failure: the feed ends at this image
                    with self.cond:
                        self.total = index if self.total is None else min(self.total, index)
                        self.failure = e
                        self.cond.notify_all()
                    continue
                with self.cond:
                    self.items[index] = (image, pending)
                    self.cond.notify_all()
                continue
            c = action[1]
            if c and not self._wait(self.event("began", c - 1)):
                return
            if action[0] == "end":
                if c and not self._wait(self.event("handed", c - 1)):
                    return
                feed._put(feed._chunks, _END if self.failure is None else self.failure)
                return
            chunk = action[2]
            entering = self.event("began", c)
            decoded, failed = None, None
            try:
                decoded = feed.decoder.finish([pending for _, pending in chunk], feed._spares(), entering)
            except BaseException as e:
                failed = e
            finally:
                entering.set()
            if c and not self._wait(self.event("handed", c - 1)):
                return
            if failed is not None:
                with self.cond:
                    self.done = True
                    self.cond.notify_all()
                feed._put(feed._chunks, failed)
                return
            if not feed._put(feed._chunks, FedBatch([image for image, _ in chunk], decoded)):
                return
            self.event("handed", c).set()


def _together_work(feed: FrameFeed, images: Iterable[Any]) -> list:
    together = _Together(feed, images)
    return [(f"yolojet-feed-{i}", together.run, ()) for i in (0, 1)]


VARIANTS = {"handed_over": _handed_over_work, "together": _together_work}


@contextlib.contextmanager
def preparing_without_the_gil(decoder: Any) -> Iterator[None]:
    """Inside the block, a file read from the page cache and nvJPEG's header check (`takes`) let go of the GIL (the
    product holds it through both)."""
    held = sources_module._HOLDING_THE_GIL
    hardware = getattr(decoder, "_hardware", None)
    if held is not None:
        _, new_bytes, buffer_of = held
        libc = ctypes.CDLL(None, use_errno=True)
        for name in ("preadv2", "lseek", "open", "close"):
            getattr(libc, name).argtypes = getattr(held[0], name).argtypes
            getattr(libc, name).restype = getattr(held[0], name).restype
        sources_module._HOLDING_THE_GIL = (libc, new_bytes, buffer_of)
    quick = hardware._quick if hardware is not None else None
    if hardware is not None:
        hardware._quick = hardware._long
    try:
        yield
    finally:
        sources_module._HOLDING_THE_GIL = held
        if hardware is not None:
            hardware._quick = quick


@contextlib.contextmanager
def short_list_fed(name: str) -> Iterator[None]:
    """Short lists fed the way `name` says (`product`: as the feed does now) inside the block."""
    product = FrameFeed._short_list_work
    if name != "product":
        FrameFeed._short_list_work = VARIANTS[name]  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        FrameFeed._short_list_work = product  # type: ignore[method-assign]
