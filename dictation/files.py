"""Opening the files a user points us at (models, adapters, audio): regular files only.

``open()`` on a FIFO waits until some other process opens it for writing, possibly for ever, and a
character device can stream without end. So files are opened without blocking and refused unless
``fstat`` says they are regular files; the refusal is an ``OSError`` whose ``strerror`` says what the
path is, so the callers' ``cannot be read (...)`` messages name the problem. Torch-free.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

_KINDS = (
    (stat.S_ISDIR, "is a directory"),
    (stat.S_ISFIFO, "is a FIFO (named pipe), not a regular file"),
    (stat.S_ISSOCK, "is a socket, not a regular file"),
    (stat.S_ISCHR, "is a character device, not a regular file"),
    (stat.S_ISBLK, "is a block device, not a regular file"),
)


class NotRegularFile(OSError):
    """The path exists but is a directory, FIFO, socket or device."""


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """``open(path, "rb")`` for a regular file; NotRegularFile (an OSError) for anything else, at once."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)  # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = next((text for test, text in _KINDS if test(mode)), "is not a regular file")
            raise NotRegularFile(0, what, os.fspath(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_json(path: str | os.PathLike, max_bytes: int) -> Any:
    """The parsed JSON file. Raises FileNotFoundError, OSError (NotRegularFile, unreadable) or
    ValueError with a short reason: too large, not UTF-8, not valid JSON, nested too deeply."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise ValueError(f"{size} bytes, too large for this file (at most {max_bytes})")
        data = f.read(max_bytes + 1)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    except RecursionError:
        raise ValueError("not valid JSON (nested too deeply)") from None


def is_regular(path: Path) -> bool:
    """True for a regular file (following symlinks), without opening it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False
