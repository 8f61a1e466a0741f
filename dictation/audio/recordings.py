"""Every take on disk before it is transcribed (DESIGN.md §1.7), and only the newest N kept.

Files are named ``rec-YYYYmmddTHHMMSS.fffZ.wav`` in UTC (``-2``, ``-3``... when two takes fall in the
same millisecond), so names sort by time, never collide across time zones or clock changes, and
pruning can tell our files from anything else a user put in the folder: only names matching that
pattern are ever deleted.
"""

from __future__ import annotations

import logging
import os
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from dictation.audio.wav import write_wav
from dictation.paths import recordings_dir
from dictation.private import private_dir

log = logging.getLogger(__name__)

SAMPLE_RATE = 16_000
_NAME = re.compile(r"^rec-(\d{8}T\d{6}\.\d{3})Z(?:-(\d+))?\.wav$")


def save_recording(
    samples: np.ndarray,
    sample_rate: int = SAMPLE_RATE,
    *,
    directory: str | os.PathLike | None = None,
    keep: int | None = None,
    now: datetime | None = None,
) -> Path:
    """Write ``samples`` as a 16-bit WAV with a new timestamped name and return its path.

    ``directory`` defaults to `recordings_dir()`; ``now`` (default: the current time) names the file.
    With ``keep``, older recordings beyond the newest ``keep`` are deleted afterwards; the new file
    always survives. Write errors raise OSError naming the file; pruning errors are only logged.
    """
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be at least 1 (or None to keep everything), got {keep}")
    folder = Path(directory) if directory is not None else recordings_dir()
    private_dir(folder)  # 0700; the file itself is created 0600 (_reserve_name, write_wav)
    path = _reserve_name(folder, now or datetime.now(timezone.utc))
    try:
        write_wav(path, samples, sample_rate)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    if keep is not None:
        prune_recordings(keep, directory=folder, protect=path)
    return path


def list_recordings(directory: str | os.PathLike | None = None) -> list[Path]:
    """Our recordings in ``directory``, oldest first (other files are ignored)."""
    folder = Path(directory) if directory is not None else recordings_dir()
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    ours = []
    for entry in entries:
        match = _NAME.match(entry.name)
        if match and entry.is_file(follow_symlinks=False):
            ours.append(((match.group(1), int(match.group(2) or 1)), Path(entry.path)))
    return [path for _, path in sorted(ours)]


def prune_recordings(
    keep: int, *, directory: str | os.PathLike | None = None, protect: Path | None = None
) -> list[Path]:
    """Delete our recordings older than the newest ``keep``; returns the deleted paths."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    recordings = list_recordings(directory)
    deleted = []
    for path in recordings[: max(0, len(recordings) - keep)]:
        if protect is not None and path == protect:
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue  # deleted by someone else meanwhile
        except OSError as exc:
            log.warning("cannot delete old recording %s: %s", path, exc)
            continue
        deleted.append(path)
    return deleted


def _reserve_name(folder: Path, now: datetime) -> Path:
    """Create an empty file under a free name (O_EXCL, so concurrent savers never share one)."""
    stamp = now.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%S.%f")[:-3]
    for n in range(1, 10_000):
        path = folder / (f"rec-{stamp}Z.wav" if n == 1 else f"rec-{stamp}Z-{n}.wav")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        os.close(fd)
        return path
    raise OSError(f"{folder}: no free recording name for {stamp}")
