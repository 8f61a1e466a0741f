"""A day of real use: the real app under Xvfb with a window manager (openbox),
a tray host, a gated virtual microphone (digital zeros between the clips), the x11 hotkey backend
pressed through XTest and text pasted by xdotool into a real target window, through the patterns
users hit, 42 dictations in all:

1. presses right after launch: 0.5, 0.6, 1.0 and 1.5 s after the process starts (0.3 s, the
   issue's aim, is not met on 2 cores: docs/app.md), speech from the
   press, one launch each (push-to-talk, toggle, hybrid, push-to-talk);
2. toggle (tap to start, tap to stop) and hybrid (holds and taps);
3. back to back: the next press 0.1 s after the previous release, so the previous text is pasted
   while the hotkey is held again;
4. short takes of 0.5-2 s on the gated microphone, with 0.3 s of digital zeros around the speech;
5. cancel (Esc while held), between dictations that must still be typed;
6. kill -9 in the middle of a take (started by `dictation start`), then a restart pressed 1 s after
   launch: the take is recovered into the history, and the press is recorded.

Then `day_report` counts: every dictation not cancelled has one history entry, typed (or recovered),
whose recording holds its speech from the first sample; the target holds exactly the typed texts in
order; no Space of the hotkey reached the target. The failure lists each dictation that was lost,
leaked or clipped, by number and pattern.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.day import (
    DayApp,
    DayTarget,
    Keyboard,
    app_env,
    make_clips,
    start_tray_host,
    start_window_manager,
    write_settings,
)
from tests.e2e.day_report import Dictation, Report, check_history, check_keys, check_typed
from tests.oracle.checkpoints import cached_checkpoint
from tests.output.conftest import _stop, running_xvfb

LAUNCHES = ((0.5, "push_to_talk"), (0.6, "toggle"), (1.0, "hybrid"), (1.5, "push_to_talk"))
BACK_TO_BACK = 14
GATED = 8
N_DICTATIONS = len(LAUNCHES) + 3 + 4 + BACK_TO_BACK + GATED + 5 + 1 + 3
SHORT_TEXT_EOS_BIAS = 23.0  # see tests/oracle/checkpoints.py: 25 stops after a few tokens, or at once
SETTLE_S = 60  # for the model to load, the queue to drain, the last paste to land


@pytest.fixture(scope="session")
def ckpt_short_text(ckpt_root):
    """The tiny random checkpoint with a bias towards ending its text: 10 to 450 characters on these
    clips (never none, every clip a different text), so a transcription takes a second or two on two
    cores instead of the full token budget's five or more."""
    return cached_checkpoint(ckpt_root, tie_word_embeddings=False, eos_bias=SHORT_TEXT_EOS_BIAS)


@pytest.fixture
def desk(xvfb, tmp_path):
    """A display of its own with openbox and trayer (the shared Xvfb has no window manager)."""
    with running_xvfb(tmp_path / "xvfb.log") as display:
        env = {**xvfb, "DISPLAY": display}
        wm = start_window_manager(env, tmp_path / "wm")
        tray = start_tray_host(env)
        target = DayTarget(env, tmp_path)
        keyboard = Keyboard(display)
        try:
            yield env, target, keyboard
        finally:
            keyboard.close()
            target.close()
            _stop(tray)
            _stop(wm)


class Day:
    def __init__(self, env, target, keyboard, pulse, home, model, clips):
        self.env, self.target, self.keys, self.pulse = env, target, keyboard, pulse
        self.home, self.model, self.clips = home, model, clips
        self.dictations: list[Dictation] = []
        self.notes: list[str] = []  # problems of the app itself (exits, hangs, tracebacks)
        self.app: DayApp | None = None

    def launch(self, mode: str) -> DayApp:
        write_settings(self.home, self.model, mode)
        self.app = DayApp(app_env(self.env, self.pulse.env, self.home), self.home)
        return self.app

    def new(self, pattern: str, expect: str = "typed", detail: str = "") -> Dictation:
        d = Dictation(len(self.dictations) + 1, pattern, self.clips[len(self.dictations)], expect, detail=detail)
        self.dictations.append(d)
        return d

    def speak(self, d: Dictation) -> None:
        self.pulse.play(d.clip.path).wait(30)

    def hold(self, d: Dictation, lead: float = 0.0, tail: float = 0.2) -> None:
        """Push-to-talk (or a hybrid hold): press, ``lead`` s of zeros, the clip, ``tail`` s, release."""
        d.pressed = self.keys.press()
        time.sleep(lead)
        self.speak(d)
        time.sleep(tail)
        d.released = self.keys.release()

    def taps(self, d: Dictation) -> None:
        """Toggle (or a hybrid tap): tap, the clip, tap."""
        d.pressed, _ = self.keys.tap()
        self.speak(d)
        time.sleep(0.2)
        _, d.released = self.keys.tap()

    def settle(self, timeout: float = SETTLE_S) -> None:
        """Waits until the last dictation is typed (or dropped) and the app idle. A recording still
        running 3 s after the dictation ended (the app missed its press or its release) is noted and
        cancelled, so the day goes on."""
        last = self.dictations[-1]
        end = time.monotonic() + 3
        while self.app.status().get("status") == "recording" and time.monotonic() < end:
            time.sleep(0.1)
        if self.app.status().get("status") == "recording":
            self.notes.append(
                f"{last.name()}: the app was still recording 3 s after it ended (it missed a press or a "
                "release): that recording was cancelled"
            )
            self.app.send("cancel")
        doing = self.app.wait_settled(timeout)
        if doing is not None:
            self.notes.append(f"{last.name()}: the app was still busy ({doing}) {timeout:.0f} s after it")
        time.sleep(0.3)  # a paste sent just now lands; an extra key would too

    def quit(self, what: str) -> None:
        code = self.app.quit()
        if code != 0:
            self.notes.append(f"the app ({what}) exited with {code} when asked to quit")

    def at(self, seconds_after_launch: float) -> None:
        time.sleep(max(0.0, self.app.launched + seconds_after_launch - time.time()))


