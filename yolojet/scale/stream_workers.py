"""`yolojet label --server --streams N`: N client processes, each one stream to the server on a connection of its own.

One client process reads the files, builds the requests and turns the replies into records for about 2,000 images a
second (H200 host, 137 KB JPEGs: `label --server` measured 2,002-2,264 img/s whether the server was one process or
four); threads in one interpreter share that. `StreamWorkersLabeler` is `MultiDeviceLabeler` (scale/local_workers.py)
with a `RemoteLabeler` in each worker instead of an engine: the same chunks asked for as each stream wants more
images, the same records and errors delivered once in this process, the same restart of a worker that dies. Against
a server of several processes (`serve --processes`), stream i goes to process i modulo their number (the kernel
gives a connection to one at random: four streams left to it reach all four processes one time in ten). Each worker
sends its refusals, reconnects and streams that missed their process as "counts" after every stream.
"""

from __future__ import annotations

import signal
import threading
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from yolojet.client.label import ModelFacts
from yolojet.errors import EngineConfigError
from yolojet.options import apply_switch_interval
from yolojet.scale.local_workers import MultiDeviceLabeler, _Worker, chunked_paths


def _stream_worker_main(
    connection: Connection, server: dict[str, Any], window: int, options: dict[str, Any], process: int
) -> None:
    """A worker: a `RemoteLabeler` of `window` requests in flight to `server` (`Connection`'s fields), its stream on
    the server's process `process` where it runs several, then one stream over the chunks the parent hands out until
    it says stop."""
    apply_switch_interval()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    sending = threading.Lock()  # the stream's request thread asks for chunks while the reply loop sends records

    def send(message: tuple) -> None:
        with sending:
            connection.send(message)

    try:
        from yolojet.client import records
        from yolojet.client.remote import Connection as ServerConnection
        from yolojet.client.remote import RemoteLabeler, model_facts

        server_connection = ServerConnection(**server)
        facts = model_facts(server_connection)
        remote = RemoteLabeler(server_connection, window, options, process)
    except BaseException as e:
        send(("failed", type(e).__name__, str(e)))
        return
    try:
        send(("ready", facts))
        sent = {"refusals": 0, "reconnects": 0, "missed_process": 0}
        while True:
            told: list[str] = []
            remote.run(
                chunked_paths(connection, send, told),
                lambda path, reply: send(("record", path, records.from_reply(path, reply))),
                lambda path, message: send(("error", path, message)),
            )
            now = {
                "refusals": remote.refusals,
                "reconnects": remote.reconnects,
                "missed_process": remote.missed_process,
            }
            send(("counts", {k: now[k] - sent[k] for k in now}))
            sent = now
            if told != ["end"]:
                return
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the parent is gone
    except BaseException as e:
        try:
            send(("crashed", f"{type(e).__name__}: {e}"))
        except OSError:
            pass
        raise


class StreamWorkersLabeler(MultiDeviceLabeler):
    """A labeler (`facts`, `__call__(paths, on_record, on_error)`, `close()`, `notes()`) over `streams` worker
    processes, each one stream to the server `server` (`yolojet.client.remote.Connection`'s fields) with its share of
    `window` requests in flight. Spawned, as `MultiDeviceLabeler`'s workers are. Stream i goes to the server's
    process i (modulo their number) where the server is several (`serve --processes`), so that the streams load them
    evenly."""

    def __init__(self, server: dict[str, Any], window: int, options: dict[str, Any], streams: int) -> None:
        if streams < 2 or streams > window:
            raise EngineConfigError(f"--streams {streams}: between 2 and the requests in flight (-c {window})")
        self._windows = [window // streams + (i < window % streams) for i in range(streams)]
        self._start_state(self._windows[0])  # a chunk is a few windows of one stream
        self._server, self._options = server, options
        try:
            self.workers = [self._spawn(slot, f"stream {slot}") for slot in range(streams)]
            self.facts: ModelFacts = self._wait_ready()
        except BaseException:
            self._shutdown(graceful=False)
            raise

    def _spawn(self, slot: int, device: str) -> _Worker:
        ours, theirs = self._context.Pipe()
        process: BaseProcess = self._context.Process(
            target=_stream_worker_main,
            args=(theirs, self._server, self._windows[slot], self._options, slot),
            name=f"yolojet-label-{device.replace(' ', '-')}",
            daemon=True,
        )
        process.start()
        theirs.close()
        return _Worker(slot, device, process, ours)
