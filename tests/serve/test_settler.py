"""Outcomes handed from the runner's thread to the event loop (yolojet/serve/service.py `Settler`): every future gets
its own outcome, a cancelled one is left alone, and a batch's outcomes arriving together wake the loop once,
not once an outcome."""

from __future__ import annotations

import asyncio
import threading

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
        outcomes = [object() for _ in futures]
        runner = threading.Thread(target=lambda: [settler.put(f, o) for f, o in zip(futures, outcomes, strict=True)])
        # The loop's thread waits while the runner puts every outcome (as under load, when the runner answers a batch
        # faster than the loop gets to run): how many wake-ups then depends on nothing but the coalescing.
        runner.start()
        runner.join()
        await asyncio.gather(*futures, return_exceptions=True)
        settled = [f.result() for i, f in enumerate(futures) if i != 5]
        return settled, [o for i, o in enumerate(outcomes) if i != 5], len(wakeups), futures[5].cancelled()

    settled, wanted, wakeups, cancelled = asyncio.run(main())
    assert all(a is b for a, b in zip(settled, wanted, strict=True)) and cancelled
    assert wakeups == 1, wakeups  # 64 without coalescing
