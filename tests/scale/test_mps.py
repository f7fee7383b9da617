"""`yolojet serve --processes N --mps`: the servers as clients of an MPS daemon of their own, which quits when they
stop and when their parent is killed; clear refusals where it cannot run.

On a GPU machine the real nvidia-cuda-mps-control runs (the gpu test). Without one, a stand-in program of the same
name takes its place on PATH for the daemon's lifetime logic: it answers the commands the server and its guardian
send (`-d`, get_server_list, get_client_list, quit) as the daemon's protocol does and writes down each."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from support import calibrated_model, run_cli
from test_server_processes import BUS, CONF, rows, server_children, wait_for

import yolojet
from yolojet.engine.engine import Engine
from yolojet.errors import EngineConfigError
from yolojet.scale import mps
from yolojet.scale.devices import cuda_driver
from yolojet.scale.mps import CONTROL, MpsDaemon
from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb
from yolojet.serve.proto.yolojet.v1 import inference_pb2_grpc as pb_grpc

STAND_IN = textwrap.dedent(
    """\
    #!{python}
    import os, pathlib, sys
    pipes = pathlib.Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"])
    said = pathlib.Path({log!r})
    client = pathlib.Path({client!r})
    command = "-d" if sys.argv[1:] == ["-d"] else sys.stdin.read().strip()
    connected = client.exists()  # before the command is written down: it answers what was there when asked
    with said.open("a") as f:
        f.write(f"{{command}} {{pipes}}\\n")
    if command == "-d":
        (pipes / "control").touch()
    elif command == "get_server_list" and connected:
        print(4242)
    elif command.startswith("get_client_list") and connected:
        print(4343)
    elif command == "quit":
        (pipes / "control").unlink()
    """
)


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """A stand-in nvidia-cuda-mps-control first on PATH; returns (its log of commands, the file whose presence makes
    it report a connected client)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    log, client = tmp_path / "commands.log", tmp_path / "client"
    program = folder / CONTROL
    program.write_text(STAND_IN.format(python=sys.executable, log=str(log), client=str(client)))
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.delenv("CUDA_MPS_LOG_DIRECTORY", raising=False)
    return log, client


def commands(log: Path) -> list[str]:
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def wait_until(check, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_daemon_serves_processes_started_inside_and_quits_after_its_clients_leave(stand_in, tmp_path):
    log, client = stand_in
    with MpsDaemon("on", probe=False) as daemon:
        assert daemon.running and daemon.folder is not None
        pipes = daemon.folder / "pipe"
        seen = subprocess.run(
            [sys.executable, "-c", "import os; print(os.environ['CUDA_MPS_PIPE_DIRECTORY'])"],
            capture_output=True,
            text=True,
        )
        assert seen.stdout.strip() == str(pipes)  # a process started inside is the daemon's client
        assert commands(log) == ["-d"]
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ and not daemon.folder.exists()
    assert commands(log)[-1] == "quit" and "get_server_list" in commands(log)

    # A client still connected (a killed server's processes stopping by themselves): the guardian waits for it.
    client.touch()
    daemon = MpsDaemon("on", probe=False)
    daemon.__enter__()

    def leave_once_asked() -> None:  # the client leaves only after the guardian has found it there
        assert wait_until(lambda: "get_client_list" in commands(log), 60)
        client.unlink()

    leaving = threading.Thread(target=leave_once_asked)
    leaving.start()
    daemon.stop()
    leaving.join()
    said = commands(log)
    second = said[len(said) - 1 - said[::-1].index("-d") :]
    # Asked, found the client, asked again once it had left, then quit.
    assert second == ["-d", "get_server_list", "get_client_list", "get_server_list", "quit"], said
    assert not daemon.folder.exists()  # type: ignore[union-attr]


def test_a_killed_parent_leaves_no_daemon(stand_in, tmp_path):
    log, _ = stand_in
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from yolojet.scale.mps import MpsDaemon\n"
            "daemon = MpsDaemon('on', probe=False).__enter__(); print(daemon.folder, flush=True); time.sleep(300)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    folder = Path(parent.stdout.readline().strip())
    assert (folder / "pipe" / "control").exists()
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert wait_until(lambda: not folder.exists()), commands(log)
    assert commands(log)[-1] == "quit"


def test_mps_refusals_name_what_is_missing(capsys, tmp_path, monkeypatch):
    model = str(tmp_path / "m")
    code, _, stderr = run_cli(capsys, "serve", "--model", model, "--mps", "on")
    assert code == 2 and "--processes N" in stderr, stderr
    code, _, stderr = run_cli(capsys, "serve", "--model", model, "--processes", "2", "--mps", "on", "--device", "cpu")
    assert code == 2 and "--device cpu is none" in stderr, stderr
    code, _, stderr = run_cli(capsys, "serve", "--model", model, "--processes", "2", "--mps", "sometimes")
    assert code == 2 and "--mps" in stderr, stderr

    source = str(tmp_path)
    for extra in ([], ["--workers", "2", "--device", "cpu"]):
        code, _, stderr = run_cli(
            capsys,
            "label",
            source,
            "--out",
            str(tmp_path / "o.jsonl"),
            "--local",
            "--model",
            model,
            "--mps",
            "on",
            *extra,
        )
        assert code == 2 and "--mps on shares a GPU between labeling processes" in stderr, stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    machine = tmp_path / "machine"  # the folder a machine-wide daemon would use, here none
    monkeypatch.setattr(mps, "DEFAULT_PIPES", machine)
    with pytest.raises(EngineConfigError, match=f"{CONTROL} is not on PATH"):
        MpsDaemon("on", probe=False).__enter__()
    with MpsDaemon("auto") as daemon:  # auto: said, and the servers run without
        assert not daemon.running and CONTROL in daemon.why
    machine.mkdir()
    (machine / "control").touch()
    with MpsDaemon("on", probe=False) as daemon:  # the machine runs a daemon: its clients, none started
        assert not daemon.running and str(machine) in daemon.why
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "theirs"))
    with MpsDaemon("on", probe=False) as daemon:  # the environment names a daemon already: its clients, none started
        assert not daemon.running and str(tmp_path / "theirs") in daemon.why


