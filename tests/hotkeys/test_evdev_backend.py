"""EvdevBackend: permission explanations on a fake /dev/input, and event decoding from fake devices.

The tests run as root in CI, so "permission denied" is simulated with an injected open function;
events are real `evdev.InputEvent` objects delivered through a pipe, so the backend's select loop,
hot-plug rescans and unplug handling run for real.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading

import pytest
from evdev import InputEvent, ecodes

from dictation.hotkeys import EvdevBackend, HotkeyBackendError, parse_hotkey
from dictation.hotkeys.evdev_backend import FIX_COMMAND, GroupInfo, explain_permission_denied
from tests.waiting import wait_until

TIMEOUT = 10.0
KEYBOARD_KEYS = [
    ecodes.KEY_ESC,
    ecodes.KEY_A,
    ecodes.KEY_SPACE,
    ecodes.KEY_F9,
    ecodes.KEY_LEFTCTRL,
    ecodes.KEY_LEFTALT,
    ecodes.KEY_PAUSE,
]


class FakeDevice:
    """The part of evdev.InputDevice the backend uses; events arrive through a real pipe fd."""

    def __init__(self, path, name="Fake Keyboard", keys=KEYBOARD_KEYS):
        self.path, self.name, self._keys = path, name, list(keys)
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        self.fd = self._r
        self._events: list = []
        self._lock = threading.Lock()
        self.gone = False
        self.active: list[int] = []
        self.closed = False

    def capabilities(self):
        return {ecodes.EV_SYN: [0], ecodes.EV_KEY: self._keys}

    def push(self, *events):
        with self._lock:
            self._events += events
        os.write(self._w, b"x")

    def key(self, code, value):
        self.push(InputEvent(0, 0, ecodes.EV_KEY, code, value), InputEvent(0, 0, ecodes.EV_SYN, ecodes.SYN_REPORT, 0))

    def unplug(self):
        self.gone = True
        os.write(self._w, b"x")

    def read(self):
        with contextlib.suppress(BlockingIOError):
            os.read(self._r, 4096)
        if self.gone:
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
        with self._lock:
            events, self._events = self._events, []
        if not events:
            raise BlockingIOError
        return iter(events)

    def active_keys(self):
        return list(self.active)

    def close(self):
        if not self.closed:
            self.closed = True
            os.close(self._r)
            os.close(self._w)


class FakeInput:
    """A fake /dev/input: event files in a temp dir, opened by an injected function."""

    def __init__(self, folder):
        self.folder = folder
        self.devices: dict[str, FakeDevice] = {}
        self.denied: set[str] = set()
        self.opened: list[str] = []

    def add(self, n, *, denied=False, **kwargs) -> str:
        path = str(self.folder / f"event{n}")
        open(path, "w").close()
        os.chmod(path, 0o000)  # as on a real system; root ignores it, hence the injected open
        if denied:
            self.denied.add(path)
        else:
            self.devices[path] = FakeDevice(path, **kwargs)
        return path

    def remove(self, path):
        os.unlink(path)

    def open(self, path):
        self.opened.append(path)
        if path in self.denied:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        device = self.devices[path]
        if device.closed:  # reopened after a rescan: a fresh device object, as the kernel would give
            device = self.devices[path] = FakeDevice(path, device.name, device._keys)
        return device


@pytest.fixture
def fake_input(tmp_path):
    return FakeInput(tmp_path)


NOT_IN_GROUP = GroupInfo(user="ada")


def backend_for(fake_input, group=NOT_IN_GROUP, **kwargs):
    return EvdevBackend(
        input_dir=str(fake_input.folder), open_device=fake_input.open, group_info=lambda: group, **kwargs
    )


# --- permission explanations -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("info", "must_contain", "must_not_contain"),
    [
        (GroupInfo(user="ada"), [FIX_COMMAND, "log out and back in", "permission denied"], ["reboot"]),
        (
            GroupInfo(user="ada", in_group_database=True),
            ["ada was added to the 'input' group", "log out"],
            [FIX_COMMAND],
        ),
        (GroupInfo(user="ada", in_group_database=True, in_group_now=True), ["ls -l /dev/input", "g+r"], [FIX_COMMAND]),
        (GroupInfo(user="ada", group_exists=False), ["no 'input' group", "udev rule"], [FIX_COMMAND]),
    ],
)
def test_permission_explanations(info, must_contain, must_not_contain):
    text = explain_permission_denied(["/dev/input/event3", "/dev/input/event4", "/dev/input/event7"], info)
    assert "\n" not in text
    assert text.startswith("can't read /dev/input/event3 and 2 more (permission denied)")
    for part in must_contain:
        assert part in text
    for part in must_not_contain:
        assert part not in text


def test_unreadable_input_devices_explain_the_fix(fake_input):
    for n in range(3):
        fake_input.add(n, denied=True)
    ok, reason = backend_for(fake_input).is_available()
    assert not ok
    assert reason.startswith(f"can't read {fake_input.folder}/event0 and 2 more (permission denied)")
    assert "`sudo usermod -aG input $USER`" in reason and "log out and back in" in reason
    with pytest.raises(HotkeyBackendError, match="sudo usermod -aG input"):
        backend_for(fake_input).start({"ptt": "F9"}, lambda *a: None)


def test_added_to_group_but_not_relogged(fake_input):
    fake_input.add(0, denied=True)
    ok, reason = backend_for(fake_input, GroupInfo(user="ada", in_group_database=True)).is_available()
    assert not ok and "login session started before that" in reason and "usermod" not in reason


def test_availability_lists_readable_keyboards_and_skips_other_devices(fake_input):
    fake_input.add(0, name="Power Button", keys=[ecodes.KEY_POWER])
    fake_input.add(1, name="AT Keyboard")
    fake_input.add(2, denied=True)
    ok, reason = backend_for(fake_input).is_available()
    assert ok
    assert "1 keyboard(s)" in reason and "AT Keyboard" in reason and "Power Button" not in reason
    assert "1 device(s) unreadable" in reason
    assert all(d.closed for d in fake_input.devices.values())  # the probe leaves nothing open


def test_no_devices_and_wrong_platform(fake_input):
    ok, reason = backend_for(fake_input).is_available()
    assert not ok and "no input devices" in reason
    ok, reason = backend_for(fake_input, platform="darwin").is_available()
    assert not ok and "only on Linux" in reason
    fake_input.add(0, keys=[ecodes.BTN_LEFT])
    ok, reason = backend_for(fake_input).is_available()
    assert not ok and "is a keyboard" in reason


# --- event decoding ------------------------------------------------------------------------------


@pytest.fixture
def running(fake_input):
    backends = []

    def start(bindings, **kwargs):
        backend = backend_for(fake_input, **kwargs)
        events, errors, threads = [], [], []

        def on_event(name, pressed):
            events.append((name, pressed))
            threads.append(threading.current_thread().name)

        bindings = {**bindings, "sync": "pause"}  # the barrier key, see settle()
        backend.start({k: parse_hotkey(v) for k, v in bindings.items()}, on_event, errors.append)
        assert backend.wait_ready(TIMEOUT)
        backends.append(backend)
        return backend, events, errors, threads

    yield start
    for backend in backends:
        backend.stop()


def settle(device, events):
    """Tap Pause (bound to "sync") and wait for it: everything sent before it has been handled.

    Returns the events without the barrier's, and leaves ``events`` holding the same."""
    device.key(ecodes.KEY_PAUSE, 1)
    device.key(ecodes.KEY_PAUSE, 0)
    assert wait_until(lambda: ("sync", False) in events, TIMEOUT), events
    events[:] = [e for e in events if e[0] != "sync"]
    return list(events)