def run_day(day: Day) -> None:
    # 1-2: presses right after launch, each launch in its own mode, then that mode's dictations
    for delay, mode in LAUNCHES:
        day.launch(mode)
        day.at(delay)
        d = day.new(f"launch +{delay} s ({mode})", detail=f"pressed {delay} s after the process started")
        if mode == "toggle":
            day.taps(d)
        else:
            day.hold(d)
        day.settle()
        grabbed = day.app.grabbed_after_s()
        if grabbed is None or d.pressed - day.app.launched <= grabbed + 0.02:
            # before the grab (it lands 0.3-0.5 s after the start on 2 cores): the press itself
            # reaches the window, nothing more (tests/e2e/test_cold_start_e2e.py)
            d.leak_allowed = 1
        if mode == "toggle":
            for _ in range(3):
                day.taps(day.new("toggle"))
                day.settle()
        elif mode == "hybrid":
            for i in range(4):
                if i % 2:
                    day.taps(day.new("hybrid tap"))
                else:
                    day.hold(day.new("hybrid hold"))
                day.settle()
        if mode == "push_to_talk" and delay == LAUNCHES[-1][0]:
            break
        day.quit(f"launched for the {mode} press")
    # 3: back to back, the next press 0.1 s after the previous release
    for _ in range(BACK_TO_BACK):
        day.hold(day.new("back-to-back", detail="pressed 0.1 s after the previous release"), tail=0.15)
        time.sleep(0.1)
    day.settle()
    # 4: short takes on the gated microphone, digital zeros around the speech
    for _ in range(GATED):
        day.hold(day.new("gated microphone", detail="0.3 s of digital zeros before and after"), lead=0.3, tail=0.3)
        day.settle()
    # 5: cancel with Esc while held, next to dictations that are typed
    for expect in ("typed", "cancelled", "typed", "cancelled", "cancelled"):
        d = day.new("cancel (Esc while held)" if expect == "cancelled" else "next to a cancel", expect)
        d.pressed = day.keys.press()
        day.speak(d)
        time.sleep(0.1)
        if expect == "cancelled":
            day.keys.escape()
            time.sleep(0.1)
        d.released = day.keys.release()
        time.sleep(0.3)
    day.settle()
    # 6: kill -9 in the middle of a take, then a restart pressed 1 s after launch
    d = day.new("kill -9 mid-take", "recovered", detail="started by `dictation start`, killed 0.8 s after the speech")
    d.pressed = time.time()
    reply = day.app.send("start")
    if reply.get("status") != "recording":
        day.notes.append(f"`dictation start` for dictation #{d.n} answered {reply}")
    day.speak(d)
    time.sleep(0.8)  # the take is written to disk every 0.5 s while it records
    day.app.kill9()
    day.launch("push_to_talk")
    day.at(1.0)
    day.hold(day.new("after the restart", detail="pressed 1.0 s after the restart"))
    day.settle()
    for _ in range(2):
        day.hold(day.new("after the restart"))
        day.settle()
    day.quit("restarted after kill -9")


def test_a_day_of_dictation_loses_nothing_leaks_nothing_clips_nothing(desk, pulse_server, tmp_path, ckpt_short_text):
    env, target, keyboard = desk
    clips = make_clips(tmp_path / "clips", N_DICTATIONS)
    assert min(c.seconds for c in clips) >= 0.5 and max(c.seconds for c in clips) <= 2.0
    day = Day(env, target, keyboard, pulse_server, tmp_path / "home", ckpt_short_text, clips)
    t0 = time.monotonic()
    try:
        run_day(day)
    finally:
        keyboard.let_go()
        if day.app is not None and day.app.proc.poll() is None:
            day.app.quit()
    assert len(day.dictations) == N_DICTATIONS >= 40
    (tmp_path / "day.json").write_text(json.dumps([d.record() for d in day.dictations], indent=1))

    report = Report(other=list(day.notes))
    log = day.app.log()
    owned = check_history(day.dictations, day.app.history(), log, report)
    check_typed(day.dictations, owned, target.text(), log, report)
    check_keys(day.dictations, target.key_events(), report)
    if "Traceback" in log:
        report.other.append("the app's log holds a traceback:\n" + log[log.index("Traceback") :][:3000])
    print(f"\n{report.summary(day.dictations)}\n(the day took {time.monotonic() - t0:.0f} s)")
    # the day's files stay for a closer look: day.json, target.txt, target-keys.log, home/ (log, history, recordings)
    assert not report.lines(), f"{report.summary(day.dictations)}\n(the day's files: {tmp_path})"