@pytest.mark.skipif(cuda_driver() is not None, reason="a CUDA driver here: the stand-in's clients run without it")
def test_a_daemon_its_clients_cannot_use_is_quit_and_said(stand_in):
    log, _ = stand_in
    with pytest.raises(EngineConfigError, match="a CUDA context through it failed: no CUDA driver"):
        MpsDaemon("on").__enter__()
    assert commands(log)[0] == "-d" and commands(log)[-1] == "quit"
    with MpsDaemon("auto") as daemon:  # auto: said, the daemon quit, and the servers run without
        assert not daemon.running and "CUDA context" in daemon.why
        assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert commands(log).count("quit") == 2


def processes_with(environ_has: bytes, name_prefix: str = "") -> list[int]:
    """Processes whose name begins with `name_prefix` and whose environment holds the bytes `environ_has`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.joinpath("comm").read_text().startswith(name_prefix)
                and environ_has in (entry / "environ").read_bytes() + b"\0"
            ):
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def mps_processes(pipes: Path) -> list[int]:
    """The daemon, its MPS server and its clients: their environment names its pipe folder."""
    return processes_with(f"CUDA_MPS_PIPE_DIRECTORY={pipes}\0".encode())


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which(CONTROL) is None, reason=f"needs {CONTROL}")
def test_two_servers_share_the_gpu_through_a_daemon_of_their_own(tmp_path):
    model_dir = yolojet.export(calibrated_model("yolo11n.yaml", 64), out=tmp_path / "m", imgsz=64)
    with Engine.load(model_dir, device="cuda", max_batch=2) as engine:
        want = engine([BUS], conf=CONF)[0].boxes.data
    command = [sys.executable, "-m", "yolojet", "serve", "--model", f"{model_dir}:2", "--port", "0"]
    command += ["--processes", "2", "--mps", "on", "--slo-ms", "120000"]
    log = tmp_path / "serve.log"
    server = subprocess.Popen(command, stderr=log.open("w"), stdout=subprocess.DEVNULL)
    try:
        port = wait_for(log, r"listening on 127\.0\.0\.1:(\d+) \(2 processes, sharing the GPU through MPS\)", server)[1]
        pipes = Path(wait_for(log, r'"pipes": "([^"]+)"', server)[1])
        for _ in range(4):
            with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as c:
                reply = pb_grpc.InferenceStub(c).Infer(pb.InferRequest(image=BUS, conf=CONF), timeout=120)
            np.testing.assert_allclose(rows(reply), want, rtol=1e-3, atol=0.5)
        children = server_children(server.pid)
        assert len(children) == 2 and set(children) <= set(mps_processes(pipes))
        control_log = (pipes.parent / "log" / "control.log").read_text()
        assert control_log.count("NEW CLIENT") >= 2, control_log
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=120) == 0
        assert wait_until(lambda: not mps_processes(pipes) and not pipes.exists(), 60), mps_processes(pipes)

        # Killed outright: the servers stop by themselves, then the guardian quits the daemon.
        killed_log = tmp_path / "killed.log"
        orphaned = subprocess.Popen(command, stderr=killed_log.open("w"), stdout=subprocess.DEVNULL)
        wait_for(killed_log, r"sharing the GPU through MPS", orphaned)
        pipes = Path(wait_for(killed_log, r'"pipes": "([^"]+)"', orphaned)[1])
        orphaned.kill()
        orphaned.wait()
        assert wait_until(lambda: not mps_processes(pipes) and not pipes.exists(), 150), mps_processes(pipes)

        # Two labeling processes on the GPU: every image once, through a daemon that is gone afterwards.
        photos = tmp_path / "photos"
        photos.mkdir()
        for i in range(6):
            (photos / f"{i}.jpg").write_bytes(BUS)
        out = tmp_path / "labels.jsonl"
        command = [sys.executable, "-m", "yolojet", "label", str(photos), "--local", "--model", str(model_dir)]
        command += ["--workers", "2", "--mps", "on", "--out", str(out), "--quiet"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and "through an MPS daemon of their own" in done.stderr, done.stderr
        assert len(out.read_text().splitlines()) == 6
        # No MPS program of yolojet's left (any test's: their folders are all named so).
        assert wait_until(lambda: not processes_with(b"/yolojet-mps-", "nvidia-cuda-mps"), 30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
