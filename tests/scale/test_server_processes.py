"""`yolojet serve --processes 2` as a user runs it: two whole servers share one port, connections reach both (their
metrics say so), each answers as the engine in this process does, `yolojet label --streams 4` labels every image once
through them, one killed is started again, SIGTERM stops them all, and a parent killed outright leaves no orphan."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
from support import calibrated_model, run_cli
from ultralytics.utils import ASSETS

import yolojet
from yolojet.client.remote import Connection, bench
from yolojet.engine.engine import Engine
from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb
from yolojet.serve.proto.yolojet.v1 import inference_pb2_grpc as pb_grpc

BUS = (ASSETS / "bus.jpg").read_bytes()
CONF = 0.001


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(log: Path, pattern: str, process: subprocess.Popen, seconds: float = 300) -> re.Match:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text())
        if found:
            return found
        assert process.poll() is None, f"the server exited with {process.returncode}: {log.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"no {pattern!r} in the server's log within {seconds} s: {log.read_text()[-3000:]}")


def answered(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("yolojet_requests_total{"))


def server_children(parent: int) -> list[int]:
    """The parent's server processes (spawned children), not multiprocessing's resource tracker."""
    found = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def rows(reply: pb.InferReply) -> np.ndarray:
    return np.array(
        [[d.box.x1, d.box.y1, d.box.x2, d.box.y2, d.confidence, d.class_id] for d in reply.detections], dtype=np.float32
    ).reshape(-1, 6)


def test_two_server_processes_share_the_port_and_restart_and_stop_together(tmp_path):
    model_dir = yolojet.export(calibrated_model("yolo11n.yaml", 64), out=tmp_path / "m", imgsz=64)
    with Engine.load(model_dir, device="cpu", backend="reference") as engine:
        want = engine([BUS], conf=CONF)[0].boxes.data
    metrics, log = free_port(), tmp_path / "serve.log"
    command = [
        sys.executable,
        "-m",
        "yolojet",
        "serve",
        "--model",
        f"{model_dir}:2",
        "--port",
        "0",
        "--processes",
        "2",
        "--metrics-port",
        str(metrics),
        "--slo-ms",
        "120000",
        "--device",
        "cpu",
    ]
    # Without Triton's interpreter a CPU server runs the reference executor, as the engine above does.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    server = subprocess.Popen(command, stderr=log.open("w"), stdout=subprocess.DEVNULL, env=env)
    try:
        port = wait_for(log, r"listening on 127\.0\.0\.1:(\d+) \(2 processes\)", server)[1]

        def call() -> pb.InferReply:  # a connection of its own each time: the kernel picks a process for it
            with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as c:
                return pb_grpc.InferenceStub(c).Infer(pb.InferRequest(image=BUS, conf=CONF), timeout=120)

        for _ in range(16):
            np.testing.assert_allclose(rows(call()), want, rtol=1e-5, atol=0.02)
        counts = [answered(metrics), answered(metrics + 1)]
        assert sum(counts) == 16 and min(counts) > 0, counts  # both took connections (2 * 2**-16 odds otherwise)

        # ListModels tells clients how many servers share the address and which one answered; a client reaches the
        # one it asks for (the kernel picks one at random for each connection: 2**-6 odds of six right by chance).
        indices = set()
        for wanted in (0, 1, 0, 1, 1, 0):
            channel, listing = Connection(f"127.0.0.1:{port}").reach(wanted)
            with channel:
                again = pb_grpc.InferenceStub(channel).ListModels(pb.ListModelsRequest(), timeout=60)
            assert (listing.processes, listing.process_index, again.process_index) == (2, wanted, wanted)
            indices.add(listing.process_index)
        assert indices == {0, 1}
        # The bench mode's connections too (two processes of two connections: each server gets two).
        before = [answered(metrics), answered(metrics + 1)]
        row = bench(Connection(f"127.0.0.1:{port}"), ASSETS / "bus.jpg", 8, 4, 2, {"conf": CONF}, server_processes=2)
        assert row["codes"] == {"OK": 8}, row
        assert min(answered(metrics) - before[0], answered(metrics + 1) - before[1]) > 0

        # The labeling client over four streams, each a connection of its own, and by default over one a server
        # process: every image once, and the same records as one stream gives.
        photos = tmp_path / "photos"
        photos.mkdir()
        for i in range(12):
            (photos / f"{i:02d}.jpg").write_bytes(BUS)
        outputs = {}
        for streams in (1, 4, None):
            before = [answered(metrics), answered(metrics + 1)]
            out = tmp_path / f"labels-{streams}.jsonl"
            chosen = [] if streams is None else ["--streams", str(streams)]
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "yolojet",
                    "label",
                    str(photos),
                    "--server",
                    f"127.0.0.1:{port}",
                    *chosen,
                    "-c",
                    "8",
                    "--conf",
                    str(CONF),
                    "--out",
                    str(out),
                    "--quiet",
                ],
                capture_output=True,
                text=True,
                env=env,
                timeout=300,
            )
            assert done.returncode == 0, done.stderr
            assert ("2 streams, one a process of the server's" in done.stderr) == (streams is None), done.stderr
            assert "ran on another of the server's processes" not in done.stderr, done.stderr
            if streams is None:  # a stream on each process: both answered
                assert min(answered(metrics) - before[0], answered(metrics + 1) - before[1]) > 0
            records = [json.loads(line) for line in out.read_text().splitlines()]
            assert sorted(Path(r["path"]).name for r in records) == [f"{i:02d}.jpg" for i in range(12)]
            outputs[streams] = {Path(r["path"]).name: r["detections"] for r in records}
        for streams in (4, None):
            assert outputs[1].keys() == outputs[streams].keys()
            for name, detections in outputs[streams].items():
                assert len(detections) == len(outputs[1][name])
        assert answered(metrics) + answered(metrics + 1) == 16 + 8 + 36

        children = server_children(server.pid)
        assert len(children) == 2
        os.kill(children[0], signal.SIGKILL)
        wait_for(log, r'"event": "server process restarted"', server)
        assert len(server_children(server.pid)) == 2
        for _ in range(4):
            np.testing.assert_allclose(rows(call()), want, rtol=1e-5, atol=0.02)

        children = server_children(server.pid)
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=120) == 0
        assert children and all(not Path(f"/proc/{pid}").exists() for pid in children)

        # A parent killed outright leaves no orphan serving the port: each process sees its pipe end and stops.
        orphaned = subprocess.Popen(
            command, stderr=(tmp_path / "killed.log").open("w"), stdout=subprocess.DEVNULL, env=env
        )
        wait_for(tmp_path / "killed.log", r"listening on 127\.0\.0\.1:\d+ \(2 processes\)", orphaned)
        children = server_children(orphaned.pid)
        orphaned.kill()
        orphaned.wait()
        deadline = time.monotonic() + 60
        while any(Path(f"/proc/{pid}").exists() for pid in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(children) == 2 and not any(Path(f"/proc/{pid}").exists() for pid in children)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_processes_go_with_neither_devices_nor_ray_and_streams_only_with_a_server(capsys, tmp_path):
    for extra in (["--devices", "cpu,cpu"], ["--ray"]):
        code, _, stderr = run_cli(capsys, "serve", "--model", str(tmp_path / "m"), "--processes", "2", *extra)
        assert code == 2 and "--processes" in stderr, stderr
    out = str(tmp_path / "out.jsonl")
    refusals = (
        (["--local", "--model", "m"], "give it with --server"),
        (["--server", "127.0.0.1:1", "-c", "2"], "between 1 and the requests in flight"),
    )
    for where, message in refusals:
        code, _, stderr = run_cli(capsys, "label", str(ASSETS / "bus.jpg"), "--out", out, "--streams", "3", *where)
        assert code == 2 and message in stderr, stderr


def test_a_connection_lands_on_the_process_asked_for_modulo_the_servers_or_any_that_does_not_say():
    from yolojet.client.remote import lands_on

    assert lands_on(pb.ListModelsReply(processes=3, process_index=1), 4)
    assert not lands_on(pb.ListModelsReply(processes=3, process_index=0), 4)
    assert lands_on(pb.ListModelsReply(processes=3, process_index=0), None)
    assert lands_on(pb.ListModelsReply(processes=1, process_index=0), 5)
    assert lands_on(pb.ListModelsReply(processes=3), 2)  # a server older than process_index: any connection does
