"""`yolojet label --local --devices`: worker processes on the CPU (`cpu,cpu`, the reference backend) label the shipped
photos as one local engine does, each image once, a bad file in the error log; a worker killed with SIGKILL in the
middle of the run loses no image and writes none twice (its chunk is re-run, the summary says so); bad --devices and a
model the workers cannot load are clear errors, and no worker process is left behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support import calibrated_model, run_cli, sigint_as_in_a_terminal
from ultralytics.utils import ASSETS

import yolojet
from yolojet.errors import EngineConfigError
from yolojet.scale.devices import cuda_device_count, parse_devices

CONF = "0.001"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # 320: about a second an image on one core, so a kill lands while both workers hold images
    out = tmp_path_factory.mktemp("workers") / "m"
    return yolojet.export(calibrated_model("yolov8n.yaml", 320), out=out, imgsz=320)


@pytest.fixture(autouse=True)
def cpu(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the reference backend, not the interpreter
    monkeypatch.setenv("YOLOJET_CACHE", str(tmp_path / "cache"))


def photos(folder: Path, count: int) -> Path:
    folder.mkdir(parents=True)
    for i in range(count):
        shutil.copy(ASSETS / ("bus.jpg" if i % 2 else "zidane.jpg"), folder / f"{i:02d}.jpg")
    return folder


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def workers_alive(parent: int | None = None) -> list[int]:
    """The pids of the processes that multiprocessing spawned as children of `parent` (default: this one)."""
    me, found = os.getpid() if parent is None else parent, []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # state, ppid, ... after the command's name
        if int(fields[1]) == me and fields[0] != "Z" and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def test_two_workers_give_the_records_of_one_engine(model_dir, tmp_path, capsys):
    """Two labeling processes on one device (`--workers 2`; `--devices cpu,cpu` names the same two, as the
    kill test below does)."""
    folder = photos(tmp_path / "photos", 8)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    ours, theirs = tmp_path / "workers.jsonl", tmp_path / "local.jsonl"
    code, _, stderr = run_cli(
        capsys,
        "label",
        folder,
        "--local",
        "--device",
        "cpu",
        "--workers",
        "2",
        "--model",
        model_dir,
        "--out",
        ours,
        "--conf",
        CONF,
        "-c",
        "2",
    )
    assert code == 1, stderr  # the broken file
    assert "8 images labeled" in stderr and "1 errors" in stderr and "re-run" not in stderr
    assert "labeled by 2 worker processes: cpu, cpu" in stderr
    assert not workers_alive()
    assert (
        run_cli(
            capsys,
            "label",
            folder,
            "--local",
            "--model",
            model_dir,
            "--out",
            theirs,
            "--conf",
            CONF,
            "-c",
            "2",
            "--device",
            "cpu",  # the workers' device: on a GPU machine the default would be the GPU, in half precision
            "--quiet",
        )[0]
        == 1
    )
    records = lines(ours)
    paths = [r["path"] for r in records]
    assert len(paths) == len(set(paths)) == 8
    want = {r["path"]: r for r in lines(theirs)}
    assert set(paths) == set(want)
    for record in records:
        other = want[record["path"]]
        assert {k: v for k, v in record.items() if k != "detections"} == {
            k: v for k, v in other.items() if k != "detections"
        }
        mine, them = record["detections"], other["detections"]
        assert [d["class"] for d in mine] == [d["class"] for d in them]
        if not mine:
            continue
        # fp32 both, one torch thread a worker against two here: sums in another order
        np.testing.assert_allclose([d["box"] for d in mine], [d["box"] for d in them], atol=0.02)
        np.testing.assert_allclose([d["confidence"] for d in mine], [d["confidence"] for d in them], atol=1e-4)
    assert sum(len(r["detections"]) for r in records) > 0
    (error,) = lines(tmp_path / "workers.jsonl.errors.jsonl")
    assert Path(error["path"]).name == "broken.jpg" and "cannot decode" in error["error"]


def test_a_killed_worker_loses_no_image_and_writes_none_twice(model_dir, tmp_path, capsys):
    folder = photos(tmp_path / "photos", 16)
    out = tmp_path / "labels.jsonl"
    killed: list[int] = []

    def kill_a_worker_once_records_flow() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if out.exists() and out.read_text().count("\n") >= 1 and (alive := workers_alive()):
                os.kill(alive[0], signal.SIGKILL)
                killed.append(alive[0])
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_a_worker_once_records_flow, daemon=True)
    killer.start()
    code, _, stderr = run_cli(
        capsys,
        "label",
        folder,
        "--local",
        "--devices",
        "cpu,cpu",
        "--model",
        model_dir,
        "--out",
        out,
        "-c",
        "2",
        "--quiet",
    )
    killer.join(timeout=5)
    assert killed, stderr
    assert code == 0, stderr
    paths = [r["path"] for r in lines(out)]
    assert sorted(paths) == sorted(str(p) for p in folder.iterdir())
    assert len(paths) == len(set(paths)) == 16
    assert "16 images labeled" in stderr and "0 errors" in stderr
    (reruns,) = re.findall(
        r"worker deaths: 1 \(cpu: killed by SIGKILL\); chunks they held, re-run on the other "
        r"workers or those started again: (\d+)",
        stderr,
    )
    assert int(reruns) >= 1
    assert not workers_alive()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        pytest.param(
            ["--devices", "all"],
            "--devices all: no CUDA device; name devices, e.g. --devices cpu,cpu",
            marks=pytest.mark.skipif(cuda_device_count() > 0, reason="a machine without a GPU"),
        ),
        pytest.param(
            ["--devices", "0"],
            "--devices 0: no CUDA device 0 (this machine has none)",
            marks=pytest.mark.skipif(cuda_device_count() > 0, reason="a machine without a GPU"),
        ),
        (["--devices", "cpu,tpu"], "--devices cpu,tpu: 'tpu' is no device (expected all, CUDA indices"),
        (["--devices", "cpu,,cpu"], "--devices cpu,,cpu: '' is no device"),
        (["--devices", "cpu,cpu", "--device", "cpu"], "--device and --devices: give one"),
        (["--workers", "0"], "argument --workers: '0': expected a positive integer"),
    ],
)
def test_bad_devices_are_clear_errors_before_any_work(model_dir, tmp_path, capsys, flags, message):
    out = tmp_path / "labels.jsonl"
    started = time.monotonic()
    code, _, stderr = run_cli(
        capsys, "label", ASSETS / "bus.jpg", "--local", "--model", model_dir, "--out", out, *flags
    )
    assert code == 2 and message in stderr, stderr
    assert time.monotonic() - started < 5 and not out.exists() and not workers_alive()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--devices", "cpu"], "--devices runs worker processes on this machine's devices: give it with --local"),
        (["--workers", "2"], "--workers runs labeling processes on this machine: give it with --local"),
    ],
)
def test_devices_and_workers_only_with_local(tmp_path, capsys, flags, message):
    code, _, stderr = run_cli(
        capsys, "label", ASSETS / "bus.jpg", "--server", "127.0.0.1:9", *flags, "--out", tmp_path / "o.jsonl"
    )
    assert code == 2 and message in stderr, stderr


def test_the_drivers_count_of_gpus_is_torchs():
    """The fronts count GPUs through the driver (no torch import before their workers start): the count torch
    gives, on a machine with GPUs and without."""
    import torch

    from yolojet.scale.devices import cuda_device_count, default_device

    assert cuda_device_count() == torch.cuda.device_count()
    assert default_device() == ("cuda:0" if torch.cuda.is_available() else "cpu")


def test_parse_devices_against_a_count_of_gpus():
    assert parse_devices("all", cuda_count=2) == ["cuda:0", "cuda:1"]
    assert parse_devices("0, 1", cuda_count=2) == ["cuda:0", "cuda:1"]
    assert parse_devices("cuda:1,cpu,cuda", cuda_count=2) == ["cuda:1", "cpu", "cuda:0"]
    assert parse_devices("cpu,cpu", cuda_count=0) == ["cpu", "cpu"]
    with pytest.raises(EngineConfigError, match=r"--devices 0,5: no CUDA device 5 \(this machine has 2 \(0..1\)\)"):
        parse_devices("0,5", cuda_count=2)
    with pytest.raises(EngineConfigError, match="'cuda:x' is no device"):
        parse_devices("cuda:x", cuda_count=2)


def test_a_model_the_workers_cannot_load_names_the_device_and_stops_them(tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "graph.json").write_text("{ not json")
    (broken / "weights.safetensors").write_bytes(b"")
    out = tmp_path / "labels.jsonl"
    code, _, stderr = run_cli(
        capsys, "label", ASSETS / "bus.jpg", "--local", "--devices", "cpu,cpu", "--model", broken, "--out", out
    )
    assert code == 2 and "the worker on cpu could not load the model" in stderr and "not valid JSON" in stderr, stderr
    assert not out.exists() and not workers_alive()


@pytest.mark.parametrize(("stop", "status", "said"), [("ctrl-c", 130, "interrupted"), ("sigterm", 143, "terminated")])
def test_ctrl_c_or_sigterm_ends_the_workers_with_the_command(model_dir, tmp_path, stop, status, said):
    """SIGINT to the command's process group, as Ctrl-C in a terminal sends, or SIGTERM to the command alone, as a
    scheduler stopping a job sends: the command stops (130 or 143) with what it labeled kept and says how to go on,
    and its workers stop with it. Enough images that the run is still going when the signal comes, however fast the
    machine (16 were all done first on a quiet CI machine): one copy of each photo, then hard links to it."""
    folder = photos(tmp_path / "photos", 2)
    for i in range(2, 400):
        os.link(folder / f"{i % 2:02d}.jpg", folder / f"{i:03d}.jpg")
    out = tmp_path / "labels.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [
        sys.executable,
        "-m",
        "yolojet",
        "label",
        str(folder),
        "--local",
        "--devices",
        "cpu,cpu",
        "--model",
        str(model_dir),
        "--out",
        str(out),
        "-c",
        "2",
        "--quiet",
    ]
    process = subprocess.Popen(
        command, env=env, stderr=subprocess.PIPE, start_new_session=True, preexec_fn=sigint_as_in_a_terminal
    )
    try:
        deadline = time.monotonic() + 120
        while (not out.exists() or out.read_text().count("\n") < 1) and time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            time.sleep(0.02)
        workers = workers_alive(process.pid)
        assert len(workers) == 2
        if stop == "ctrl-c":
            os.killpg(process.pid, signal.SIGINT)
        else:
            os.kill(process.pid, signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == status, stderr.decode()
    assert f"{said} after" in stderr.decode() and "run again with --resume" in stderr.decode()
    assert 1 <= len(lines(out)) < 400
    for pid in workers:  # gone, or at most a zombie waiting for init to reap it
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
