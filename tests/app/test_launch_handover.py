"""The hotkey grabbed in the app's first moment (dictation.launch): presses made before
the app took the backend over wait, with their own times, and reach the controller in order once it
has; the take is recorded from the press, not from the hand-over."""

from __future__ import annotations

import threading
import time

from dictation.config import Settings
from dictation.launch import CANCEL, DICTATE, EarlyHotkeys
from dictation.session import Status
from tests.app.controller_fakes import FakeHotkeys, hotkey_chooser
from tests.app.rig import speech


def bindings() -> dict[str, str]:
    keys = Settings().hotkeys
    return {DICTATE: keys.hotkey, CANCEL: keys.cancel_key}


def test_reports_wait_until_the_app_takes_over_then_come_in_order_with_their_times():
    inner = FakeHotkeys()
    early = EarlyHotkeys(inner, clock=lambda: 99.0)
    early.listen(bindings(), disabled={CANCEL})
    inner.event_time = 10.0
    inner.press()
    inner.event_time = 10.5
    inner.release()
    inner.event_time = None  # a backend without the X server's stamps: the time it reported
    inner.press()
    got: list[tuple] = []
    done = threading.Event()

    def on_event(name, pressed, t):
        got.append((name, pressed, t, threading.current_thread() is threading.main_thread()))
        if len(got) == 4:
            done.set()

    assert got == []
    early.start(bindings(), on_event, disabled={CANCEL})  # the app's start: the hand-over
    inner.event_time = 11.0
    inner.release()  # after the hand-over: after the held ones
    assert done.wait(5)
    assert [g[:3] for g in got] == [
        (DICTATE, True, 10.0),
        (DICTATE, False, 10.5),
        (DICTATE, True, 99.0),
        (DICTATE, False, 11.0),
    ]
    assert not got[0][3]  # handed on from a thread: a Qt receiver gets them queued, once its loop runs
    early.stop()
    assert not inner.running


def test_other_keys_by_the_hand_over_restart_the_backend_and_drop_what_was_held():
    inner = FakeHotkeys()
    early = EarlyHotkeys(inner)
    early.listen(bindings(), disabled={CANCEL})
    inner.press()
    got = []
    early.start({DICTATE: "f9"}, lambda *event: got.append(event))
    assert inner.running and inner.bindings[DICTATE].key == "f9"
    time.sleep(0.2)  # nothing is coming: the held press belonged to the old key
    assert got == []
    early.stop()


def test_the_cancel_key_stays_off_until_the_app_turns_it_on():
    inner = FakeHotkeys()
    early = EarlyHotkeys(inner)
    early.listen(bindings(), disabled={CANCEL})
    assert not inner.is_enabled(CANCEL)
    early.start(bindings(), lambda *event: None, disabled={CANCEL})
    early.set_enabled(CANCEL, True)
    assert inner.is_enabled(CANCEL)
    early.stop()


def test_a_press_from_before_the_app_is_recorded_from_its_own_time(rig):
    r = rig()
    early = EarlyHotkeys(r.hotkeys)
    early.listen(bindings(), disabled={CANCEL})
    r.c._s.hotkey_chooser = hotkey_chooser(early)  # what dictation.app.main hands the controller
    pressed = r.clock() - 0.8  # the X server's stamp of a press 0.8 s before the app took over
    r.hotkeys.event_time = pressed
    r.recorders.next_samples(speech())
    r.hotkeys.press()
    r.start()
    r.wait_status(Status.RECORDING)
    # the status turns at the press; the recorder is started on its worker's thread after it (the
    # start cue says it is live: what the rig's hold waits for too)
    r.qtbot.waitUntil(lambda: r.sounds.played[-1:] == ["start"], timeout=5000)
    recorder = r.recorders.recorder
    assert recorder.t_press == pressed
    released = r.hotkeys.event_time = r.clock()
    r.hotkeys.release()
    r.qtbot.waitUntil(lambda: recorder.t_release is not None, timeout=10_000)
    assert recorder.t_release == released


def test_the_output_hold_sees_the_keys_the_early_grab_took(qtbot):
    """The app's HotkeyInput over the early backend: the output's hold reads the keys the x11 grab
    took through it, and catches up through it (without them a paste swallowed while the hotkey was
    held would count as arrived: the day test lost a text that way)."""
    from dictation.app.hotkey_input import HotkeyInput

    class Grabbing(FakeHotkeys):
        keys_taken = 0
        settled = 0

        def settle(self, timeout: float = 5.0) -> bool:
            self.settled += 1
            return True

    inner = Grabbing()
    early = EarlyHotkeys(inner)
    early.listen(bindings(), disabled={CANCEL})
    hotkeys = HotkeyInput(clock=time.monotonic)
    hotkeys.start(Settings().hotkeys, hotkey_chooser(early), recording=False)
    try:
        hold = hotkeys.hold
        mark = hold.mark()
        inner.keys_taken = 2  # the grab took our paste's Ctrl+V
        assert hold.swallowed(mark)
        hold.interrupted(mark)
        assert inner.settled == 1
    finally:
        hotkeys.stop()


def test_a_release_after_the_binding_was_disabled_still_reaches_the_app():
    """Esc cancels and the app disables the cancel key at once: Esc's release must still reach the
    app (the output's hold would otherwise think Esc held and keep every text waiting)."""
    inner = FakeHotkeys()
    early = EarlyHotkeys(inner)
    early.listen(bindings(), disabled={CANCEL})
    got: list[tuple] = []
    early.start(bindings(), lambda name, pressed, t: got.append((name, pressed)), disabled=set())
    deadline = time.monotonic() + 5
    while not early._attached and time.monotonic() < deadline:
        time.sleep(0.01)
    inner.press(CANCEL)
    early.set_enabled(CANCEL, False)
    inner.release(CANCEL)
    inner.release(CANCEL)  # a second release: nothing was pressed, nothing goes out
    assert got == [(CANCEL, True), (CANCEL, False)]
    early.stop()
