"""Logging for the app: a rotating file in the platformdirs log folder, stderr, and the log view.

Users never see stdout (docs/architecture.md, principle 8), so every line that matters goes to
``<log dir>/dictation.log`` (1 MB x 3 files, readable by the user alone) and into `LogBridge`,
which keeps the last lines for a settings window opened later and re-emits new ones as a Qt signal
(queued to the GUI thread, whatever thread logged them).

A log file that stops taking lines (a full disk, an I/O error) is said once, not with Python's
"--- Logging error ---" traceback for every line: the first failed write sets
``LogBridge.write_problem`` and emits ``LogBridge.file_failed``, which the controller turns into one
warning (stderr, the Log page) and a notification (`LogBridge.attach`). Later lines still try the
file (they are written again once there is room) and go to stderr and the Log page as usual.
"""

from __future__ import annotations

import collections
import contextlib
import faulthandler
import logging
import logging.handlers
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot

from dictation.paths import CRASH_FILE, LOG_FILE, LOG_FORMAT, log_dir
from dictation.private import private_dir, repair

log = logging.getLogger(__name__)

FORMAT = LOG_FORMAT
KEEP_RECORDS = 1000


class LogBridge(QObject):
    record = Signal(object)  # logging.LogRecord
    file_failed = Signal(str)  # the log file stopped taking lines (once a session): one line for the user

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.records: collections.deque[logging.LogRecord] = collections.deque(maxlen=KEEP_RECORDS)
        self.file_problem = ""  # why no log file is written this session ("" when it is)
        self.write_problem = ""  # why the log file stopped taking lines ("" while it takes them)
        self._on_file_failed: Callable[[str], None] | None = None
        self._told = False
        # queued, also from this thread: never inside the failing handler, always on the GUI thread
        self.file_failed.connect(self._tell, Qt.ConnectionType.QueuedConnection)

    def attach(self, on_record: Callable, on_file_failed: Callable[[str], None]) -> None:
        """Hear every new record, and the log file's write failure (once, on this object's thread;
        also one that came before, once the event loop runs: the tray that shows it exists by then)."""
        self.record.connect(on_record)
        self._on_file_failed = on_file_failed
        if self.write_problem:
            QTimer.singleShot(0, self, lambda: self._tell(self.write_problem))

    @Slot(str)
    def _tell(self, problem: str) -> None:
        if self._on_file_failed is not None and not self._told:
            self._told = True
            self._on_file_failed(problem)

    def report_write_failure(self, problem: str) -> None:
        """Any thread: the log file failed to take a line; said once (``file_failed``)."""
        self.write_problem = problem
        with contextlib.suppress(RuntimeError):  # the bridge was deleted at shutdown
            self.file_failed.emit(problem)


class _PrivateLogFile(logging.handlers.RotatingFileHandler):
    """The rotating log file, created 0600 (an older one is made 0600); rotation renames, so the
    older files keep that mode. A write that fails (a full disk) calls ``on_failure`` once with one
    line for the user, instead of Python's traceback for every line."""

    on_failure: Callable[[str], None] | None = None
    _failed = False

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):  # not the file: a bug (a bad format string) keeps Python's report
            super().handleError(record)
            return
        self._failed_write(exc)

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as exc:
            self._failed_write(exc)

    def close(self) -> None:  # at quit: what is still buffered cannot be written either
        try:
            super().close()
        except OSError as exc:
            self._failed_write(exc)

    def _failed_write(self, exc: OSError) -> None:
        if self._failed:
            return
        self._failed = True
        problem = (
            f"Cannot write the log file {self.baseFilename}: {exc.strerror or exc}. "
            "Dictation goes on; this session's log is on the Log page"
        )
        if self.on_failure is not None:
            self.on_failure(problem)

    def _open(self):
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self.baseFilename, flags, 0o600)
        try:
            st = os.fstat(fd)
            # a regular file only: a log linked to a device (/dev/null, /dev/full) is left as it is
            ours = stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()
            if hasattr(os, "fchmod") and ours and st.st_mode & 0o077:
                os.fchmod(fd, st.st_mode & 0o700)
            return open(fd, self.mode, encoding=self.encoding, errors=self.errors)  # noqa: SIM115
        except BaseException:
            os.close(fd)
            raise


class _BridgeHandler(logging.Handler):
    def __init__(self, bridge: LogBridge) -> None:
        super().__init__(logging.INFO)
        self.bridge = bridge

    def emit(self, record: logging.LogRecord) -> None:
        try:
            record.message = record.getMessage()
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            self.bridge.records.append(record)
            self.bridge.record.emit(record)
        except RuntimeError:  # the bridge was deleted at shutdown
            pass


def setup_logging(verbose: bool = False, folder: Path | None = None) -> tuple[LogBridge, Path]:
    """Attach the file, stderr and bridge handlers to the root logger; returns the bridge and the log file.

    The log folder is 0700 and its files 0600 (older ones are made so). When the file cannot be
    written (the folder is a file, the log a folder, a read-only disk) the app logs to stderr and
    the log view only, and ``bridge.file_problem`` says why, for the caller to tell the user.
    """
    folder = folder or log_dir()
    path = folder / LOG_FILE
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in list(root.handlers):
        if getattr(handler, "_dictation", False):
            root.removeHandler(handler)
            handler.close()
    bridge = LogBridge()
    handlers: list[logging.Handler] = []
    try:
        private_dir(folder)
        repair([folder])  # log files of an older version were 0644
        file_handler = _PrivateLogFile(path, maxBytes=1_000_000, backupCount=3, encoding="utf-8")
    except OSError as exc:
        where = exc.filename or path
        bridge.file_problem = (
            f"No log file: {where}: {exc.strerror or exc}. This session's log is kept on the Log page only"
        )
    else:
        file_handler.setFormatter(logging.Formatter(FORMAT))
        file_handler.on_failure = bridge.report_write_failure
        handlers.append(file_handler)
    stderr = logging.StreamHandler()
    stderr.setLevel(logging.INFO if verbose else logging.WARNING)
    stderr.setFormatter(logging.Formatter(FORMAT))
    bridge_handler = _BridgeHandler(bridge)
    for handler in (*handlers, stderr, bridge_handler):
        handler._dictation = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    # Third-party chatter stays out of the user's log view unless it is a warning.
    for noisy in ("huggingface_hub", "urllib3", "filelock", "PIL"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return bridge, path


_crash_stream = None  # the open crash file: faulthandler writes to its descriptor when the process dies


def record_crashes(folder: Path | None = None) -> Path | None:
    """If the process dies of a fatal signal (SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL), Python's stack
    of every thread is written to ``crash.log`` in the log folder (0600): file names, lines and
    function names, nothing the user said. A crash file left by the previous run is kept as
    ``crash-previous.log`` and named in the log once. Returns the crash file, or None where it cannot
    be opened (the app runs on without it)."""
    global _crash_stream
    folder = folder or log_dir()
    path = folder / CRASH_FILE
    try:
        private_dir(folder)
        if path.is_file() and path.stat().st_size > 0:
            previous = path.with_name("crash-previous.log")
            os.replace(path, previous)
            log.warning("the previous run of dictation crashed; Python's stacks at that moment: %s", previous)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError as exc:
        log.warning("no crash file: %s: %s", exc.filename or path, exc.strerror or exc)
        return None
    stream = os.fdopen(fd, "w", encoding="utf-8")
    faulthandler.enable(file=stream, all_threads=True)
    if _crash_stream is not None:
        _crash_stream.close()
    _crash_stream = stream
    return path
