"""PynputBackend: key translation and repeat suppression with a fake listener, then real X11 events under Xvfb."""

from __future__ import annotations

import enum
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from dictation.hotkeys import HotkeyBackendError, PynputBackend, parse_hotkey
from dictation.hotkeys.pynput_backend import pynput_key_name
from tests.waiting import wait_until

TIMEOUT = 15.0


class Key(enum.Enum):
    """Stands in for pynput.keyboard.Key: the backend only looks at member names."""

    ctrl = 1
    ctrl_r = 2
    alt = 3
    alt_r = 4
    alt_gr = 5
    shift = 6
    shift_r = 7
    cmd = 8
    cmd_r = 9
    f9 = 10
    esc = 11
    space = 12
    media_play_pause = 13
    pause = 14


@dataclass(frozen=True)
class KeyCode:
    char: str | None = None
    vk: int | None = None


@pytest.mark.parametrize(
    ("key", "platform", "expected"),
    [
        (Key.ctrl, "linux", "left_ctrl"),  # X11 reports the left key as the side-less member
        (Key.ctrl_r, "linux", "right_ctrl"),
        (Key.alt_gr, "linux", "right_alt"),
        (Key.alt_r, "win32", "right_alt"),
        (Key.cmd, "darwin", "left_super"),
        (Key.f9, "linux", "f9"),
        (Key.esc, "linux", "esc"),
        (Key.media_play_pause, "linux", None),
        (KeyCode(char="d"), "linux", "d"),
        (KeyCode(char="D"), "linux", "d"),
        (KeyCode(char="!"), "linux", "1"),  # shift+1 goes down as '!' and may come up as '1'
        (KeyCode(char="_"), "linux", "minus"),
        (KeyCode(char="\x04", vk=0x44), "win32", "d"),  # Ctrl+D on Windows: control char, vk 'D'
        (KeyCode(vk=0x64), "linux", "d"),  # X11 keysym 'd' without a char
        (KeyCode(vk=0x02), "darwin", None),  # macOS key codes are not ASCII: no guessing
        (KeyCode(char="é", vk=0xE9), "linux", None),
        (None, "linux", None),
    ],
)
def test_pynput_key_names(key, platform, expected):
    assert pynput_key_name(key, platform) == expected


class FakeListener:
    """Like pynput's Listener: a thread that delivers key events to on_press / on_release."""

    def __init__(self, on_press, on_release):
        self.on_press, self.on_release = on_press, on_release
        self.keys: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="fake-pynput-listener", daemon=True)
        self.ready = threading.Event()

    def start(self):
        self.thread.start()

    def _run(self):
        self.ready.set()
        while (item := self.keys.get()) is not None:
            if isinstance(item, Exception):  # pynput re-raises a listener failure in join()
                self.error = item
                return
            key, pressed = item
            (self.on_press if pressed else self.on_release)(key, False)

    def wait(self):
        self.ready.wait()

    def join(self, timeout=None):
        self.thread.join(timeout)
        if getattr(self, "error", None):
            raise self.error

    def stop(self):
        self.keys.put(None)

    def feed(self, *items):
        for item in items:
            self.keys.put(item)


@pytest.fixture
def fake_backend():
    listeners = []

    def factory(**callbacks):
        listeners.append(FakeListener(**callbacks))
        return listeners[-1]

    backend = PynputBackend(listener_factory=factory, platform="linux")
    events, threads, errors = [], [], []

    def on_event(name, pressed):
        events.append((name, pressed))
        threads.append(threading.current_thread().name)

    def start(bindings):
        backend.start(bindings, on_event, errors.append)
        assert backend.wait_ready(TIMEOUT)
        return listeners[-1]

    yield backend, start, events, threads, errors
    backend.stop()


def settle(listener, events):
    """Tap Pause (bound to "sync") and wait for it: every earlier key has been handled."""
    listener.feed((Key.pause, True), (Key.pause, False))
    assert wait_until(lambda: ("sync", False) in events, TIMEOUT), events
    return [e for e in events if e[0] != "sync"]


def test_auto_repeat_is_reported_once_and_counted(fake_backend):
    backend, start, events, threads, _ = fake_backend
    listener = start({"ptt": parse_hotkey("F9")})
    listener.feed(*[(Key.f9, True)] * 10, (Key.f9, False))
    assert wait_until(lambda: len(events) == 2, TIMEOUT)
    assert events == [("ptt", True), ("ptt", False)]
    assert backend.repeats_suppressed == 9
    assert set(threads) == {"fake-pynput-listener"}  # callbacks come from the listener's thread


