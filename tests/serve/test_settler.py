"""Outcomes handed from the runner's thread to the event loop (yolojet/serve/service.py `Settler`): every future gets
its own outcome, a cancelled one is left alone, and a batch's outcomes arriving together wake the loop a few times,
not once each; each answer's lateness against its promise goes to the admission margin."""

from __future__ import annotations

import asyncio
import threading

from yolojet.serve.runner import Outcome
from yolojet.serve.service import Settler


def test_a_batch_of_outcomes_settles_every_future_in_a_few_wakeups():
    async def main() -> tuple[list[object], list[object], int, bool]:
        loop = asyncio.get_running_loop()
        settler = Settler(loop)
        wakeups = []
        asking = loop.call_soon_threadsafe

        def counted(*args):  # the loop's own call, counted
            wakeups.append(args[0])
            return asking(*args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        futures = [loop.create_future() for _ in range(64)]
        futures[5].cancel()  # a client that went away
        outcomes = [Outcome() for _ in futures]
        runner = threading.Thread(target=lambda: [settler.put(f, o) for f, o in zip(futures, outcomes, strict=True)])
        runner.start()
        await asyncio.gather(*futures, return_exceptions=True)
        runner.join()
        settled = [f.result() for i, f in enumerate(futures) if i != 5]
        return settled, [o for i, o in enumerate(outcomes) if i != 5], len(wakeups), futures[5].cancelled()

    settled, wanted, wakeups, cancelled = asyncio.run(main())
    assert all(a is b for a, b in zip(settled, wanted, strict=True)) and cancelled
    assert 1 <= wakeups <= 8, wakeups  # 64 without coalescing


def test_each_promised_answer_is_noted_with_when_it_reached_the_loop():
    async def main() -> tuple[list[tuple[float, float]], float]:
        loop = asyncio.get_running_loop()
        noted: list[tuple[float, float]] = []
        clock = [250.0]
        settler = Settler(loop, lambda answered, promised: noted.append((answered, promised)), lambda: clock[0])
        futures = [loop.create_future() for _ in range(3)]
        # Answered 4 ms early, a failure with no promise, 7 ms late.
        for future, promised in zip(futures, [250.004, 0.0, 249.993], strict=True):
            settler.put(future, Outcome(promised=promised))
        await asyncio.gather(*futures)
        return noted, clock[0]

    noted, now = asyncio.run(main())
    assert noted == [(now, 250.004), (now, 249.993)]
