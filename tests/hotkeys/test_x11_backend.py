"""X11GrabBackend: the hotkey is grabbed, so a real target window under Xvfb never sees it.

xdotool presses the keys (XTEST), the backend runs in this process on its own X connection, and a
Qt text field in a child process (key_target.py, on the xcb platform) reports every key event it
receives. Barrier: F12 is bound to "sync" and "z" goes to the window, so once both have arrived,
everything pressed before them has been delivered (the X server delivers in order).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dictation.hotkeys import HotkeyBackendError, X11GrabBackend, parse_hotkey
from dictation.hotkeys.keys import KEYS
from dictation.hotkeys.x11_grabs import probe_grabs
from dictation.hotkeys.x11_keyboard import Keyboard

TIMEOUT = 15.0
HERE = Path(__file__).parent
# Qt::Key values the target reports
QT_SPACE, QT_ESCAPE, QT_F7, QT_F9, QT_F12, QT_Z = 0x20, 0x01000000, 0x01000036, 0x01000038, 0x0100003B, 0x5A
QT_CONTROL, QT_ALT = 0x01000021, 0x01000023
BINDINGS = {
    "dictate": "ctrl+alt+space",
    "ptt": "F9",
    "cancel": "esc",
    "sided": "right_ctrl+F7",
    "sync": "F12",
    "mark": "menu",  # Run.held()'s barrier: unlike F12 (Ctrl+Alt+F12 switches the console) it works with any modifier
}


def xdotool(display: str, *args: str) -> None:
    subprocess.run(["xdotool", *args], env={**os.environ, "DISPLAY": display}, check=True, timeout=TIMEOUT)


class Target:
    """The Qt text field in a child process, and the key events it reported."""

    def __init__(self, display: str):
        env = {**os.environ, "DISPLAY": display, "QT_QPA_PLATFORM": "xcb"}
        env.pop("WAYLAND_DISPLAY", None)
        self.display = display
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "key_target.py")],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.text = ""
        shown = self._next(timeout=60)
        assert shown.startswith("SHOWN"), shown
        self.window = shown.split()[1]

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _next(self, timeout=TIMEOUT) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"the target window said nothing for {timeout} s")
        if line is None:
            pytest.fail(f"the target window exited: {self.proc.wait()}")
        return line

    def focus(self):
        xdotool(self.display, "windowfocus", "--sync", self.window)

    def events_until_sentinel(self) -> list[tuple[str, int, bool]]:
        """(PRESS|RELEASE, Qt key, auto-repeat) received before the sentinel "z" came and went."""
        events = []
        while True:
            line = self._next()
            if line.startswith("TEXT"):
                self.text = eval(line[5:])  # the repr the target printed  # noqa: S307
                continue
            kind, _code, repeat, key = line.split()
            if int(key) == QT_Z:
                if kind == "RELEASE":
                    return events
                continue
            events.append((kind, int(key), repeat == "1"))

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=TIMEOUT)


@pytest.fixture(scope="module")
def target(xvfb_display):
    window = Target(xvfb_display)
    try:
        window.focus()
        yield window
    finally:
        window.close()


class Run:
    """A started backend and what it reported, with the barrier over both it and the window."""

    def __init__(self, display: str, target: Target, bindings=None, disabled=("cancel",), held_since=None):
        self.display, self.target = display, target
        self.backend = X11GrabBackend(display)
        self.backend.held_since = held_since
        self.events: queue.Queue = queue.Queue()
        self.errors: list = []
        self.backend.start(
            bindings or BINDINGS,
            lambda name, pressed: self.events.put((name, pressed, time.monotonic())),
            self.errors.append,
            disabled=disabled,
        )
        assert self.backend.wait_ready(TIMEOUT)
        self.sentinels = 0
        self.state: set[str] = set()  # held(): the bindings held, by the events reported

    def keys(self, *args: str) -> None:
        xdotool(self.display, *args)

    def sync(self) -> tuple[list[tuple[str, bool]], list[tuple[str, int, bool]]]:
        """Events of the backend (with times in ``self.times``) and of the window since the last sync."""
        self.target.focus()
        self.keys("key", "F12", "z")
        self.sentinels += 1
        reported, self.times = [], []
        while True:
            try:
                name, pressed, t = self.events.get(timeout=TIMEOUT)
            except queue.Empty:
                pytest.fail(f"the backend never reported the F12 barrier; so far {reported}")
            if name == "sync":
                if not pressed:
                    break
                continue
            reported.append((name, pressed))
            self.times.append(t)
        return reported, self.target.events_until_sentinel()

    def held(self) -> set[str]:
        """The bindings held now, by the backend's own events so far (Menu is the barrier: it is
        grabbed, so it comes to the backend even while a chord holds the keyboard)."""
        self.keys("key", "Menu")
        while True:
            try:
                name, pressed, _t = self.events.get(timeout=TIMEOUT)
            except queue.Empty:
                pytest.fail(f"the backend never reported the Menu barrier; held so far {self.state}")
            if name == "mark":
                if not pressed:
                    return set(self.state)
                continue
            assert pressed != (name in self.state), f"{name} {'pressed' if pressed else 'released'} twice"
            self.state = self.state | {name} if pressed else self.state - {name}

    def stop(self):
        self.backend.stop()


@pytest.fixture
def run(xvfb_display, target):
    runs = []

    def start(**kwargs):
        runs.append(Run(xvfb_display, target, **kwargs))
        return runs[-1]

    yield start
    for r in runs:
        r.stop()


def keys_of(window_events, kind=None) -> set[int]:
    return {key for k, key, _ in window_events if kind in (None, k)}


def test_the_chord_never_reaches_the_window_whatever_the_release_order(run, target):
    r = run()
    assert r.backend.detectable_auto_repeat  # XkbSetDetectableAutoRepeat took effect on Xvfb
    assert r.sync() == ([], [])

    r.keys("key", "F9")  # F9 alone typed ^[[20~ into a terminal
    assert r.sync() == ([("ptt", True), ("ptt", False)], [])

    repeats = r.backend.repeats_suppressed
    r.keys("keydown", "F9")
    time.sleep(1.2)  # past X's auto-repeat delay (660 ms): repeated presses come, to us only
    r.keys("keyup", "F9")
    assert r.sync() == ([("ptt", True), ("ptt", False)], [])
    assert r.backend.repeats_suppressed - repeats >= 5

    # the key up first, then the modifiers: the window saw Ctrl and Alt go down (before anything
    # was grabbed) and up, never Space
    r.keys("keydown", "ctrl+alt+space")
    time.sleep(1.0)
    r.keys("keyup", "space", "keyup", "alt", "keyup", "ctrl")
    reported, seen = r.sync()
    assert reported == [("dictate", True), ("dictate", False)]
    assert QT_SPACE not in keys_of(seen) and keys_of(seen) <= {QT_CONTROL, QT_ALT}

    # the modifiers up first (the stray-space case): the chord lasts until Space goes up, and the
    # auto-repeating Space never reaches the window
    for first, second in (("ctrl", "alt"), ("alt", "ctrl")):
        r.keys("keydown", "ctrl+alt+space", "keyup", first, "keyup", second)
        up = time.monotonic()
        time.sleep(1.0)
        r.keys("keyup", "space")
        reported, seen = r.sync()
        assert reported == [("dictate", True), ("dictate", False)]
        assert r.times[1] - up >= 0.9  # released by Space's release, not by the modifiers'
        assert QT_SPACE not in keys_of(seen) and keys_of(seen) <= {QT_CONTROL, QT_ALT}
        assert keys_of(seen, "RELEASE") == set()  # the modifiers' releases went to the grab too

    # with Num Lock and Caps Lock on, the grabs still hold
    r.keys("key", "Num_Lock", "key", "Caps_Lock")
    r.sync()
    r.keys("key", "F9", "keydown", "ctrl+alt+space", "keyup", "ctrl+alt+space")
    reported, seen = r.sync()
    assert reported == [("ptt", True), ("ptt", False), ("dictate", True), ("dictate", False)]
    assert QT_F9 not in keys_of(seen) and QT_SPACE not in keys_of(seen)
    r.keys("key", "Num_Lock", "key", "Caps_Lock")
    r.sync()

    # near misses stay with the window: shift+F9, ctrl+space, and left Ctrl with a right_ctrl chord
    r.keys("key", "shift+F9", "key", "ctrl+space", "key", "Control_L+F7")
    reported, seen = r.sync()
    assert reported == []
    assert {QT_F9, QT_SPACE, QT_F7} <= keys_of(seen, "PRESS")
    r.keys("key", "Control_R+F7")
    reported, seen = r.sync()
    assert reported == [("sided", True), ("sided", False)] and QT_F7 not in keys_of(seen)

    # nothing but the sentinels was ever typed into the field (Caps Lock made some of them capitals)
    assert target.text.lower() == "z" * r.sentinels  # (ctrl+space types nothing in a QTextEdit)


def test_escape_is_taken_only_while_the_cancel_key_is_enabled(run):
    r = run()
    r.keys("key", "Escape")
    reported, seen = r.sync()
    assert reported == [] and keys_of(seen, "PRESS") == {QT_ESCAPE}

    r.backend.set_enabled("cancel", True)  # the app does this when a recording starts
    assert r.backend.settle()
    r.keys("key", "Escape")
    assert r.sync() == ([("cancel", True), ("cancel", False)], [])
    r.keys("keydown", "F9", "key", "Escape", "keyup", "F9")
    assert r.sync() == ([("ptt", True), ("cancel", True), ("cancel", False), ("ptt", False)], [])
    r.keys("keydown", "ctrl+alt+space", "key", "Escape", "keyup", "space", "keyup", "alt", "keyup", "ctrl")
    reported, seen = r.sync()
    assert reported == [("dictate", True), ("cancel", True), ("cancel", False), ("dictate", False)]
    assert QT_ESCAPE not in keys_of(seen)

    r.backend.set_enabled("cancel", False)  # and this when it ends
    assert r.backend.settle()
    r.keys("key", "Escape")
    reported, seen = r.sync()
    assert reported == [] and keys_of(seen, "PRESS") == {QT_ESCAPE}


# (keys pressed, the bindings held afterwards): each release ends its own chord, no other, and no
# earlier (a release that ended every held chord left the final events the same)
HOLD_STEPS = [
    (("keydown", "F9"), {"ptt"}),
    (("key", "Escape"), {"ptt"}),  # Esc's release ends the cancel key alone
    (("keydown", "Escape"), {"ptt", "cancel"}),
    (("keyup", "Escape"), {"ptt"}),
    (("keyup", "F9"), set()),
    (("keydown", "ctrl+alt+space"), {"dictate"}),
    (("keyup", "ctrl"), {"dictate"}),  # a modifier goes up first: the chord lasts until Space does
    (("key", "Escape"), {"dictate"}),
    (("keydown", "F9"), {"dictate", "ptt"}),
    (("keyup", "F9"), {"dictate"}),
    (("keyup", "alt"), {"dictate"}),
    (("keyup", "space"), set()),
    (("keydown", "Escape"), {"cancel"}),
    (("keydown", "F9"), {"cancel", "ptt"}),
    (("keyup", "Escape"), {"ptt"}),  # the key that took the keyboard goes up first: F9 is still held
    (("key", "z"), {"ptt"}),  # and the keyboard is still ours: z goes to the backend, not the window
    (("keyup", "F9"), set()),
]


def test_each_release_ends_only_its_own_chord_at_its_own_time(run, target):
    r = run()
    r.backend.set_enabled("cancel", True)
    assert r.backend.settle()
    assert r.sync() == ([], [])
    typed, sentinels = target.text.lower(), r.sentinels
    for i, (keys, held) in enumerate(HOLD_STEPS):
        r.keys(*keys)
        assert r.held() == held, f"step {i}: after {' '.join(keys)}"
    reported, seen = r.sync()
    assert reported == [] and not [e for e in seen if e[1] in (QT_F9, QT_ESCAPE, QT_SPACE)]
    assert target.text.lower() == typed + "z" * (r.sentinels - sentinels)  # the z of the steps never arrived


def test_a_key_disabled_while_it_is_held_still_reports_its_release(run):
    """Esc cancels, the app disables the cancel key at once, Esc goes up: that release is reported,
    or the output would think Esc held for ever and keep every text waiting (output.hold)."""
    r = run()
    r.backend.set_enabled("cancel", True)
    assert r.backend.settle()
    r.keys("keydown", "Escape")
    assert r.held() == {"cancel"}
    r.backend.set_enabled("cancel", False)  # the recording it cancelled has ended
    assert r.backend.settle()
    r.keys("keyup", "Escape")
    assert r.held() == set()
    r.keys("key", "Escape")  # and while disabled it is not reported at all: it goes to the window
    reported, seen = r.sync()
    assert reported == [] and keys_of(seen, "PRESS") == {QT_ESCAPE}


def test_a_chord_another_program_holds_is_named_once_and_the_rest_works(run, xvfb_display):
    import Xlib.display
    from Xlib import XK, X

    other = Xlib.display.Display(xvfb_display)
    try:
        f6 = other.keysym_to_keycode(XK.string_to_keysym("F6"))
        other.screen().root.grab_key(f6, 0, False, X.GrabModeAsync, X.GrabModeAsync)
        other.sync()
        r = run(bindings={"ptt": "F6", "sync": "F12"})
        assert len(r.errors) == 1 and not r.errors[0].fatal
        message = str(r.errors[0])
        assert "The hotkey F6 is already taken by another program" in message
        assert r.backend.problems == [message]
        r.keys("key", "F6")
        assert r.sync() == ([], [])  # F6 went to the program that holds it; F12 still works
        assert probe_grabs(["F6", "F9", "right_ctrl"], xvfb_display) == {"F6": message, "F9": None, "right_ctrl": None}
    finally:
        other.close()


def test_stop_releases_every_grab(run, xvfb_display):
    r = run()
    r.backend.set_enabled("cancel", True)
    assert r.backend.settle()
    assert all(probe_grabs(["F9", "esc", "ctrl+alt+space"], xvfb_display).values())  # all held now
    r.backend.stop()
    assert probe_grabs(["F9", "esc", "ctrl+alt+space", "F12"], xvfb_display) == dict.fromkeys(
        ["F9", "esc", "ctrl+alt+space", "F12"]
    )
    xdotool(xvfb_display, "key", "F9", "z")
    assert keys_of(r.target.events_until_sentinel(), "PRESS") == {QT_F9}


def test_the_backends_connection_sets_up_no_protocol_extension_yet_can_still_list_them(run, xvfb_display):
    """python-xlib would query and load each extension it knows at connection time (half of the time
    to the grab at launch); the backend needs none, so its connection loads none, and works. Asking
    the server for its extensions afterwards is done on a connection made the same way: the backend's
    own belongs to its thread (a request from here raced its event loop for the reply, and under
    pytest -n 2 it once waited forever)."""
    from dictation.hotkeys import x11_xkb

    r = run()
    assert r.backend._display.extensions == []  # an attribute: no request on the backend's connection
    reported, _ = r.sync()  # and the grabs made on it work
    assert reported == []
    display = x11_xkb.connect(xvfb_display)
    try:
        assert display.extensions == []
        assert "XKEYBOARD" in display.list_extensions()  # asking afterwards still reaches the server
    finally:
        display.close()


def test_a_modifier_only_hotkey_is_watched_not_grabbed(xvfb_display, target):
    """right_ctrl types nothing, so it is watched through pynput (in a child process: pynput picks
    its backend at import) and Ctrl+key keeps working in applications."""
    env = {**os.environ, "DISPLAY": xvfb_display, "PYNPUT_BACKEND": "xorg"}
    probe = subprocess.Popen(
        [sys.executable, str(HERE / "x11_probe.py"), json.dumps({"ptt": "right_ctrl", "sync": "F12"})],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert probe.stdout.readline().strip() == "READY"
        # XRecord attaches just after pynput says ready: press until the first press arrives
        deadline = time.monotonic() + TIMEOUT
        while True:
            xdotool(xvfb_display, "key", "Control_R")
            line = probe.stdout.readline().strip()
            if line == "EVENT ptt 1":
                assert probe.stdout.readline().strip() == "EVENT ptt 0"
                break
            assert time.monotonic() < deadline, line
        target.focus()
        xdotool(xvfb_display, "key", "Control_R+F7", "F12", "z")
        lines = []
        while (line := probe.stdout.readline().strip()) != "EVENT sync 0":
            lines.append(line)
        assert lines == ["EVENT ptt 1", "EVENT ptt 0", "EVENT sync 1"]
    finally:
        probe.stdin.write("stop\n")
        probe.stdin.close()
        probe.wait(timeout=TIMEOUT)
    seen = target.events_until_sentinel()
    assert QT_F7 in keys_of(seen, "PRESS")  # right Ctrl+F7 reached the window: nothing was grabbed


# --- the mapping from keys to X key codes and modifier masks, with a fake display -----------------


class FakeDisplay:
    """A keyboard mapping: keysym name -> key codes, and the eight modifiers' key codes."""

    def __init__(self, codes: dict[str, list[int]], modmap: list[list[int]]):
        from Xlib import XK

        XK.load_keysym_group("xkb")
        self._codes = {XK.string_to_keysym(name): c for name, c in codes.items()}
        self._modmap = modmap

    def keysym_to_keycodes(self, keysym):
        return [(code, 0) for code in self._codes.get(keysym, [])]

    def get_modifier_mapping(self):
        return self._modmap


