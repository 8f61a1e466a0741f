"""The Log page: the app's log lines (earlier ones from ``recent_log()``, new ones as they arrive),
filtered by level, and a button that opens the folder holding the log files."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections import deque
from datetime import datetime
from typing import Any

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices, QFontDatabase, QTextOption
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QWidget

from dictation import spawn
from dictation.app.pages import SettingsPage
from dictation.app.widgets.fields import ERROR_STYLE
from dictation.app.widgets.wheel import ComboBox

MAX_LINES = 5000
LEVELS = (("All messages", logging.NOTSET), ("Info and above", logging.INFO), ("Warnings and errors", logging.WARNING))
_formatter = logging.Formatter()


def open_folder(folder: str) -> bool:
    """Show ``folder`` in the file manager. On Linux and the BSDs through ``xdg-open`` (what Qt would run),
    started with the user's environment (`dictation.spawn`: Qt would hand the frozen app's library and
    plugin paths to the file manager); elsewhere through Qt."""
    if sys.platform.startswith(("linux", "freebsd", "openbsd", "netbsd")):
        env = spawn.user_environment()
        opener = shutil.which("xdg-open", path=env.get("PATH", os.defpath))
        if opener:
            return spawn.start_detached([opener, folder], env=env)
    return QDesktopServices.openUrl(QUrl.fromLocalFile(folder))


def format_record(record: logging.LogRecord) -> str:
    """ "12:03:04  WARNING  dictation.audio  message" (plus the traceback, if any)."""
    try:
        message = record.getMessage()
    except (TypeError, ValueError) as e:  # a bad format string must not break the log view
        message = f"{record.msg!r} (unformattable: {e})"
    time = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
    line = f"{time}  {record.levelname:<8} {record.name}  {message}"
    if record.exc_info:
        line += "\n" + _formatter.formatException(record.exc_info)
    elif record.exc_text:
        line += "\n" + record.exc_text
    return line


class LogPage(SettingsPage):
    name = "log"
    title = "Log"

    def __init__(self, controller: Any, parent: QWidget | None = None):
        super().__init__(controller, parent)
        self._records: deque[logging.LogRecord] = deque(maxlen=MAX_LINES)
        bar = QWidget()
        row = QHBoxLayout(bar)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(QLabel("Show:"))
        self.level_filter = ComboBox()
        for label, level in LEVELS:
            self.level_filter.addItem(label, level)
        self.level_filter.currentIndexChanged.connect(self._render)
        row.addWidget(self.level_filter)
        row.addStretch(1)
        self.open_button = QPushButton("Open log folder")
        self.open_button.clicked.connect(self.open_log_folder)
        row.addWidget(self.open_button)
        self.add_widget(bar)
        self.view = QPlainTextEdit()
        self.view.setReadOnly(True)
        # Long lines (paths, tracebacks) wrap at the view's width, inside a word where they must.
        self.view.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.view.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.view.setMaximumBlockCount(MAX_LINES)
        self.view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.view.setMinimumHeight(360)
        self._layout.addWidget(self.view, 1)
        self.folder_error = QLabel()
        self.folder_error.setStyleSheet(ERROR_STYLE)
        self.folder_error.hide()
        self.add_widget(self.folder_error)
        for record in controller.recent_log():
            self._records.append(record)
        self._render()
        controller.log_record.connect(self.add_record)

    def _min_level(self) -> int:
        return int(self.level_filter.currentData())

    def _render(self) -> None:
        level = self._min_level()
        self.view.setPlainText("\n".join(format_record(r) for r in self._records if r.levelno >= level))
        self._scroll_to_end()

    def add_record(self, record: logging.LogRecord) -> None:
        self._records.append(record)
        if record.levelno < self._min_level():
            return
        scrollbar = self.view.verticalScrollBar()
        at_end = scrollbar.value() >= scrollbar.maximum() - 2
        self.view.appendPlainText(format_record(record))
        if at_end:  # follow new lines unless the user scrolled up to read
            self._scroll_to_end()

    def text(self) -> str:
        return self.view.toPlainText()

    def _scroll_to_end(self) -> None:
        self.view.verticalScrollBar().setValue(self.view.verticalScrollBar().maximum())

    def open_log_folder(self) -> None:
        from dictation.paths import log_dir

        folder = log_dir()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self._folder_failed(f"Cannot create the log folder {folder}: {e}")
            return
        if open_folder(str(folder)):
            self.folder_error.hide()
        else:
            self._folder_failed(f"No file manager could open {folder}.")

    def _folder_failed(self, message: str) -> None:
        self.folder_error.setText(message)
        self.folder_error.show()
