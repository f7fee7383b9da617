"""The environment variables yolojet honours are read in one module, `yolojet/options.py`, when asked."""

from __future__ import annotations

import re
from pathlib import Path

import yolojet
from yolojet import options


def test_the_environment_is_read_only_in_options(monkeypatch, tmp_path):
    monkeypatch.setenv("YOLOJET_CACHE", str(tmp_path))
    monkeypatch.setenv("YOLOJET_NOTUNE", "1")
    monkeypatch.setenv("YOLOJET_PDL", "0")
    monkeypatch.setenv("YOLOJET_BRANCHES", "1")
    monkeypatch.setenv("YOLOJET_COMPILE_WORKERS", "3")
    monkeypatch.setenv("YOLOJET_TOKEN", "  secret \n")
    assert options.cache_dir() == tmp_path
    assert options.tuning_off() and options.pdl_off() and not options.branches_off()
    assert options.compile_workers_asked() == 3 and options.serve_token() == "secret"
    monkeypatch.setenv("YOLOJET_COMPILE_WORKERS", "many")
    monkeypatch.delenv("YOLOJET_NOTUNE")
    assert options.compile_workers_asked() is None and not options.tuning_off()

    reads = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[|environ\.get\(")
    package = Path(yolojet.__file__).parent
    readers = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "options.py" and reads.search(path.read_text())
    )
    assert not readers, f"environment variables read outside yolojet/options.py: {readers}"


def test_engine_options_resolve_tuning_and_take_keywords_that_differ_from_their_defaults(monkeypatch):
    monkeypatch.setenv("YOLOJET_NOTUNE", "1")
    assert not options.EngineOptions().tuning() and options.EngineOptions(tune=True).tuning()
    monkeypatch.delenv("YOLOJET_NOTUNE")
    assert options.EngineOptions().tuning() and not options.EngineOptions(tune=False).tuning()
    given = options.EngineOptions(tune=False, fuse=False, pdl=False)
    # Engine.load(switches=given) with its keywords at their defaults keeps every switch given ...
    assert given.overridden(tune=None, fuse=True, pdl=None, branches=None) == given
    # ... and a keyword given beside it wins.
    assert given.overridden(tune=None, fuse=True, pdl=True, branches=False) == options.EngineOptions(
        tune=False, fuse=False, pdl=True, branches=False
    )


def test_the_switch_interval_is_set_by_yolojets_commands_and_a_bad_value_is_named(monkeypatch, tmp_path, capsys):
    import sys

    from yolojet.cli import main

    before = sys.getswitchinterval()
    try:
        monkeypatch.setenv("YOLOJET_SWITCH_INTERVAL_MS", "0.25")
        assert options.switch_interval_s() == 0.25e-3
        main(["info", str(tmp_path / "no-such-model")])  # any command: the interval is set before it runs
        assert abs(sys.getswitchinterval() - 0.25e-3) < 1e-9
        for bad in ("fast", "0", "-1", "nan", "5000"):
            monkeypatch.setenv("YOLOJET_SWITCH_INTERVAL_MS", bad)
            assert main(["info", str(tmp_path / "no-such-model")]) == 2
            assert f"YOLOJET_SWITCH_INTERVAL_MS='{bad}': expected milliseconds" in capsys.readouterr().err
        monkeypatch.delenv("YOLOJET_SWITCH_INTERVAL_MS")
        assert options.switch_interval_s() is None
    finally:
        sys.setswitchinterval(before)
