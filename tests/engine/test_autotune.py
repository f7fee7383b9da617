"""Per-layer tile tuning on the GPU: candidates compiled in parallel, timed, cached on disk, reused."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from support import random_model
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

import yolojet
from yolojet.engine.autotune import TuningCache, compile_launches, tune, untuned
from yolojet.engine.engine import Engine
from yolojet.engine.lowering import Launch
from yolojet.errors import EngineConfigError
from yolojet.kernels.attention import AttentionTile
from yolojet.kernels.conv import ConvConfig, ConvKind
from yolojet.kernels.dwconv import DwConvTile

needs_cuda = pytest.mark.gpu(reason="tuning times kernels on a CUDA GPU")


def test_candidates_that_cannot_run_are_left_out_with_a_warning(tmp_path):
    # The timings stand in for the GPU's: what is checked is the choice around a candidate that cannot launch.
    fits, faster, too_big = ConvConfig(64, 64, 64, 4, 3), ConvConfig(128, 128, 64, 4, 3), ConvConfig(128, 256, 64, 8, 4)
    picked: list[ConvConfig] = []

    def timer(launch: Launch) -> float:
        if picked[-1] == too_big:
            raise OutOfResources(196608, 101376, "shared memory")
        return {fits: 2.0, faster: 1.0}[picked[-1]]

    def conv(name: str, candidates: list[ConvConfig]) -> Launch:
        return Launch("conv", [name], [], lambda: None, tune_key=name, configure=picked.append, candidates=candidates)

    cache = TuningCache(tmp_path / "autotune.json", device_name="a smaller GPU")
    with pytest.warns(RuntimeWarning, match="left out of tuning: out of resource: shared memory"):
        counts = tune([conv("model.0/conv", [fits, too_big, faster])], cache, timer=timer)
    assert counts == {"cached": 0, "timed": 1, "unusable": 1}
    assert picked[-1] == faster and cache.get("model.0/conv") == faster

    with pytest.raises(EngineConfigError, match=r"model.1/conv: none of its 1 tile candidates runs .* a smaller GPU"):
        tune([conv("model.1/conv", [too_big])], cache, timer=timer)


def test_the_cache_keeps_every_kind_of_tile_and_skips_entries_it_cannot_read(tmp_path):
    cache = TuningCache(tmp_path / "autotune.json", device_name="GPU")
    conv, attention = ConvConfig(64, 32, 16, 2, 1, ConvKind.DIRECT, whole_pixels=True), AttentionTile(32, 256, 8)
    depthwise = DwConvTile(64, 16, 4)
    cache.put("conv|a", conv)
    cache.put("attention|b", attention)
    cache.put("dwconv|c", depthwise)
    cache.save()
    again = TuningCache(tmp_path / "autotune.json", device_name="GPU")
    assert again.get("conv|a") == conv and again.get("attention|b") == attention
    assert again.get("dwconv|c") == depthwise
    assert TuningCache(tmp_path / "autotune.json", device_name="another GPU").get("conv|a") is None
    again.entries[again.prefix + "conv|old"] = {"block_m": 64, "tile_shape": "from another version"}
    again.entries[again.prefix + "conv|bad"] = {
        "type": "ConvConfig",
        "block_m": 48,
        "block_n": 16,
        "block_k": 16,
        "num_warps": 4,
        "num_stages": 3,
    }
    assert again.get("conv|old") is None and again.get("conv|bad") is None


def test_compile_failures_are_named_by_their_message_and_other_errors_stop_tuning(tmp_path):
    bad_source, bad_pass, broken, fits = (ConvConfig(16 * 2**i, 64, 64, 4, 3) for i in range(4))
    picked: list[ConvConfig] = []

    def timer(launch: Launch) -> float:
        config = picked[-1]
        if config == bad_source:
            raise CompilationError("acc = tl.dot(a, b)", ast.parse("acc").body[0], "dot needs K >= 16")
        if config == bad_pass:
            raise RuntimeError("PassManager::run failed")
        if config == broken:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return 1.0

    def conv(candidates: list[ConvConfig]) -> Launch:
        return Launch("conv", ["c"], [], lambda: None, tune_key="c", configure=picked.append, candidates=candidates)

    cache = TuningCache(tmp_path / "autotune.json", device_name="GPU")
    with pytest.warns(RuntimeWarning) as caught:
        assert tune([conv([bad_source, bad_pass, fits])], cache, timer=timer)["unusable"] == 2
    reasons = sorted(str(w.message).split(": ", 1)[1] for w in caught)
    assert reasons == ["PassManager::run failed", "dot needs K >= 16"]
    with pytest.raises(RuntimeError, match="illegal memory access"):
        tune([conv([broken, fits])], TuningCache(tmp_path / "other.json", device_name="GPU"), timer=timer)


@needs_cuda
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
    assert second.network.tuning == {"cached": convs, "timed": 0, "unusable": 0}
    assert torch.equal(second.raw(x), first.raw(x))  # the same picks, so the same arithmetic


@needs_cuda
def test_candidates_compile_in_the_background_without_launching(tmp_path):
    pytest.importorskip("triton.runtime._async_compile")
    model_dir = yolojet.export(random_model("yolov8n.yaml"), out=tmp_path / "m", imgsz=64)
    engine = Engine.load(model_dir, device="cuda", half=True, max_batch=1, tune=False)
    launches = engine.network.launch_list(1)
    tunable = [launch for launch in launches if launch.compile is not None]
    for buffer in (engine.network.features, engine.network.heads):
        buffer.fill_(float("nan"))
    # Every candidate of the tunable launches, and every launch's current kernels (a tunable one's remembered pick)
    assert compile_launches(tunable, launches, workers=4, processes=False)
    assert engine.network.features.isnan().all() and engine.network.heads.isnan().all()  # compiled, not run


_CAPTURE_COMPILES = textwrap.dedent(
    """
    import json, sys, triton
    from yolojet.engine.engine import Engine
    from yolojet.engine.network import TritonNetwork

    compiled, during_capture = [], []
    triton.knobs.compilation.listener = lambda src, **_: compiled.append(src.name)
    capture = TritonNetwork._capture

    def watched(network):
        start = len(compiled)
        capture(network)
        during_capture.extend(compiled[start:])

    TritonNetwork._capture = watched
    engine = Engine.load(sys.argv[1], device="cuda", half=True, max_batch=2, tune=sys.argv[2] == "tune")
    print(json.dumps({"compiled": len(compiled), "during_capture": during_capture,
                      "phases": sorted(engine.network.startup_seconds)}))
    """
)


@needs_cuda
@pytest.mark.parametrize("tune_layers", [False, True])
def test_the_graph_capture_compiles_nothing(tmp_path, tune_layers):
    """Every kernel the network launches (tuned convs, SPPF's pools, the copies into concats, the decode) is
    compiled before the timing and the capture, which then only launch. In a fresh process with empty caches, so
    that no kernel is compiled in memory yet."""
    model_dir = yolojet.export(random_model("yolo11n.yaml"), out=tmp_path / "m", imgsz=96)
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"), YOLOJET_CACHE=str(tmp_path / "cache"))
    for switch in ("YOLOJET_COMPILE_WORKERS", "TRITON_ALWAYS_COMPILE"):  # either would turn the workers off
        env.pop(switch, None)
    mode = "tune" if tune_layers else "defaults"
    result = subprocess.run(
        [sys.executable, "-c", _CAPTURE_COMPILES, str(model_dir), mode], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["compiled"] >= 20 and report["during_capture"] == []
    assert {"compile", "compile_threads", "capture"} <= set(report["phases"])
    assert ("compile_workers" in report["phases"]) == tune_layers  # workers only when there is tuning to do
