"""The progress line of `dictation transcribe` for long files (stderr; Qt- and torch-free)."""

from __future__ import annotations

import sys
import time


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class TranscribeProgress:
    """'FILE: 40:00 of 2:00:00 (33%), pass 2/6, about 8:10 left' on stderr for a long file: one line
    rewritten on a terminal, a line per pass otherwise. The time left is the pace of the passes so far."""

    def __init__(self, name: str) -> None:
        self.name, self.clock, self.started = name, time.monotonic, None
        self.tty = sys.stderr.isatty()
        self.shown = False

    def update(self, p) -> None:
        now = self.clock()
        if self.started is None:
            self.started = now
        line = f"{self.name}: {_clock(p.done_seconds)} of {_clock(p.total_seconds)} ({p.fraction:.0%})"
        if p.chunk == 0:
            line += ", transcribing in one pass" if p.n_chunks == 1 else f", transcribing in {p.n_chunks} passes"
        else:
            line += f", pass {p.chunk}/{p.n_chunks}"
            if p.done_seconds < p.total_seconds:
                left = (now - self.started) / p.done_seconds * (p.total_seconds - p.done_seconds)
                line += f", about {_clock(left)} left"
        sys.stderr.write(f"\r{line}\033[K" if self.tty else line + "\n")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()
