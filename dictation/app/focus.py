"""Keeping the keyboard focus where the user left it.

No window of ours takes the focus unasked: the status window (no tray), the overlay and
notifications are shown without activation and do not accept focus; only a window the user opened
on purpose (settings, history) is raised and activated. That holds on X11 (the window manager reads
the WM_HINTS input flag and _NET_WM_USER_TIME 0). A Wayland compositor decides alone and usually
focuses every new window; on Sway `keep_unfocused_on_map` asks it not to (a `no_focus` rule for
our process's status window).

Where one of our windows has the focus anyway (the user opened it or clicked it, a compositor
focused it, our menu is open), `OwnFocus` tells the output thread, and the text is kept on the
clipboard instead of being pasted into our own window (`dictation.output.focus.FocusGuard`).
"""

from __future__ import annotations

import logging
import os
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


def keep_unfocused_on_map(title_pattern: str) -> bool:
    """Ask Sway not to focus our next window whose title matches the regular expression
    `title_pattern` when it appears.

    Sway focuses every new window (Qt's WindowDoesNotAcceptFocus does not reach it); its `no_focus`
    rule is the one way to appear without the focus there, for windows of this process with that
    title. (Sway still focuses a window that is alone on its workspace, where no other window could
    lose the focus.) The rule lasts until Sway reloads its configuration. True if Sway took it."""
    if not QGuiApplication.platformName().startswith("wayland") or not os.environ.get("SWAYSOCK"):
        return False
    from dictation.output.process import SystemHost

    host = SystemHost()
    if host.which("swaymsg") is None:
        return False
    criteria = f'[pid={os.getpid()} title="{title_pattern}"]'
    result = host.run(["swaymsg", f"no_focus {criteria}"], timeout=2.0)
    if not result.ok:
        log.info("sway did not take the no_focus rule for the status window: %s", result.failure())
        return False
    log.info("asked sway not to focus the status window when it appears (no_focus %s)", criteria)
    return True
