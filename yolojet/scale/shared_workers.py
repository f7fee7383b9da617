"""`yolojet serve --processes N --devices D`: N gRPC fronts sharing one engine worker process a device.

Whole servers side by side (`--processes` alone) each hold their own engines, so one GPU runs N CUDA contexts in
turn, each with small batches and its own decode calls: four servers on an H200 took 5.1 ms from launch to results
for batches a single server runs in well under one, and their runners spent most of their time in small decode calls
(bench/NOTES.md). Here the fronts (the gRPC event loop, admission, the scheduler) are N processes as with
`--processes`, and each device has one worker process, the only one with a CUDA context there: it takes every front's
batches over a Unix socket, queues their requests in a scheduler of its own, and runs them with the server's own
`Runner`, so requests of several fronts share one decode call and one run, and decode overlaps the run before it.

The parent starts the workers first (each tunes what the tuning cache lacks, alone on its device), then the fronts,
which connect to every worker (the socket lives in a directory only this user can enter, and the connection is
authenticated with the key multiprocessing gives the whole process family). A front sees a worker as `--devices`'
front sees its worker processes (`PoolRunner`): a worker whose connection ends has died, its batches go to another
worker or are answered UNAVAILABLE, and the front connects again once the parent has started it anew. A worker whose
device work hangs ends itself (the runner's watchdog, `HUNG_EXIT_CODE`); the parent starts it again.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Sequence
from functools import partial
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import grpc

from yolojet.errors import EngineConfigError
from yolojet.options import apply_switch_interval
from yolojet.scale.devices import select_device
from yolojet.scale.server_workers import WorkerItem, WorkerOutcome, WorkerPool, _Worker
from yolojet.serve.models import ModelCard, ModelSpec
from yolojet.serve.runner import Job, Outcome, Runner

log = logging.getLogger("yolojet.serve")
CONNECT_TIMEOUT_S = 30.0  # a worker that is up answers a connection at once; one being restarted is retried


def _authkey() -> bytes:
    """The key every process spawned from the same parent holds (multiprocessing passes it on)."""
    return bytes(multiprocessing.current_process().authkey)


# -- the worker process ------------------------------------------------------------------------------------------


class _Front:
    """One front's connection, in the worker: its batches' requests queued in the worker's runner, and each batch's
    outcomes sent back together once all are in (from a thread of its own, so that a front that stops reading holds
    up neither the runner nor the other fronts)."""

    def __init__(self, connection: Connection, runner: Runner) -> None:
        self.connection, self.runner = connection, runner
        self.closed = False
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[list[WorkerOutcome | None], list[int]]] = {}  # ticket -> outcomes, count left
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def serve(self) -> None:
        writer = threading.Thread(target=self._write, name="yolojet-worker-reply", daemon=True)
        writer.start()
        try:
            while True:
                _, ticket, name, items = self.connection.recv()
                self._take(ticket, name, items)
        except (EOFError, OSError):  # the front went away: what it queued is never run for nobody
            pass
        finally:
            self.closed = True
            self._outbox.put(None)
            self.runner.forget_gone()

    def _take(self, ticket: int, name: str, items: list[WorkerItem]) -> None:
        with self._lock:
            self._pending[ticket] = ([None] * len(items), [len(items)])
        jobs = [
            (Job(request_id, data, options, partial(self._answered, ticket, index), lambda: self.closed), deadline, key)
            for index, (request_id, data, options, deadline, key) in enumerate(items)
        ]
        self.runner.enqueue_admitted(name, jobs)

    def _answered(self, ticket: int, index: int, outcome: Outcome) -> None:
        if outcome.result is not None:
            outcome.result.image = None  # the original image stays here: replies never carry it
        body = outcome.result if outcome.code == grpc.StatusCode.OK else outcome.message
        with self._lock:
            outcomes, left = self._pending[ticket]
            outcomes[index] = (outcome.code.name, body, outcome.queue_s, outcome.decode_s, outcome.run_s)
            left[0] -= 1
            if left[0]:
                return
            del self._pending[ticket]
        self._outbox.put(("done", ticket, outcomes))

    def _write(self) -> None:
        while (message := self._outbox.get()) is not None:
            try:
                self.connection.send(message)
            except (OSError, ValueError):  # the front is gone; its reader ends too
                return


def _accept(listener: Listener, runner: Runner, report: dict[str, Any]) -> None:
    while True:
        try:
            connection = listener.accept()
        except multiprocessing.AuthenticationError:
            log.error('{"event": "worker connection refused", "reason": "authentication failed"}')
            continue
        except OSError:  # the listener was closed: the worker is stopping
            return
        try:
            connection.send(("ready", os.getpid(), report))
        except OSError:
            continue
        front = _Front(connection, runner)
        threading.Thread(target=front.serve, name="yolojet-worker-front", daemon=True).start()


def _worker_main(
    parent: Connection,
    address: str,
    specs: list[ModelSpec],
    device: str,
    engine_options: dict[str, Any],
    metrics_at: tuple[str, int] | None,
) -> None:
    """A device's worker: load the models, listen for fronts, run their requests until the parent says stop (or is
    gone), then answer what is queued. With `metrics_at` (host, port) it serves its Prometheus metrics there: the
    batches the device runs (each front's metrics count the batches it sent) and the device's memory."""
    import torch

    from yolojet.serve.batcher import Scheduler
    from yolojet.serve.metrics import ServerMetrics
    from yolojet.serve.models import load_models
    from yolojet.serve.server import configure_logging

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops the workers last
    apply_switch_interval()
    configure_logging()
    try:
        select_device(device)
        models = load_models(specs, device=device, **engine_options)
        listener = Listener(address, family="AF_UNIX", authkey=_authkey())
        metrics = ServerMetrics()
        metrics.watch_gpu_memory([torch.device(device)])
        http = metrics.serve_http(*metrics_at) if metrics_at is not None else None
    except BaseException as e:  # reported to the parent, which names the device
        parent.send(("failed", f"{type(e).__name__}: {e}"))
        return
    scheduler = Scheduler(time.monotonic)
    for name, model in models.items():
        scheduler.add_model(name, model.max_batch, model.latency, max_queue=0)  # the fronts admit; nothing refuses here
    runner = Runner(models, scheduler, metrics)
    runner.start()
    port = http.server_port if http is not None else None
    log.info(json.dumps({"event": "engine worker serving", "device": device, "pid": os.getpid(), "metrics_port": port}))
    report = {name: (m.version, m.card, m.latency.run_seconds) for name, m in models.items()}
    threading.Thread(target=_accept, args=(listener, runner, report), name="yolojet-worker-accept", daemon=True).start()
    parent.send(("ready", os.getpid()))
    try:
        parent.recv()  # the parent never writes: its end (a stop, or the parent gone) ends the worker
    except (EOFError, OSError):
        pass
    listener.close()
    runner.stop(timeout=60.0)
    if http is not None:
        http.shutdown()
    for model in models.values():
        if model.engine is not None:
            model.engine.close()


class DeviceWorker:
    """A device's worker process, as the parent sees it: where it listens, and its process and pipe."""

    def __init__(self, index: int, device: str, address: str, metrics_at: tuple[str, int] | None = None) -> None:
        self.index, self.device, self.address, self.metrics_at = index, device, address, metrics_at
        self.process: Any = None
        self.pipe: Connection | None = None  # kept open: the worker stops when it ends

    @property
    def name(self) -> str:
        return f"the engine worker on {self.device}"

    def spawn(self, context: Any, specs: list[ModelSpec], engine_options: dict[str, Any]) -> Connection:
        if os.path.exists(self.address):  # a dead worker's socket
            os.unlink(self.address)
        ours, theirs = context.Pipe()
        self.process = context.Process(
            target=_worker_main,
            args=(theirs, self.address, specs, self.device, engine_options, self.metrics_at),
            name=f"yolojet-serve-worker-{self.index}",
            daemon=True,
        )
        self.process.start()
        theirs.close()  # ours sees the end of the pipe if the worker dies before it reports
        if self.pipe is not None:
            self.pipe.close()
        self.pipe = ours
        return ours

    def stop(self, timeout: float) -> None:
        """End its pipe (the worker answers what it queued and exits), then wait; killed past `timeout`."""
        if self.pipe is not None:
            self.pipe.close()
            self.pipe = None
        if self.process is not None:
            self.process.join(timeout)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()


# -- the front's side --------------------------------------------------------------------------------------------


class _WorkerProcess:
    """A shared worker's process as a front sees it (not its child): what `PoolRunner` asks of a process."""

    exitcode = None  # only the parent can read it

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def is_alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill(self) -> None:
        """A worker found hung, or one whose connection broke mid-send: the parent sees it die and starts it again."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class SharedWorkerPool(WorkerPool):
    """A front's connections to the device workers the parent runs (`workers`: (device, address) pairs); spawning a
    worker is connecting to it, and a worker that died is connected to again once the parent has restarted it."""

    def __init__(self, workers: Sequence[tuple[str, str]]) -> None:
        super().__init__([], [device for device, _ in workers], {})
        self.addresses = [address for _, address in workers]

    def spawn(self, worker: _Worker) -> None:
        address = self.addresses[worker.index]
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            try:
                worker.connection = Client(address, family="AF_UNIX", authkey=_authkey())
                return
            except (OSError, multiprocessing.AuthenticationError) as e:
                if time.monotonic() > deadline or self.closing:
                    raise EngineConfigError(
                        f"the engine worker on {worker.device} does not answer at {address}: {e}"
                    ) from None
                time.sleep(0.2)

    def wait_ready(self, worker: _Worker) -> dict[str, tuple[str, ModelCard, dict[int, float]]]:
        assert worker.connection is not None
        try:
            if not worker.connection.poll(CONNECT_TIMEOUT_S):
                raise EngineConfigError(f"the engine worker on {worker.device} did not greet this front")
            _, pid, report = worker.connection.recv()
        except (EOFError, OSError) as e:
            raise EngineConfigError(f"the engine worker on {worker.device} closed the connection: {e}") from None
        worker.process = _WorkerProcess(pid)
        worker.live = True
        return report

    def close(self, timeout: float = 30.0) -> None:
        """The connections only: the workers are the parent's to stop."""
        self.closing = True
        for worker in self.workers:
            if worker.connection is not None:
                with worker.send_lock:
                    worker.connection.close()
            worker.live = False
