"""Talking to the running app: `dictation toggle | start | stop | cancel | status` (Qt-free client).

The app listens on a local socket (QLocalServer in `dictation.app.ipc`); this module is the
client, written with the standard library only so that a compositor binding such as Sway's
``bindsym --no-repeat F9 exec dictation start`` / ``bindsym --release F9 exec dictation stop``
starts in a few tens of milliseconds (no Qt, no torch).

Where the socket lives:
- POSIX: ``$XDG_RUNTIME_DIR/dictation/ipc.sock`` (per user, mode 0700 folder), else
  ``<tmp>/dictation-<uid>/ipc.sock``. With ``DICTATION_HOME`` set (tests, portable installs) the
  folder name carries a hash of it, so separate homes run separate apps.
- Windows: the named pipe ``\\\\.\\pipe\\dictation-<user>[-<hash>]``.

Protocol: one JSON object per line each way. Request ``{"command": "toggle"}``; reply
``{"ok": true, "status": "recording", "message": "..."}``. Unknown commands get ``ok: false``.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

COMMANDS = ("toggle", "start", "stop", "cancel", "status", "show-settings", "show-history", "quit")
_SUFFIX_LEN = 10


class IpcError(Exception):
    """The running app could not be reached or answered nonsense; the message is for the user."""


class NotRunning(IpcError):
    pass


def _home_suffix() -> str:
    home = os.environ.get("DICTATION_HOME")
    if not home:
        return ""
    return "-" + hashlib.sha1(os.path.abspath(home).encode()).hexdigest()[:_SUFFIX_LEN]


def server_name() -> str:
    """The name to give QLocalServer.listen: an absolute socket path on POSIX, a pipe name on Windows."""
    if sys.platform == "win32":
        return f"dictation-{getpass.getuser()}{_home_suffix()}"
    return str(socket_dir() / "ipc.sock")


def socket_dir() -> Path:
    """The private folder holding the socket (created with mode 0700 when missing)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        folder = Path(runtime) / f"dictation{_home_suffix()}"
    else:
        folder = Path(tempfile.gettempdir()) / f"dictation-{os.getuid()}{_home_suffix()}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if sys.platform != "win32":
        st = folder.stat()
        if st.st_uid != os.getuid():
            raise IpcError(f"{folder}: belongs to another user; refusing to use it for the app's socket")
        if st.st_mode & 0o077:
            os.chmod(folder, 0o700)
    return folder


def send_command(command: str, timeout: float = 3.0) -> dict:
    """Send one command to the running app and return its reply (a dict with at least ``ok``).

    Raises `NotRunning` when no app listens, `IpcError` when it does not answer in ``timeout`` seconds.
    """
    request = (json.dumps({"command": command}) + "\n").encode()
    if sys.platform == "win32":
        raw = _send_windows(request, timeout)
    else:
        raw = _send_posix(request, timeout)
    try:
        reply = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise IpcError(f"the running app sent an unreadable reply: {raw[:200]!r}") from None
    if not isinstance(reply, dict) or "ok" not in reply:
        raise IpcError(f"the running app sent an unexpected reply: {reply!r}")
    return reply


def _send_posix(request: bytes, timeout: float) -> bytes:
    path = server_name()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            raise NotRunning("dictation is not running (start it with `dictation`)") from None
        except OSError as exc:
            raise IpcError(f"cannot reach the running app at {path}: {exc.strerror or exc}") from None
        try:
            sock.sendall(request)
            return _read_line(sock.recv)
        except TimeoutError:
            raise IpcError(f"the running app did not answer within {timeout:g} s") from None
        except OSError as exc:
            raise IpcError(f"lost the connection to the running app: {exc.strerror or exc}") from None
    finally:
        sock.close()


def _read_line(read: Callable[[int], bytes]) -> bytes:
    """The first line of the reply (without its newline), reading with ``read(n)`` until one arrives."""
    data = b""
    while b"\n" not in data:
        chunk = read(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > 1 << 20:
            break
    if b"\n" not in data:
        raise IpcError("the running app closed the connection without answering")
    return data.split(b"\n", 1)[0]


def _send_windows(request: bytes, timeout: float) -> bytes:  # pragma: no cover - Windows only
    path = r"\\.\pipe" + "\\" + server_name()
    try:
        pipe = open(path, "r+b", buffering=0)  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise NotRunning("dictation is not running (start it with `dictation`)") from None
    except OSError as exc:
        raise IpcError(f"cannot reach the running app at {path}: {exc}") from None
    try:
        pipe.write(request)
        return _read_line(pipe.read)
    finally:
        pipe.close()