SHIFT, LOCK, CONTROL, MOD1, MOD2, MOD3, MOD4, MOD5 = (1 << i for i in range(8))
CODES = {
    "Shift_L": [50],
    "Control_L": [37],
    "Control_R": [105],
    "Alt_L": [64],
    "ISO_Level3_Shift": [108],  # AltGr on the right Alt key
    "Super_L": [133],
    "Caps_Lock": [66],
    "Num_Lock": [77],
    "Scroll_Lock": [78],
    "space": [65],
    "F9": [75],
}
MODMAP = [[50], [66], [37, 105], [64], [77], [78], [133], [108]]  # Scroll Lock on Mod3, AltGr on Mod5


def test_every_lock_combination_is_grabbed_where_the_layout_has_them():
    keyboard = Keyboard(FakeDisplay(CODES, MODMAP))
    assert keyboard.lock_mask == LOCK | MOD2 | MOD3
    assert keyboard.lock_combinations() == sorted(
        {0, LOCK, MOD2, MOD3, LOCK | MOD2, LOCK | MOD3, MOD2 | MOD3, LOCK | MOD2 | MOD3}
    )
    without_scroll = [m if i != 5 else [] for i, m in enumerate(MODMAP)]
    assert Keyboard(FakeDisplay(CODES, without_scroll)).lock_combinations() == [0, LOCK, MOD2, LOCK | MOD2]


