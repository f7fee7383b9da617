"""An MPS control daemon of a command's own: the servers of `yolojet serve --processes N`, the workers of `yolojet
label --local --workers N` sharing a GPU (`--mps auto`, the default).

Each process holds a CUDA context of its own, and a GPU runs one context's kernels at a time, taking turns between
them. As clients of one MPS (Multi-Process Service) server, the processes' kernels share one context and run side by
side. Four servers on an H100, with and without it in turns (bench/NOTES.md, "four servers as clients of one MPS
daemon"): Infer at 64 calls in flight +18-30 %, the p50 at 8 in flight -22-30 %; four labeling workers +10 %.

The daemon is the command's alone: its pipe and log folders are in a temporary folder, which the processes are told of
by CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY in their environment; no other process sees it and no setting of
the GPU changes. A guardian process (this module run as a script) holds a pipe from the command and tells the daemon
to quit once that pipe ends: when the command stops, and also when it is killed, so no daemon outlives it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from yolojet.errors import EngineConfigError
from yolojet.options import MPS_CHOICES, mps_directories
from yolojet.scale.devices import cuda_driver

log = logging.getLogger("yolojet.serve")
CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPES = Path("/tmp/nvidia-mps")  # where CUDA looks for a machine-wide daemon when no folder is named
QUIT_TIMEOUT_S = 60.0
# A killed server's processes stop gracefully by themselves (up to --grace-s, 30 s by default), MPS clients meanwhile.
CLIENTS_WAIT_S = 90.0
START_TIMEOUT_S = 30.0


def running_daemon() -> str | None:
    """The pipe folder of an MPS daemon the server's processes would already be clients of, or None."""
    named = mps_directories()["CUDA_MPS_PIPE_DIRECTORY"]
    if named:
        return named
    return str(DEFAULT_PIPES) if (DEFAULT_PIPES / "control").exists() else None


