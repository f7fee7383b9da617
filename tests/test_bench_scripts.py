"""The GPU benchmark scripts import on any machine (a broken import would otherwise surface only on a GPU machine)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(autouse=True)
def bench_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))


@pytest.mark.parametrize(
    "script",
    [
        "bench_network",
        "bench_pipeline",
        "bench_images",
        "bench_serve",
        "bench_overload",
        "bench_conv_ceiling",
        "bench_one_to_one",
        "bench_server_cpu",
        "bench_feed_handoff",
        "bench_file_reads",
        "bench_label_formats",
        "launch_census",
        "probe_serve",
        "sampler",
    ],
)
def test_script_imports(script):
    module = importlib.import_module(script)
    assert module.__doc__


def test_conv_ceiling_checks_the_tile_it_picks_against_cudnn(monkeypatch):
    """bench_conv_ceiling's shape run on a small stride-2 conv (under the interpreter without a GPU): it offers
    the tiles this conv's views allow (here TMA patches too, through the paired-pixel view), and checks every one's
    output against torch's fp32 conv, as it does the same GEMM's through the 1x1 kernel."""
    import bench_conv_ceiling

    from yolojet.kernels.conv import config as conv_config

    if not torch.cuda.is_available():  # the kernels run under the interpreter (conftest)
        monkeypatch.setattr(bench_conv_ceiling, "DEVICE", "cpu")
    monkeypatch.setattr(bench_conv_ceiling, "median_ms", lambda fn: (fn(), 1.0)[1])
    monkeypatch.setattr(conv_config, "_TMA_MIN_M", 1)  # TMA tiles are offered from 2^16 output pixels
    row = bench_conv_ceiling.bench_shape("small", 2, 8, 8, 32, 48, 32, 3, 2)
    assert row["M"] == 2 * 4 * 4 and row["K"] == 9 * 32
    assert any("tile_w=" in name and "tile_w=0" not in name for name in row["conv_errors"])
    assert set(row["conv_errors"]) == set(row["conv_candidates"]) and row["conv_config"] in row["conv_errors"]
    assert row["worst_rel_l2"] < 1e-2, {**row["conv_errors"], **row["gemm_errors"]}


def test_one_to_one_checks_its_kernels_against_the_torch_ops(monkeypatch):
    """bench_one_to_one's case on a small head (under the interpreter without a GPU, one run standing in for the
    timed replays): both selections run and select the same scores, for both kinds of scores."""
    import bench_one_to_one

    from yolojet.timing import Timing

    if not torch.cuda.is_available():  # the kernels run under the interpreter (conftest)
        monkeypatch.setattr(bench_one_to_one, "DEVICE", "cpu")
    monkeypatch.setattr(bench_one_to_one, "time_replays", lambda run, iters, warmup: (run(), Timing((1e-3,)))[1])
    for scores in ("independent", "correlated"):
        row = bench_one_to_one.bench_case("small", 400, 80, 2, 2, scores, iters=1, warmup=0, profile=False)
        assert row["same_scores"] and row["kernels_ms"]["p50"] == 1.0, row


def test_label_formats_bench_makes_both_formats(tmp_path):
    import json
    import subprocess
    import sys

    run = [sys.executable, str(BENCH / "bench_label_formats.py"), "--records", "40", "--task", "segment"]
    found = json.loads(
        subprocess.run([*run, "--under", str(tmp_path)], check=True, capture_output=True, text=True).stdout
    )
    assert found["records"] == 40 and found["coco workers=default"]["seconds"] > 0
    assert found["yolo workers=default"]["peak_rss_mib"] > 0
