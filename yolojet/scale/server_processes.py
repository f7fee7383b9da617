"""`yolojet serve --processes N`: N whole servers (gRPC front, batcher, engines) in processes of their own, sharing
one port.

One interpreter runs a server's gRPC event loop and its batch dispatching: on an H200 a server stopped near 1,400
images a second at 64 calls in flight, with one engine worker process as with the engine in-process, while the
network alone runs 12,700 a second (bench/NOTES.md). Several processes listen on the same port (SO_REUSEPORT: the
kernel hands each new connection to one of them), each with its own engines on the same device, so the fronts'
Python runs side by side and the GPU interleaves their graphs. The kernel gives each connection to a process picked by
a hash of its addresses, so N connections reach all N processes only now and then (four of four one time in ten):
ListModels says which process answered, and the labeling client opens connections until each of its streams (the
bench mode: each of its connections) reaches a process of its own (client/remote.py, `Connection.reach`).

The first process loads alone, so that it alone tunes what the tuning cache lacks (timing tiles while another
process runs kernels on the same GPU would time them wrong); the others then load from the caches, together. The
first reports the port it bound (`--port 0` picks one), which the others bind too. Each serves its Prometheus metrics
on `--metrics-port` plus its index (with `--metrics-port 0`, each on a free port of its own). SIGTERM or SIGINT stops
them all gracefully (each answers what it accepted). A process that dies is started again; the calls it held fail
with UNAVAILABLE, which clients retry. Each process watches its pipe to the parent: a parent that is gone (killed, not
stopped) stops them too, so no orphan keeps serving the port.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from typing import Any

from yolojet.errors import EngineConfigError
from yolojet.options import apply_switch_interval
from yolojet.scale.mps import MpsDaemon
from yolojet.serve.models import ModelSpec
from yolojet.serve.server import ServeOptions, host_port

log = logging.getLogger("yolojet.serve")
START_TIMEOUT_S = 900.0  # a cold start tunes every model's tiles: minutes on a GPU


class _Stopped(Exception):
    """SIGTERM or SIGINT came while a process was loading."""


def _process_main(connection: Connection, specs: list[ModelSpec], options: ServeOptions) -> None:
    """One of the servers: load, serve, report the port bound, stop on SIGTERM or SIGINT or when the parent is gone."""
    from yolojet.serve.server import build_models, configure_logging, run_server, serve_forever

    apply_switch_interval()
    configure_logging()
    try:
        models = build_models(specs, options)
    except BaseException as e:  # reported to the parent, which says which process failed
        connection.send(("failed", f"{type(e).__name__}: {e}"))
        return

    def started(port: int) -> None:
        connection.send(("ready", port))
        threading.Thread(target=_stop_when_orphaned, args=(connection,), daemon=True).start()

    try:
        run_server(serve_forever(models, options, started=started), options.event_loop)
    except EngineConfigError as e:  # the port could not be bound
        connection.send(("failed", str(e)))


def _stop_when_orphaned(connection: Connection) -> None:
    """The parent never writes after the start: the pipe's end means it is gone, and this server stops gracefully."""
    try:
        connection.recv()
    except (EOFError, OSError):
        pass
    os.kill(os.getpid(), signal.SIGTERM)


