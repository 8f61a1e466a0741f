"""Logging for the app: a rotating file in the platformdirs log folder, stderr, and the log view.

Users never see stdout (DESIGN.md principle 8), so every line that matters goes to
``<log dir>/dictation.log`` (1 MB x 3 files) and into `LogBridge`, which keeps the last lines for a
settings window opened later and re-emits new ones as a Qt signal (queued to the GUI thread,
whatever thread logged them).
"""

from __future__ import annotations

import collections
import logging
import logging.handlers
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from dictation.paths import log_dir

FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
KEEP_RECORDS = 1000


class LogBridge(QObject):
    record = Signal(object)  # logging.LogRecord

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.records: collections.deque[logging.LogRecord] = collections.deque(maxlen=KEEP_RECORDS)


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
    """Attach the file, stderr and bridge handlers to the root logger; returns the bridge and the log file."""
    folder = folder or log_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "dictation.log"
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in list(root.handlers):
        if getattr(handler, "_dictation", False):
            root.removeHandler(handler)
            handler.close()
    file_handler = logging.handlers.RotatingFileHandler(path, maxBytes=1_000_000, backupCount=3, encoding="utf-8")
    file_handler.setFormatter(logging.Formatter(FORMAT))
    stderr = logging.StreamHandler()
    stderr.setLevel(logging.INFO if verbose else logging.WARNING)
    stderr.setFormatter(logging.Formatter(FORMAT))
    bridge = LogBridge()
    bridge_handler = _BridgeHandler(bridge)
    for handler in (file_handler, stderr, bridge_handler):
        handler._dictation = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    # Third-party chatter stays out of the user's log view unless it is a warning.
    for noisy in ("huggingface_hub", "urllib3", "filelock", "PIL"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return bridge, path
