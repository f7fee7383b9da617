"""How the feed's threads hand work to each other, without a GPU: `FrameFeed` over a stand-in for the hardware decoder
whose `prepare` runs ~95 us of Python an image (the H200's read and header checks of a 1080x810 JPEG) and whose
`finish` lets go of the GIL for ~90 us an image (its batched decode call), then runs a little Python.

A thread woken for work another thread handed over (a queue's item) must still take the GIL from that thread, which
goes on running Python: it waits for the switch interval (5 ms) unless the GIL is let go. The variants:
  product      the feed as it is, for a blocking decoder: a list of at most two batches fed by two threads taking
               turns (each prepares a chunk and decodes it while the other prepares the next), a longer one handed
               image by image from a source thread to a decode thread; a thread that has queued a chunk's worth of
               work where a thread may wait for it lets go of the GIL (time.sleep(0))
  handed_over  a short list prepared on one thread and its chunks handed whole to a finishing thread (the product
               before the turns)
  two_threads  every list handed image by image (as the product's long lists)
  no_yield     two threads without letting go of the GIL after a handover
  one_thread   one thread that prepares a chunk, then decodes the one before (the decoder not said to block)
Lists of --short and --long images in batches of 64, chunks as the product's (32 for a short list, 64 for a long one).

    python3 bench/bench_feed_handoff.py [--short 64] [--long 1280] [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import time

import torch
from feed_variants import short_list_fed

import yolojet.engine.feed as feed_module
from yolojet.engine.feed import FrameFeed
from yolojet.images.decoders import CpuDecoder, DecodedBatch, Pending
from yolojet.images.frames import Frame

PREPARE_US = 95
DECODE_US = 90  # an image, the GIL let go
FRAMES_US = 100  # Python after a decode call


def burn(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


class StandIn:
    """The hardware decoder's costs without its hardware."""

    blocking_finish = True
    name = "stand-in"

    def __init__(self) -> None:
        self.cpu = CpuDecoder(torch.device("cpu"), threads=1)
        self.pixels = torch.zeros(4, 4, 3, dtype=torch.uint8)

    def prepare(self, item):
        burn(PREPARE_US)
        return Pending(item, outcome=Frame(self.pixels, bgr=True))

    def finish(self, pending, pool=None, entering=None):
        if entering is not None:
            entering.set()
        time.sleep(DECODE_US * 1e-6 * len(pending))
        burn(FRAMES_US)
        return DecodedBatch([p.outcome for p in pending], [])

    def close(self) -> None:
        self.cpu.close()


def put_without_yielding(self, q, item) -> bool:
    """FrameFeed._put as it was before it let go of the GIL after a handover."""
    while not self._stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def timed(decoder: StandIn, count: int, rounds: int) -> dict:
    """Median ms to the first batch and to the last, over `rounds` feeds of `count` images in batches of 64."""
    firsts, totals = [], []
    for _ in range(rounds):
        start, first = time.perf_counter(), None
        for _fed in FrameFeed([b"x"] * count, decoder, batch=64):
            first = first if first is not None else time.perf_counter() - start
        totals.append(time.perf_counter() - start)
        firsts.append(first)
    return {"first_ms": statistics.median(firsts) * 1e3, "all_ms": statistics.median(totals) * 1e3}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", type=int, default=64)
    parser.add_argument("--long", type=int, default=1280)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    decoder = StandIn()
    product_put, short_list_batches = FrameFeed._put, feed_module.SHORT_LIST_BATCHES
    found: dict = {}
    try:
        for variant in ("product", "handed_over", "two_threads", "no_yield", "one_thread"):
            FrameFeed._put = put_without_yielding if variant == "no_yield" else product_put  # type: ignore[method-assign]
            feed_module.SHORT_LIST_BATCHES = 0 if variant in ("two_threads", "no_yield") else short_list_batches
            decoder.blocking_finish = variant != "one_thread"
            for count in (args.short, args.long):
                rounds = args.rounds if count == args.short else max(3, args.rounds // 3)
                key = f"{variant}_{count}"
                with short_list_fed("handed_over" if variant == "handed_over" else "product"):
                    found[key] = timed(decoder, count, rounds)
                print(f"{key}: {json.dumps({k: round(v, 1) for k, v in found[key].items()})}", flush=True)
    finally:
        FrameFeed._put = product_put  # type: ignore[method-assign]
        feed_module.SHORT_LIST_BATCHES = short_list_batches
        decoder.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
