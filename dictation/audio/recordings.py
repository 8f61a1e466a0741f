"""Every take on disk while it is recorded and before it is transcribed (docs/architecture.md, principle 7); the
newest N kept.

A take is written as it is recorded (`TakeFile`): the app appends the new audio and updates the
WAV header's sizes about every half second, so a crash or ``kill -9`` mid-take leaves a valid WAV
that lacks at most the last half second, under the name the finished take will have. At the end
`TakeFile.finish` replaces it atomically with the complete take (16 kHz), so the file is always
either the growing take or the whole take, never a torn one.

Files are named ``rec-YYYYmmddTHHMMSS.fffZ.wav`` in UTC (``-2``, ``-3``... when two takes fall in the
same millisecond), so names sort by time, never collide across time zones or clock changes, and
pruning can tell our files from anything else a user put in the folder: only names matching that
pattern are ever deleted.

The folder is the user's alone (`recordings_folder`): a real folder is made 0700; a link in its
place (recordings moved to another disk) is followed only to a folder of this user that no one
else can open. Otherwise nothing is written there and the error says why and what to do.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import struct
from collections.abc import Collection
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from dictation.asr import SAMPLE_RATE
from dictation.audio.wav import write_wav
from dictation.paths import recordings_dir
from dictation.private import private_dir

log = logging.getLogger(__name__)

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
    folder = recordings_folder(directory)  # 0700; the file itself is created 0600 (_reserve_name, write_wav)
    path = _reserve_name(folder, now or datetime.now(timezone.utc))
    try:
        write_wav(path, samples, sample_rate)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    if keep is not None:
        prune_recordings(keep, directory=folder, protect=path)
    return path


def recordings_folder(directory: str | os.PathLike | None = None) -> Path:
    """The folder takes are written to (``directory``, default `recordings_dir()`), made ready: a real
    folder is created or made private (0700). A link there is followed only to a folder of this
    user's that group and others cannot open; otherwise OSError says why and what to do, and nothing
    is written (its files would be 0600, but their names and times would be listed to anyone)."""
    folder = Path(directory) if directory is not None else recordings_dir()
    if not os.path.islink(folder):
        return private_dir(folder)
    target = os.path.realpath(folder)
    try:
        st = os.stat(folder)
    except OSError as exc:
        raise OSError(f"{folder} is a link to {target}, which cannot be used ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{folder} is a link to {target}, which is not a folder")
    if st.st_uid != os.getuid():
        raise PermissionError(
            f"{folder} is a link to {target}, a folder of another user (uid {st.st_uid}); not writing there"
        )
    if st.st_mode & 0o077:
        raise PermissionError(
            f"{folder} is a link to {target}, which other users can open (mode {stat.S_IMODE(st.st_mode):o}); "
            f"not writing recordings there: make it private (chmod 700 {target}) or remove the link",
        )
    return folder


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
    keep: int,
    *,
    directory: str | os.PathLike | None = None,
    protect: Path | Collection[Path] | None = None,
) -> list[Path]:
    """Delete our recordings older than the newest ``keep``; returns the deleted paths.

    ``protect``: a path or paths never deleted (the take just saved, takes still being recorded
    or transcribed, history entries whose text is not known yet); they count among the newest.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    if protect is None:
        protected: set[Path] = set()
    elif isinstance(protect, (str, os.PathLike)):
        protected = {Path(protect).resolve()}
    else:
        protected = {Path(p).resolve() for p in protect}
    recordings = list_recordings(directory)
    deleted = []
    for path in recordings[: max(0, len(recordings) - keep)]:
        if path.resolve() in protected:
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


class TakeFile:
    """A take written to disk while it is recorded (16-bit PCM WAV at the device's rate).

    `create` reserves the take's name; `append` adds samples and updates the header's sizes, so
    what has been appended is a valid WAV at once (one ``write`` per call, no buffering in this
    process: a killed app loses nothing appended). `finish` replaces the file atomically with the
    whole take; `discard` deletes it. Errors raise OSError naming the file.
    """

    def __init__(self, path: Path, fd: int, sample_rate: int) -> None:
        self.path = path
        self.sample_rate = sample_rate
        self.frames = 0
        self._fd: int | None = fd

    @classmethod
    def create(
        cls,
        sample_rate: int = SAMPLE_RATE,
        *,
        directory: str | os.PathLike | None = None,
        now: datetime | None = None,
    ) -> TakeFile:
        folder = recordings_folder(directory)
        path = _reserve_name(folder, now or datetime.now(timezone.utc))
        try:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, _wav_header(sample_rate, 0))
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return cls(path, fd, int(sample_rate))

    def append(self, samples: np.ndarray) -> None:
        """Write ``samples`` (float in [-1, 1]) after the audio so far, then the new sizes."""
        if self._fd is None:
            raise ValueError(f"{self.path}: the take file is closed")
        pcm = np.clip(np.round(np.asarray(samples, dtype=np.float32) * 32768.0), -32768, 32767).astype("<i2")
        if not len(pcm):
            return
        data = pcm.tobytes()
        offset = _HEADER_BYTES + self.frames * 2
        try:
            written = os.pwrite(self._fd, data, offset)
            if written != len(data):
                raise OSError(f"short write ({written} of {len(data)} bytes)")
            frames = self.frames + len(pcm)
            os.pwrite(self._fd, struct.pack("<I", 36 + frames * 2), 4)
            os.pwrite(self._fd, struct.pack("<I", frames * 2), _HEADER_BYTES - 4)
        except OSError as exc:
            raise OSError(exc.errno, f"{self.path}: cannot write the recording ({exc.strerror or exc})") from None
        self.frames = frames

    def finish(self, samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> Path:
        """Replace the file with the whole take (atomically, fsynced) and close it; its path."""
        self._close()
        write_wav(self.path, samples, sample_rate)
        return self.path

    def close(self) -> None:
        """Leave the file as it is (the app quits mid-take: the next start transcribes it)."""
        self._close()

    def discard(self) -> None:
        """Close and delete the file (a cancelled take, or one that could not be kept whole)."""
        self._close()
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot delete the recording %s: %s", self.path, exc)

    def _close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


_HEADER_BYTES = 44


def _wav_header(sample_rate: int, frames: int) -> bytes:
    """The 44-byte header of a mono 16-bit PCM WAV holding ``frames`` frames."""
    data = frames * 2
    return b"".join(
        [
            b"RIFF",
            struct.pack("<I", 36 + data),
            b"WAVE",
            b"fmt ",
            struct.pack("<IHHIIHH", 16, 1, 1, int(sample_rate), int(sample_rate) * 2, 2, 16),
            b"data",
            struct.pack("<I", data),
        ]
    )
