"""Picking a backend per session, with fake environments and fake backends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dictation.hotkeys import Environment, HotkeyBackend, HotkeyError, choose_backend
from dictation.hotkeys.choose import COMMANDS_HINT


@pytest.mark.parametrize(
    ("env", "platform", "session", "desktop"),
    [
        ({"XDG_SESSION_TYPE": "wayland", "XDG_CURRENT_DESKTOP": "KDE"}, "linux", "wayland", "KDE"),
        ({"WAYLAND_DISPLAY": "wayland-1", "NIRI_SOCKET": "/run/niri.sock"}, "linux", "wayland", "niri"),
        ({"WAYLAND_DISPLAY": "wayland-1", "HYPRLAND_INSTANCE_SIGNATURE": "abc"}, "linux", "wayland", "Hyprland"),
        ({"XDG_SESSION_TYPE": "x11", "DISPLAY": ":0", "WAYLAND_DISPLAY": "w"}, "linux", "x11", ""),
        ({"XDG_SESSION_TYPE": "tty", "DISPLAY": ":0"}, "linux", "x11", ""),  # startx from a console
        ({}, "linux", "console", ""),
        ({"DISPLAY": ":0"}, "win32", "windows", ""),
        ({}, "darwin", "macos", ""),
    ],
)
def test_environment_detection(env, platform, session, desktop):
    detected = Environment.detect(env, platform)
    assert (detected.session, detected.desktop) == (session, desktop)


class FakeBackend(HotkeyBackend):
    def __init__(self, name, ok, reason, log):
        super().__init__()
        self.name, self._ok, self._reason, self._log = name, ok, reason, log

    def is_available(self):
        self._log.append(self.name)
        return self._ok, self._reason

    def _start(self):
        pass

    def _stop(self):
        pass


def factories(log, **availability):
    defaults = {
        "portal": (True, "portal v2"),
        "evdev": (True, "reads 1 keyboard"),
        "x11": (True, "XGrabKey"),
        "pynput": (True, "XRecord"),
    }
    defaults.update(availability)
    return {name: (lambda n=name, a=a: FakeBackend(n, *a, log)) for name, a in defaults.items()}


WAYLAND = Environment("linux", "wayland", "KDE")
NIRI = Environment("linux", "wayland", "niri")
X11 = Environment("linux", "x11")


@pytest.mark.parametrize(
    ("environment", "availability", "chosen", "probed"),
    [
        (WAYLAND, {}, "portal", ["portal"]),
        (NIRI, {"portal": (False, "no GlobalShortcuts")}, "evdev", ["portal", "evdev"]),
        (NIRI, {"portal": (False, "no portal"), "evdev": (False, "permission denied")}, "none", ["portal", "evdev"]),
        (X11, {}, "x11", ["x11"]),  # grabs, so the hotkey never reaches the focused window
        (X11, {"x11": (False, "no python-xlib")}, "pynput", ["x11", "pynput"]),
        (X11, {"x11": (False, "no X"), "pynput": (False, "no X")}, "evdev", ["x11", "pynput", "evdev"]),
        (Environment("win32", "windows"), {}, "pynput", ["pynput"]),
        (Environment("darwin", "macos"), {}, "pynput", ["pynput"]),
        (Environment("linux", "console"), {}, "evdev", ["evdev"]),
    ],
)
def test_auto_pick(environment, availability, chosen, probed):
    log = []
    choice = choose_backend("auto", environment=environment, factories=factories(log, **availability))
    assert choice.name == chosen
    assert log == probed  # later candidates are not probed once one works


def test_wayland_report_explains_every_backend():
    choice = choose_backend("auto", environment=WAYLAND, factories=factories([]))
    text = choice.describe()
    assert text.splitlines() == [
        "Hotkeys: portal (picked automatically; Wayland session (KDE)) — portal v2.",
        "  evdev: not tried: portal comes first here",
        "  x11: not used — on Wayland X11 key grabs only catch keys typed into XWayland windows",
        "  pynput: not used — on Wayland its X11 hooks only see keys typed into XWayland windows",
    ]


def test_nothing_works_points_to_the_commands():
    availability = {"portal": (False, "no GlobalShortcuts portal"), "evdev": (False, "can't read /dev/input/event0")}
    choice = choose_backend("auto", environment=NIRI, factories=factories([], **availability))
    text = choice.describe()
    assert choice.backend is None
    assert text.startswith("Hotkeys: none of the global hotkey backends works in this Wayland session (niri).")
    assert "portal: unavailable — no GlobalShortcuts portal" in text
    assert "evdev: unavailable — can't read /dev/input/event0" in text
    assert text.endswith(COMMANDS_HINT)
    assert "`dictation toggle`" in text and "`dictation start`" in text and "`dictation stop`" in text


def test_override_by_name_has_no_silent_fallback():
    log = []
    choice = choose_backend("evdev", environment=X11, factories=factories(log))
    assert choice.name == "evdev" and log == ["evdev"]
    assert "chosen in settings" in choice.describe()

    log = []
    choice = choose_backend(" Portal ", environment=X11, factories=factories(log, portal=(False, "no portal")))
    assert choice.backend is None and log == ["portal"]  # x11 would work, but wasn't asked for
    assert choice.describe().startswith("Hotkeys: none — portal was chosen in settings but can't be used")

    choice = choose_backend("none", environment=X11, factories=factories(log))
    assert choice.backend is None and choice.describe().startswith("Hotkeys: off")

    with pytest.raises(HotkeyError, match="unknown hotkey backend 'xinput' — choose one of auto, portal"):
        choose_backend("xinput", environment=X11)


def test_importing_the_package_loads_no_backend_library():
    script = (
        "import sys, dictation.hotkeys as h; h.parse_hotkey('ctrl+alt+space'); "
        "h.Environment.detect(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'pynput', 'evdev', 'jeepney', 'Xlib', 'PySide6'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=Path(__file__).parents[2],
    )
    assert out.stdout.strip() == "[]"
