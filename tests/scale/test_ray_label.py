"""`yolojet label --ray` on a real local Ray cluster of CPU workers (the reference backend): the records are those
of `--local`, bad files in the error log; an actor that dies mid-run still leaves each image exactly once; `--resume`
labels only the rest; the driver drops repeated answers; the errors of a missing Ray, an unreachable cluster and
flags that do not go together."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import ray
from support import calibrated_model, run_cli
from ultralytics.utils import ASSETS

import yolojet
from yolojet.client.label import LabelJob, Summary, run
from yolojet.scale.ray_cluster import head_of
from yolojet.scale.ray_label import NO_ANSWER, Delivery, LabelActor, RayLabeler

CONF = "0.001"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return yolojet.export(
        calibrated_model("yolov8n.yaml", 320), out=tmp_path_factory.mktemp("ray_label") / "detect", imgsz=320
    )


@pytest.fixture(scope="module")
def cluster():
    """One local cluster for the module (starting one takes about 10 s here); the labeler labels on it, as on any
    cluster this process is on already. Two CPUs: two engine actors at most."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture
def photos(tmp_path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("bus.jpg", "zidane.jpg"):
        shutil.copy(ASSETS / name, folder / name)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    return folder


@pytest.fixture(autouse=True)
def cpu(monkeypatch, tmp_path):
    # --local in this process on the reference backend, not our kernels under Triton's interpreter (minutes); the
    # Ray workers are given the reference backend by name.
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("YOLOJET_CACHE", str(tmp_path / "cache"))


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_same_records(ours: list[dict], theirs: list[dict]) -> None:
    """The same images, each once, with the same detections up to float rounding (batches of other images)."""
    mine, other = {r["path"]: r for r in ours}, {r["path"]: r for r in theirs}
    assert len(mine) == len(ours) and mine.keys() == other.keys()
    for path, record in mine.items():
        them = other[path]
        assert {k: v for k, v in record.items() if k != "detections"} == {
            k: v for k, v in them.items() if k != "detections"
        }
        assert [d["class"] for d in record["detections"]] == [d["class"] for d in them["detections"]], path
        if record["detections"]:
            np.testing.assert_allclose(
                [d["box"] for d in record["detections"]], [d["box"] for d in them["detections"]], atol=0.02
            )
            np.testing.assert_allclose(
                [d["confidence"] for d in record["detections"]],
                [d["confidence"] for d in them["detections"]],
                atol=2e-5,
            )


# -- without a cluster ------------------------------------------------------------------------------------------------


def test_flags_that_do_not_go_together(model_dir, photos, tmp_path, capsys):
    out = ["--out", tmp_path / "o.jsonl", "--model", model_dir]
    code, _, stderr = run_cli(capsys, "label", photos, *out, "--local", "--ray")
    assert code == 2 and "not allowed with argument" in stderr
    code, _, stderr = run_cli(capsys, "label", photos, *out)
    assert code == 2 and "--local (an engine here) or --ray [ADDRESS] (a Ray cluster)" in stderr
    code, _, stderr = run_cli(capsys, "label", photos, *out, "--local", "--ray-actors", "2")
    assert code == 2 and "give it with --ray" in stderr
    code, _, stderr = run_cli(capsys, "label", photos, *out, "--ray", "--bench", "10")
    assert code == 2 and "--bench measures a server" in stderr
    code, _, stderr = run_cli(capsys, "label", photos / "bus.jpg", "--ray", photos, *out)  # --ray took the folder
    assert code == 2 and f"--ray {photos}: an image source, not a cluster address" in stderr
    code, _, stderr = run_cli(capsys, "label", "--ray", photos, *out)  # the only source, taken by --ray
    assert code == 2 and f"--ray {photos}: an image source, not a cluster address" in stderr
    code, _, stderr = run_cli(capsys, "label", *out, "--local")
    assert code == 2 and "give the images to label" in stderr
    code, _, stderr = run_cli(capsys, "label", photos, *out, "--device", "cuda:1", "--ray")
    assert code == 2 and "expected cuda or cpu" in stderr
    assert not (tmp_path / "o.jsonl").exists()


def test_an_unreachable_cluster_and_a_missing_ray_are_clear_errors(model_dir, photos, tmp_path, capsys, monkeypatch):
    started = time.monotonic()
    code, _, stderr = run_cli(
        capsys, "label", photos, "--model", model_dir, "--out", tmp_path / "o.jsonl", "--ray", "127.0.0.1:9"
    )
    assert code == 2 and "--ray 127.0.0.1:9: cannot reach the Ray cluster there" in stderr, stderr
    assert time.monotonic() - started < 30  # not ray.init's minutes of retrying
    monkeypatch.setitem(sys.modules, "ray.data", None)  # as if Ray Data were not installed
    code, _, stderr = run_cli(capsys, "label", photos, "--model", model_dir, "--out", tmp_path / "o.jsonl", "--ray")
    assert code == 2 and "pip install 'yolojet[ray]'" in stderr
    assert not (tmp_path / "o.jsonl").exists()


def test_addresses():
    assert head_of("10.0.0.1:6380") == ("10.0.0.1", 6380)
    assert head_of("head") == ("head", 6379)
    assert head_of("ray://head") == ("head", 10001) and head_of("ray://head:1234") == ("head", 1234)
    assert head_of("[::1]:6379") == ("::1", 6379) and head_of("[::1]") == ("::1", 6379)
    assert head_of("auto") is None
    with pytest.raises(yolojet.errors.EngineConfigError, match="expected HOST:PORT"):
        head_of("head:port")


def test_a_path_is_delivered_once_and_one_without_an_answer_is_an_error():
    """The driver's half of exactly once, on answers as the workers send them: a batch that ran twice (its actor
    restarted, in a new process) is dropped the second time; a path that got no answer goes to the error log."""

    def batch(paths: list[str], actor: str, worker: str) -> dict[str, np.ndarray]:
        n = len(paths)
        records = [json.dumps({"path": p}) if not p.endswith("bad") else "" for p in paths]
        errors = [f"{p}: cannot decode" if p.endswith("bad") else "" for p in paths]
        return {
            k: np.array(v, dtype=object)
            for k, v in {
                "path": paths,
                "record": records,
                "error": errors,
                "failure": [""] * n,
                "actor": [actor] * n,
                "worker": [worker] * n,
            }.items()
        }

    answers = [batch(["a", "bad"], "A", "node:1"), batch(["c"], "B", "node:2"), batch(["a", "bad"], "A", "node:3")]
    delivery, records, errors = Delivery(), [], []
    delivery.deliver(answers, ["a", "bad", "c", "lost"], records.append, lambda p, m: errors.append((p, m)))
    assert [r["path"] for r in records] == ["a", "c"]
    assert errors == [("bad", "bad: cannot decode"), ("lost", NO_ANSWER)]
    assert (delivery.restarts, delivery.repeats, delivery.missing) == (1, 2, 1)
    notes = " ".join(delivery.notes())
    assert "Ray restarted a worker that died" in notes and "2 answers" in notes and "an image got no answer" in notes
    failed = batch(["d"], "A", "node:3")
    failed["failure"] = np.array(["EngineConfigError: max_det 1000: expected an int in 1..300"], dtype=object)
    with pytest.raises(yolojet.errors.EngineConfigError, match="on a Ray worker: max_det 1000"):
        Delivery().deliver([failed], ["d"], records.append, lambda p, m: None)


# -- on a local cluster -----------------------------------------------------------------------------------------------


def test_ray_gives_the_records_local_does(cluster, model_dir, photos, tmp_path, capsys):
    local, remote = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    common = ["--model", model_dir, "--conf", CONF, "-c", "2"]
    assert run_cli(capsys, "label", photos, "--local", "--out", local, *common, "--quiet")[0] == 1  # the bad file
    code, _, stderr = run_cli(capsys, "label", photos, "--out", remote, *common, "--ray")
    assert code == 1, stderr
    assert "2 images labeled" in stderr and "1 errors" in stderr
    assert_same_records(lines(remote), lines(local))
    assert sum(len(r["detections"]) for r in lines(remote)) > 0
    errors = lines(tmp_path / "ray.jsonl.errors.jsonl")
    assert errors == lines(tmp_path / "local.jsonl.errors.jsonl")  # the same message, naming the path as given
    assert [Path(e["path"]).name for e in errors] == ["broken.jpg"] and "cannot decode" in errors[0]["error"]


def test_an_actor_that_dies_mid_run_leaves_each_image_once(cluster, model_dir, tmp_path):
    """The first actor to reach its second batch exits (as a crash or a lost node would end it); Ray starts it again
    and runs that batch again: every image has exactly one record."""
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(6):
        shutil.copy(ASSETS / ("bus.jpg" if i % 2 else "zidane.jpg"), folder / f"{i:02d}.jpg")
    marker = tmp_path / "died"  # outlives the process, so that the batch run again succeeds

    class DiesOnce(LabelActor):  # defined here, so that Ray pickles it by value for its workers
        batches = 0

        def __call__(self, batch):
            self.batches += 1
            if self.batches == 2 and not marker.exists():
                marker.touch()
                os._exit(1)
            return super().__call__(batch)

    out = tmp_path / "labels.jsonl"
    job = LabelJob([str(folder)], out, quiet=True)
    labeler = RayLabeler(str(model_dir), 2, job.options, actor=DiesOnce)  # three batches, two actors at most
    try:
        summary = run(job, labeler, labeler.facts, Summary())
    finally:
        labeler.close()
    assert marker.exists(), "no actor died"
    paths = [r["path"] for r in lines(out)]
    assert sorted(paths) == sorted(str(p) for p in folder.iterdir())
    assert len(paths) == len(set(paths)) == 6 and summary.labeled == 6 and summary.failed == 0
    assert labeler.delivery.restarts >= 1 and "Ray restarted" in " ".join(labeler.notes())


def test_resume_labels_only_the_rest(cluster, model_dir, photos, tmp_path, capsys):
    """A partial output (one whole record, a last line a kill cut short), made by --local: --ray --resume labels the
    other image and the bad one again, and ends with each image once, as --local labels them."""
    out, full = tmp_path / "labels.jsonl", tmp_path / "full.jsonl"
    common = ["--model", model_dir, "--conf", CONF, "-c", "2", "--quiet"]
    assert run_cli(capsys, "label", photos, "--local", "--out", full, *common)[0] == 1
    first = full.read_text().splitlines()
    out.write_text(first[0] + "\n" + first[1][:20])
    code, _, stderr = run_cli(capsys, "label", photos, "--out", out, "--resume", *common, "--ray")
    assert code == 1, stderr
    assert "1 images labeled" in stderr and "1 done before and skipped" in stderr and "1 errors" in stderr
    records = lines(out)
    assert records[0] == json.loads(first[0])  # kept as it was
    assert_same_records(records, lines(full))