class MpsDaemon:
    """`with MpsDaemon(choice) as daemon:` processes started inside are its clients where `daemon.running`.

    `choice` "on": a daemon or an EngineConfigError saying why none; "auto": a daemon where one can be started, else
    the reason logged and the processes run as they would without; "off": nothing. Where the environment already names
    an MPS daemon (or the machine runs one), the processes are its clients and none is started."""

    def __init__(self, choice: str, control: str | None = None, probe: bool = True) -> None:
        if choice not in MPS_CHOICES:
            raise EngineConfigError(f"--mps {choice!r}: expected one of {', '.join(MPS_CHOICES)}")
        self.choice = choice
        self.control = control if control is not None else shutil.which(CONTROL)
        self.probe = probe  # a CUDA context made through the daemon before it is used (tests without a GPU: off)
        self.folder: Path | None = None
        self.guardian: subprocess.Popen[bytes] | None = None
        self.running = False
        self.why = "--mps off"
        self._kept: dict[str, str | None] = {}

    def __enter__(self) -> MpsDaemon:
        if self.choice == "off":
            return self
        elsewhere = running_daemon()
        if elsewhere is not None:
            self.why = f"the processes are clients of the MPS daemon at {elsewhere}; none started"
            log.info(json.dumps({"event": "mps", "daemon": "already running", "pipes": str(elsewhere)}))
            return self
        try:
            self._start()
        except EngineConfigError as e:
            if self.choice == "on":
                raise
            self.why = str(e)
            log.info(json.dumps({"event": "mps", "daemon": "not started", "why": str(e)}))
        return self

    def _start(self) -> None:
        if self.control is None:
            raise EngineConfigError(
                f"--mps: {CONTROL} is not on PATH (it comes with NVIDIA's driver utilities); "
                "without it the processes take turns on the GPU"
            )
        self.folder = Path(tempfile.mkdtemp(prefix="yolojet-mps-"))
        pipes, logs = self.folder / "pipe", self.folder / "log"
        pipes.mkdir()
        logs.mkdir()
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipes), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
        try:
            started = subprocess.run(
                [self.control, "-d"], env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise EngineConfigError(f"--mps: {CONTROL} -d could not be run: {e}") from None
        if started.returncode != 0 or not _wait_for(pipes / "control", START_TIMEOUT_S):
            shutil.rmtree(self.folder, ignore_errors=True)
            said = (started.stderr or started.stdout).strip()[-300:]
            raise EngineConfigError(f"--mps: {CONTROL} -d exited with {started.returncode}, no daemon: {said}")
        # The guardian outlives a killed server: a session of its own, so a terminal's Ctrl-C reaches only the server.
        self.guardian = subprocess.Popen(
            [sys.executable, "-m", "yolojet.scale.mps", "guard", self.control, str(self.folder)],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )
        if self.probe:
            # A daemon can start where its clients cannot connect (a container without the rights MPS needs, a GPU
            # in a compute mode that refuses it): known here, before every server fails to load.
            try:
                made = subprocess.run(
                    [sys.executable, "-m", "yolojet.scale.mps", "probe"],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=START_TIMEOUT_S,
                )
                failed = made.stderr.strip()[-300:] if made.returncode else ""
            except subprocess.TimeoutExpired:
                failed = f"no CUDA context within {START_TIMEOUT_S:g} s"
            if failed:
                self.stop()
                raise EngineConfigError(f"--mps: the MPS daemon started; a CUDA context through it failed: {failed}")
        self._kept = mps_directories()
        # Inherited by every process started from here on.
        os.environ.update(CUDA_MPS_PIPE_DIRECTORY=str(pipes), CUDA_MPS_LOG_DIRECTORY=str(logs))
        self.running = True
        self.why = f"an MPS daemon of these processes' own ({pipes})"
        log.info(json.dumps({"event": "mps", "daemon": "started", "pipes": str(pipes)}))

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Tell the daemon to quit (through its guardian) and wait for it; the environment as it was before."""
        for key, value in self._kept.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ.update({key: value})
        self._kept = {}
        if self.guardian is not None:
            assert self.guardian.stdin is not None
            self.guardian.stdin.close()  # the pipe's end: the guardian quits the daemon
            try:
                self.guardian.wait(timeout=QUIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.error(json.dumps({"event": "mps", "daemon": "did not quit", "folder": str(self.folder)}))
            self.guardian = None
        self.running = False


def _wait_for(path: Path, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _ask(control: str, env: dict[str, str], command: str) -> list[str]:
    """The process ids in the daemon's answer to one command (none where it cannot be asked)."""
    try:
        said = subprocess.run([control], input=command + "\n", env=env, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [word for word in said.stdout.split() if word.isdigit()]


def _has_clients(control: str, env: dict[str, str]) -> bool:
    return any(_ask(control, env, f"get_client_list {server}") for server in _ask(control, env, "get_server_list"))


def guard(control: str, folder: Path, clients_wait_s: float = CLIENTS_WAIT_S) -> None:
    """Wait for the end of standard input (the server stopping, or killed), then for the daemon's clients to leave (a
    killed server's processes stop by themselves, answering what they accepted), then quit the daemon and remove its
    folder."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's stop, not a signal, ends the daemon
    while sys.stdin.buffer.read(4096):
        pass
    env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(folder / "log"),
    }
    try:
        deadline = time.monotonic() + clients_wait_s
        while time.monotonic() < deadline and _has_clients(control, env):
            time.sleep(0.5)
        _ask(control, env, "quit")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def probe() -> str:
    """Make the first GPU's primary CUDA context (through the MPS daemon the environment names): "" where that works,
    else the driver's error."""
    import ctypes

    cuda = cuda_driver()
    if cuda is None:
        return "no CUDA driver (libcuda.so.1)"
    device, context = ctypes.c_int(), ctypes.c_void_p()
    steps = (
        ("cuInit", lambda: cuda.cuInit(0)),
        ("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(device), 0)),
        ("cuDevicePrimaryCtxRetain", lambda: cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)),
    )
    for name, step in steps:
        code = step()
        if code:
            said = ctypes.c_char_p()
            cuda.cuGetErrorName(code, ctypes.byref(said))
            return f"{name}: {(said.value or b'error').decode()} ({code})"
    cuda.cuDevicePrimaryCtxRelease(device)
    return ""


if __name__ == "__main__":
    if sys.argv[1] == "guard":
        guard(sys.argv[2], Path(sys.argv[3]))
    else:
        failed = probe()
        print(failed, file=sys.stderr)
        sys.exit(1 if failed else 0)
