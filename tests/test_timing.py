"""The one timing helper: quantiles as numpy computes them, warm-up calls untimed, the device synchronised around each
timed call, and what a timing was measured on."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from yolojet.timing import Timing, provenance, time_calls


def test_quantiles_are_numpys_and_p50_is_the_median():
    rng = np.random.default_rng(7)
    for n in (1, 2, 5, 200):
        samples = rng.exponential(1e-3, n)
        timing = Timing(tuple(samples))
        for q, got in ((0.2, timing.p20), (0.5, timing.p50), (0.8, timing.p80)):
            assert got == pytest.approx(float(np.quantile(samples, q)), rel=1e-12)
        assert timing.p50 == pytest.approx(float(np.median(samples)))
    summary = Timing((0.001, 0.002, 0.003)).summary_ms()
    assert summary == {
        "p20_ms": pytest.approx(1.4),
        "p50_ms": pytest.approx(2.0),
        "p80_ms": pytest.approx(2.6),
        "repeats": 3,
    }
    with pytest.raises(ValueError, match="at least one sample"):
        Timing(())


def test_time_calls_times_each_call_after_the_warmup_between_synchronisations():
    events = []
    timing = time_calls(lambda: events.append("call"), repeats=4, warmup=2, synchronize=lambda: events.append("sync"))
    assert len(timing.seconds) == 4 and all(s >= 0 for s in timing.seconds)
    assert events == ["call", "call"] + ["sync", "call", "sync"] * 4
    with pytest.raises(ValueError, match="repeats"):
        time_calls(lambda: None, repeats=0)


def test_provenance_names_the_commit(monkeypatch):
    monkeypatch.setenv("YOLOJET_COMMIT", "0123abc")
    assert provenance()["commit"] == "0123abc"  # a copy of the code without .git, on a benchmark machine
    monkeypatch.delenv("YOLOJET_COMMIT")
    here = Path(__file__).resolve().parent
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True)
    info = provenance()
    if head.returncode == 0:  # a checkout: an abbreviation of git's own HEAD, marked when files differ from it
        short = info["commit"].removesuffix("-dirty")
        assert len(short) >= 7 and head.stdout.strip().startswith(short), (info["commit"], head.stdout)
    else:
        assert info["commit"] == "?"
    assert set(info) == {"date", "gpu", "torch", "triton", "yolojet", "commit"}
