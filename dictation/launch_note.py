"""The note of what a launch needs from the settings: ``launch.json`` beside ``settings.json``.

Reading ``settings.json`` means building the whole settings schema (two dozen dataclasses and the
engine's option tables): a third of the time from the process's start to the hotkey grab
(`dictation.launch`). What the launch needs from it (the hotkeys, the microphone) is noted beside it
whenever the settings are written (`dictation.config.store`) or read by a launch, with the identity
(inode, size, modification time) of the file they came from, and used while ``settings.json`` is
that same file and the app the same version. A note that is wrong all the same costs nothing lasting:
the app reads the settings itself and takes the keys and the microphone over only where they match
(`dictation.launch.Early.take_hotkeys`, `take_recorder`, `EarlyHotkeys`).

Standard library only, and outside `dictation.config`, whose package import is what it saves.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

log = logging.getLogger(__name__)

NOTE_FILE = "launch.json"
FORMAT = 1
NOTED = {  # part of the settings -> field -> the type its value must have
    "hotkeys": {"backend": str, "hotkey": str, "cancel_key": str},
    "recording": {"input_device": str, "max_seconds": (int, float), "keep_mic_open": bool},
}


def note_path(settings_file: Path) -> Path:
    return settings_file.parent / NOTE_FILE


def file_identity(path: Path) -> list[int] | None:
    """(inode, size, modification time in ns) of ``path``; None when it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def _version() -> str:
    from dictation import __version__

    return __version__


def read(settings_file: Path, identity: list[int] | None) -> Any:
    """The noted settings (``.hotkeys``, ``.recording``, each with the fields of `NOTED`) when the
    note beside ``settings_file`` was made from the file whose identity is ``identity`` (None: no
    file) by this version of the app; else None (no note, another file, damaged)."""
    try:
        with open(note_path(settings_file), "rb") as f:
            note = json.loads(f.read(4096))
        if note.get("format") != FORMAT or note.get("version") != _version() or note.get("source") != identity:
            return None
        parts = {}
        for part, fields in NOTED.items():
            values = {k: note[part][k] for k in fields}
            for k, kind in fields.items():
                if not isinstance(values[k], kind) or (kind is not bool and isinstance(values[k], bool)):
                    return None
            parts[part] = SimpleNamespace(**values)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return SimpleNamespace(**parts)


def write(settings_file: Path, settings: Any, identity: list[int] | None) -> None:
    """Note what a launch needs from ``settings``, which are what the file whose identity is
    ``identity`` holds. Nothing is noted when ``settings_file`` is no longer that file (changed
    meanwhile: the next launch reads it). Owner-only, written whole or not at all; failing to
    write is no error (the next launch reads the settings)."""
    if file_identity(settings_file) != identity:
        return
    note = {"format": FORMAT, "version": _version(), "source": identity}
    note |= {part: {k: getattr(getattr(settings, part), k) for k in fields} for part, fields in NOTED.items()}
    path = note_path(settings_file)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        from dictation.private import private_dir

        private_dir(path.parent)  # no settings saved yet: the config folder may not exist
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(note, f)
        os.replace(temporary, path)
    except (OSError, TypeError, ValueError) as exc:
        log.info("cannot note the launch settings in %s: %s", path, exc)
        with contextlib.suppress(OSError):
            os.unlink(temporary)
