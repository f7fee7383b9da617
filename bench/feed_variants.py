"""Other ways of feeding a short list to a blocking decoder, kept for the benchmarks to time beside the product.

`handed_over` (the product from 2026-12-06 until two threads took turns): one thread prepares a short list's chunks
and hands each whole to a finishing thread, then waits, the GIL let go, until the finishing thread is inside the
decoder's long call. `short_list_fed(name)` puts one in place of `FrameFeed._short_list_work` for a `with` block.
(Two threads preparing a list's images between them, with and without the GIL held through the read and header
check, lost to the product on an H100 and were removed: bench/NOTES.md, "Two feed threads taking turns".)
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any

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
                    decoded = feed.decoder.finish([pending for _, pending in chunk], feed._spare, entering)
                finally:
                    entering.set()
                if not feed._put(feed._chunks, FedBatch([image for image, _ in chunk], decoded)):
                    return
        except BaseException as e:
            feed._put(feed._chunks, e)

    return [("yolojet-feed", prepare_chunks, ()), ("yolojet-feed-finish", finish_chunks, ())]


VARIANTS = {"handed_over": _handed_over_work}


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
