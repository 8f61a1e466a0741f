"""PortalBackend against a fake GlobalShortcuts portal on a private dbus-daemon."""

from __future__ import annotations

import threading
import time

import pytest
from jeepney import DBusAddress, new_signal
from jeepney.io.threading import open_dbus_connection

from dictation.hotkeys import PortalBackend, parse_hotkey
from dictation.hotkeys.portal import PORTAL_PATH, SHORTCUTS_IFACE, portal_trigger, session_bus_address
from tests.hotkeys.fake_portal import FakePortal
from tests.waiting import wait_until

TIMEOUT = 10.0
BINDINGS = {"dictate": parse_hotkey("ctrl+alt+space"), "cancel": parse_hotkey("esc")}


@pytest.mark.parametrize(
    ("hotkey", "trigger"),
    [
        ("ctrl+alt+space", "CTRL+ALT+space"),
        ("F9", "F9"),
        ("super+shift+d", "SHIFT+LOGO+d"),
        ("esc", "Escape"),
        ("right_ctrl", "Control_R"),  # a lone modifier is named by its keysym
        ("ctrl", "Control_L"),
        ("right_alt+page_up", "ALT+Page_Up"),  # the spec has no sided modifiers
        ("shift+ctrl", "CTRL+Shift_L"),
        ("ctrl+minus", "CTRL+minus"),
        ("enter", "Return"),
    ],
)
def test_portal_trigger_strings(hotkey, trigger):
    assert portal_trigger(parse_hotkey(hotkey)) == trigger


def test_session_bus_address_fallbacks(tmp_path):
    assert session_bus_address({"DBUS_SESSION_BUS_ADDRESS": "unix:path=/x"}) == "unix:path=/x"
    assert session_bus_address({"XDG_RUNTIME_DIR": str(tmp_path)}) is None
    (tmp_path / "bus").touch()
    assert session_bus_address({"XDG_RUNTIME_DIR": str(tmp_path)}) == f"unix:path={tmp_path}/bus"


def test_availability_reasons(dbus_address, monkeypatch):
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/nonexistent")
    assert PortalBackend().is_available() == (False, "no D-Bus session bus (DBUS_SESSION_BUS_ADDRESS is unset)")
    ok, reason = PortalBackend(bus_address=dbus_address).is_available()
    assert not ok and "xdg-desktop-portal is not running" in reason
    with FakePortal(dbus_address, has_shortcuts=False):
        ok, reason = PortalBackend(bus_address=dbus_address).is_available()
        assert not ok and "no GlobalShortcuts interface" in reason and "niri" in reason
    with FakePortal(dbus_address, version=1):
        assert PortalBackend(bus_address=dbus_address).is_available() == (
            True,
            "desktop portal GlobalShortcuts version 1",
        )


class Recorder:
    def __init__(self):
        self.events, self.errors, self.threads = [], [], set()

    def on_event(self, name, pressed):
        self.events.append((name, pressed))
        self.threads.add(threading.current_thread().name)

    def on_error(self, error):
        self.errors.append(error)


@pytest.fixture
def started(dbus_address):
    backends = []

    def start(fake, **kwargs):
        backend = PortalBackend(bus_address=dbus_address, **kwargs)
        recorder = Recorder()
        t0 = time.monotonic()
        backend.start(BINDINGS, recorder.on_event, recorder.on_error)
        assert time.monotonic() - t0 < 1.0  # start() never waits for the portal or the user
        backends.append(backend)
        return backend, recorder

    yield start
    for backend in backends:
        backend.stop()


def test_session_binding_and_press_release(dbus_address, started):
    with FakePortal(dbus_address, triggers={"dictate": "Ctrl+Alt+Space"}) as fake:
        backend, rec = started(
            fake, app_id="io.github.dictation", descriptions={"dictate": "Hold to dictate", "cancel": "Cancel"}
        )
        assert backend.wait_ready(TIMEOUT)
        assert backend.version == 2
        assert [name for name, _ in fake.calls[:2]] == ["Register", "Get"]  # app id first, then portal calls
        assert fake.calls[0][1] == ("io.github.dictation", {})
        ((session, shortcuts),) = fake.bound
        assert session == fake.sessions[-1]
        assert shortcuts == [
            ("dictate", {"description": ("s", "Hold to dictate"), "preferred_trigger": ("s", "CTRL+ALT+space")}),
            ("cancel", {"description": ("s", "Cancel"), "preferred_trigger": ("s", "Escape")}),
        ]
        assert backend.bound_triggers == {"dictate": "Ctrl+Alt+Space", "cancel": "Escape"}

        fake.activate("dictate")
        fake.activate("dictate")  # a repeated activation is reported once
        fake.activate("cancel")
        fake.deactivate("cancel")
        fake.activate("unknown")  # not ours
        fake.activate("dictate", session=f"{PORTAL_PATH}/session/other/s1")  # another session
        fake.deactivate("dictate")
        expected = [("dictate", True), ("cancel", True), ("cancel", False), ("dictate", False)]
        assert wait_until(lambda: len(rec.events) >= 4, TIMEOUT)
        fake.activate("cancel")
        fake.deactivate("cancel")
        assert wait_until(lambda: len(rec.events) >= 6, TIMEOUT)
        assert rec.events == [*expected, ("cancel", True), ("cancel", False)]
        assert backend.repeats_suppressed == 1
        assert rec.threads == {"hotkeys-portal"} and rec.errors == []

        backend.stop()
        assert fake.closed_sessions == [session]  # the session is closed on stop
        fake.activate("dictate")
        time.sleep(0.1)
        assert len(rec.events) == 6


