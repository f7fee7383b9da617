"""`yolojet label --local --devices`: one labeling worker process a device, every GPU of a host in one command.

`MultiDeviceLabeler` is a labeler as `LocalLabeler` is (`facts`, `__call__(paths, on_record, on_error)`, `close()`),
so the JSON lines, the resume and the COCO / YOLO outputs stay those of `client/label.py`: records and errors are
handed to its callbacks in this process only, as the workers send them.

Each worker (spawned: CUDA does not survive a fork) builds a `LocalLabeler` on its device and runs one engine stream
over chunks of paths that it asks this process for as its stream wants more images, so batches stay full and decoding
overlaps running across chunk boundaries, and a faster device simply asks more often (work stealing). Over a worker's
pipe:

    worker → parent   ("ready", facts) | ("failed", error class, message)     once, after loading the model
                      ("counts", {name: n})  what it counted since it last said (a server's refusals, reconnects)
                      ("want", fresh)       its stream wants more paths; `fresh`: nothing of it is in flight
                      ("results", [("record", path, record) | ("error", path, message), ...])
                                            in the stream's order, a batch's worth (or 50 ms of them) a message:
                                            a message an image cost the worker a GIL round trip an image
                      ("record", path, record) | ("error", path, message)   one an image (stream_workers.py)
                      ("crashed", "Error: message")                         before it exits on an engine failure
    parent → worker   ("chunk", paths)      the next chunk, to the worker that asked
                      ("end",)              none left now: finish the stream (its last batch runs short)
                      ("stop",)             exit

A `fresh` want with nothing queued is held, not answered, until a chunk comes back from a dead worker, a next call
brings work, or `close` stops the worker; a want from inside a stream is answered `end` at once, since images of the
stream may still wait for their batch to fill.

A worker that dies (its pipe ends) loses nothing: the records it sent before are delivered, the paths it held and
had not sent go back to the front of the queue, and the worker is started again on its device (up to
`MAX_RESTARTS` times). The oldest chunk it held is the one it died on: a chunk that two workers died on goes to the
error log, image by image, rather than round again. A path is delivered once, from the first record or error a
worker sends for it; every later one is dropped, so a chunk run again never writes a line twice.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from yolojet import errors
from yolojet.client.label import FIRST_IMAGES, ModelFacts
from yolojet.errors import EngineConfigError, YolojetError
from yolojet.options import apply_switch_interval
from yolojet.scale.devices import select_device

# Paths a chunk, in batches: small enough that the last chunks of a run spread over the devices (a worker's stream
# asks for its next chunk two to three batches ahead of its results), large enough that the asking costs nothing
# beside the batches (one message a chunk against four batches of work).
CHUNK_BATCHES = 4
MAX_RESTARTS = 3  # a device's worker started again after this many deaths is given up: something is wrong there
SEND_EVERY_S = 0.05  # a worker's records wait at most this long (or for a batch's worth) before going out
STOP_TIMEOUT_S = 10.0  # for the workers to finish their last batch and exit when told, before they are terminated
MESSAGES_A_TURN = 64  # read from one worker before looking at the others, so that a busy one starves none


# -- the worker process ----------------------------------------------------------------------------------------


def _worker_main(
    connection: Connection,
    device: str,
    model: str,
    batch: int,
    options: dict[str, Any],
    engine_options: dict[str, Any],
    threads: int | None,
) -> None:
    """A worker: a `LocalLabeler` on `device`, then streams of the chunks the parent hands out until told to stop."""
    apply_switch_interval()
    # Ctrl-C reaches the whole process group; the parent alone decides what it means, and ends the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sending = threading.Lock()  # the stream's source thread asks for chunks while the main thread sends records

    def send(message: tuple) -> None:
        with sending:
            connection.send(message)

    try:
        select_device(device)
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        from yolojet.client.local import LocalLabeler

        labeler = LocalLabeler(model, batch, options, device=device, **engine_options)
    except BaseException as e:  # reported to the parent, which names the device
        send(("failed", type(e).__name__, str(e)))
        return
    try:
        send(("ready", labeler.facts))
        while _label_stream(labeler, connection, send):
            pass
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the parent is gone: nobody to label for
    except BaseException as e:
        try:
            send(("crashed", f"{type(e).__name__}: {e}"))
        except OSError:
            pass
        raise
    finally:
        labeler.close()
    # Told to stop, everything sent: the interpreter's own teardown (the engine's graphs, buffers and threads freed
    # one by one, about a second on an H200, which the parent's close waits for) is left to the process's exit.
    connection.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def chunked_paths(connection: Connection, send: Callable[[tuple], None], told: list[str]) -> Iterator[str]:
    """The paths of the chunks the parent hands out, asked for as they are walked, until it says `end` or `stop`
    (appended to `told`)."""
    fresh = True
    while True:
        send(("want", fresh))
        fresh = False
        message = connection.recv()
        if message[0] != "chunk":
            told.append(message[0])
            return
        yield from message[1]


def _label_stream(labeler: Any, connection: Connection, send: Callable[[tuple], None]) -> bool:
    """One engine stream over the chunks handed out until the parent says `end` (True: more may come) or `stop`."""
    from yolojet.client import records

    fed: deque[str] = deque()  # the paths given to the stream whose results are still to come, in order
    told: list[str] = []

    def paths() -> Iterator[str]:  # walked by the stream's source thread, ahead of the results
        for path in chunked_paths(connection, send, told):
            fed.append(path)
            yield path

    f = labeler.facts
    gathered: list[tuple[str, str, Any]] = []
    sent_at = time.monotonic()
    # The engine's stream directly, not `LocalLabeler.__call__`, which takes a list: one stream across the chunks
    # keeps the next chunk's decoding overlapping this chunk's last batches. The records are made as it makes them.
    for result in labeler.engine.stream(paths(), **labeler.options):
        path = fed.popleft()
        if result.error:
            gathered.append(("error", path, result.error))
        else:
            gathered.append(("record", path, records.from_results(path, result, f.name, f.version, f.task)))
        if len(gathered) >= labeler.engine.max_batch or time.monotonic() - sent_at >= SEND_EVERY_S:
            send(("results", gathered))
            gathered, sent_at = [], time.monotonic()
    if gathered:
        send(("results", gathered))
    return told == ["end"]


# -- the parent's side -----------------------------------------------------------------------------------------


@dataclass
class _Chunk:
    paths: list[str]
    died_on: list[str] = field(default_factory=list)  # the devices whose workers died on it


@dataclass
class _Worker:
    slot: int  # which of the devices named it runs for (a device may be named twice)
    device: str
    process: BaseProcess
    connection: Connection
    ready: bool = False
    waiting: bool = False  # its fresh want is held until there is work
    held: deque[_Chunk] = field(default_factory=deque)  # chunks sent, oldest first, that may have paths to deliver
    last_words: str = ""  # what a failing worker said before it exited


class MultiDeviceLabeler:
    """`LocalLabeler`'s interface over one worker process a device of `devices` (torch device names; a device named
    twice runs two workers), each a `LocalLabeler(model, batch, options, device=device, **engine_options)`.

    The workers are spawned, so a script that makes one runs it under `if __name__ == "__main__":` (a spawned
    process imports the script's main module again); the `yolojet` command needs nothing."""

    workers: list[_Worker]

    def __init__(
        self,
        model: str,
        batch: int,
        options: dict[str, Any],
        devices: Sequence[str],
        first_images: Sequence[str] = (),
        **engine_options: Any,
    ) -> None:
        if not devices:
            raise EngineConfigError("--devices: name at least one device")
        if "device" in engine_options:
            raise EngineConfigError("device and devices: give one (devices runs a worker process a device)")
        self._start_state(batch)
        try:
            model = self._shared_model(model)
            cpus = sum(d == "cpu" for d in devices)
            # Workers on the CPU share its cores: each taking all of them (torch's default) would thrash.
            self._cpu_threads = max(1, (os.cpu_count() or 1) // cpus) if cpus else None
            # Each worker builds the first images' rectangles at its load, as `LocalLabeler` does (a worker started
            # again too): not at its first batch, inside the labeling.
            self._spec = (model, batch, options, {**engine_options, "first_images": list(first_images[:FIRST_IMAGES])})
            self.workers = [self._spawn(slot, device) for slot, device in enumerate(devices)]
            self.facts = self._wait_ready()
        except BaseException:
            self._shutdown(graceful=False)
            raise

    def _start_state(self, batch: int) -> None:
        """What the parent keeps, before any worker starts; `batch`: images a worker runs at once (chunks are a few
        batches)."""
        self.batch = batch
        self.workers = []
        self.deaths: list[str] = []  # "cuda:1: killed by SIGKILL", one a worker that died while labeling
        self.given_up: list[str] = []  # devices no longer started again, and why
        self.reruns = 0  # chunks put back in the queue after their worker died
        self.died_twice = 0  # images sent to the error log because two workers died on their chunk
        self._restarts: Counter[int] = Counter()  # by slot
        self.counts: Counter[str] = Counter()  # what the workers counted and sent ("counts" messages)
        self._queue: deque[_Chunk] = deque()
        self._pending: set[str] = set()  # paths of the current call not yet delivered
        self._on_record: Callable[[dict], None] | None = None
        self._on_error: Callable[[str, str], None] | None = None
        self._closed = False
        self._tmp: Path | None = None
        self._context = get_context("spawn")

    # -- the interface -----------------------------------------------------------------------------------------

    def __call__(
        self, paths: list[str], on_record: Callable[[dict], None], on_error: Callable[[str, str], None]
    ) -> None:
        if self._closed:
            raise EngineConfigError("the labeler's workers are stopped (closed, or a call failed)")
        todo = list(dict.fromkeys(paths))  # a path named twice is labeled once
        size = max(1, min(CHUNK_BATCHES * self.batch, math.ceil(len(todo) / (2 * len(self.workers)))))
        self._queue = deque(_Chunk(todo[i : i + size]) for i in range(0, len(todo), size))
        self._pending = set(todo)
        for worker in self.workers:
            worker.held.clear()  # every chunk of a call before was delivered
        self._on_record, self._on_error = on_record, on_error
        try:
            self._hand_out()
            while self._pending:
                self._turn()
        except BaseException:  # Ctrl-C, a callback's error (a full disk), every worker dead: nothing runs on
            self._shutdown(graceful=False)
            raise
        finally:
            self._on_record = self._on_error = None

    def close(self) -> None:
        self._shutdown(graceful=True)

    def notes(self) -> list[str]:
        """Lines for the run's summary: workers that died, what was labeled again, devices given up."""
        started = [w.device for w in sorted(self.workers, key=lambda w: w.slot)]
        notes = [f"labeled by {len(started)} worker processes: {', '.join(started)}"] if started else []
        if self.deaths:
            deaths = "; ".join(why if n == 1 else f"{why} ({n} times)" for why, n in Counter(self.deaths).items())
            notes.append(
                f"worker deaths: {len(self.deaths)} ({deaths}); chunks they held, re-run on the other "
                f"workers or those started again: {self.reruns}"
            )
        if self.died_twice:
            notes.append(f"{self.died_twice} images went to the error log: two workers died on their chunk")
        if self.given_up:
            notes.append(f"devices given up: {'; '.join(self.given_up)}")
        return notes

    # -- starting and stopping ---------------------------------------------------------------------------------

    def _shared_model(self, model: str) -> str:
        """A model every worker loads as it is: `model` if it is a model directory or a checkpoint (exported into
        the cache here first, so that the workers do not race to write it), else an architecture YAML exported
        here once, so that the workers share one set of its random weights."""
        from yolojet.ir import GRAPH_FILE

        path = Path(str(model).rstrip("/"))
        if (path / GRAPH_FILE).is_file():
            return str(model)
        if path.suffix.lower() in (".yaml", ".yml"):
            import yolojet

            self._tmp = Path(tempfile.mkdtemp(prefix="yolojet-label-"))
            # Named after the YAML, so the records name the model as a run in one process does; 640 as Engine.load.
            return str(yolojet.export(str(model), out=self._tmp / path.stem, imgsz=640))
        from yolojet.engine.models import resolve_graph

        resolve_graph(model)
        return str(model)

    def _spawn(self, slot: int, device: str) -> _Worker:
        ours, theirs = self._context.Pipe()
        threads = self._cpu_threads if device == "cpu" else None
        process = self._context.Process(
            target=_worker_main,
            args=(theirs, device, *self._spec, threads),
            name=f"yolojet-label-worker-{device}",
            daemon=True,
        )
        process.start()
        theirs.close()  # the child holds its end: ours reads the end of the pipe when the child dies
        return _Worker(slot, device, process, ours)

    def _wait_ready(self) -> ModelFacts:
        """Every worker's engine loaded (the facts of the first), or the first failure raised naming its device."""
        facts: list[ModelFacts] = []
        starting = list(self.workers)
        while starting:
            ready = wait([w.connection for w in starting] + [w.process.sentinel for w in starting])
            for worker in [w for w in starting if w.connection in ready or w.process.sentinel in ready]:
                try:
                    message = worker.connection.recv()
                except (EOFError, OSError):
                    worker.process.join()
                    raise EngineConfigError(
                        f"the worker on {worker.device} exited while loading the model "
                        f"({_exit_reason(worker.process.exitcode, '')})"
                    ) from None
                if message[0] == "failed":
                    raise _start_error(worker.device, message[1], message[2])
                worker.ready = True
                facts.append(message[1])
                starting.remove(worker)
        return facts[0]

    def _shutdown(self, graceful: bool) -> None:
        """Stop every worker: told to (graceful: they finish their batch), terminated where they do not in time."""
        if self._closed:
            return
        self._closed = True
        if graceful:
            for worker in self.workers:
                if not worker.ready:  # one started again and still loading: nothing of it to finish
                    worker.process.terminate()
                    continue
                try:
                    worker.connection.send(("stop",))
                except (OSError, ValueError):
                    pass
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for worker in self.workers:
                worker.process.join(max(0.0, deadline - time.monotonic()))
        for worker in self.workers:
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join(5.0)
            if worker.process.is_alive():
                worker.process.kill()
            worker.process.join()
            worker.connection.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    # -- handing out and taking in -----------------------------------------------------------------------------

    def _turn(self) -> None:
        """Wait for messages or a death, and handle them."""
        workers = list(self.workers)
        ready = wait([w.connection for w in workers] + [w.process.sentinel for w in workers])
        for worker in workers:
            died = worker.process.sentinel in ready
            if worker.connection in ready or died:
                ended = self._read(worker, MESSAGES_A_TURN if not died else None)
                if ended or died:
                    self._buried(worker)

    def _read(self, worker: _Worker, most: int | None) -> bool:
        """Handle up to `most` messages of the worker's that are there (all until the pipe ends: None); True when
        its pipe ended. A worker killed in the middle of sending leaves half a message: the end, too."""
        count = 0
        while most is None or count < most:
            try:
                if most is not None and not worker.connection.poll():
                    return False
                message = worker.connection.recv()
            except (EOFError, OSError):
                return True
            self._handle(worker, message)
            count += 1
        return False

    def _handle(self, worker: _Worker, message: tuple) -> None:
        kind = message[0]
        if kind == "want":
            self._answer(worker, fresh=message[1])
        elif kind == "results":
            for outcome in message[1]:
                self._outcome(outcome)
        elif kind in ("record", "error"):  # a worker that sends one an image (stream_workers.py)
            self._outcome(message)
        elif kind == "counts":  # what the worker counted since its last counts (refusals, reconnects: by name)
            self.counts.update(message[1])
        elif kind == "ready":  # a worker started again
            worker.ready = True
        elif kind in ("failed", "crashed"):
            worker.last_words = message[-1]

    def _outcome(self, outcome: tuple[str, str, Any]) -> None:
        kind, path, payload = outcome
        if self._deliver(path):
            assert self._on_record is not None and self._on_error is not None
            if kind == "record":
                self._on_record(payload)
            else:
                self._on_error(path, payload)

    def _deliver(self, path: str) -> bool:
        """True the first time a path of this call is delivered."""
        if path not in self._pending:
            return False
        self._pending.discard(path)
        return True

    def _answer(self, worker: _Worker, fresh: bool) -> None:
        while worker.held and not any(p in self._pending for p in worker.held[0].paths):
            worker.held.popleft()  # done
        worker.waiting = False
        if self._queue:
            chunk = self._queue.popleft()
            worker.held.append(chunk)  # before sending: a worker that dies now still gives it back
            self._send(worker, ("chunk", chunk.paths))
        elif fresh:
            worker.waiting = True
        else:
            self._send(worker, ("end",))

    def _hand_out(self) -> None:
        for worker in self.workers:
            if worker.waiting and self._queue:
                self._answer(worker, fresh=True)

    def _send(self, worker: _Worker, message: tuple) -> None:
        try:
            worker.connection.send(message)
        except (OSError, ValueError):
            pass  # it died: its sentinel says so next, and what it held goes back to the queue then

    def _buried(self, worker: _Worker) -> None:
        """A worker exited: its chunks back to the queue, a worker started again on its device."""
        self._read(worker, None)  # what it sent before it died counts
        worker.process.join(STOP_TIMEOUT_S)  # its pipe may end a moment before the process does
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join()
        worker.connection.close()
        self.workers.remove(worker)
        why = _exit_reason(worker.process.exitcode, worker.last_words)
        if not worker.ready:  # a worker started again that could not load the model
            self.given_up.append(f"{worker.device} (started again, it failed: {why})")
        else:
            self.deaths.append(f"{worker.device}: {why}")
            self._give_back(worker)
            if self._restarts[worker.slot] < MAX_RESTARTS:
                self._restarts[worker.slot] += 1
                self.workers.append(self._spawn(worker.slot, worker.device))
            else:
                self.given_up.append(f"{worker.device} (died {MAX_RESTARTS + 1} times)")
        if not self.workers and self._pending:
            raise EngineConfigError(
                f"every worker died ({'; '.join(self.deaths + self.given_up)}); "
                f"{len(self._pending)} images were not labeled"
            )
        self._hand_out()

    def _give_back(self, worker: _Worker) -> None:
        held = [c for c in worker.held if any(p in self._pending for p in c.paths)]
        worker.held.clear()
        for i in reversed(range(len(held))):  # put back at the front of the queue, in their order
            chunk = held[i]
            left = [p for p in chunk.paths if p in self._pending]
            # Results come in order, so the oldest chunk with paths left is the one the worker was labeling.
            died_on = [*chunk.died_on, worker.device] if i == 0 else chunk.died_on
            if len(died_on) < 2:
                self._queue.appendleft(_Chunk(left, died_on))
                self.reruns += 1
                continue
            message = _died_twice(died_on)
            for path in left:
                if self._deliver(path):
                    assert self._on_error is not None
                    self._on_error(path, message)
                    self.died_twice += 1


def _died_twice(devices: list[str]) -> str:
    if devices[0] == devices[1]:
        return f"worker on {devices[0]} died twice labeling it"
    return f"workers died twice labeling it (on {devices[0]}, then on {devices[1]})"


def _exit_reason(code: int | None, last_words: str) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    said = f": {last_words}" if last_words else ""
    return f"exit code {code}{said}"


def _start_error(device: str, kind: str, message: str) -> YolojetError:
    """The worker's error as the same typed error where it was one (a missing model, a bad model directory), naming
    the device; an engine's other failures as EngineConfigError."""
    found = getattr(errors, kind, None)
    text = f"the worker on {device} could not load the model: {message}"
    if isinstance(found, type) and issubclass(found, YolojetError):
        try:
            return found(text)
        except TypeError:  # an error class that takes more than a message
            pass
    return EngineConfigError(f"{text} ({kind})" if found is None else text)
