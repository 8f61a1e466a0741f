"""`Commands`: answers `dictation <command>` (`dictation.ipc`) for the controller (`AppController.commands`).

A command's send time is the press time where it is plausible on this app's clock; a `start` (or a
`toggle` that starts) is answered once the microphone records, so a late or failed start is told to
the command too (`late_ms`, `warning`, ``ok`` false), or after `START_REPLY_MS` all the same. The
waiting answer is part of its take (`dictation.takes.Take.start_reply`). `show-settings` and
`show-history` are answered before their window opens. What it reads and asks of the app is
`CommandsApp` (the controller's face).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QObject, QTimer

from dictation import session as S

if TYPE_CHECKING:
    from dictation.app.hotkey_input import HotkeyInput
    from dictation.takes import Emits, Takes

log = logging.getLogger("dictation.app.controller")  # the controller's part: its log lines stay its own

# A command's send time (`dictation.ipc`) is the press time when it is plausible on this app's clock:
# not ahead of it (beyond a little slack) and not older than this.
MAX_COMMAND_AGE_S = 30.0
CLOCK_SLACK_S = 0.05
START_REPLY_MS = 2000  # a `start` whose microphone is not recording by then is answered all the same


class CommandsApp(Protocol):
    """What `Commands` reads and asks of the app (the controller, a QObject on the GUI thread)."""

    session: S.DictationSession
    takes: Takes

    @property
    def status(self) -> S.Status: ...
    @property
    def model_label(self) -> str: ...
    @property
    def keys(self) -> HotkeyInput: ...
    @property
    def show_settings_requested(self) -> Emits: ...
    @property
    def show_history_requested(self) -> Emits: ...
    @property
    def quit_requested(self) -> Emits: ...

    def dispatch(self, event: Any) -> None: ...
    def cancel_dictation(self) -> None: ...


class Commands(QObject):
    """`handle_ipc` and the answers to `start` commands. A QObject on the GUI thread (a child of
    ``parent``, the controller), so its timer's slot does not keep the controller alive."""

    def __init__(self, app: CommandsApp, clock: Callable[[], float], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._app = app
        self._clock = clock
        self._clock_warned = False
        self._reply_timer = QTimer(self)  # answers `start` requests whose microphone is slow
        self._reply_timer.setSingleShot(True)
        self._reply_timer.timeout.connect(self._start_replies_overdue)

    def handle_ipc(
        self, command: str, sent: float | None = None, answer: Callable[[dict], None] | None = None
    ) -> dict | None:
        """Answer one `dictation <command>` (see dictation.ipc). ``sent`` is the client's monotonic
        send time: a plausible one is the press time (`command_time`). With ``answer``, a command
        that starts a recording returns None and is answered through it once the microphone records
        (`answer_start`): late (``late_ms``, ``warning``) or failed (``ok`` false) starts are told."""
        app = self._app
        t = self.command_time(sent)
        actions = {  # (not through toggle() etc.: those are slots, and Qt passes them arguments of its own)
            "toggle": lambda: app.dispatch(S.ToggleRequested(t)),
            "start": lambda: app.dispatch(S.StartRequested(t)),
            "stop": lambda: app.dispatch(S.StopRequested(t)),
            "cancel": app.cancel_dictation,
            "status": lambda: None,
            "show-settings": lambda: self._after_the_reply(app.show_settings_requested.emit, ""),
            "show-history": lambda: self._after_the_reply(app.show_history_requested.emit),
            "quit": app.quit_requested.emit,
        }
        if command not in actions:
            return {"ok": False, "message": f"unknown command {command!r}; known: {', '.join(actions)}"}
        before = app.session.recording_take_id
        actions[command]()
        if command in ("toggle", "start") and app.session.model_state is S.ModelState.NOT_CHOSEN:
            return {"ok": False, "message": S.NO_MODEL_MESSAGE}  # refused: the command says so too
        take_id = app.session.recording_take_id
        if answer is not None and take_id is not None and take_id != before and take_id in app.takes:
            app.takes.await_start(take_id, answer, time.monotonic() + START_REPLY_MS / 1000)
            if not self._reply_timer.isActive():
                self._reply_timer.start(START_REPLY_MS)
            return None
        return self.status_reply()

    def _after_the_reply(self, emit: Callable[..., None], *args: Any) -> None:
        """Open a window once the command is answered: the settings window is built on first use,
        which can take longer than the client waits (a second `dictation` said "did not answer")."""
        QTimer.singleShot(0, self, lambda: emit(*args))

    def command_time(self, sent: float | None) -> float:
        """The time a command was sent, on this app's clock, where plausible; else now."""
        now = self._clock()
        if sent is None:
            return now
        if sent <= now + CLOCK_SLACK_S and now - sent <= MAX_COMMAND_AGE_S:
            return min(sent, now)
        if not self._clock_warned:  # another clock (a container's time namespace, another machine)
            self._clock_warned = True
            log.warning("a command's send time is %.1f s off this app's clock; using the time it arrived", now - sent)
        return now

    def status_reply(self) -> dict:
        app, keys = self._app, self._app.keys
        return {
            "ok": True,
            "status": app.status.value,
            "model": app.model_label,
            "model_state": app.session.model_state.value,
            "hotkeys": keys.choice.name if keys.choice is not None else "none",
            "hotkeys_paused": keys.paused,
            "hotkey_problems": list(getattr(keys.backend, "problems", [])),
        }

    def stop(self) -> None:
        """Quitting: every command still waiting is answered."""
        for take_id in self._app.takes.start_replies():
            self.answer_start(take_id, {"ok": False, "message": "dictation is quitting"})
        self._reply_timer.stop()

    def answer_start(self, take_id: int, extra: dict | None = None) -> None:
        """Answer the `start` (or `toggle`) request that began take ``take_id``, if one waits."""
        self._app.takes.answer_start(take_id, {**self.status_reply(), **(extra or {})})

    def _start_replies_overdue(self) -> None:
        now = time.monotonic()
        warning = (
            f"The microphone was not recording {START_REPLY_MS / 1000:g} s after the press (it is slow to "
            "open): what is said until it records is missing."
        )
        takes = self._app.takes
        for take_id, due in takes.start_replies().items():
            if due <= now:
                self.answer_start(take_id, {"warning": warning})
        if waiting := takes.start_replies():
            self._reply_timer.start(max(1, round((min(waiting.values()) - now) * 1000)))
