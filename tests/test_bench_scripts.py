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
        "tile_offers",
        "first_replays",
        "kernel_counters",
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


def test_tile_offers_widen_the_offer_inside_and_restore_it_after():
    """Each offer of bench/tile_offers.py changes what the tuner is offered only while its engine is built and timed:
    8-warp twins, TMA tiles from 2^14 output pixels, three persistent programs an SM, the product less its 8-warp
    persistent tile; and the product's offer comes back after each."""
    import tile_offers

    from yolojet.kernels.conv import config, dispatch

    def offered(m: int, n: int, k: int, is_1x1: bool) -> list:
        return config.conv_candidate_configs(m, n, k, is_1x1)

    large_1x1, small_3x3 = (64 * 80 * 60, 128, 96, True), (64 * 20 * 15, 128, 9 * 128, False)
    product = (offered(*large_1x1), offered(*small_3x3), dispatch._PERSISTENT_PROGRAMS_PER_SM)
    eight_warp_persistent = [c for c in product[0] if c.persistent and c.num_warps == 8]
    assert eight_warp_persistent and not any(c.loads_by_tma for c in product[1])
    with tile_offers.offer("warps8"):
        assert sum(c.num_warps == 8 for c in offered(*large_1x1)) > sum(c.num_warps == 8 for c in product[0])
    with tile_offers.offer("tma-small"):
        assert any(c.loads_by_tma for c in offered(*small_3x3))
    with tile_offers.offer("persistent3"):
        assert dispatch._PERSISTENT_PROGRAMS_PER_SM == 3
        assert any(c.persistent and c.num_stages == 2 for c in offered(*large_1x1))
    with tile_offers.offer("no-eight-warp-1x1"):
        assert not any(c in eight_warp_persistent for c in offered(*large_1x1))
    assert (offered(*large_1x1), offered(*small_3x3), dispatch._PERSISTENT_PROGRAMS_PER_SM) == product
    with pytest.raises(SystemExit, match="unknown offer"), tile_offers.offer("nothing"):
        pass
