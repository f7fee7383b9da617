"""Writing outputs without losing data (yolojet/outputs.py): links followed, special files written straight, whole
files atomic, JSON lines whole and on disk as they come."""

from __future__ import annotations

import json
import os
import threading

import pytest

from yolojet.errors import OutputPathError
from yolojet.outputs import JsonLines, check_output_file, write_atomically, write_small_file


def test_atomic_write_follows_a_chain_of_links(tmp_path):
    target = tmp_path / "data" / "metrics.json"
    target.parent.mkdir()
    target.write_text("old")
    (tmp_path / "middle.json").symlink_to(target)
    (tmp_path / "first.json").symlink_to(tmp_path / "middle.json")
    write_atomically(tmp_path / "first.json", lambda p: p.write_text("new"))
    assert target.read_text() == "new"
    assert (tmp_path / "first.json").is_symlink() and (tmp_path / "middle.json").is_symlink()
    assert sorted(p.name for p in target.parent.iterdir()) == ["metrics.json"]  # no staging file left


def test_failed_atomic_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("old")

    def half_write(path):
        path.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomically(target, half_write)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_small_files_are_whole_written_through_links_and_leave_nothing_behind(tmp_path):
    folder = tmp_path / "labels"
    folder.mkdir()
    umask = os.umask(0o022)
    try:
        write_small_file(str(folder / "a.txt"), b"0 0.5 0.5 0.1 0.1\n")
        write_small_file(str(folder / "a.txt"), b"1 0.25 0.25 0.2 0.2\n")  # replaced whole
    finally:
        os.umask(umask)
    assert (folder / "a.txt").read_bytes() == b"1 0.25 0.25 0.2 0.2\n"
    assert (folder / "a.txt").stat().st_mode & 0o777 == 0o644  # as a plain write under the umask
    elsewhere = tmp_path / "kept" / "b.txt"
    elsewhere.parent.mkdir()
    elsewhere.write_text("old")
    (folder / "b.txt").symlink_to(elsewhere)
    write_small_file(str(folder / "b.txt"), b"new")
    assert (folder / "b.txt").is_symlink() and elsewhere.read_text() == "new"
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt", "b.txt"]  # no staging file left
    assert sorted(p.name for p in elsewhere.parent.iterdir()) == ["b.txt"]
    with pytest.raises(OutputPathError, match=r"c\.txt: cannot write there"):
        write_small_file(str(tmp_path / "missing" / "c.txt"), b"x")
    big = os.urandom(3 << 20)  # more than one write's worth on some systems
    write_small_file(str(folder / "big.bin"), big)
    assert (folder / "big.bin").read_bytes() == big


def test_json_lines_are_whole_and_on_disk_as_they_come(tmp_path):
    path = tmp_path / "out.jsonl"
    records = JsonLines(path, sync_every=2)
    assert not path.exists()  # created by the first record
    records.write({"a": 1})
    assert path.read_text() == '{"a":1}\n'  # flushed at once
    records.write({"b": [1, 2]})
    records.close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"a": 1}, {"b": [1, 2]}]

    with JsonLines(path, append=True) as more:  # a resumed run keeps what is there
        more.write({"c": None})
    assert path.read_text().splitlines()[-1] == '{"c":null}'
    with JsonLines(path) as fresh:
        fresh.write({"d": 0})
    assert path.read_text() == '{"d":0}\n'
    fresh.write({"e": 1})  # a late writer after close (a reply thread still running) adds, never replaces
    fresh.close()
    assert path.read_text() == '{"d":0}\n{"e":1}\n'


def test_json_lines_flushed_in_batches_reach_the_file_within_their_bound(tmp_path):
    """A labeling run writes its records 64 at a time: a reader of the file (or a kill) sees all but fewer than 64,
    and the ones held back reach it within flush_seconds of the last flush, and at close."""
    path = tmp_path / "out.jsonl"
    records = JsonLines(path, flush_every=4, flush_seconds=3600)
    for i in range(10):
        records.write({"i": i})
    assert [json.loads(line)["i"] for line in path.read_text().splitlines()] == list(range(8))
    records.flush_seconds = 0.0  # the next record finds the time passed: it and those held back go out
    records.write({"i": 10})
    assert len(path.read_text().splitlines()) == 11
    records.flush_seconds = 3600
    records.write({"i": 11})
    records.close()
    assert [json.loads(line)["i"] for line in path.read_text().splitlines()] == list(range(12))
    special = JsonLines(os.devnull, flush_every=64)
    assert special.flush_every == 1  # standard output and special files are read as they come


def test_json_lines_from_many_threads_keep_every_record(tmp_path):
    """A labeler writes its error log from the thread reading files and the one taking replies; the first writes
    may come at once, and each must still open the file once and keep every line."""
    for attempt in range(20):
        out = JsonLines(tmp_path / f"log{attempt}.jsonl")
        start = threading.Barrier(8)

        def writer(n: int, out: JsonLines = out, start: threading.Barrier = start) -> None:
            start.wait()
            for i in range(25):
                out.write({"writer": n, "i": i})

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out.close()
        found = [json.loads(line) for line in (tmp_path / f"log{attempt}.jsonl").read_text().splitlines()]
        assert sorted((r["writer"], r["i"]) for r in found) == [(n, i) for n in range(8) for i in range(25)]


def test_json_lines_through_a_link(tmp_path):
    real = tmp_path / "real.jsonl"
    real.write_text('{"old": true}\n')
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    with JsonLines(link, append=True) as records:
        records.write({"new": True})
    assert link.is_symlink()
    assert real.read_text() == '{"old": true}\n{"new":true}\n'


def test_output_checks_name_what_is_wrong(tmp_path):
    with pytest.raises(OutputPathError, match="is a directory"):
        check_output_file(tmp_path, "--json")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OutputPathError, match="exists and is not a directory"):
        check_output_file(blocker / "out.jsonl", "--json")
    link = tmp_path / "to_dir"
    link.symlink_to(tmp_path)
    with pytest.raises(OutputPathError, match="is a directory"):
        check_output_file(link, "--json")
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(OutputPathError, match="not writable"):
            check_output_file(locked / "out.jsonl", "--json")
