"""Talking to the running app: `dictation toggle | start | stop | cancel | status` (Qt-free client).

The app listens on a local socket (QLocalServer in `dictation.app.ipc`); this module is the
client, written with the standard library only so that a compositor binding such as Sway's
``bindsym --no-repeat F9 exec dictation start`` / ``bindsym --release F9 exec dictation stop``
starts in a few tens of milliseconds (no Qt, no torch).

Where the socket lives:
- POSIX: ``ipc.sock`` in a private folder (`socket_dir`): the first usable of
  ``$XDG_RUNTIME_DIR/dictation``, ``/run/user/<uid>/dictation`` (the same place when the variable
  is unset, as under su or cron), ``<user cache dir>/dictation/run`` (in the user's home, where no
  one else can create anything) and, last, ``<tmp>/dictation-<uid>``. Usable means a real folder
  (not a link), owned by this user, mode 0700 (set if it is ours), in a runtime folder that is ours
  and closed to group and others, with a socket path short enough for the system; each folder passed
  over is logged with the reason. A folder someone else created is passed over, so
  another user cannot keep the app from starting or listen in its place. With ``DICTATION_HOME`` set
  (tests, portable installs) the folder name carries a hash of it, so separate homes run separate apps.
- Windows: the named pipe ``\\\\.\\pipe\\dictation-<user>[-<hash>]``.

`socket_path` gives the path in use; `dictation status --json` prints it as ``socket``, also when
the app is not running (then the path it would listen on).

Protocol: one JSON object per line each way. Request ``{"command": "start", "sent": 12345.678}``;
reply ``{"ok": true, "status": "recording", "message": "..."}``. Unknown commands get ``ok: false``.
``sent`` is the client's `time.monotonic()` when it sent the request (CLOCK_MONOTONIC on Linux, one
clock for every process of the machine): the app takes it as the time of the press, so a request
that waited while the app was busy (starting up) still records from the press (the app checks
that the time is plausible, else it uses the time it read the request). A `start` or `toggle`
that starts a recording is answered once the microphone is recording; when the take cannot begin
at the press (the microphone was still opening), the reply says so: ``late_ms`` (how much audio
after the press is missing) and ``warning`` (a sentence for the user); when the microphone cannot
be opened, ``ok`` is false.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import socket

log = logging.getLogger(__name__)

_SUFFIX_LEN = 10


class IpcError(Exception):
    """The running app could not be reached or answered nonsense; the message is for the user."""


class NotRunning(IpcError):
    pass


def _home_suffix() -> str:
    home = os.environ.get("DICTATION_HOME")
    if not home:
        return ""
    import hashlib  # only here: loading it (OpenSSL) costs the launch before the hotkey grab time

    return "-" + hashlib.sha1(os.path.abspath(home).encode()).hexdigest()[:_SUFFIX_LEN]


def server_name() -> str:
    """The name to give QLocalServer.listen: an absolute socket path on POSIX, a pipe name on Windows."""
    if sys.platform == "win32":
        import getpass

        return f"dictation-{getpass.getuser()}{_home_suffix()}"
    return str(socket_dir() / "ipc.sock")


def socket_path() -> str:
    """Where the app listens (or would), as a path a person can look up: the socket file on POSIX
    (its private folder is created if missing), the named pipe's full path on Windows. Raises IpcError
    when no private folder can be had (`socket_dir`)."""
    if sys.platform == "win32":
        return "\\\\.\\pipe\\" + server_name()
    return server_name()


RUN_USER = "/run/user"  # systemd-logind's per-user runtime folders (tests point it elsewhere)
# sun_path holds 108 bytes on Linux, 104 on macOS and the BSDs, the terminating NUL included.
MAX_SOCKET_PATH = 103 if sys.platform == "darwin" or "bsd" in sys.platform else 107


def socket_dir() -> Path:
    """The private folder holding the socket: the first usable candidate (module docstring), created
    with mode 0700 when missing. Raises IpcError naming every candidate when none is usable."""
    refused = []
    for folder, parent_must_be_private in _socket_candidates():
        reason = _claim(folder, parent_must_be_private)
        if reason is None:
            return folder
        refused.append(f"{folder}: {reason}")
        log.info("not using %s for the app's socket: %s", folder, reason)
    raise IpcError("no private folder for the app's socket: " + "; ".join(refused))


def _socket_candidates() -> Iterator[tuple[Path, bool]]:
    """(folder, whether its parent must be a private folder of ours), best first. Made one at a
    time: the later ones import modules the usual first one does not need (the launch claims the
    instance before it grabs the hotkey, dictation.launch)."""
    suffix = _home_suffix()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    runtime_folder = Path(runtime) / f"dictation{suffix}" if runtime and os.path.isabs(runtime) else None
    if runtime_folder is not None:
        yield runtime_folder, True
    run_user = Path(RUN_USER) / str(os.getuid()) / f"dictation{suffix}"
    if run_user != runtime_folder:
        yield run_user, True
    try:
        import platformdirs

        cache = Path(platformdirs.user_cache_dir("dictation", appauthor=False))
    except Exception:  # no home folder at all: the other candidates remain
        cache = None
    if cache is not None and cache.is_absolute():
        yield cache / f"run{suffix}", False
    import tempfile

    yield Path(tempfile.gettempdir()) / f"dictation-{os.getuid()}{suffix}", False


def _claim(folder: Path, parent_must_be_private: bool) -> str | None:
    """Make ``folder`` the socket's private folder if it can be; else why not."""
    if len(os.fsencode(folder / "ipc.sock")) > MAX_SOCKET_PATH:
        return f"the socket path would be longer than {MAX_SOCKET_PATH} bytes"
    uid = os.getuid()
    if parent_must_be_private:  # a runtime folder: it exists already and is ours alone
        try:
            st = os.stat(folder.parent)
        except OSError as exc:
            return f"no runtime folder ({exc.strerror or exc})"
        if st.st_uid != uid:
            return f"the runtime folder {folder.parent} belongs to another user (uid {st.st_uid}); passing it over"
        if st.st_mode & 0o077:  # others could reach the socket's folder, or replace it: not private
            return (
                f"the runtime folder {folder.parent} is open to group or others "
                f"(mode {stat.S_IMODE(st.st_mode):o}); passing it over"
            )
    else:
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"cannot create its parent ({exc.strerror or exc})"
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot create it ({exc.strerror or exc})"
    try:
        st = os.lstat(folder)
    except OSError as exc:
        return f"cannot check it ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link; refusing it"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a folder"
    if st.st_uid != uid:
        return f"it belongs to another user (uid {st.st_uid}); refusing it"
    if st.st_mode & 0o077:
        try:
            os.chmod(folder, 0o700)  # checked above: a folder of ours, not a link
        except OSError as exc:
            return f"cannot make it private ({exc.strerror or exc})"
    return None


