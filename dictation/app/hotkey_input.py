"""`HotkeyInput`: the global hotkeys the settings choose, for the controller.

It starts the backend (`dictation.hotkeys`) with the dictate key and, where the backend allows, the
cancel key; the listener's thread stamps each press with the clock at once (a take's pre-roll
counts from it) and hands it to the GUI thread as `event`. Paused hotkeys are no events (a new
hotkey is being captured); the cancel key is on only while recording, so elsewhere Esc reaches the
user's windows. Where no backend works the user is told why, with how to bind `dictation toggle`
(or start/stop) in the desktop instead. `hold` (`dictation.output.hold.KeyHold`) knows at every
moment which hotkeys are held, straight from the listener's thread: the output waits for their
release before it sends keys.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal

from dictation.launch import CANCEL, DICTATE  # noqa: F401 - the binding names, shared with the early start
from dictation.output.hold import KeyHold

log = logging.getLogger(__name__)


def no_backend_message(description: str) -> str:
    """What the user is told when no global hotkey works: the reason and how to bind the app's
    commands in the desktop instead (the per-backend reasons stay in the log and on Diagnostics)."""
    from dictation.hotkeys.choose import COMMANDS_HINT

    head = description.splitlines()[0]
    return head if COMMANDS_HINT in head else f"{head} {COMMANDS_HINT}"


# The desktop-file id the portal knows the app by: the file `dictation install-desktop` writes
# (dictation.desktop) and the name main.py gives Qt (setDesktopFileName), so all three agree.
APP_ID = "dictation"


def default_hotkey_chooser(preference: str) -> Any:
    from dictation.hotkeys import choose_backend
    from dictation.hotkeys.choose import default_factories
    from dictation.hotkeys.portal import PortalBackend

    factories = {**default_factories(), "portal": lambda: PortalBackend(app_id=APP_ID)}
    return choose_backend(preference, factories=factories)


class HotkeyInput(QObject):
    event = Signal(str, bool, float)  # binding name, pressed, the clock when the listener saw it
    problem = Signal(str, str)  # level, message: for the user

    _error = Signal(str, bool)  # from the listener's thread: message, fatal

    def __init__(self, clock: Callable[[], float], parent: QObject | None = None, hold: KeyHold | None = None) -> None:
        super().__init__(parent)
        self._clock = clock
        self.backend: Any = None  # the started HotkeyBackend, or None
        self.choice: Any = None  # the BackendChoice (why this backend), or None before the first start
        self.paused = False
        self.hold = hold if hold is not None else KeyHold()  # the output worker's: it waits on it
        self._error.connect(self._on_error)  # queued: handled on this object's (the GUI) thread

    def start(self, hotkeys: Any, chooser: Callable[[str], Any] | None, *, recording: bool) -> None:
        """Start the backend ``chooser`` (None: `default_hotkey_chooser`) picks for ``hotkeys`` (the
        settings' Hotkeys)."""
        from dictation.hotkeys import HotkeyError

        try:
            choice = (chooser or default_hotkey_chooser)(hotkeys.backend)
        except HotkeyError as exc:
            self.problem.emit("error", f"Global hotkeys are off: {exc}")
            return
        self.choice = choice
        log.info("%s", choice.describe())
        if choice.backend is None:
            self.problem.emit("warning", no_backend_message(choice.describe()))
            return
        bindings = {DICTATE: hotkeys.hotkey}
        if hotkeys.cancel_key and choice.backend.name != "portal":
            # The portal would take Esc from every application all the time, so there the cancel key is
            # left out. Elsewhere it is enabled only while recording (`update`): the x11 backend grabs
            # it only then, so Esc keeps working in the user's windows.
            bindings[CANCEL] = hotkeys.cancel_key
        backend = choice.backend
        disabled = set(bindings) if self.paused else set() if recording else {CANCEL}
        try:
            backend.start(
                bindings,
                self._from_listener,
                lambda error: self._error.emit(str(error), bool(getattr(error, "fatal", False))),
                disabled=disabled,
            )
        except (HotkeyError, OSError) as exc:
            self.problem.emit("error", f"Global hotkeys could not start ({backend.name}): {exc}")
            return
        self.backend = backend
        self.hold.backend = backend.name
        grabs = getattr(backend, "keys_taken", None) is not None  # x11: its grab can take our own keys
        self.hold.taken = (lambda: backend.keys_taken) if grabs else None
        self.hold.catch_up = (lambda: backend.settle(1.0)) if grabs else None

    def update(self, *, recording: bool) -> None:
        """Paused hotkeys are off, and the cancel key is on only while recording: the x11 backend
        grabs a key only while it is on, so otherwise it reaches the user's windows (and the hotkey
        field of the settings window while a new hotkey is being chosen)."""
        backend = self.backend
        if backend is None:
            return
        for name in backend.bindings:
            backend.set_enabled(name, not self.paused and (name != CANCEL or recording))

    def set_paused(self, paused: bool, *, recording: bool) -> bool:
        """Pause or resume the hotkeys; False if they already were."""
        if paused == self.paused:
            return False
        self.paused = paused
        self.update(recording=recording)
        log.info("global hotkeys %s", "paused" if paused else "resumed")
        return True

    def stop(self) -> None:
        if self.backend is not None:
            self.backend.stop()
            self.backend = None
        self.hold.reset()  # no release comes any more: a text waiting for one goes out

    def wait_ready(self, timeout: float) -> bool:
        return self.backend is None or self.backend.wait_ready(timeout)

    def describe(self) -> str:
        return "Hotkeys: not started." if self.choice is None else self.choice.describe()

    def _on_error(self, message: str, fatal: bool) -> None:
        self.problem.emit("error" if fatal else "warning", f"Hotkeys: {message}")

    def _from_listener(self, name: str, pressed: bool, t: float | None = None) -> None:
        """Runs on the listener's thread: stamp the time now (the pre-roll counts from it), hand over.
        ``t``: when the key went down or up, where the backend knows (`dictation.launch.EarlyHotkeys`)."""
        self.hold.set(name, pressed)  # at once, not via the GUI thread: a paste may be about to go out
        if not self.paused:  # paused (e.g. while a hotkey is being captured): keys are not events
            self.event.emit(name, pressed, self._clock() if t is None else t)