def test_chord_masks_and_sides():
    keyboard = Keyboard(FakeDisplay(CODES, MODMAP))
    chord = keyboard.chord("dictate", parse_hotkey("ctrl+alt+space"))
    assert chord.keycodes == {65} and chord.masks == {CONTROL | MOD1, CONTROL | MOD5} and not chord.sync
    sided = keyboard.chord("ptt", parse_hotkey("right_ctrl+F9"))
    assert sided.masks == {CONTROL} and sided.sided == (frozenset({105}),) and sided.sync
    assert keyboard.chord("ptt", parse_hotkey("F9")).masks == {0}
    with pytest.raises(HotkeyBackendError, match="F10: no key of this keyboard layout produces 'f10'"):
        keyboard.chord("ptt", parse_hotkey("F10"))
    with pytest.raises(HotkeyBackendError, match="no modifier of this keyboard layout is carried by 'right_super'"):
        keyboard.chord("ptt", parse_hotkey("right_super+space"))


def test_every_key_name_has_an_x_keysym():
    from Xlib import XK

    assert [name for name, info in KEYS.items() if not XK.string_to_keysym(info.xkb)] == []


class QueueDisplay:
    """Enough of a display for the key handling: events to read, requests recorded."""

    def __init__(self, events):
        self.events = list(events)
        self.requests = []

    def pending_events(self):
        return len(self.events)

    def next_event(self):
        return self.events.pop(0)

    def allow_events(self, mode, time):
        self.requests.append(("allow_events", mode))

    def flush(self):
        pass


