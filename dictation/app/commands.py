"""`Commands`: the part of `AppController` that answers `dictation <command>` (`dictation.ipc`).

A command's send time is the press time where it is plausible on this app's clock; a `start` (or a
`toggle` that starts) is answered once the microphone records, so a late or failed start is told to
the command too (`late_ms`, `warning`, ``ok`` false), or after `START_REPLY_MS` all the same. The
waiting answer is part of its take (`dictation.takes.Take.start_reply`). A mixin of `AppController`
(its state and signals are the controller's), kept apart to be read alone. `show-settings` and
`show-history` are answered before their window opens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QTimer

from dictation import session as S

log = logging.getLogger("dictation.app.controller")  # the controller's part: its log lines stay its own

# A command's send time (`dictation.ipc`) is the press time when it is plausible on this app's clock:
# not ahead of it (beyond a little slack) and not older than this.
MAX_COMMAND_AGE_S = 30.0
CLOCK_SLACK_S = 0.05
START_REPLY_MS = 2000  # a `start` whose microphone is not recording by then is answered all the same


class Commands:
    """Methods of `AppController`: `handle_ipc` and the answers to `start` commands."""

    session: S.DictationSession
    takes: Any
    _status: S.Status
    _model_label: str
    _keys: Any
    _clock: Callable[[], float]
    _clock_warned: bool
    _reply_timer: Any

    def handle_ipc(
        self, command: str, sent: float | None = None, answer: Callable[[dict], None] | None = None
    ) -> dict | None:
        """Answer one `dictation <command>` (see dictation.ipc). ``sent`` is the client's monotonic
        send time: a plausible one is the press time (`command_time`). With ``answer``, a command
        that starts a recording returns None and is answered through it once the microphone records
        (`_answer_start`): late (``late_ms``, ``warning``) or failed (``ok`` false) starts are told."""
        t = self.command_time(sent)
        actions = {  # (not through toggle() etc.: those are slots, and Qt passes them arguments of its own)
            "toggle": lambda: self._dispatch(S.ToggleRequested(t)),
            "start": lambda: self._dispatch(S.StartRequested(t)),
            "stop": lambda: self._dispatch(S.StopRequested(t)),
            "cancel": self.cancel_dictation,
            "status": lambda: None,
            "show-settings": lambda: self._after_the_reply(self.show_settings_requested.emit, ""),
            "show-history": lambda: self._after_the_reply(self.show_history_requested.emit),
            "quit": self.quit_requested.emit,
        }
        if command not in actions:
            return {"ok": False, "message": f"unknown command {command!r}; known: {', '.join(actions)}"}
        before = self.session.recording_take_id
        actions[command]()
        if command in ("toggle", "start") and self.session.model_state is S.ModelState.NOT_CHOSEN:
            return {"ok": False, "message": S.NO_MODEL_MESSAGE}  # refused: the command says so too
        take_id = self.session.recording_take_id
        if answer is not None and take_id is not None and take_id != before and take_id in self.takes:
            self.takes.await_start(take_id, answer, time.monotonic() + START_REPLY_MS / 1000)
            if not self._reply_timer.isActive():
                self._reply_timer.start(START_REPLY_MS)
            return None
        return self._status_reply()

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

    def _status_reply(self) -> dict:
        return {
            "ok": True,
            "status": self._status.value,
            "model": self._model_label,
            "model_state": self.session.model_state.value,
            "hotkeys": self._keys.choice.name if self._keys.choice is not None else "none",
            "hotkeys_paused": self._keys.paused,
            "hotkey_problems": list(getattr(self._keys.backend, "problems", [])),
        }

    def _answer_start(self, take_id: int, extra: dict | None = None) -> None:
        """Answer the `start` (or `toggle`) request that began take ``take_id``, if one waits."""
        self.takes.answer_start(take_id, {**self._status_reply(), **(extra or {})})

    def _start_replies_overdue(self) -> None:
        now = time.monotonic()
        warning = (
            f"The microphone was not recording {START_REPLY_MS / 1000:g} s after the press (it is slow to "
            "open): what is said until it records is missing."
        )
        for take_id, due in self.takes.start_replies().items():
            if due <= now:
                self._answer_start(take_id, {"warning": warning})
        if waiting := self.takes.start_replies():
            self._reply_timer.start(max(1, round((min(waiting.values()) - now) * 1000)))
