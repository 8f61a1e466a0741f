"""The user's own files are theirs alone: folders 0700, files 0600, whatever the umask.

What the user says (history, recordings), their vocabulary (settings) and the log are written into
the app's folders (`dictation.paths.private_folders`). Each writer makes its folder with
`private_dir` and creates its files owner-only (`create_private_file`, `tempfile.mkstemp`, or
`make_private` right after a library created one with its own mode, as SQLite does). At start the
app runs `repair` over all of them, for installs from before this was enforced (their files were
0644 in 0755 folders); `exposed` lists what other users can still read, for `dictation doctor`.

Only group and other bits are ever removed (``mode & 0o700``): a folder the user made read-only
stays read-only. Links are not followed below the top folders, and files or folders of another
owner are left alone (they cannot be changed, and are reported by `exposed`). On Windows, where
POSIX modes mean nothing, every function here does nothing.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
_ENABLED = os.name == "posix"


def private_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` as a folder only its owner can open (missing parents too), or take group and
    other bits off the existing one; returns it. Raises OSError when it cannot be created."""
    path = Path(path)
    if not _ENABLED:
        path.mkdir(parents=True, exist_ok=True)
        return path
    missing = []
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by another thread or process: tightened like an existing one
        os.chmod(folder, DIR_MODE)  # exactly 0700, whatever bits the umask took off
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
    _tighten(path, follow=True)  # an existing folder, or one made meanwhile by another process
    return path


def create_private_file(path: str | os.PathLike) -> Path:
    """Create ``path`` empty with mode 0600 if it does not exist (else leave its content alone and take
    group and other bits off it): for files another library then opens with its own default mode."""
    path = Path(path)
    if not _ENABLED:
        path.touch(exist_ok=True)
        return path
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    except FileExistsError:
        # An existing file is never opened here: closing any descriptor of a file drops every POSIX
        # lock this process holds on it, such as SQLite's on a database another of our connections
        # has open (the history's worker reconnecting beside the GUI's reader broke its WAL locks).
        if os.path.isdir(path):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path)) from None
        make_private(path)
        return path
    os.close(fd)
    return path


def make_private(path: str | os.PathLike) -> bool:
    """Take group and other bits off an existing file or folder of ours (links are left alone);
    True if it changed. A missing path is no error."""
    if not _ENABLED:
        return False
    try:
        return _tighten(Path(path), follow=False)
    except FileNotFoundError:
        return False


def repair(folders: Iterable[str | os.PathLike]) -> list[Path]:
    """Make every folder and file under ``folders`` owner-only; returns what was changed. Errors on
    single entries are logged and skipped: a start never fails here."""
    changed: list[Path] = []
    if not _ENABLED:
        return changed
    for path, _ in _walk(folders):
        try:
            if _tighten(path, follow=False):
                changed.append(path)
        except OSError as exc:
            log.warning("cannot make %s private: %s", path, exc.strerror or exc)
    return changed


def exposed(folders: Iterable[str | os.PathLike]) -> list[tuple[Path, int]]:
    """Folders and files under ``folders`` that group or others may read, write or enter: (path, mode)."""
    if not _ENABLED:
        return []
    return [(path, mode) for path, mode in _walk(folders) if mode & 0o077]


def _walk(folders: Iterable[str | os.PathLike]) -> Iterator[tuple[Path, int]]:
    """Each top folder (through a link, if the user linked it elsewhere) and everything below it
    (links there are not followed or reported), with its mode; each path once."""
    seen: set[Path] = set()
    for top in folders:
        top = Path(top)
        try:
            st = os.stat(top)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or top in seen:
            continue
        seen.add(top)
        yield top, stat.S_IMODE(st.st_mode)
        for root, dirs, files in os.walk(top, followlinks=False):
            for name in dirs + files:
                path = Path(root) / name
                if path in seen:
                    continue
                seen.add(path)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                    yield path, stat.S_IMODE(st.st_mode)


def _tighten(path: Path, *, follow: bool) -> bool:
    st = os.stat(path) if follow else os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid():
        return False
    mode = stat.S_IMODE(st.st_mode)
    wanted = mode & 0o700
    if wanted == mode:
        return False
    os.chmod(path, wanted)
    return True
