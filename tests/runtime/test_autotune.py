"""Per-layer tile tuning on the GPU: candidates compiled in parallel, timed, cached on disk, reused."""

from __future__ import annotations

import pytest
import torch
from support import random_model

import yolojet
from yolojet.runtime.autotune import TuningCache, compile_candidates, untuned
from yolojet.runtime.engine import Engine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="tuning times kernels on a CUDA GPU")


def test_tuned_engine_matches_reference_and_second_load_uses_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLOJET_CACHE", str(tmp_path / "cache"))
    model_dir = yolojet.export(random_model("yolo11n.yaml"), out=tmp_path / "m", imgsz=96)
    first = Engine.load(model_dir, device="cuda", half=True, max_batch=2, tune=True)
    convs = sum(1 for b in first.network.buckets for launch in first.network.launch_list(b) if launch.tune_key)
    # Convs of one shape share a tuning entry: the first of them is timed, the others take its pick.
    assert first.network.tuning["timed"] > 0
    assert first.network.tuning["cached"] + first.network.tuning["timed"] == convs
    assert (
        untuned([launch for b in first.network.buckets for launch in first.network.launch_list(b)], TuningCache()) == []
    )

    x = torch.rand(2, 3, 96, 96, device="cuda")
    first.network.poison()
    ours, expected = first.raw(x), yolojet.load_reference(model_dir, device="cuda")(x)
    assert float((ours - expected).norm() / expected.norm()) <= 1e-2

    second = Engine.load(model_dir, device="cuda", half=True, max_batch=2, tune=True)
    assert second.network.tuning == {"cached": convs, "timed": 0}
    assert torch.equal(second.raw(x), first.raw(x))  # the same picks, so the same arithmetic


def test_candidates_compile_in_the_background_without_launching(tmp_path):
    pytest.importorskip("triton.runtime._async_compile")
    model_dir = yolojet.export(random_model("yolov8n.yaml"), out=tmp_path / "m", imgsz=64)
    engine = Engine.load(model_dir, device="cuda", half=True, max_batch=1, tune=False)
    launches = [launch for launch in engine.network.launch_list(1) if launch.compile is not None]
    out = engine.network.features
    out.fill_(float("nan"))
    assert compile_candidates(launches, workers=4)
    assert out.isnan().all()  # compiled, not run
