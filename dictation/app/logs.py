"""Logging for the app: a rotating file in the platformdirs log folder, stderr, and the log view.

Users never see stdout (DESIGN.md principle 8), so every line that matters goes to
``<log dir>/dictation.log`` (1 MB x 3 files, readable by the user alone) and into `LogBridge`,
which keeps the last lines for a settings window opened later and re-emits new ones as a Qt signal
(queued to the GUI thread, whatever thread logged them).
"""

from __future__ import annotations

import collections
import logging
import logging.handlers
import os
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from dictation.paths import LOG_FILE, LOG_FORMAT, log_dir
from dictation.private import private_dir, repair

FORMAT = LOG_FORMAT
KEEP_RECORDS = 1000


class LogBridge(QObject):
    record = Signal(object)  # logging.LogRecord

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.records: collections.deque[logging.LogRecord] = collections.deque(maxlen=KEEP_RECORDS)
        self.file_problem = ""  # why no log file is written this session ("" when it is)


class _PrivateLogFile(logging.handlers.RotatingFileHandler):
    """The rotating log file, created 0600 (an older one is made 0600); rotation renames, so the
    older files keep that mode."""

    def _open(self):
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self.baseFilename, flags, 0o600)
        try:
            st = os.fstat(fd)
            if hasattr(os, "fchmod") and st.st_uid == os.getuid() and st.st_mode & 0o077:
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