def test_without_detectable_auto_repeat_the_fake_releases_are_recognised():
    from Xlib import X

    def key(kind, time):
        return SimpleNamespace(type=kind, detail=75, state=0, time=time)

    backend = X11GrabBackend(":0")
    reported = []
    backend._on_event = lambda name, pressed: reported.append((name, pressed))
    backend._stopped.clear()
    backend._keyboard = Keyboard(FakeDisplay(CODES, MODMAP))
    backend._chords = {"ptt": backend._keyboard.chord("ptt", parse_hotkey("F9"))}
    # press; two repeats (a release and a press at the same server time each); the real release
    events = [key(X.KeyPress, 10), key(X.KeyRelease, 50), key(X.KeyPress, 50), key(X.KeyRelease, 90)]
    events += [key(X.KeyPress, 90), key(X.KeyRelease, 120)]
    backend._display = QueueDisplay(events[1:])
    backend._handle(events[0])
    while backend._pushback or backend._display.pending_events():
        backend._handle(backend._pushback.pop(0) if backend._pushback else backend._display.next_event())
    assert reported == [("ptt", True), ("ptt", False)]
    assert backend.repeats_suppressed == 2
    assert backend._display.requests == [("allow_events", X.AsyncKeyboard)]


# --- dictation doctor ------------------------------------------------------------------------------