class InstanceLock:
    """Held by the one app of this user (and ``DICTATION_HOME``) while it runs: an exclusive
    ``flock`` on ``instance.lock`` beside the socket, which the system releases when the process
    ends, however it ends. It lets the app open the microphone and take the hotkeys before it
    listens on its socket, without a second copy started at the same moment doing the same."""

    def __init__(self, fd: int | None, path: Path | None) -> None:
        self._fd = fd
        self.path = path

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def claim_instance() -> InstanceLock | None:
    """The instance lock, or None when another app holds it (it runs, or is starting). On Windows
    the lock is not used (an InstanceLock that holds nothing): the named pipe decides alone.
    Raises IpcError when the lock file cannot be opened."""
    if sys.platform == "win32":  # pragma: no cover - Windows only
        return InstanceLock(None, None)
    import fcntl

    path = socket_dir() / "instance.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise IpcError(f"cannot open the app's instance lock {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError as exc:  # a file system without locks: go on; the socket still keeps one instance
        log.warning("cannot lock %s (%s); relying on the socket alone", path, exc.strerror or exc)
    return InstanceLock(fd, path)


def send_command(command: str, timeout: float = 3.0) -> dict:
    """Send one command to the running app and return its reply (a dict with at least ``ok``).

    Raises `NotRunning` when no app listens, `IpcError` when it does not answer in ``timeout`` seconds.
    """
    request = (json.dumps({"command": command, "sent": time.monotonic()}) + "\n").encode()
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
    sock = _connect(path, timeout)
    try:
        try:
            sock.sendall(request)
            return _read_line(sock.recv)
        except TimeoutError:
            raise IpcError(f"the running app did not answer within {timeout:g} s") from None
        except OSError as exc:
            raise IpcError(f"lost the connection to the running app: {exc.strerror or exc}") from None
    finally:
        sock.close()


REFUSED_RETRY_S = 0.3  # a socket that exists but refuses: the app may be between binding and listening


def _connect(path: str, timeout: float) -> socket.socket:
    """A connection to the app's socket. A socket file that refuses connections is either left by a
    crashed app or one the app has just bound and is about to listen on (the moment it starts):
    that is retried for `REFUSED_RETRY_S` before the app is called not running. A socket whose
    backlog is full (EAGAIN: a flood of other connections the app has not accepted yet) is retried
    until ``timeout``."""
    import socket  # not at the top: the app's launch needs this module's lock before the hotkey grab

    started = time.monotonic()
    deadline = started + REFUSED_RETRY_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            return sock
        except FileNotFoundError:
            sock.close()
            raise NotRunning("dictation is not running (start it with `dictation`)") from None
        except ConnectionRefusedError:
            sock.close()
            if time.monotonic() > deadline:
                raise NotRunning("dictation is not running (start it with `dictation`)") from None
            time.sleep(0.01)
        except BlockingIOError:
            sock.close()
            if time.monotonic() > started + timeout:
                raise IpcError(f"the running app at {path} took no new connection within {timeout:g} s") from None
            time.sleep(0.01)
        except OSError as exc:
            sock.close()
            raise IpcError(f"cannot reach the running app at {path}: {exc.strerror or exc}") from None


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
