"""Keeping the keyboard focus where the user left it.

Where one of our windows has the focus anyway (the user opened it or clicked it, a compositor
focused it, our menu is open), `OwnFocus` tells the output thread, and the text is kept on the
clipboard instead of being pasted into our own window (`dictation.output.focus.FocusGuard`).
"""

from __future__ import annotations

import logging
import threading

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QGuiApplication, QWindow

log = logging.getLogger(__name__)

# Platforms where Qt's focus window is the desktop's keyboard focus (offscreen and minimal have no
# desktop: every shown window counts as focused there).
_REAL_FOCUS = ("xcb", "wayland", "windows", "cocoa")
ANSWER_TIMEOUT_S = 0.5  # how long the output thread waits for the GUI thread's answer


class _Question:
    def __init__(self) -> None:
        self.answered = threading.Event()
        self.title: str | None = None


class OwnFocus(QObject):
    """Which of our windows has the keyboard focus, asked from any thread.

    Called on the output thread just before text is sent, it asks the GUI thread (a queued call,
    answered within ANSWER_TIMEOUT_S) for `QGuiApplication.focusWindow()` at that moment, and returns
    that window's title, or None when none of ours has the focus. It asks rather than caching
    `focusWindowChanged`: after our tray menu closes, Qt drops its focus window without that signal
    (seen on X11), and a cache would then hold every later dictation back. Only if the GUI thread
    does not answer in time (it is busy) does the last value that signal gave count.
    """

    _asked = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        app = QGuiApplication.instance()
        self.enabled = app is not None and QGuiApplication.platformName().startswith(_REAL_FOCUS)
        self._gui_thread = threading.get_ident()  # where it was made: the GUI thread
        self._lock = threading.Lock()
        self._questions: list[_Question] = []
        self._last: str | None = None
        if self.enabled:
            self._asked.connect(self._answer, Qt.ConnectionType.QueuedConnection)
            app.focusWindowChanged.connect(self._changed)
            self._changed(QGuiApplication.focusWindow())

    @staticmethod
    def _title(window: QWindow | None) -> str | None:
        if window is None or not window.isVisible():
            return None
        return window.title() or "untitled window"

    def _changed(self, window: QWindow | None) -> None:
        self._last = self._title(window)

    def _answer(self) -> None:
        """On the GUI thread: answer every question asked so far."""
        self._last = title = self._title(QGuiApplication.focusWindow())
        with self._lock:
            questions, self._questions = self._questions, []
        for question in questions:
            question.title = title
            question.answered.set()

    def __call__(self) -> str | None:
        if not self.enabled:
            return None
        if threading.get_ident() == self._gui_thread:
            return self._title(QGuiApplication.focusWindow())
        question = _Question()
        with self._lock:
            self._questions.append(question)
        self._asked.emit()
        if question.answered.wait(ANSWER_TIMEOUT_S):
            return question.title
        log.info("the GUI thread did not say within %.1f s which window has the focus", ANSWER_TIMEOUT_S)
        return self._last