class Unavailable(X11GrabBackend):
    """Stands in for the backends the doctor also asks about (none of them is needed here)."""

    def __init__(self, name):
        super().__init__()
        self.name = name

    def is_available(self):
        return False, "not in this test"


def test_doctor_names_a_hotkey_another_program_holds(xvfb_display, monkeypatch, tmp_path):
    import Xlib.display
    from Xlib import XK, X

    from dictation import doctor
    from dictation.config.settings import Settings

    monkeypatch.setenv("DICTATION_HOME", str(tmp_path / "home"))
    factories = {"x11": lambda: X11GrabBackend(xvfb_display)}
    factories |= {name: (lambda n=name: Unavailable(n)) for name in ("portal", "evdev", "pynput")}
    monkeypatch.setattr(doctor.hotkeys, "hotkey_factories", lambda: factories)
    app_status = {}
    monkeypatch.setattr(doctor.hotkeys, "running_app_status", lambda: app_status.get("reply"))
    settings = Settings()
    settings = settings.replace(hotkeys=settings.hotkeys.replace(hotkey="ctrl+F6"))
    env = {"DISPLAY": xvfb_display, "XDG_SESSION_TYPE": "x11", "PATH": os.environ["PATH"]}

    def grab_checks():
        checks = doctor.run_checks(settings, env=env, platform="linux", areas=["Hotkeys"])
        assert checks[0].detail.startswith("x11 (picked automatically; X11 session) for ctrl+F6")
        return {c.name: c for c in checks if c.name.startswith("Grab")}

    assert {name: c.status for name, c in grab_checks().items()} == {"Grab ctrl+F6": "ok", "Grab esc": "ok"}
    other = Xlib.display.Display(xvfb_display)
    try:
        f6 = other.keysym_to_keycode(XK.string_to_keysym("F6"))
        other.screen().root.grab_key(f6, X.ControlMask, False, X.GrabModeAsync, X.GrabModeAsync)
        other.sync()
        check = grab_checks()["Grab ctrl+F6"]
        assert check.status == "problem"
        assert check.detail.startswith("The hotkey ctrl+F6 is already taken by another program on this X display")
        assert check.fix.startswith("choose another key on the Recording page, or remove that shortcut")
        # the running app itself holds its hotkey: that is no problem
        app_status["reply"] = {"ok": True, "hotkeys": "x11", "hotkey_problems": []}
        assert grab_checks()["Grab ctrl+F6"].detail == "held by the running dictation app"
        app_status["reply"]["hotkey_problems"] = [check.detail]  # ... unless it says it could not grab it
        assert grab_checks()["Grab ctrl+F6"].status == "problem"
    finally:
        other.close()


