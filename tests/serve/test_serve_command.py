"""`yolojet serve` as a user starts it: a process on 127.0.0.1 that answers, shuts down on SIGTERM without losing
an accepted request, and refuses bad command lines with one clear line; and the generated protobuf code is what
the .proto gives."""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from support import run_cli, self_signed_pem
from ultralytics.utils import ASSETS

from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb
from yolojet.serve.proto.yolojet.v1 import inference_pb2_grpc as pb_grpc

BUS = (ASSETS / "bus.jpg").read_bytes()
PROTO_DIR = Path(__file__).resolve().parents[2] / "yolojet" / "serve" / "proto" / "yolojet" / "v1"


def start(model_dir, *flags) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    process = subprocess.Popen(
        [sys.executable, "-m", "yolojet", "serve", "--model", f"{model_dir}:1", "--port", "0", *flags],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    lines = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(r"listening on (\S+)", line)
        if found:
            process.startup_log = "".join(lines)  # type: ignore[attr-defined]
            return process, found.group(1)
    process.kill()
    raise AssertionError("the server did not start:\n" + "".join(lines))


def test_sigterm_answers_every_accepted_request(model_dirs):
    process, address = start(model_dirs["detect"], "--slo-ms", "60000")
    try:
        stub = pb_grpc.InferenceStub(grpc.insecure_channel(address))
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            calls = [pool.submit(stub.Infer, pb.InferRequest(id=str(i), image=BUS), timeout=120) for i in range(12)]
            first = next(concurrent.futures.as_completed(calls)).result()  # the server is busy on the rest
            process.send_signal(signal.SIGTERM)
            replies = [c.result() for c in calls]
        assert first.width == 810
        assert sorted(int(r.id) for r in replies) == list(range(12))
        assert all(r.width == 810 for r in replies)
        assert process.wait(timeout=60) == 0
        with pytest.raises(grpc.RpcError) as info:  # and it is gone
            stub.Infer(pb.InferRequest(image=BUS), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        log = process.stderr.read()
        assert '"event": "shutting down"' in log and '"event": "stopped"' in log and "Traceback" not in log
    finally:
        if process.poll() is None:
            process.kill()


def test_sigterm_ends_an_open_stream_unavailable_after_answering_what_it_read(model_dirs):
    """A stream that would go on sending: after SIGTERM the server answers what it has read, ends the stream
    UNAVAILABLE (its client sends the rest elsewhere), and exits long before the grace period would have ended it."""
    from yolojet.serve.service import SHUTTING_DOWN

    process, address = start(model_dirs["detect"], "--slo-ms", "60000", "--grace-s", "60")
    try:
        stub = pb_grpc.InferenceStub(grpc.insecure_channel(address))

        def endless():
            for i in itertools.count():
                yield pb.InferRequest(id=str(i), image=BUS)
                time.sleep(0.05)

        replies = stub.InferStream(endless(), timeout=120)
        ids = [int(next(replies).id)]
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            for reply in replies:
                ids.append(int(reply.id))
                assert reply.width == 810 and not reply.error.message
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE and info.value.details() == SHUTTING_DOWN
        assert ids == list(range(len(ids)))  # in order, none lost before the end
        assert process.wait(timeout=60) == 0
        assert time.monotonic() - signalled < 30, "the stream held the shutdown open"
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.parametrize(
    ("flags", "loop", "second"),
    [([], "uvloop", signal.SIGTERM), (["--event-loop", "asyncio"], "asyncio", signal.SIGINT)],
)
def test_the_event_loop_is_uvloop_unless_asked_otherwise_and_a_second_signal_ends_the_drain(
    model_dirs, flags, loop, second
):
    """On either loop, SIGTERM with `--drain-delay-s` turns health NOT_SERVING while calls are still answered, and a
    second SIGTERM, or SIGINT, ends the ten-minute delay: the server exits at once."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    process, address = start(model_dirs["detect"], "--drain-delay-s", "600", *flags)
    try:
        channel = grpc.insecure_channel(address)
        stub, health = pb_grpc.InferenceStub(channel), health_pb2_grpc.HealthStub(channel)
        assert stub.Infer(pb.InferRequest(image=BUS), timeout=120).width == 810
        assert f'"event_loop": "{loop}"' in process.startup_log  # type: ignore[attr-defined]
        process.send_signal(signal.SIGTERM)
        serving = health_pb2.HealthCheckResponse.SERVING
        while health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == serving:
            time.sleep(0.01)
        assert stub.Infer(pb.InferRequest(image=BUS), timeout=120).width == 810  # draining, still serving
        process.send_signal(second)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()


def test_uvloop_asked_for_where_it_is_missing_is_a_clear_error(monkeypatch):
    from yolojet.errors import EngineConfigError
    from yolojet.serve.server import ServeOptions, event_loop_name

    monkeypatch.setitem(sys.modules, "uvloop", None)  # an import of it now fails
    assert event_loop_name("auto") == "asyncio"
    with pytest.raises(EngineConfigError, match="--event-loop uvloop: uvloop is not installed"):
        event_loop_name("uvloop")
    with pytest.raises(EngineConfigError, match="event loop 'trio': expected one of auto, uvloop, asyncio"):
        ServeOptions(event_loop="trio")


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--model", "x.pt:0"], "max_batch must be at least 1"),
        (["--model", "yolo11n:abc"], "'abc' after the colon is no max_batch"),
        (["--model", "yolo11n:-4"], "'-4' after the colon is no max_batch"),
        (["--model", "m", "--tls-cert", "cert.pem"], "--tls-cert and --tls-key go together"),
        (["--model", "m", "--token-file", "missing.txt"], "--token-file missing.txt: no such file"),
        (["--model", "nowhere_model_dir"], "nowhere_model_dir"),
        (["--model", "m", "--devices", "gpu7"], "--devices gpu7: 'gpu7' is no device"),
        (["--model", "m", "--devices", "cpu", "--device", "cpu"], "--device and --devices: give one"),
        (["--model", "nowhere_model_dir", "--devices", "cpu"], "the worker on cpu could not load its models"),
        (["--model", "m", "--port", "70000"], "70000: a port is a number from 0 to 65535"),
        (["--model", "m", "--metrics-port", "-1"], "-1: a port is a number from 0 to 65535"),
        (["--model", "m", "--slo-ms", "-5"], "'-5': expected a positive number"),
        (
            ["--model", "m", "--port", "50999", "--metrics-port", "50999"],
            "--metrics-port 50999: the same port as --port",
        ),
        (["--model", "m", "--metrics-port", "65535", "--processes", "2"], "65536: a port is a number from 0 to 65535"),
        (["--model", "m", "--health-port", "70000"], "70000: a port is a number from 0 to 65535"),
        (
            ["--model", "m", "--port", "50998", "--health-port", "50998"],
            "--health-port 50998: the same port as --port",
        ),
        (["--model", "m", "--max-message-mb", "0"], "'0': expected a positive number"),
        (["--model", "m", "--grace-s", "nan"], "'nan': expected a number, 0 or more"),
        (["--model", "m", "--grace-s", "-1"], "'-1': expected a number, 0 or more"),
        (["--model", "m", "--drain-delay-s", "inf"], "'inf': expected a number, 0 or more"),
    ],
)
def test_bad_command_lines_are_one_clear_line(capsys, monkeypatch, tmp_path, flags, fragment):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("YOLOJET_CACHE", str(tmp_path / "cache"))
    code, _, stderr = run_cli(capsys, "serve", *flags)
    assert code == 2 and fragment in stderr and "Traceback" not in stderr, stderr


def test_an_empty_token_file_or_a_mismatched_tls_pair_is_refused_before_the_models_load(capsys, monkeypatch, tmp_path):
    """An empty --token-file (a secret that was not mounted) would serve without authentication, and a certificate with
    another key's private key would fail only as 'cannot listen' after the models load: each is said at once."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("YOLOJET_CACHE", str(tmp_path / "cache"))
    (tmp_path / "empty.tok").write_text("\n")
    code, _, stderr = run_cli(capsys, "serve", "--model", "nowhere_model_dir", "--token-file", "empty.tok")
    assert code == 2 and "--token-file empty.tok: empty; it must hold the bearer token" in stderr, stderr
    cert, _ = self_signed_pem(tmp_path, "one")
    _, other_key = self_signed_pem(tmp_path, "two")
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(other_key.read_bytes(), password=None)
    locked = tmp_path / "locked.key.pem"
    locked.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    # A key of another certificate, the two swapped, and an encrypted key (refused, never a pass phrase prompt).
    for pair in ((cert, other_key), (other_key, cert), (cert, locked)):
        code, _, stderr = run_cli(
            capsys, "serve", "--model", "nowhere_model_dir", "--tls-cert", pair[0], "--tls-key", pair[1]
        )
        assert code == 2 and "not a PEM certificate chain and its unencrypted private key" in stderr, stderr


def test_ports_in_use_are_one_clear_line(model_dirs, capsys, tmp_path, monkeypatch):
    import socket

    monkeypatch.setenv("YOLOJET_CACHE", str(tmp_path / "cache"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        model = f"{model_dirs['detect']}:1"
        for flags, fragment in (
            (["--port", port], f"--port {port}: cannot listen there"),
            (["--port", "0", "--metrics-port", port], f"--metrics-port {port}: cannot listen there"),
            (["--port", "0", "--health-port", port], f"--health-port {port}: cannot listen there"),
        ):
            code, _, stderr = run_cli(capsys, "serve", "--model", model, "--slo-ms", "60000", *flags)
            assert code == 2 and fragment in stderr and "Traceback" not in stderr, stderr
            assert "model loaded" not in stderr, "said only after the models loaded"


def test_generated_code_is_what_the_proto_gives(tmp_path):
    """The committed *_pb2.py files equal grpcio-tools' output for the committed .proto (regenerate them with the
    command in yolojet/serve/proto/README.md after changing it)."""
    pytest.importorskip("grpc_tools")
    root = Path(__file__).resolve().parents[2]
    relative = PROTO_DIR.relative_to(root)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{root}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--pyi_out={out}",
            str(relative / "inference.proto"),
        ],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    for name in ("inference_pb2.py", "inference_pb2_grpc.py", "inference_pb2.pyi"):
        assert (out / relative / name).read_text() == (PROTO_DIR / name).read_text(), name


def test_the_protobuf_requirement_spans_the_generated_codes_major_version():
    """The package requires the protobuf release that generated the committed code, up to its next major version:
    protobuf runs generated code only on its own release or a newer one of the same major version."""
    generated = re.search(r"# Protobuf Python Version: ((\d+)\.\d+\.\d+)", (PROTO_DIR / "inference_pb2.py").read_text())
    assert generated, "the generated code names no protobuf version"
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    required = re.findall(r'^\s*"protobuf([^";]*)"', pyproject, flags=re.MULTILINE)
    assert required == [f">={generated.group(1)},<{int(generated.group(2)) + 1}"], required
