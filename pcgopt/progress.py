"""A one-line progress display for long jobs (stderr; a line every 10% when not a terminal)."""

from __future__ import annotations

import sys
import time
from collections import Counter


class Progress:
    """``Progress(total, "verifying")``; ``update(tag)`` per finished item; ``close()``."""

    def __init__(self, total: int, label: str = "", *, stream=None) -> None:
        self.total, self.label, self.done, self.counts = total, label, 0, Counter()
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self.tty = self.stream.isatty()
        self.next_report = 0.1

    def update(
        self, tag: str | None = None, n: int = 1, *, note: str = "", fraction: float | None = None
    ) -> None:
        """One more item done (``n``), counted under ``tag`` (e.g. "proved"). ``note`` replaces
        the count and tags (e.g. "iteration 3: 48,659 e-nodes"); ``fraction`` sets how full the
        bar is, for work bounded by several limits at once (iterations, time, e-nodes)."""
        self.done += n
        if tag:
            self.counts[tag] += n
        frac = self.done / max(1, self.total) if fraction is None else min(1.0, fraction)
        detail = note or (
            f"{self.done}/{self.total}  "
            + "  ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        )
        line = (
            f"{self.label + ' ' if self.label else ''}[{'#' * int(frac * 30):<30}] "
            f"{detail}  {time.perf_counter() - self.start:.0f}s"
        )
        if self.tty:
            print("\r" + line, end="", file=self.stream, flush=True)
        elif frac >= self.next_report or frac >= 1:
            print(line, file=self.stream, flush=True)
            while self.next_report <= frac:
                self.next_report += 0.1

    def close(self) -> None:
        if self.tty:
            print(file=self.stream)
