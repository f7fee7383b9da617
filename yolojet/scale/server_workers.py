"""`yolojet serve --devices`: one engine worker process a device behind the one gRPC front end.

The front (the gRPC event loop, the scheduler, the metrics) loads no model. Each worker process (spawned: CUDA does
not survive a fork) loads every served model on its device, measures their latency and reports their cards; then it
takes batches of encoded images over a pipe, decodes and runs each with its engines, and sends back one outcome a
request. The front's dispatcher sends each batch the scheduler forms to the live worker with the fewest batches in
flight (two at most each, so that a worker's next batch is already waiting in its pipe when it finishes one). Each
worker has a sending thread, since a batch is megabytes and a pipe holds kilobytes: a send waits until the worker
reads, which must hold up neither the dispatcher nor the other workers; and a receiving thread for its answers.

A worker that dies (its pipe ends) is started again; each batch it held is sent once more to another live worker,
and a batch whose second worker dies too is answered UNAVAILABLE: an accepted request is never dropped silently. A
worker that holds a batch for `HUNG_AFTER_S` without answering is taken for hung (a stuck driver call, a stopped
process) and killed, which makes it a worker that died.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import grpc

from yolojet.errors import EngineConfigError, ImageReadError
from yolojet.options import apply_switch_interval
from yolojet.scale.devices import select_device
from yolojet.serve.batcher import LatencyModel, Request, Scheduler
from yolojet.serve.metrics import ServerMetrics
from yolojet.serve.models import ModelCard, ModelSpec, ServedModel
from yolojet.serve.runner import HUNG_AFTER_S, Outcome, Runner

log = logging.getLogger("yolojet.serve")
BATCHES_PER_WORKER = 2  # one running, the next waiting in the pipe
START_TIMEOUT_S = 900.0  # a cold start tunes every model's tiles: minutes on a GPU


# -- the worker process ----------------------------------------------------------------------------------------


def _worker_main(connection: Connection, specs: list[ModelSpec], device: str, engine_options: dict[str, Any]) -> None:
    """A worker: load the models on `device`, report them, then answer batches until told to stop."""
    from yolojet.images.decoders import Encoded, OutputPool
    from yolojet.serve.models import load_models

    apply_switch_interval()
    try:
        select_device(device)
        models = load_models(specs, device=device, **engine_options)
    except BaseException as e:  # reported to the front, which names the device
        connection.send(("failed", f"{type(e).__name__}: {e}"))
        return
    connection.send(("ready", {name: (m.version, m.card, m.latency.run_seconds) for name, m in models.items()}))
    # A model's answered batches' decode buffers, decoded into again (one batch at a time here: one batch's worth).
    pools: dict[str, OutputPool] = {}
    try:
        while True:
            message = connection.recv()
            if message[0] == "stop":
                return
            _, ticket, name, items = message
            engine = models[name].engine
            assert engine is not None
            outcomes: list[tuple[str, Any, float, float]] = []
            started = time.perf_counter()
            try:
                encoded = [Encoded(data, f"image of request {rid!r}") for rid, data, _ in items]
                decoded = engine.decoder.decode(encoded, pools.setdefault(name, OutputPool()))
                decode_s = time.perf_counter() - started
                frames = [(i, item) for i, item in enumerate(decoded.items) if not isinstance(item, ImageReadError)]
                ran = time.perf_counter()
                results = (
                    engine.submit(
                        [f for _, f in frames], [items[i][2] for i, _ in frames], ready=decoded.ready
                    ).results()
                    if frames
                    else []
                )
                run_s = time.perf_counter() - ran
                by_slot = {i: r for (i, _), r in zip(frames, results, strict=True)}
                for i, item in enumerate(decoded.items):
                    if i in by_slot:
                        by_slot[i].image = None  # the original image stays here: replies never carry it
                        outcomes.append(("OK", by_slot[i], decode_s, run_s))
                    else:
                        outcomes.append(("INVALID_ARGUMENT", str(item), decode_s, 0.0))
                pools[name].give(decoded.outputs)
            except Exception as e:  # an engine failure, not a bad image: every request of the batch gets it
                failure = {"event": "batch failed", "model": name, "device": device, "error": traceback.format_exc()}
                log.error(json.dumps(failure))
                outcomes = [("INTERNAL", f"the engine on {device} failed: {e}", 0.0, 0.0)] * len(items)
            connection.send(("done", ticket, outcomes))
    except (EOFError, OSError, KeyboardInterrupt):  # the front went away, or Ctrl-C reached the whole group
        return
    finally:
        for model in models.values():
            if model.engine is not None:
                model.engine.close()


# -- the front's side ------------------------------------------------------------------------------------------


@dataclass
class _Batch:
    ticket: int
    model: str
    requests: list[Request]
    started: float
    tries: int = 0
    dispatched: float = 0.0  # when it was last handed to a worker


@dataclass
class _Worker:
    index: int
    device: str
    process: Any = None
    connection: Connection | None = None
    live: bool = False
    in_flight: dict[int, _Batch] = field(default_factory=dict)
    batches: int = 0  # batches answered, over the worker's restarts
    restarts: int = 0
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    outbox: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)  # (batch, items) for its sending thread


class WorkerPool:
    """The worker processes, one a device: `start()` launches them and returns the served models as the workers
    report them (the slowest worker's latency a bucket)."""

    def __init__(self, specs: list[ModelSpec], devices: Sequence[str], engine_options: dict[str, Any]) -> None:
        self.specs, self.engine_options = specs, engine_options
        self.workers = [_Worker(i, d) for i, d in enumerate(devices)]
        self._context = multiprocessing.get_context("spawn")
        self.closing = False

    def start(self) -> dict[str, ServedModel]:
        for worker in self.workers:
            self._spawn(worker)
        reports = []
        try:
            for worker in self.workers:
                reports.append(self._wait_ready(worker))
        except BaseException:
            self.close()
            raise
        models: dict[str, ServedModel] = {}
        for name, (version, card, _) in reports[0].items():
            slowest = {b: max(r[name][2][b] for r in reports) for b in reports[0][name][2]}
            models[name] = ServedModel(name, version, card, LatencyModel(slowest))
        return models

    def _spawn(self, worker: _Worker) -> None:
        ours, theirs = self._context.Pipe()
        worker.process = self._context.Process(
            target=_worker_main,
            args=(theirs, self.specs, worker.device, self.engine_options),
            name=f"yolojet-serve-worker-{worker.index}",
            daemon=True,
        )
        worker.process.start()
        theirs.close()  # the child holds its end: ours sees EOF when the child dies
        worker.connection = ours

    def _wait_ready(self, worker: _Worker) -> dict[str, tuple[str, ModelCard, dict[int, float]]]:
        assert worker.connection is not None
        if not worker.connection.poll(START_TIMEOUT_S):
            raise EngineConfigError(f"the worker on {worker.device} did not load its models in {START_TIMEOUT_S:.0f} s")
        try:
            kind, body = worker.connection.recv()
        except EOFError:
            raise EngineConfigError(
                f"the worker on {worker.device} exited while loading its models (exit code {worker.process.exitcode})"
            ) from None
        if kind == "failed":
            raise EngineConfigError(f"the worker on {worker.device} could not load its models: {body}")
        worker.live = True
        return body

    def send(self, worker: _Worker, batch: _Batch, items: list[tuple[str, bytes, Any]]) -> bool:
        """Hand a batch to a worker; False where its pipe is broken (it died)."""
        assert worker.connection is not None
        try:
            with worker.send_lock:
                worker.connection.send(("batch", batch.ticket, batch.model, items))
        except (OSError, ValueError):
            return False
        return True

    def close(self, timeout: float = 30.0) -> None:
        self.closing = True
        for worker in self.workers:
            if worker.connection is not None and worker.process is not None and worker.process.is_alive():
                try:
                    with worker.send_lock:
                        worker.connection.send(("stop",))
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            if worker.process is not None:
                worker.process.join(max(0.0, deadline - time.monotonic()))
                if worker.process.is_alive():
                    worker.process.kill()
                    worker.process.join()
            if worker.connection is not None:
                worker.connection.close()
            worker.live = False


class PoolRunner(Runner):
    """The server's runner when the engines are worker processes: the scheduler's batches go to the least-loaded
    live worker; a thread a worker takes its answers; a worker that dies is restarted and its batches retried."""

    watched = False  # a hung worker is killed and started again (`_kill_hung`); the front itself never waits on one

    def __init__(
        self,
        models: dict[str, ServedModel],
        scheduler: Scheduler,
        metrics: ServerMetrics,
        pool: WorkerPool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(models, scheduler, metrics, clock)
        self.pool = pool
        scheduler.engines = sum(w.live for w in pool.workers)
        self.retried = 0  # batches sent again after their worker died
        self._receivers = [
            threading.Thread(target=self._receive, args=(w,), name=f"yolojet-serve-receive-{w.index}", daemon=True)
            for w in pool.workers
        ]
        self._senders = [
            threading.Thread(target=self._send, args=(w,), name=f"yolojet-serve-send-{w.index}", daemon=True)
            for w in pool.workers
        ]

    def start(self) -> None:
        for thread in self._receivers + self._senders:
            thread.start()
        super().start()

    def stop(self, timeout: float | None = None) -> None:
        super().stop(timeout)  # answers every queued request first
        self.pool.close()
        for worker in self.pool.workers:
            worker.outbox.put(None)  # ends its sending thread

    # -- dispatching -----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._drop_unwanted()
                self._kill_hung()
                chosen = self.scheduler.next_batch()
                if chosen is None:
                    busy = self.scheduler.in_flight
                    if self._stopping and self.scheduler.queued() == 0 and not busy:
                        return
                    wait = min(1.0, max(0.0, self.scheduler.next_wakeup() - self.clock()))
                    self._cond.wait(timeout=wait)
                    continue
                ticket, name, requests = chosen
                self._show_queue_depths()
                self.metrics.child(self.metrics.batch_size, name).observe(len(requests))
                self._dispatch(_Batch(ticket, name, requests, self.clock()))

    def _dispatch(self, batch: _Batch) -> None:
        """Give a batch to the live worker with the fewest in flight, for its sending thread (under the lock);
        answered UNAVAILABLE where no worker can take it."""
        batch.tries += 1
        live = [w for w in self.pool.workers if w.live]
        if not live:
            self._settle_batch(
                batch, Outcome(code=grpc.StatusCode.UNAVAILABLE, message="no engine worker is running (restarting)")
            )
            return
        worker = min(live, key=lambda w: len(w.in_flight))
        worker.in_flight[batch.ticket] = batch
        batch.dispatched = self.clock()
        items = [(r.payload.request_id, r.payload.data, r.payload.options) for r in batch.requests]
        worker.outbox.put((batch, items))

    def _send(self, worker: _Worker) -> None:
        """A worker's sending thread: its batches into its pipe, in order. A batch no longer in its hands (retried
        elsewhere after it died) is skipped. A send that fails, however, kills the worker: its receiver then sees the
        pipe end, retries its batches and starts it again (a worker left alive but unfed would hold its batches)."""
        while (item := worker.outbox.get()) is not None:
            batch, items = item
            with self._cond:
                held = worker.in_flight.get(batch.ticket)
            if held is None or held is not batch:
                continue
            try:
                sent = self.pool.send(worker, held, items)
            except Exception:  # a closed connection mid-send, a request that does not pickle: the same remedy
                log.exception("sending a batch to the worker on %s failed", worker.device)
                sent = False
            if not sent:
                with self._cond:
                    worker.live = False
                if worker.process is not None and worker.process.is_alive():
                    worker.process.kill()

    def _kill_hung(self) -> None:
        """Kill each live worker that has held a batch for HUNG_AFTER_S without answering (under the lock): its
        receiver then sees the pipe end, retries its batches elsewhere and starts it again."""
        now = self.clock()
        for worker in self.pool.workers:
            oldest = min((b.dispatched for b in worker.in_flight.values()), default=now)
            if worker.live and now - oldest > HUNG_AFTER_S and worker.process is not None:
                hung = {"event": "worker hung", "device": worker.device, "seconds_without_answer": round(now - oldest)}
                log.error(json.dumps(hung))
                worker.live = False
                worker.process.kill()

    def _settle_batch(self, batch: _Batch, outcome: Outcome) -> None:
        for request in batch.requests:
            self._answer(request, outcome)
        self.scheduler.finished(batch.ticket)
        self._cond.notify()

    # -- receiving -------------------------------------------------------------------------------------------

    def _receive(self, worker: _Worker) -> None:
        while True:
            connection = worker.connection
            try:
                assert connection is not None
                message = connection.recv()
            except (EOFError, OSError, AssertionError):
                if self.pool.closing:
                    return
                self._worker_died(worker)
                continue
            _, ticket, outcomes = message
            with self._cond:
                batch = worker.in_flight.pop(ticket, None)
                worker.batches += 1
            if batch is None:
                continue
            self._answer_batch(batch, outcomes)

    def _answer_batch(self, batch: _Batch, outcomes: list[tuple[str, Any, float, float]]) -> None:
        model = self.models[batch.model]
        decode_s = outcomes[0][2] if outcomes else 0.0
        model.latency.observe_decode(len(outcomes), decode_s)
        for request, (code, body, decode_s, run_s) in zip(batch.requests, outcomes, strict=True):
            queue_s = batch.started - request.arrival
            if code == "OK":
                self._answer(request, Outcome(body, queue_s=queue_s, decode_s=decode_s, run_s=run_s))
            else:
                self._answer(
                    request, Outcome(code=grpc.StatusCode[code], message=body, queue_s=queue_s, decode_s=decode_s)
                )
        with self._cond:
            self.scheduler.finished(batch.ticket)
            self._cond.notify()

    def _worker_died(self, worker: _Worker) -> None:
        """Retry the dead worker's batches elsewhere (once each), then start it again (outside the lock: loading
        takes seconds to minutes)."""
        code = worker.process.exitcode if worker.process is not None else None
        died = {
            "event": "worker died",
            "device": worker.device,
            "exit_code": code,
            "batches_in_flight": len(worker.in_flight),
        }
        log.error(json.dumps(died))
        with self._cond:
            worker.live = False
            self.scheduler.engines = sum(w.live for w in self.pool.workers)
            orphans = list(worker.in_flight.values())
            worker.in_flight.clear()
            for batch in orphans:
                if batch.tries >= 2:
                    self._settle_batch(
                        batch,
                        Outcome(
                            code=grpc.StatusCode.UNAVAILABLE,
                            message=(f"the engine workers running it died twice (last on {worker.device})"),
                        ),
                    )
                else:
                    self.retried += 1
                    self._dispatch(batch)
        if worker.connection is not None:
            with worker.send_lock:  # not while its sending thread is inside a send
                worker.connection.close()
        while not self.pool.closing:
            try:
                self.pool._spawn(worker)
                self.pool._wait_ready(worker)
                break
            except EngineConfigError as e:
                log.error(json.dumps({"event": "worker restart failed", "device": worker.device, "error": str(e)}))
                time.sleep(5.0)
        with self._cond:
            worker.restarts += 1
            self.scheduler.engines = sum(w.live for w in self.pool.workers)
            self._cond.notify()
        log.info(json.dumps({"event": "worker restarted", "device": worker.device}))