def test_each_report_carries_the_x_servers_time_of_its_key_event(run, target, xvfb_display):
    """The listener's thread may get to a press late (it waits for the GIL while the app
    imports Qt and torch); the press is dated by the X server's stamp, on this process's clock."""
    r = run()
    times = []
    r.events = EventTimes(r, times)
    before = time.monotonic()
    r.keys("key", "ctrl+alt+space")
    reported, _ = r.sync()
    assert reported == [("dictate", True), ("dictate", False)]
    pressed, released = times[:2]
    assert before - 0.002 <= pressed <= released <= r.times[1] + 0.002


class EventTimes:
    """The events queue of a Run that also notes the backend's `event_time` of each report."""

    def __init__(self, r, times):
        self.queue, self.backend, self.times = r.events, r.backend, times

    def put(self, item):
        if item[0] == "dictate":
            self.times.append(self.backend.event_time)
        self.queue.put(item)

    def get(self, timeout=None):
        return self.queue.get(timeout=timeout)


def test_a_chord_held_at_the_start_counts_from_when_the_microphone_began(run, target, xvfb_display):
    """When a held chord went down is unknown; the app's early start says from when its
    microphone hears (held_since), and the take reaches back to that."""
    target.focus()
    xdotool(xvfb_display, "keydown", "ctrl+alt+space")
    try:
        r = run(held_since=lambda: 123.5)
        name, pressed, _ = r.events.get(timeout=TIMEOUT)
        assert (name, pressed) == ("dictate", True) and r.backend.event_time == 123.5
    finally:
        xdotool(xvfb_display, "keyup", "space", "keyup", "alt", "keyup", "ctrl")
    assert r.sync()[0] == [("dictate", False)]


