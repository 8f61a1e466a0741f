"""What the command line writes on stderr besides its results: the error line, the progress bars of
downloads and of work counted in steps, and the progress line of `dictation transcribe` for long files
(Qt- and torch-free)."""

from __future__ import annotations

import sys
import time


def fail(message: str) -> int:
    print(f"dictation: error: {message}", file=sys.stderr)
    return 1


class CountBar:
    """ "label [#####.....] 120/398" on stderr, for work counted in steps (tensors)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.shown = False

    def update(self, done: int, total: int) -> None:
        width = 30
        filled = int(width * done / total) if total else 0
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")


class ProgressBar:
    """A one-line progress bar on stderr (no dependency; tqdm would be fine too)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.shown = False

    def update(self, done: int, total: int) -> None:
        width = 30
        frac = done / total if total else 0.0
        filled = int(frac * width)
        sys.stderr.write(
            f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] "
            f"{done / 1e9:.2f}/{total / 1e9:.2f} GB {frac * 100:5.1f}%"
        )
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")


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
