"""The settings window: a list of pages on the left, the chosen page on the right, a Close button.

There is no OK button: every edit applies (and is saved) as soon as it is finished; see
:mod:`dictation.app.pages`.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QDialogButtonBox,
    QFrame,
    QHBoxLayout,
    QListWidget,
    QScrollArea,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from dictation.app.pages import SettingsPage
from dictation.app.pages.diagnostics import DiagnosticsPage
from dictation.app.pages.general_page import GeneralPage
from dictation.app.pages.log_page import LogPage
from dictation.app.pages.model_page import ModelPage
from dictation.app.pages.output_page import OutputPage
from dictation.app.pages.recording_page import RecordingPage
from dictation.app.pages.vocabulary_page import VocabularyPage
from dictation.app.widgets.fields import FieldRow

PAGE_CLASSES: tuple[type[SettingsPage], ...] = (
    ModelPage,
    VocabularyPage,
    RecordingPage,
    OutputPage,
    GeneralPage,
    DiagnosticsPage,
    LogPage,
)
PAGE_NAMES: tuple[str, ...] = tuple(cls.name for cls in PAGE_CLASSES)


class SettingsWindow(QWidget):
    def __init__(self, controller: Any, parent: QWidget | None = None):
        super().__init__(parent, Qt.WindowType.Window)
        self.controller = controller
        self.setWindowTitle("Dictation settings")
        self.resize(900, 680)
        self.pages: dict[str, SettingsPage] = {}

        self.sidebar = QListWidget()
        self.sidebar.setFixedWidth(150)
        self.sidebar.setFrameShape(QFrame.Shape.NoFrame)
        self.sidebar.setStyleSheet("QListWidget::item { padding: 6px 10px; }")
        self.stack = QStackedWidget()
        for cls in PAGE_CLASSES:
            page = cls(controller)
            self.pages[cls.name] = page
            self.sidebar.addItem(cls.title)
            if isinstance(page, (LogPage, DiagnosticsPage)):
                self.stack.addWidget(page)  # the log view and the diagnostics tree scroll themselves
            else:
                scroll = QScrollArea()
                scroll.setWidgetResizable(True)
                scroll.setFrameShape(QFrame.Shape.NoFrame)
                scroll.setWidget(page)
                self.stack.addWidget(scroll)
        self.sidebar.currentRowChanged.connect(self.stack.setCurrentIndex)

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        QShortcut(QKeySequence(QKeySequence.StandardKey.Close), self, self.close)

        body = QHBoxLayout()
        body.addWidget(self.sidebar)
        body.addWidget(self.stack, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(body, 1)
        layout.addWidget(buttons)
        self.sidebar.setCurrentRow(0)

    def show_page(self, name: str) -> None:
        """Switch to page ``name`` ("model", "vocabulary", "recording", "output", "general", "diagnostics", "log")."""
        if name not in self.pages:
            raise ValueError(f"no settings page {name!r}; the pages are {', '.join(PAGE_NAMES)}")
        self.sidebar.setCurrentRow(PAGE_NAMES.index(name))

    def current_page(self) -> str:
        return PAGE_NAMES[self.stack.currentIndex()]

    def page(self, name: str) -> SettingsPage:
        return self.pages[name]

    def bring_forward(self, page: str | None = None) -> None:
        """Show the window (optionally on ``page``), un-minimise it, raise it and give it the focus."""
        if page is not None:
            self.show_page(page)
        self.setWindowState(self.windowState() & ~Qt.WindowState.WindowMinimized)
        self.show()
        self.raise_()
        self.activateWindow()

    def field_rows(self) -> dict[str, FieldRow]:
        """Every settings row of every page by dotted key."""
        rows: dict[str, FieldRow] = {}
        for page in self.pages.values():
            rows.update(page.rows)
        return rows