def test_press_repeat_release_and_combo(fake_input, running):
    path = fake_input.add(0)
    backend, events, errors, threads = running({"ptt": "F9", "dictate": "ctrl+alt+space"})
    kb = fake_input.devices[path]
    kb.key(ecodes.KEY_F9, 1)
    for _ in range(5):
        kb.key(ecodes.KEY_F9, 2)  # kernel auto-repeat
    kb.key(ecodes.KEY_F9, 0)
    kb.key(ecodes.KEY_LEFTCTRL, 1)
    kb.key(ecodes.KEY_LEFTALT, 1)
    kb.key(ecodes.KEY_SPACE, 1)
    kb.key(ecodes.KEY_SPACE, 2)
    kb.key(ecodes.KEY_LEFTALT, 0)  # a modifier going up releases the combo
    kb.key(ecodes.KEY_SPACE, 0)
    kb.key(ecodes.KEY_LEFTCTRL, 0)
    kb.key(ecodes.KEY_A, 1)
    kb.key(ecodes.KEY_A, 0)
    assert settle(kb, events) == [("ptt", True), ("ptt", False), ("dictate", True), ("dictate", False)]
    assert backend.repeats_suppressed == 6
    assert set(threads) == {"hotkeys-evdev"}
    assert errors == []
    assert backend.device_paths == [path]


