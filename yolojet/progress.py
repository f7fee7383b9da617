"""Progress of long runs on stderr: a live bar on a terminal (tqdm), a plain line every 30 s in a log.

A bar that redraws itself is right for a terminal and wrong for a log file or a CI console, where every redraw is a
new line: there, a line with the count, the rate and the time left, at a fixed interval.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

LOG_INTERVAL_S = 30.0


class Progress:
    """Counts `total` items (None: unknown) and shows it; `write` prints a line without breaking the bar."""

    def __init__(self, total: int | None, label: str, unit: str = "img", enabled: bool = True) -> None:
        self.total, self.label, self.unit = total, label, unit
        self.count = 0
        self.started = time.monotonic()
        self._logged = self.started
        self._bar: Any = None
        self.enabled = enabled
        self.live = enabled and sys.stderr.isatty()
        if self.live:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, unit=unit, file=sys.stderr, dynamic_ncols=True)

    @property
    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.count / elapsed if elapsed > 0 else 0.0

    def update(self, n: int = 1) -> None:
        self.count += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.enabled and time.monotonic() - self._logged >= LOG_INTERVAL_S:
            self._logged = time.monotonic()
            print(self.status(), file=sys.stderr, flush=True)

    def status(self) -> str:
        """`label: 120/1000 img, 45.3 img/s, 19 s left`."""
        done = f"{self.count}/{self.total}" if self.total is not None else str(self.count)
        line = f"{self.label}: {done} {self.unit}, {self.rate:.1f} {self.unit}/s"
        if self.total is not None and self.rate > 0:
            line += f", {(self.total - self.count) / self.rate:.0f} s left"
        return line

    def write(self, line: str, file: IO[str] | None = None) -> None:
        file = file if file is not None else sys.stdout
        if self._bar is not None:
            self._bar.write(line, file=file)
        else:
            print(line, file=file)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