def test_signals_from_other_bus_clients_are_ignored(dbus_address, started):
    with FakePortal(dbus_address) as fake:
        backend, rec = started(fake)
        assert backend.wait_ready(TIMEOUT)
        spoofer = open_dbus_connection(bus=dbus_address)
        try:
            emitter = DBusAddress(PORTAL_PATH, interface=SHORTCUTS_IFACE)
            spoofer.send(new_signal(emitter, "Activated", "osta{sv}", (fake.sessions[-1], "dictate", 1, {})))
            fake.activate("cancel")
            assert wait_until(lambda: rec.events, TIMEOUT)
            assert rec.events == [("cancel", True)]
        finally:
            spoofer.close()


def test_waits_for_user_consent(dbus_address, started):
    with FakePortal(dbus_address, answer_bind=False) as fake:
        backend, rec = started(fake)
        assert wait_until(lambda: fake.waiting_for_consent, TIMEOUT)
        assert not backend.wait_ready(0.3)  # the dialog is open: not live yet, and start() did not block
        fake.answer(0)
        assert backend.wait_ready(TIMEOUT)
        fake.activate("dictate")
        assert wait_until(lambda: rec.events == [("dictate", True)], TIMEOUT)


def test_dismissed_dialog_is_a_clear_error(dbus_address, started):
    with FakePortal(dbus_address, bind_response=1) as fake:
        backend, rec = started(fake)
        assert wait_until(lambda: rec.errors, TIMEOUT)
        (error,) = rec.errors
        assert error.fatal and error.backend == "portal"
        assert "dismissed" in str(error) and "dictation toggle" in str(error)
        assert not backend.wait_ready(0)
        assert wait_until(lambda: fake.closed_sessions == fake.sessions, TIMEOUT)


def test_portal_errors_are_reported_with_their_name(dbus_address, started):
    with FakePortal(dbus_address, bind_error="org.freedesktop.portal.Error.NotAllowed") as fake:
        backend, rec = started(fake)
        assert wait_until(lambda: rec.errors, TIMEOUT)
        assert str(rec.errors[0]) == (
            "the desktop portal refused the shortcut request: org.freedesktop.portal.Error.NotAllowed: "
            "An app id is required (some desktops only answer apps that register an app id)"
        )
        assert rec.errors[0].fatal and not backend.wait_ready(0)


def test_partly_bound_shortcuts_are_reported(dbus_address, started):
    with FakePortal(dbus_address, bind_only={"dictate"}) as fake:
        backend, rec = started(fake)
        assert backend.wait_ready(TIMEOUT)
        assert wait_until(lambda: rec.errors, TIMEOUT)
        assert not rec.errors[0].fatal and "'cancel'" in str(rec.errors[0])
        assert backend.bound_triggers == {"dictate": "CTRL+ALT+space"}


def test_desktop_closing_the_session_and_stop_during_consent(dbus_address, started):
    with FakePortal(dbus_address) as fake:
        backend, rec = started(fake)
        assert backend.wait_ready(TIMEOUT)
        fake.close_session()
        assert wait_until(lambda: rec.errors, TIMEOUT)
        assert rec.errors[0].fatal and "closed the shortcut session" in str(rec.errors[0])
        assert wait_until(lambda: not backend._thread.is_alive(), TIMEOUT)  # the worker is done
        fake.activate("dictate")
        backend.stop()
        assert rec.events == [] and fake.closed_sessions == []  # nothing to close: the desktop did

    with FakePortal(dbus_address, answer_bind=False) as fake:
        backend, rec = started(fake)
        assert wait_until(lambda: fake.waiting_for_consent, TIMEOUT)
        t0 = time.monotonic()
        backend.stop()
        assert time.monotonic() - t0 < 2.0
        assert fake.closed_sessions == fake.sessions and rec.errors == []
