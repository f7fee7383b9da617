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
    ["bench_network", "bench_pipeline", "bench_images", "bench_serve", "bench_conv_ceiling", "sampler"],
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
