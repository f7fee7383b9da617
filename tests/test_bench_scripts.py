"""The GPU benchmark scripts import on any machine (a broken import would otherwise surface only on a GPU machine),
and their results name the commit measured."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(autouse=True)
def bench_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))


@pytest.mark.parametrize("script", ["bench_network", "bench_pipeline", "bench_conv_ceiling", "provenance"])
def test_script_imports(script):
    module = importlib.import_module(script)
    assert module.__doc__


def test_provenance_names_the_commit(monkeypatch):
    from provenance import provenance

    monkeypatch.setenv("YOLOJET_COMMIT", "0123abc")
    assert provenance()["commit"] == "0123abc"
    monkeypatch.delenv("YOLOJET_COMMIT")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCH, capture_output=True, text=True)
    info = provenance()
    if head.returncode == 0:  # a checkout: an abbreviation of git's own HEAD, marked when files differ from it
        short = info["commit"].removesuffix("-dirty")
        assert len(short) >= 7 and head.stdout.strip().startswith(short), (info["commit"], head.stdout)
    else:
        assert info["commit"] == "?"
    assert set(info) == {"date", "gpu", "torch", "triton", "commit"}
