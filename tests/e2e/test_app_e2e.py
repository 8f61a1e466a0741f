"""The real app, end to end: `python -m dictation` under Xvfb with a tray host and a virtual
microphone, a tiny random checkpoint, and a separate target window.

Driven twice, as users do: with `dictation start` / `dictation stop` (compositor bindings) and
with a synthesized hotkey press and release (xdotool keydown/keyup, grabbed by the x11 backend,
Ctrl and Alt let go before Space as people often do). Each time the exact transcript the engine
produced, as recorded in the history database, must appear in the target window, and the
clipboard the user had before must be back afterwards: the auto-repeating Space of the held
hotkey must not have reached the window.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dictation.config import History, Outcome, Settings
from dictation.config.store import SettingsStore
from tests.waiting import wait_until

HOTKEY = "ctrl+alt+space"
USER_CLIPBOARD = "what the user had copied — ünïcode ✓"
SPEECH = "Hello world, this is a dictation test."


def _run(env, *argv, timeout=30) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)


class RunningApp:
    def __init__(self, env: dict[str, str], home: Path, module: str = "dictation"):
        self.env = env
        self.home = home
        self.log = home / "app-stdout.log"
        with open(self.log, "ab") as out:  # appended: a restarted app keeps the first one's output
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, "-v"], env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def command(self, *args: str) -> subprocess.CompletedProcess:
        return _run(self.env, sys.executable, "-m", "dictation", *args)

    def status(self) -> dict:
        proc = self.command("status", "--json")
        if proc.returncode != 0:
            if self.proc.poll() is not None:
                pytest.fail(f"the app exited with {self.proc.returncode}:\n{self.output()}")
            return {}
        return json.loads(proc.stdout)

    def wait_status(self, status: str, timeout: float = 60) -> None:
        wait_until(
            lambda: self.status().get("status") == status, timeout, what=f"app status {status!r}\n{self.output()}"
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def history(self) -> list:
        with History(self.home / "data" / "history.sqlite3") as history:
            return history.recent(10)

    def finished_entries(self, n: int) -> list:
        entries = self.history()
        if len(entries) >= n and all(e.outcome != Outcome.PENDING for e in entries[:n]):
            return entries
        return []

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.command("quit")
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@pytest.fixture
def tray_host(xvfb):
    if shutil.which("trayer") is None:
        pytest.fail("trayer (a system tray host for Xvfb) is missing: apt-get install trayer")
    proc = subprocess.Popen(
        ["trayer", "--edge", "top", "--align", "right", "--widthtype", "request", "--height", "24"],
        env=xvfb,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(lambda: _run(xvfb, "xdotool", "search", "--class", "trayer").returncode == 0, 15, what="trayer")
    yield
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def speech_wav(tmp_path):
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is missing: apt-get install espeak-ng")
    path = tmp_path / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(path), SPEECH], check=True, capture_output=True, timeout=30)
    return path


@pytest.fixture
def app(xvfb, pulse_server, tray_host, tmp_path, ckpt_untied):
    home = tmp_path / "home"
    settings = Settings()
    settings = settings.replace(
        engine=settings.engine.replace(model=str(ckpt_untied), device="cpu", dtype="fp32"),
        hotkeys=settings.hotkeys.replace(hotkey=HOTKEY, backend="x11"),
        # the cues play into the virtual sink, whose monitor is the microphone: a speaker the
        # microphone hears perfectly; they must stay out of the recordings
        recording=settings.recording.replace(sounds=True, sound_volume=100, trim_silence=True),
        output=settings.output.replace(restore_delay_ms=500),
    )
    SettingsStore(home / "config" / "settings.json").save(settings)
    env = {
        **xvfb,
        **{k: pulse_server.env[k] for k in ("PULSE_SERVER", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME")},
        "DICTATION_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "PYNPUT_BACKEND": "xorg",
    }
    running = RunningApp(env, home)
    try:
        wait_until(
            lambda: running.status().get("model_state") == "ready", 120, what=f"the model to load\n{running.output()}"
        )
        yield running
    finally:
        code = running.stop()
        log = (home / "log" / "dictation.log").read_text(errors="replace") if (home / "log").exists() else ""
        assert code == 0, f"the app exited with {code}:\n{running.output()}"
        assert "Traceback" not in log, log[-4000:]


def test_dictation_reaches_the_target_window_by_command_and_by_hotkey(
    app, target, xclipboard, pulse_server, speech_wav
):
    # Started after the tray host: the real tray icon, not the fallback window.
    log = (app.home / "log" / "dictation.log").read_text()
    assert "tray icon shown" in log
    assert "Hotkeys: x11" in log

    # 1. `dictation start` / `dictation stop`, as a compositor binding would send them.
    xclipboard.set_text(USER_CLIPBOARD)
    assert target.focused()
    assert app.command("start").returncode == 0
    app.wait_status("recording", 15)
    # the recording indicator shows, and the focus stays in the user's window
    wait_until(
        lambda: (
            _run(target.env, "xdotool", "search", "--onlyvisible", "--name", "^Dictation indicator$").returncode == 0
        ),
        10,
        what="the recording indicator",
    )
    assert target.focused()
    pulse_server.play(speech_wav).wait(30)
    assert app.command("stop").returncode == 0
    entries = wait_until(lambda: app.finished_entries(1), 60, what=f"the first transcript\n{app.output()}")
    first = entries[0]
    assert first.text.strip(), "the engine produced no text for real speech"
    assert first.outcome == Outcome.PASTED
    assert first.audio_path is not None and first.audio_path.is_file()
    assert start_cue_fit(first.audio_path) < 0.3  # heard, it would explain nearly all there (fit ~1)
    assert target.wait_for_text(first.text) == first.text
    wait_until(lambda: xclipboard.text() == USER_CLIPBOARD, 10, what="the user's clipboard to be restored")

    # 2. Push-to-talk with the global hotkey; Ctrl and Alt go up first while Space auto-repeats
    # (with a listening backend that typed stray spaces into the window).
    target.reset()
    xdotool = ["xdotool", "keydown", "ctrl+alt+space"]
    subprocess.run(xdotool, env=target.env, check=True, timeout=10)
    try:
        app.wait_status("recording", 15)
        subprocess.run(["xdotool", "keyup", "ctrl", "keyup", "alt"], env=target.env, check=True, timeout=10)
        pulse_server.play(speech_wav).wait(30)
        time.sleep(0.3)  # keep holding briefly after the speech, as a person does
        assert app.status().get("status") == "recording"  # Space alone still holds it
    finally:
        subprocess.run(["xdotool", "keyup", "space"], env=target.env, check=True, timeout=10)
    entries = wait_until(lambda: app.finished_entries(2), 60, what=f"the second transcript\n{app.output()}")
    second = entries[0]
    assert second.id != first.id and second.text.strip()
    assert start_cue_fit(second.audio_path) < 0.3
    assert target.wait_for_text(second.text) == second.text
    wait_until(lambda: xclipboard.text() == USER_CLIPBOARD, 10, what="the user's clipboard to be restored")
    app.wait_status("idle", 15)


def start_cue_fit(path: Path) -> float:
    """The largest share of any stretch of the recording that the start cue explains (matched filter)."""
    import numpy as np

    from dictation import resources
    from dictation.audio.cue_echo import locate_cue
    from dictation.audio.resample import resample
    from dictation.audio.wav import load_audio_16k, read_wav

    samples, rate = read_wav(resources.sound_path("start"))
    cue = resample(samples, rate, 16_000)
    x = load_audio_16k(path)
    match = locate_cue(x, cue, 0, len(x) - len(cue), 16_000)
    return 0.0 if match is None else float(np.float64(match.fit))


def test_a_second_start_leaves_the_first_running(app):
    proc = _run(app.env, sys.executable, "-m", "dictation", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "already running" in proc.stderr
    assert app.proc.poll() is None
    assert app.status().get("status") == "idle"


def test_commands_without_the_app_fail_clearly(xvfb, tmp_path):
    env = {**xvfb, "DICTATION_HOME": str(tmp_path / "nobody-home")}
    proc = _run(env, sys.executable, "-m", "dictation", "toggle")
    assert proc.returncode == 1
    assert "not running" in proc.stderr
