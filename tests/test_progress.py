"""Progress in a log (stderr not a terminal): a plain status line at a fixed interval, never a redraw a line."""

from __future__ import annotations

import yolojet.progress as progress_module
from yolojet.progress import LOG_INTERVAL_S, Progress


def test_a_log_gets_a_line_every_interval_not_a_redraw_per_line(capsys, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    progress = Progress(120, "detect")
    assert not progress.live  # capsys' stderr is no terminal
    for i in range(120):
        now[0] += 1.0  # an image a second: two minutes in all
        progress.update(1)
        progress.write(f"image {i}: 3 detections")
    progress.close()
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"image {i}: 3 detections" for i in range(120)]
    status = err.splitlines()
    assert len(status) == int(120 // LOG_INTERVAL_S)  # 4 lines, not 120 redraws
    assert status[0] == "detect: 30/120 img, 1.0 img/s, 90 s left"
    quiet = Progress(20, "detect", enabled=False)
    for _ in range(20):
        now[0] += 10.0
        quiet.update(1)
    assert capsys.readouterr().err == ""