class ServerProcesses:
    """The N server processes: `start()` returns once all of them listen, `run()` serves until a signal."""

    def __init__(self, specs: list[ModelSpec], options: ServeOptions, processes: int) -> None:
        if processes < 1:
            raise EngineConfigError(f"--processes {processes}: at least one")
        self.specs, self.count = specs, processes
        self.options = replace(options, reuse_port=True, processes=processes)
        self._context = multiprocessing.get_context("spawn")  # CUDA does not survive a fork
        self.processes: list[Any] = [None] * processes
        self.pipes: list[Connection | None] = [None] * processes  # kept open: a child sees the parent go by its end
        self.restarts = 0
        self.port = options.port
        self._stopping = False

    def _options_of(self, index: int) -> ServeOptions:
        metrics = self.options.metrics_port
        if metrics:  # 0 (a free port) stays 0 for each
            metrics += index
        return replace(self.options, port=self.port, metrics_port=metrics, process_index=index)

    def _spawn(self, index: int) -> Connection:
        ours, theirs = self._context.Pipe()
        process = self._context.Process(
            target=_process_main,
            args=(theirs, self.specs, self._options_of(index)),
            name=f"yolojet-serve-{index}",
            daemon=True,
        )
        process.start()
        theirs.close()  # ours sees the end of the pipe if the child dies before it reports
        old = self.pipes[index]
        if old is not None:
            old.close()
        self.processes[index], self.pipes[index] = process, ours
        return ours

    def _ready(self, index: int, connection: Connection) -> int:
        """The port the process listens on, once it reports; in one-second waits, so that a signal ends the wait."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not connection.poll(1.0):
            if self._stopping:
                raise _Stopped
            if time.monotonic() > deadline:
                raise EngineConfigError(f"server process {index} did not load its models in {START_TIMEOUT_S:.0f} s")
        try:
            kind, body = connection.recv()
        except EOFError:
            code = self.processes[index].exitcode
            raise EngineConfigError(f"server process {index} exited while loading (exit code {code})") from None
        if kind == "failed":
            raise EngineConfigError(f"server process {index}: {body}")
        return int(body)

    def start(self) -> None:
        """Start every process; returns once all listen (raises _Stopped on SIGTERM or SIGINT meanwhile)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._request_stop())
        try:
            self.port = self._ready(0, self._spawn(0))  # alone: it tunes; its port is everyone's
            pending = [(i, self._spawn(i)) for i in range(1, self.count)]
            for index, connection in pending:
                self._ready(index, connection)
        except BaseException:
            self.stop()
            raise

    def run(self) -> None:
        """Serve until SIGTERM or SIGINT; a process that dies is started again."""
        try:
            while not self._stopping:
                sentinels = {p.sentinel: i for i, p in enumerate(self.processes) if p is not None}
                for sentinel in wait(list(sentinels), timeout=1.0):
                    index = sentinels[sentinel]  # type: ignore[index]
                    if self._stopping:
                        break
                    code = self.processes[index].exitcode
                    log.error(json.dumps({"event": "server process died", "index": index, "exit_code": code}))
                    self._restart(index)
        finally:
            self.stop()

    def _restart(self, index: int) -> None:
        while not self._stopping:
            try:
                self._ready(index, self._spawn(index))
                self.restarts += 1
                log.info(json.dumps({"event": "server process restarted", "index": index}))
                return
            except _Stopped:
                return
            except EngineConfigError as e:
                log.error(json.dumps({"event": "server process restart failed", "index": index, "error": str(e)}))
                time.sleep(5.0)

    def _request_stop(self) -> None:
        self._stopping = True

    def stop(self) -> None:
        """SIGTERM to every process (each serves on for --drain-delay-s, then answers what it accepted, up to
        --grace-s), then wait for them."""
        self._stopping = True
        for process in self.processes:
            if process is not None and process.is_alive():
                process.terminate()
        deadline = time.monotonic() + self.options.drain_delay_s + self.options.grace_s + 30
        for process in self.processes:
            if process is not None:
                process.join(max(0.0, deadline - time.monotonic()))
                if process.is_alive():
                    process.kill()
                    process.join()
        for pipe in self.pipes:
            if pipe is not None:
                pipe.close()


def serve_processes(specs: list[ModelSpec], options: ServeOptions, processes: int) -> None:
    """Serve until SIGTERM or SIGINT; with `options.mps`, the processes as clients of an MPS daemon of their own (it
    quits once they have stopped)."""
    on_cpu = options.device is not None and not options.device.startswith("cuda")
    if options.mps == "on" and on_cpu:
        raise EngineConfigError(f"--mps shares a GPU between the server's processes; --device {options.device} is none")
    with MpsDaemon("off" if on_cpu else options.mps) as mps:
        servers = ServerProcesses(specs, options, processes)
        try:
            servers.start()
        except _Stopped:  # stopped while loading: every process is stopped already
            return
        sharing = ", sharing the GPU through MPS" if mps.running else ""
        print(
            f"yolojet serve: listening on {host_port(options.host, servers.port)} ({processes} processes{sharing})",
            file=sys.stderr,
            flush=True,
        )
        servers.run()
