"""Dictating back to back on a real X server: the real x11 hotkey backend, fed to the
hold as the app feeds it (`HotkeyInput`), the real output chain and a real target window under Xvfb.
The chord is held with xdotool while a take's text is ready."""

from __future__ import annotations

import random
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest

from dictation.hotkeys import X11GrabBackend
from dictation.output import OutputOptions, choose_backend
from dictation.output.hold import KeyHold
from dictation.takes import outcome_of
from tests.waiting import wait_until

CHORD_DOWN = ("keydown", "ctrl+alt+space")
CHORD_UP = ("keyup", "space", "keyup", "alt", "keyup", "ctrl")  # the key first: the modifiers go up after it
QUIET_S = 1.0  # how long nothing may arrive while the chord is held


def xdotool(env, *args):
    subprocess.run(["xdotool", *args], env=env, check=True, timeout=15)


@pytest.fixture
def hotkeys(xvfb):
    """The real x11 backend started by the app's `HotkeyInput`, which feeds the hold."""
    from dictation.app.hotkey_input import HotkeyInput
    from dictation.config.settings import Settings

    hold = KeyHold()
    keys = HotkeyInput(time.monotonic, hold=hold)
    backend = X11GrabBackend(xvfb["DISPLAY"])
    choice = SimpleNamespace(backend=backend, describe=lambda: "x11")
    keys.start(Settings().hotkeys, lambda _preference: choice, recording=False)
    assert keys.backend is backend and backend.wait_ready(15)
    yield hold, backend
    keys.stop()


def test_back_to_back_takes_wait_for_the_release_and_arrive_in_order(xvfb, target, xclipboard, hotkeys):
    hold, backend = hotkeys
    options = OutputOptions(restore_delay_ms=3_600_000)
    chain = choose_backend(options, xvfb, hold=hold)
    unguarded = choose_backend(options, xvfb)  # as before: no hold
    try:
        # What users lost: a paste while the chord is held goes to the grab, and is reported as pasted.
        xdotool(xvfb, *CHORD_DOWN)
        wait_until(lambda: hold.held == {"dictate"}, 10, what="the backend to report the press")
        lost = unguarded.deliver("lost ")
        assert (lost.ok, outcome_of(lost)) == (True, "pasted")
        time.sleep(QUIET_S)
        assert target.text() == ""
        xdotool(xvfb, *CHORD_UP)
        wait_until(lambda: not hold.held, 10, what="the backend to report the release")

        results = []
        for take in ("first take. ", "second take."):
            # the next take's chord is down when this take's text is ready
            xdotool(xvfb, *CHORD_DOWN)
            wait_until(lambda: hold.held == {"dictate"}, 10, what="the backend to report the press")
            sender = threading.Thread(target=lambda t=take: results.append(chain.deliver(t)))
            sender.start()
            wait_until(lambda: hold.waiting == 1, 10, what="the text to wait for the release")
            time.sleep(QUIET_S)
            before = "first take. " if take == "second take." else ""
            assert target.text() == before  # nothing is typed while the chord is held
            if before:  # Space up, Ctrl and Alt still down: the paste must not combine with them
                xdotool(xvfb, "keyup", "space")
            else:
                xdotool(xvfb, *CHORD_UP)
            sender.join(15)
            expected = before + take
            assert target.wait_for_text(expected) == expected  # arrives after the release, in order
        xdotool(xvfb, *CHORD_UP)
        assert [(r.ok, outcome_of(r)) for r in results] == [(True, "pasted"), (True, "pasted")]
        assert all(r.waited_s >= QUIET_S for r in results)
        assert backend.keys_taken >= 1  # the unguarded paste's keys went to the grab
    finally:
        chain.flush()
        unguarded.flush()


TAKES = 20


def test_twenty_takes_in_a_row_lose_nothing(xvfb, target, xclipboard, hotkeys):
    """The first measurement: 20 dictations in a row, each pressed soon after the previous release;
    3 were lost, each one whose paste came while the next take's chord was already down. Here about
    half the texts are ready while it is down, the others before it goes down."""
    hold, _backend = hotkeys
    chain = choose_backend(OutputOptions(restore_delay_ms=3_600_000), xvfb, hold=hold)
    rng = random.Random(25)
    texts = [f"t{i:02d} " for i in range(TAKES)]
    results, held_while_ready = [], 0
    try:
        for text in texts:
            sender = threading.Thread(target=lambda t=text: results.append(chain.deliver(t)))
            if rng.random() < 0.5:  # the next take's chord is down when the text is ready
                held_while_ready += 1
                xdotool(xvfb, *CHORD_DOWN)
                wait_until(lambda: hold.held == {"dictate"}, 10, what="the backend to report the press")
                sender.start()
                wait_until(lambda: hold.waiting == 1, 10, what="the text to wait for the release")
                time.sleep(rng.uniform(0.1, 0.4))
                xdotool(xvfb, *CHORD_UP)
                sender.join(15)
            else:  # the text is out before the next press
                sender.start()
                sender.join(15)
                xdotool(xvfb, *CHORD_DOWN)
                time.sleep(rng.uniform(0.1, 0.4))
                xdotool(xvfb, *CHORD_UP)
        assert 5 <= held_while_ready <= 15
        assert target.wait_for_text("".join(texts)) == "".join(texts)  # all of them, in order, once each
        assert [outcome_of(r) for r in results] == ["pasted"] * TAKES
    finally:
        chain.flush()