def test_combo_with_repeating_key_released_by_its_modifier(fake_backend):
    _, start, events, _, _ = fake_backend
    listener = start({"dictate": parse_hotkey("ctrl+alt+space"), "sync": parse_hotkey("pause")})
    listener.feed((Key.ctrl, True), (Key.alt, True), *[(Key.space, True)] * 5)
    listener.feed((Key.alt, False), (Key.space, False), (Key.ctrl, False))
    assert settle(listener, events) == [("dictate", True), ("dictate", False)]


def test_shifted_character_and_unrelated_keys(fake_backend):
    _, start, events, _, _ = fake_backend
    listener = start({"bang": parse_hotkey("ctrl+shift+1"), "ptt": parse_hotkey("F9"), "sync": parse_hotkey("pause")})
    # shift+F9 and ctrl+alt+1 are different shortcuts; plain typing is ignored
    listener.feed((Key.shift, True), (Key.f9, True), (Key.f9, False), (Key.shift, False))
    listener.feed((KeyCode("a"), True), (KeyCode("a"), False), (Key.ctrl, True), (Key.alt, True))
    listener.feed((KeyCode("1"), True), (KeyCode("1"), False), (Key.alt, False), (Key.ctrl, False))
    listener.feed((Key.ctrl, True), (Key.shift, True), (KeyCode("!"), True))
    listener.feed((Key.shift, False), (KeyCode("1"), False), (Key.ctrl, False))
    assert settle(listener, events) == [("bang", True), ("bang", False)]


def test_callback_exception_does_not_stop_listening():
    seen = []

    def on_event(name, pressed):
        seen.append((name, pressed))
        if len(seen) == 1:
            raise RuntimeError("boom")

    listeners = []
    backend = PynputBackend(listener_factory=lambda **cb: listeners.append(FakeListener(**cb)) or listeners[-1])
    backend.start({"ptt": "F9"}, on_event)
    try:
        listeners[0].feed((Key.f9, True), (Key.f9, False), (Key.f9, True))
        assert wait_until(lambda: len(seen) == 3, TIMEOUT)
        assert seen == [("ptt", True), ("ptt", False), ("ptt", True)]
    finally:
        backend.stop()


def test_no_callbacks_after_stop_and_restart_rules(fake_backend):
    backend, start, events, _, _ = fake_backend
    listener = start({"ptt": parse_hotkey("F9")})
    with pytest.raises(HotkeyBackendError, match="already running"):
        backend.start({"ptt": "F9"}, lambda *a: None)
    backend.stop()
    backend.stop()  # idempotent
    on_press = listener.on_press
    on_press(Key.f9, False)  # a late event from pynput's thread after stop()
    assert events == []
    assert not backend.running


def test_macos_without_input_monitoring_permission_is_explained():
    errors = []

    def factory(**callbacks):
        listener = FakeListener(**callbacks)
        listener.IS_TRUSTED = False  # what pynput's macOS listener sets when the app isn't trusted
        return listener

    backend = PynputBackend(listener_factory=factory, platform="darwin")
    backend.start({"ptt": "F9"}, lambda *a: None, errors.append)
    try:
        assert backend.wait_ready(TIMEOUT)
        assert len(errors) == 1 and not errors[0].fatal
        assert "Privacy & Security → Input Monitoring" in str(errors[0])
    finally:
        backend.stop()


def test_listener_death_is_reported(fake_backend):
    _, start, _, _, errors = fake_backend
    listener = start({"ptt": parse_hotkey("F9")})
    listener.feed(OSError("display connection lost"))
    assert wait_until(lambda: errors, TIMEOUT)
    assert errors[0].fatal and "pynput key listener stopped" in str(errors[0])


# --- real key events on a virtual X display ------------------------------------------------------

PROBE = Path(__file__).with_name("pynput_probe.py")
# "sync" (F12) is the barrier between steps; "probe" (F11) only detects that XRecord is attached.
BINDINGS = {"dictate": "ctrl+alt+space", "ptt": "F9", "cancel": "esc", "sync": "F12", "probe": "F11"}


