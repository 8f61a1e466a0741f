"""The status window (offscreen, real Qt widgets): its title names the app once, its width is fixed
(tiling compositors float it), it grows to show a whole message, and where no global hotkey works
that message says how to bind the app's commands instead. On real displays:
test_status_window_real.py."""

from __future__ import annotations

import re
import time

from PySide6.QtCore import Signal

from dictation.app.hotkey_input import HotkeyInput
from dictation.app.tray import STATUS_WIDTH, Tray, status_title_pattern
from dictation.config import Settings
from dictation.hotkeys.base import HotkeyBackend
from dictation.hotkeys.choose import COMMANDS_HINT, Environment, choose_backend
from tests.app.fakes import FakeController


class _Controller(FakeController):
    hotkeys_paused_changed = Signal(bool)  # the tray listens to it


class Unavailable(HotkeyBackend):
    def __init__(self, name: str, why: str) -> None:
        super().__init__()
        self.name, self.why = name, why

    def is_available(self):
        return False, self.why

    def _start(self) -> None:
        raise AssertionError("an unavailable backend is never started")

    def _stop(self) -> None:
        pass


def _no_backend_on_sway(preference: str):
    factories = {
        "portal": lambda: Unavailable("portal", "no GlobalShortcuts portal"),
        "evdev": lambda: Unavailable("evdev", "no readable keyboard under /dev/input"),
    }
    return choose_backend(preference, environment=Environment("linux", "wayland", "sway"), factories=factories)


def test_where_no_hotkey_works_the_user_is_told_how_to_bind_the_commands(qtbot):
    keys = HotkeyInput(time.monotonic)
    said: list[tuple[str, str]] = []
    keys.problem.connect(lambda level, message: said.append((level, message)))

    keys.start(Settings().hotkeys, _no_backend_on_sway, recording=False)

    [(level, message)] = said
    assert level == "warning"
    assert message == (
        f"Hotkeys: none of the global hotkey backends works in this Wayland session (sway). {COMMANDS_HINT}"
    )
    assert "`dictation toggle`" in message and "bindsym" in message  # before: the first sentence alone


def test_the_status_window_title_names_the_app_once(qtbot, tmp_path):
    controller = _Controller(tmp_path / "app")
    tray = Tray(controller, lambda page: None, lambda: None, force_window=True)
    qtbot.addWidget(tray.window)
    assert tray.window.windowTitle() == "Ready — Dictation"  # Qt appends nothing to a title ending with it
    assert tray.window.windowHandle().title() == "Ready — Dictation"
    controller._paused = True
    controller.hotkeys_paused_changed.emit(True)
    assert tray.window.windowTitle() == "Ready (hotkeys paused) — Dictation"
    pattern = re.compile(status_title_pattern())
    assert pattern.match("Ready (hotkeys paused) — Dictation") and pattern.match("Recording… — Dictation")
    assert not pattern.match("Dictation settings — Dictation") and not pattern.match("Dictation history — Dictation")
    controller.close()


def test_the_status_window_has_a_fixed_width_and_grows_to_show_the_whole_message(qtbot, tmp_path):
    controller = _Controller(tmp_path / "app")
    tray = Tray(controller, lambda page: None, lambda: None, force_window=True)
    window = tray.window
    qtbot.addWidget(window)
    qtbot.waitExposed(window)
    assert window.minimumWidth() == window.maximumWidth() == STATUS_WIDTH  # what makes Sway float it
    before = window.height()
    assert not window.message_label.isVisible()  # no empty line under the status

    message = "Hotkeys: none of the global hotkey backends works in this Wayland session (sway). " + COMMANDS_HINT
    controller.notified.emit("warning", message)

    label = window.message_label
    qtbot.waitUntil(lambda: label.isVisible() and label.height() >= label.heightForWidth(label.width()))
    assert label.text() == message
    assert window.height() > before and window.width() == STATUS_WIDTH
    controller.close()
