"""A server whose engine stops answering (device work that never ends): its requests are answered UNAVAILABLE and
the process ends with HUNG_EXIT_CODE so that its supervisor starts it again, rather than taking calls for ever. The
hang is made by an engine whose results never come; everything else is the real runner, scheduler and server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import grpc
from support import served
from ultralytics.utils import ASSETS

from yolojet.engine.predict_path import PredictOptions
from yolojet.serve.batcher import Scheduler
from yolojet.serve.metrics import ServerMetrics
from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb
from yolojet.serve.proto.yolojet.v1 import inference_pb2_grpc as pb_grpc
from yolojet.serve.runner import HUNG_EXIT_CODE, Job, Outcome, Runner

BUS = (ASSETS / "bus.jpg").read_bytes()


class NeverDone:
    """A submitted batch whose results wait until `release` is set (a GPU that no longer answers)."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def results(self):
        self.release.wait()
        raise RuntimeError("released by the test")


def test_a_hung_batch_answers_every_request_unavailable_and_says_why(model_dirs, monkeypatch):
    model = served("detect", model_dirs["detect"])
    release, hung = threading.Event(), threading.Event()
    reasons: list[str] = []
    monkeypatch.setattr(model.engine, "submit", lambda frames, options, ready=(): NeverDone(release))
    scheduler = Scheduler(time.monotonic)
    scheduler.add_model("detect", model.max_batch, model.latency, 64)

    def on_hung(reason: str) -> None:
        reasons.append(reason)
        hung.set()

    runner = Runner({"detect": model}, scheduler, ServerMetrics(), on_hung=on_hung)
    assert runner.hung_after_s >= 180.0, "a real engine gets minutes before it is taken for hung"
    runner.hung_after_s = 1.0
    outcomes: dict[str, Outcome] = {}

    def job(name: str) -> Job:
        return Job(name, BUS, PredictOptions(), lambda outcome: outcomes.setdefault(name, outcome))

    runner.start()
    try:
        time.sleep(1.5)  # an idle runner is not hung, however long it waits for work
        assert not hung.is_set()
        for i in range(3):
            runner.enqueue("detect", job(f"r{i}"), time.monotonic() + 600, key=None)
        assert hung.wait(timeout=30), "the watchdog did not find the runner hung"
        assert sorted(outcomes) == ["r0", "r1", "r2"]  # in flight and still queued alike
        for outcome in outcomes.values():
            assert outcome.code == grpc.StatusCode.UNAVAILABLE
            assert "stopped answering" in outcome.message and "started again" in outcome.message
        assert len(reasons) == 1 and "has waited" in reasons[0]
        runner.enqueue("detect", job("late"), time.monotonic() + 600, key=None)
        assert outcomes["late"].code == grpc.StatusCode.UNAVAILABLE  # a request after the hang is refused at once
    finally:
        release.set()
        runner.stop(timeout=30)


def test_a_runner_thread_ended_by_an_unexpected_error_is_caught_too(model_dirs, monkeypatch):
    model = served("detect", model_dirs["detect"])
    scheduler = Scheduler(time.monotonic)
    scheduler.add_model("detect", model.max_batch, model.latency, 64)
    reasons: list[str] = []
    hung = threading.Event()
    runner = Runner({"detect": model}, scheduler, ServerMetrics(), on_hung=lambda r: (reasons.append(r), hung.set()))
    runner.hung_after_s = 1.0

    def broken(batch):
        raise RuntimeError("an error the loop does not expect")

    monkeypatch.setattr(runner, "_launch", broken)
    outcomes: list[Outcome] = []
    runner.start()
    try:
        runner.enqueue("detect", Job("r0", BUS, PredictOptions(), outcomes.append), time.monotonic() + 600, key=None)
        assert hung.wait(timeout=30), "a runner thread that ended was not noticed"
        assert "runner thread ended" in reasons[0]
        assert [o.code for o in outcomes] == [grpc.StatusCode.UNAVAILABLE]  # the request it held is answered
    finally:
        runner.stop(timeout=30)


# `yolojet serve` whose engine, once the server runs (its latency measured at load), never finishes a batch.
SERVE_HUNG = """
import sys, threading
from yolojet import cli
from yolojet.engine import engine as engine_module
from yolojet.serve import runner

runner.HUNG_AFTER_S, runner.HUNG_AFTER_RUNS = 2.0, 0
serving = []
measured_submit, start = engine_module.Engine.submit, runner.Runner.start


class NeverDone:
    def results(self):
        threading.Event().wait()


def submit(self, frames, options=None, ready=()):
    return NeverDone() if serving else measured_submit(self, frames, options, ready)


def start_serving(self):
    serving.append(True)
    start(self)


engine_module.Engine.submit, runner.Runner.start = submit, start_serving
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_server_whose_engine_hangs_answers_unavailable_and_ends_to_be_started_again(model_dirs):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, "-c", SERVE_HUNG, "serve", "--model", f"{model_dirs['detect']}:1", "--port", "0"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 120
        while not (found := re.search(r"listening on (\S+)", lines[-1] if lines else "")):
            line = process.stderr.readline()
            assert line and time.monotonic() < deadline, "the server did not start:\n" + "".join(lines)
            lines.append(line)
        stub = pb_grpc.InferenceStub(grpc.insecure_channel(found.group(1)))
        try:
            stub.Infer(pb.InferRequest(image=BUS), timeout=60)
            raise AssertionError("a hung engine's request was answered")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
            assert "stopped answering" in (e.details() or ""), e.details()
        assert process.wait(timeout=30) == HUNG_EXIT_CODE
        assert '"event": "engine hung"' in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