def test_a_chord_held_before_the_grabs_exist_is_caught_told_and_its_release_comes_to_us(run, target, xvfb_display):
    """Pressed while the app was still starting, the chord was lost without trace
    (a grab starts only at a press) and its release went to the window."""
    target.focus()
    xdotool(xvfb_display, "keydown", "ctrl+alt+space")
    try:
        r = run()
        name, pressed, _ = r.events.get(timeout=TIMEOUT)
        assert (name, pressed) == ("dictate", True)
        assert len(r.errors) == 1 and not r.errors[0].fatal
        assert "ctrl+alt+space was already held down when the app began listening" in str(r.errors[0])
        time.sleep(0.8)  # Space auto-repeats meanwhile: to us, not to the window
    finally:
        xdotool(xvfb_display, "keyup", "space", "keyup", "alt", "keyup", "ctrl")
    reported, seen = r.sync()  # the F12/z barrier works: the keyboard was let go at Space's release
    assert reported == [("dictate", False)]
    assert not [e for e in seen if e[1] == QT_SPACE and e[0] == "RELEASE"]  # the release came to the backend
    assert not [e for e in seen if e[1] == QT_SPACE and e[2]]  # and no repeat reached the window
    assert r.backend.repeats_suppressed > 0
    r.keys("key", "ctrl+alt+space")  # and the chord works as usual afterwards
    assert r.sync()[0] == [("dictate", True), ("dictate", False)]