def test_unplugging_a_keyboard_releases_its_keys_and_hot_plug_picks_up_a_new_one(fake_input, running):
    path = fake_input.add(0)
    backend, events, errors, _ = running({"ptt": "F9"}, rescan_interval=0.05)
    kb = fake_input.devices[path]
    kb.key(ecodes.KEY_F9, 1)
    assert wait_until(lambda: events == [("ptt", True)], TIMEOUT)
    kb.unplug()
    fake_input.remove(path)
    assert wait_until(lambda: events == [("ptt", True), ("ptt", False)], TIMEOUT)
    assert wait_until(lambda: errors, TIMEOUT)
    assert not errors[0].fatal and "went away" in str(errors[0])
    assert backend.device_paths == []

    new = fake_input.add(5, name="USB Keyboard")
    assert wait_until(lambda: backend.device_paths == [new], TIMEOUT)
    fake_input.devices[new].key(ecodes.KEY_F9, 1)
    fake_input.devices[new].key(ecodes.KEY_F9, 0)
    assert settle(fake_input.devices[new], events) == [("ptt", True), ("ptt", False)] * 2


def test_two_keyboards_share_held_keys_and_dropped_events_resync(fake_input, running):
    a, b = fake_input.add(0), fake_input.add(1)
    backend, events, _, _ = running({"dictate": "ctrl+space", "ptt": "F9"})
    kb_a, kb_b = fake_input.devices[a], fake_input.devices[b]
    kb_a.key(ecodes.KEY_LEFTCTRL, 1)
    kb_b.key(ecodes.KEY_LEFTCTRL, 1)
    kb_b.key(ecodes.KEY_SPACE, 1)
    assert wait_until(lambda: events == [("dictate", True)], TIMEOUT)
    kb_a.key(ecodes.KEY_LEFTCTRL, 0)  # Ctrl is still down on the other keyboard
    kb_b.active = [ecodes.KEY_LEFTCTRL]  # the kernel dropped space's release...
    kb_b.push(InputEvent(0, 0, ecodes.EV_SYN, ecodes.SYN_DROPPED, 0))  # ...and says so
    assert wait_until(lambda: events == [("dictate", True), ("dictate", False)], TIMEOUT)
    kb_b.key(ecodes.KEY_LEFTCTRL, 0)
    assert settle(kb_a, events) == [("dictate", True), ("dictate", False)]  # nothing stuck: Pause fires


def test_non_keyboards_are_not_opened_for_listening(fake_input, running):
    fake_input.add(0, name="Mouse", keys=[ecodes.BTN_LEFT])
    kb = fake_input.add(1)
    backend, *_ = running({"ptt": "F9"})
    assert backend.device_paths == [kb]
    assert fake_input.devices[str(fake_input.folder / "event0")].closed


def test_stop_closes_devices_and_silences_callbacks(fake_input, running):
    path = fake_input.add(0)
    backend, events, _, _ = running({"ptt": "F9"})
    kb = fake_input.devices[path]
    backend.stop()
    assert kb.closed and not backend.running
    backend.stop()
    assert events == []
