"""The real start-up code (`dictation.app.main.start`, what `dictation` runs before its event loop),
offscreen, in a private app home: files of an older install made private, and a history or log
file that cannot be used turned into one clear line while the app keeps running."""

from __future__ import annotations

import errno
import io
import logging
import logging.handlers
import os
import signal
import sqlite3
import stat
import threading
from pathlib import Path

import pytest

from dictation.app import main as app_main
from dictation.app.tray import Tray
from dictation.ipc import IpcError, send_command
from tests.app.started import stop_started_apps


@pytest.fixture
def start(qtbot, monkeypatch):
    """``start()``: the app started by the real start-up code; afterwards it is shut down as quitting
    does, and the process's signal handlers and log handlers are put back."""
    notes: list[tuple[str, str]] = []
    real_notify = Tray.notify

    def notify(self, level, message):
        notes.append((level, message))
        real_notify(self, level, message)

    monkeypatch.setattr(Tray, "notify", notify)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = []

    def run():
        app = app_main.start()
        assert not isinstance(app, int), f"the app did not start (exit status {app})"
        app.notes = notes
        started.append(app)
        return app

    yield run
    stop_started_apps(started, handlers)


def ask(qtbot, command: str) -> dict:
    box: dict = {}

    def client():
        try:
            box["reply"] = send_command(command, timeout=5)
        except IpcError as exc:
            box["error"] = exc

    thread = threading.Thread(target=client)
    thread.start()
    qtbot.waitUntil(lambda: not thread.is_alive(), timeout=8000)
    assert "error" not in box, box.get("error")
    return box["reply"]


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def records(app) -> list[logging.LogRecord]:
    return app.controller.recent_log()


def one_line(app, prefix: str) -> str:
    """The single log line starting with ``prefix``, which must also have been notified."""
    lines = [r for r in records(app) if r.getMessage().startswith(prefix)]
    assert len(lines) == 1, [r.getMessage() for r in records(app)]
    record = lines[0]
    assert record.levelno == logging.WARNING and record.exc_info is None  # a line, not a traceback
    assert ("warning", record.getMessage()) in app.notes
    return record.getMessage()


def assert_running_with_history_in_memory(qtbot, app) -> None:
    assert ask(qtbot, "status")["ok"] is True  # responsive: the socket answers
    history = app.controller.history
    entry = history.add("kept for this session")
    assert history.get(entry).text == "kept for this session"
    # the app's writes (on the history worker's thread) go into that same in-memory history
    app.controller.workers.history.update_entry(entry, {"text": "changed by the worker"})
    qtbot.waitUntil(lambda: history.get(entry).text == "changed by the worker", timeout=5000)
    assert not Path("history-unsaved.jsonl").exists()  # never a journal in the working directory
    assert not any(r.exc_info for r in records(app))


# --- permissions of an older install -------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask022", "umask000"])
def test_start_makes_an_older_installs_files_private(qtbot, dictation_home, start, umask):
    old_umask = os.umask(umask)
    try:
        (dictation_home / "data" / "recordings").mkdir(parents=True)
        (dictation_home / "config").mkdir()
        (dictation_home / "log").mkdir()
        with sqlite3.connect(dictation_home / "data" / "history.sqlite3") as conn:
            conn.execute("PRAGMA journal_mode=WAL")
        for name in (
            "data/history.sqlite3-wal",
            "data/recordings/rec-20250101T000000.000Z.wav",
            "config/settings.json.bad-20250101T000000Z",
            "log/dictation.log",
            "log/dictation.log.1",
        ):
            (dictation_home / name).write_bytes(b"")
        (dictation_home / "config" / "settings.json").write_text("{}")
        for path in [*dictation_home.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)  # as an older version left them

        app = start()

        everything = [p for p in dictation_home.rglob("*") if not p.is_symlink()]
        assert {p.name: mode(p) for p in everything if mode(p) != (0o700 if p.is_dir() else 0o600)} == {}
        assert {"history.sqlite3", "history.sqlite3-wal", "history.sqlite3-shm"} <= {
            p.name for p in (dictation_home / "data").iterdir()
        }
        made = [r.getMessage() for r in records(app) if r.getMessage().startswith("made ")]
        assert len(made) == 1 and "files and folders readable by you alone" in made[0]
    finally:
        os.umask(old_umask)


def test_a_fresh_start_writes_nothing_others_can_read(qtbot, dictation_home, start):
    old_umask = os.umask(0)
    try:
        app = start()
        app.controller.history.add("Zyxquorblat")
        logging.getLogger("test").warning("a line for the log file")
        files = [h for h in logging.getLogger().handlers if isinstance(h, logging.handlers.RotatingFileHandler)]
        files[0].doRollover()  # what a full log does
        logging.getLogger("test").warning("a line for the new log file")
    finally:
        os.umask(old_umask)
    written = [p for p in dictation_home.rglob("*")]
    for name in ("log/dictation.log", "log/dictation.log.1", "data/history.sqlite3", "data/history.sqlite3-wal"):
        assert dictation_home / name in written
    assert {str(p): oct(mode(p)) for p in written if mode(p) != (0o700 if p.is_dir() else 0o600)} == {}
    assert not [r for r in records(app) if r.getMessage().startswith("made ")]  # nothing to repair


# --- a history or log that cannot be used ---------------------------------------------------------


