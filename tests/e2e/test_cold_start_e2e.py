"""A press in the first moment after launch: the real app, started cold under
Xvfb with the virtual microphone, is pressed the moment its command socket exists, by `dictation
start` and by the global hotkey, while a tone burst plays into the microphone; the take must hold
the burst from its start (see `tests/e2e/coldstart.py`)."""

from __future__ import annotations

import os

import pytest

from tests.e2e.coldstart import cold_start, timed_press, write_burst


@pytest.fixture
def burst(tmp_path):
    return write_burst(tmp_path / "burst.wav")


def _runs(way, n, xvfb, pulse_server, tmp_path, ckpt_untied, burst):
    runs = [cold_start(way, xvfb, pulse_server, tmp_path / f"home-{way}-{i}", ckpt_untied, burst) for i in range(n)]
    lines = "\n".join(run.line() for run in runs)
    print(f"\ncold start, {way}: {sum(r.complete for r in runs)}/{n} complete\n{lines}")
    return runs, lines


@pytest.mark.parametrize("way", ["cli", "x11"])
def test_a_press_as_the_socket_appears_records_from_the_press(
    way, xvfb, pulse_server, tray_host, tmp_path, ckpt_untied, burst
):
    n = int(os.environ.get("DICTATION_COLDSTART_RUNS", "1"))
    runs, lines = _runs(way, n, xvfb, pulse_server, tmp_path, ckpt_untied, burst)
    assert all(run.complete for run in runs), lines
    for run in runs:
        assert run.exit_code == 0 and "Traceback" not in run.log(), run.log()[-4000:]
        if way == "cli":  # answered once recording, from the press on: nothing to warn about
            assert run.reply["ok"] is True and run.reply["status"] == "recording" and "warning" not in run.reply


# --- presses at set times after the launch --------------------------------------------------------------

# 0.3 s (the aim) is met on 2 idle cores: DICTATION_LAUNCH_DELAYS=0.3 DICTATION_LAUNCH_RUNS=12 measures it
# (docs/app.md); the default leaves a CI machine of unknown speed room, as a timing figure is a
# measurement, not a pass/fail line
DELAYS_S = tuple(float(s) for s in os.environ.get("DICTATION_LAUNCH_DELAYS", "0.5,0.6,1.0,1.5").split(","))
LONG_BURST_S = 3.0


@pytest.fixture(scope="module")
def installed():
    """The package compiled as an installation has it: this checkout's modules would otherwise be
    compiled at every launch (PYTHONDONTWRITEBYTECODE), which a user's start never pays."""
    import subprocess
    import sys
    from pathlib import Path

    import dictation

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(dictation.__file__).parent)], check=True)


@pytest.fixture(scope="module")
def key_target(xvfb):
    from tests.hotkeys.test_x11_backend import Target

    window = Target(xvfb["DISPLAY"])
    try:
        yield window
    finally:
        window.close()


def test_a_press_right_after_launch_records_from_the_press_and_leaks_no_key_after_the_grab(
    xvfb, pulse_server, tray_host, tmp_path, ckpt_untied, burst, key_target, installed
):
    """The real app, its chord pressed (and held) 0.5, 0.6, 1.0 and 1.5 s after the launch, the burst
    playing from the press: every take holds the whole burst with quiet before it, and nothing is
    reported missing (nothing is). No Space of the chord reaches the focused window once the grab
    exists; a press that comes before it (the grab lands 0.3-0.5 s after the process starts on a
    2-core machine: the interpreter and the imports it needs take most of that) leaks its own
    key-press alone, never an auto-repeat: the held chord is found in the keyboard's state and the
    keyboard taken until its release."""
    n = int(os.environ.get("DICTATION_LAUNCH_RUNS", "1"))
    runs = [
        timed_press(delay, xvfb, pulse_server, tmp_path / f"home-{delay}-{i}", ckpt_untied, burst, key_target)
        for i in range(n)
        for delay in DELAYS_S
    ]
    lines = "\n".join(run.line() for run in runs)
    print(f"\npresses after launch:\n{lines}")
    for run in runs:
        assert run.exit_code == 0 and "Traceback" not in run.log(), run.log()[-4000:]
    assert all(run.found is not None and run.found.complete for run in runs), lines
    for run in runs:
        grabbed = run.grabbed_after_s()
        assert grabbed is not None, lines
        # the press's own timing against the app's figure: the app's clock starts at the fork, ours
        # just before it, so a press counts as after the grab only with 20 ms to spare
        allowed = 0 if run.pressed_after_s > grabbed + 0.02 else 1
        assert run.leaked <= allowed, lines
    assert all(run.warning_ms is None for run in runs), lines


def test_a_take_that_begins_after_the_press_says_by_how_much(
    xvfb, pulse_server, tray_host, tmp_path, ckpt_untied, burst, key_target, installed
):
    """With the microphone opened at each press, the take may begin after it: the warning's amount is
    what the take is missing of the burst played from the press, within 50 ms (the player's own
    start-up latency, a few tens of ms, is part of that margin), and no warning comes where nothing
    was lost (the microphone opened in time: the unit tests in tests/audio/test_capture.py pin the
    amount for late blocks)."""
    long_burst = write_burst(tmp_path / "burst-3s.wav", seconds=LONG_BURST_S)  # outlasts a slow microphone
    home = tmp_path / "home"  # pressed once the app runs: this is about the warning, not the launch
    run = timed_press(
        0.5, xvfb, pulse_server, home, ckpt_untied, long_burst, key_target, keep_open=False, after_ready=True
    )
    print(f"\n{run.line()}")
    assert run.exit_code == 0 and "Traceback" not in run.log(), run.log()[-4000:]
    assert run.found is not None and run.found.onset_s is not None, run.line()
    missing_ms = (LONG_BURST_S - run.found.length_s) * 1000
    print(f"{missing_ms:.0f} ms of the {LONG_BURST_S:g}-s burst missing")
    if run.warning_ms is None:
        # a microphone that opened in time: nothing is said, and nothing was lost (the app warns from
        # 50 ms on; the player's own start-up latency adds a few tens of ms to what is missing here)
        assert missing_ms <= 100, f"{missing_ms:.0f} ms missing and no warning: {run.line()}"
    else:
        assert abs(run.warning_ms - missing_ms) <= 50, f"{missing_ms:.0f}: {run.line()}"
    assert run.leaked == 0, run.line()
