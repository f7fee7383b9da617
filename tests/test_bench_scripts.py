"""The GPU benchmark scripts import on any machine (a broken import would otherwise surface only on a GPU machine),
and their results name the commit measured."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(autouse=True)
def bench_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))


@pytest.mark.parametrize("script", ["bench_network", "bench_pipeline", "provenance"])
def test_script_imports(script):
    module = importlib.import_module(script)
    assert module.__doc__


def test_provenance_names_the_commit(monkeypatch):
    from provenance import provenance

    monkeypatch.setenv("YOLOJET_COMMIT", "0123abc")
    assert provenance()["commit"] == "0123abc"
    monkeypatch.delenv("YOLOJET_COMMIT")
    in_git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCH, capture_output=True, text=True).returncode == 0
    info = provenance()
    assert re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?", info["commit"]) if in_git else info["commit"] == "?"
    assert set(info) == {"date", "gpu", "torch", "triton", "commit"}
    assert sys.modules["provenance"].__file__.startswith(str(BENCH))