class Probe:
    def __init__(self, display: str):
        env = {**os.environ, "DISPLAY": display, "PYNPUT_BACKEND": "xorg"}
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, str(PROBE), json.dumps(BINDINGS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def next_line(self, timeout=TIMEOUT) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"probe said nothing for {timeout} s")
        if line is None:
            pytest.fail(f"probe exited: {self.proc.wait()} {self.proc.stderr.read()}")
        if line.startswith("ERROR"):
            pytest.fail(line)
        return line

    def xdotool(self, *args: str) -> None:
        subprocess.run(["xdotool", *args], env=self.env, check=True, timeout=TIMEOUT)

    def sync(self) -> list[tuple[str, bool]]:
        """Tap F12 and return the events that arrived before it (X delivers in order)."""
        self.xdotool("key", "F12")
        events = []
        while (line := self.next_line()).split()[:3] != ["EVENT", "sync", "0"]:
            _, name, pressed, thread = line.split()
            assert thread != "MainThread"  # callbacks come from pynput's listener thread
            if name not in ("sync", "probe"):
                events.append((name, pressed == "1"))
        return events

    def close(self) -> int:
        if self.proc.poll() is None:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
        repeats = -1
        while (line := self.lines.get(timeout=TIMEOUT)) is not None:
            if line.startswith("REPEATS"):
                repeats = int(line.split()[1])
        self.proc.wait(timeout=TIMEOUT)
        return repeats


def test_real_x11_key_events_under_xvfb(xvfb_display):
    probe = Probe(xvfb_display)
    try:
        assert probe.next_line(timeout=30).startswith("READY")
        # XRecord attaches just after pynput reports ready: tap F11 until one arrives (late
        # duplicates are ignored by sync()), then F12 barriers separate the steps.
        deadline = time.monotonic() + TIMEOUT
        while True:
            probe.xdotool("key", "F11")
            try:
                if (probe.lines.get(timeout=0.5) or "").startswith("EVENT probe 1"):
                    break
            except queue.Empty:
                assert time.monotonic() < deadline, "the listener never saw a key"
        assert probe.sync() == []

        probe.xdotool("key", "F9")
        assert probe.sync() == [("ptt", True), ("ptt", False)]

        # held past X's auto-repeat delay (660 ms): X sends repeated presses, we report one
        probe.xdotool("keydown", "F9")
        time.sleep(1.5)
        probe.xdotool("keyup", "F9")
        assert probe.sync() == [("ptt", True), ("ptt", False)]

        probe.xdotool("keydown", "ctrl+alt+space")
        time.sleep(1.0)  # space auto-repeats while the combo is held
        probe.xdotool("keyup", "ctrl+alt+space")  # ctrl goes up first: released at once
        assert probe.sync() == [("dictate", True), ("dictate", False)]

        # a modifier going up first ends the combo; the keys still held don't re-trigger it
        # (exact timing of each rule is in the unit tests: the F12 barrier needs all keys up)
        probe.xdotool("keydown", "ctrl+alt+space", "keyup", "alt", "keydown", "alt", "keyup", "space")
        probe.xdotool("keyup", "alt", "keyup", "ctrl")
        assert probe.sync() == [("dictate", True), ("dictate", False)]

        # cancel while push-to-talk is held, and while the combo's modifiers are held
        probe.xdotool("keydown", "F9", "key", "Escape", "keyup", "F9")
        assert probe.sync() == [("ptt", True), ("cancel", True), ("cancel", False), ("ptt", False)]
        probe.xdotool("keydown", "ctrl+alt+space", "key", "Escape", "keyup", "ctrl+alt+space")
        assert probe.sync() == [("dictate", True), ("cancel", True), ("cancel", False), ("dictate", False)]

        # unrelated keys and near misses trigger nothing
        for combo in ("a", "space", "ctrl+space", "alt+space", "shift+F9", "ctrl+alt+shift+space", "super+Escape"):
            probe.xdotool("key", combo)
        probe.xdotool("type", "hello world")
        assert probe.sync() == []
    finally:
        repeats = probe.close()
    assert repeats >= 3, "X auto-repeat should have produced repeated presses to suppress"


def test_a_key_that_fails_is_logged_without_its_character(fake_backend, caplog):
    """The listener sees every key typed, the app's own typing of dictated text included: a
    failure names no key."""

    class Unfoldable(str):
        def lower(self):
            raise RuntimeError("cannot fold this character")

    _, start, events, _, _ = fake_backend
    listener = start({"ptt": parse_hotkey("F9"), "sync": parse_hotkey("pause")})
    with caplog.at_level(logging.ERROR):
        listener.feed((KeyCode(Unfoldable("ß")), True), (Key.f9, True), (Key.f9, False))
        assert settle(listener, events) == [("ptt", True), ("ptt", False)]  # still listening
    assert "pynput hotkey handling failed for a key press" in caplog.text
    assert "ß" not in caplog.text