def test_a_history_table_with_the_wrong_columns(qtbot, dictation_home, start):
    (dictation_home / "data").mkdir(parents=True)
    with sqlite3.connect(dictation_home / "data" / "history.sqlite3") as conn:
        conn.execute("CREATE TABLE dictations (id INTEGER PRIMARY KEY, words TEXT)")
        conn.execute("PRAGMA user_version = 1")
    app = start()
    line = one_line(app, "History unavailable: ")
    assert line == (
        f"History unavailable: {dictation_home / 'data' / 'history.sqlite3'}: its dictations table lacks the columns "
        "['created', 'text', 'language', 'duration_s', 'model_label', 'audio_path', 'outcome', 'timings', "
        "'streamed', 'corrected', 'raw_text']. "
        "Dictation works; this session's dictations are kept until you quit, not saved"
    )
    assert_running_with_history_in_memory(qtbot, app)


def test_a_folder_in_place_of_the_history(qtbot, dictation_home, start):
    (dictation_home / "data" / "history.sqlite3").mkdir(parents=True)
    app = start()
    line = one_line(app, "History unavailable: ")
    assert line.startswith(f"History unavailable: {dictation_home / 'data' / 'history.sqlite3'}: Is a directory. ")
    assert_running_with_history_in_memory(qtbot, app)


def test_a_read_only_data_folder(qtbot, dictation_home, start, monkeypatch):
    data = dictation_home / "data"
    data.mkdir(parents=True)
    if os.geteuid() == 0:  # root writes anywhere: the kernel's answer for a non-root user, injected
        real_open = os.open

        def refuse_in_data(path, flags, *args, **kwargs):
            if os.fspath(path).startswith(str(data)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", refuse_in_data)
    else:
        data.chmod(0o500)
    try:
        app = start()
        line = one_line(app, "History unavailable: ")
        assert line.startswith(f"History unavailable: {data / 'history.sqlite3'}: Permission denied. ")
        assert_running_with_history_in_memory(qtbot, app)
    finally:
        data.chmod(0o700)


def test_a_file_in_place_of_the_log_folder(qtbot, dictation_home, start):
    dictation_home.mkdir(parents=True)
    (dictation_home / "log").write_text("not a folder")
    app = start()
    line = one_line(app, "No log file: ")
    assert line == (
        f"No log file: {dictation_home / 'log'}: Not a directory. This session's log is kept on the Log page only"
    )
    assert ask(qtbot, "status")["ok"] is True
    assert (dictation_home / "log").read_text() == "not a folder"
    assert app.controller.history.count() == 0  # the history file works as usual
    assert (dictation_home / "data" / "history.sqlite3").is_file()


def test_a_folder_in_place_of_the_log_file(qtbot, dictation_home, start):
    (dictation_home / "log" / "dictation.log").mkdir(parents=True)
    app = start()
    line = one_line(app, "No log file: ")
    assert line.startswith(f"No log file: {dictation_home / 'log' / 'dictation.log'}: Is a directory. ")
    assert ask(qtbot, "status")["ok"] is True


def full_device(path: Path) -> Path:
    """``path`` as a device where every write fails with ENOSPC, as /dev/full does: a link to it, or
    (as root, who owns /dev/full and could change it) a node of its own with /dev/full's numbers."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    if os.getuid() != 0:
        path.symlink_to("/dev/full")
        return path
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.stat("/dev/full").st_rdev)
    except OSError as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    os.chmod(path, 0o666)  # whatever the umask took off
    return path


def test_a_full_disk_under_the_log_is_said_once_and_the_app_goes_on(qtbot, dictation_home, start, capfd):
    """The fault run: a "--- Logging error ---" traceback for every line (21 in a short session)."""
    (dictation_home / "log").mkdir(parents=True)
    device = full_device(dictation_home / "log" / "dictation.log")
    app = start()
    for n in range(20):
        logging.getLogger("test").warning("line %d", n)
    problem = f"Cannot write the log file {dictation_home / 'log' / 'dictation.log'}: No space left on device. "
    qtbot.waitUntil(lambda: any(note.startswith(problem) for _, note in app.notes), timeout=5000)
    line = one_line(app, problem)
    assert line.endswith("Dictation goes on; this session's log is on the Log page")
    assert ask(qtbot, "status")["ok"] is True
    err = capfd.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err, err
    assert err.count("Cannot write the log file") == 1, err
    assert stat.S_IMODE(os.stat(device).st_mode) == 0o666  # a device is not a log file to make private


def test_a_write_error_of_the_log_file_is_said_once(tmp_path, qtbot):
    """The same without /dev/full: the handler's stream write raises OSError(ENOSPC)."""
    from dictation.app.logs import setup_logging

    bridge, path = setup_logging(folder=tmp_path / "log")
    said: list[str] = []
    bridge.attach(lambda record: None, said.append)
    try:
        [handler] = [
            h for h in logging.getLogger().handlers if getattr(h, "_dictation", False) and hasattr(h, "on_failure")
        ]

        class Full(io.StringIO):
            def write(self, text):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        real, handler.stream = handler.stream, Full()
        for n in range(5):
            logging.getLogger("test").warning("line %d", n)
        qtbot.waitUntil(lambda: bool(said), timeout=5000)  # queued to the bridge's (this) thread
        assert said == [
            f"Cannot write the log file {path}: No space left on device. "
            "Dictation goes on; this session's log is on the Log page"
        ]
        handler.stream = real  # room again: lines are written again
        logging.getLogger("test").warning("after")
        handler.flush()
        assert path.read_text().rstrip().endswith("after")
        assert bridge.write_problem == said[0] and len(said) == 1
    finally:
        root = logging.getLogger()
        for h in [h for h in root.handlers if getattr(h, "_dictation", False)]:
            root.removeHandler(h)
            h.close()
