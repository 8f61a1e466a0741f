"""Cold-start presses against the real app: start `python -m dictation` on a fresh
home, press the moment its command socket exists, play a tone burst into the virtual microphone at
that press, let go, and measure how much of the burst the take's WAV holds.

A press is "complete" when the recording holds the whole burst from its first sample, with quiet
before it: nothing said at the press was lost. Two ways to press, as users do:

- ``cli``: a `dictation start` request (the same client code the CLI runs, `dictation.ipc`) sent as
  the socket appears, `dictation stop` after the burst: a compositor binding (Wayland) at login.
- ``x11``: Ctrl+Alt+Space pressed (XTest, from a connection opened beforehand, so the press lands
  within a millisecond) as the socket appears, let go after the burst: the global hotkey (x11
  backend) pressed while the app is still starting.

`tests/e2e/test_cold_start_e2e.py` runs one press of each kind; more runs, for the figures in the
issue: ``DICTATION_COLDSTART_RUNS=5 pytest tests/e2e/test_cold_start_e2e.py -k runs -s``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dictation.config import Settings
from dictation.config.store import SettingsStore

HOTKEY = "ctrl+alt+space"
RATE = 16_000
BURST_S = 0.8
BURST_HZ = 1000.0
FRAME_S = 0.005  # envelope resolution
THRESHOLD = 0.05  # the burst's RMS is ~0.35; the virtual microphone's silence is digital zero
TOLERANCE_S = 0.03  # fade-in, envelope frames, a block boundary


def app_log(home: Path) -> str:
    """The app's log, and after it the stacks of a crash if the app died of a fatal signal."""
    log, crash = home / "log" / "dictation.log", home / "log" / "crash.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    if crash.exists() and crash.stat().st_size:
        text += "\n--- crash.log ---\n" + crash.read_text(errors="replace")
    return text


def write_burst(path: Path, seconds: float = BURST_S) -> Path:
    """``seconds`` of a ``BURST_HZ`` sine at half scale (5-ms fades), 16 kHz mono 16-bit."""
    n = round(seconds * RATE)
    t = np.arange(n) / RATE
    x = 0.5 * np.sin(2 * np.pi * BURST_HZ * t)
    fade = round(0.005 * RATE)
    ramp = np.linspace(0.0, 1.0, fade)
    x[:fade] *= ramp
    x[-fade:] *= ramp[::-1]
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes((x * 32767).astype("<i2").tobytes())
    return path


@dataclass
class BurstFound:
    onset_s: float | None  # where the burst starts in the take (None: no burst at all)
    length_s: float  # how much of it the take holds

    @property
    def complete(self) -> bool:
        """The whole burst, and quiet before it (had the take begun inside the burst, its first
        sample would already be loud)."""
        return self.onset_s is not None and self.onset_s >= 2 * FRAME_S and self.length_s >= BURST_S - TOLERANCE_S

    @property
    def missing_s(self) -> float:
        return max(0.0, BURST_S - self.length_s)


def find_burst(samples: np.ndarray) -> BurstFound:
    frame = round(FRAME_S * RATE)
    n = len(samples) // frame
    if n == 0:
        return BurstFound(None, 0.0)
    rms = np.sqrt(np.mean(samples[: n * frame].reshape(n, frame) ** 2, axis=1))
    loud = np.flatnonzero(rms > THRESHOLD)
    if len(loud) == 0:
        return BurstFound(None, 0.0)
    first, last = int(loud[0]), int(loud[-1])
    return BurstFound(first * FRAME_S, (last - first + 1) * FRAME_S)


@dataclass
class Run:
    way: str
    home: Path
    socket_after_s: float = 0.0  # from the app's launch to its socket
    found: BurstFound | None = None  # None: no recording was made
    reply: dict | None = None  # the `start` request's answer (cli)
    reply_s: float = 0.0  # how long that answer took
    wav: Path | None = None
    exit_code: int | None = None  # of the app, once asked to quit
    notes: list[str] = field(default_factory=list)

    def log(self) -> str:
        return app_log(self.home)

    @property
    def complete(self) -> bool:
        return self.found is not None and self.found.complete

    def line(self) -> str:
        if self.found is None:
            what = "no recording"
        elif self.found.onset_s is None:
            what = "recording without the burst"
        else:
            what = f"burst at {self.found.onset_s * 1000:.0f} ms, {self.found.missing_s * 1000:.0f} ms of it missing"
        reply = ""
        if self.reply is not None:
            reply = f"; start answered in {self.reply_s * 1000:.0f} ms: " + ", ".join(
                f"{k}={self.reply[k]!r}" for k in ("ok", "late_ms", "warning", "message") if k in self.reply
            )
        return (
            f"{self.way}: {'complete' if self.complete else 'INCOMPLETE'} (socket {self.socket_after_s:.2f} s after "
            f"launch; {what}{reply}){' ' + '; '.join(self.notes) if self.notes else ''}"
        )


def app_env(xvfb: dict, pulse_env: dict, home: Path) -> dict[str, str]:
    return {
        **xvfb,
        **{k: pulse_env[k] for k in ("PULSE_SERVER", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME")},
        "DICTATION_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "PYNPUT_BACKEND": "xorg",
    }


def socket_path(env: dict[str, str]) -> Path:
    code = "from dictation.ipc import server_name; print(server_name())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    return Path(out.stdout.strip())


def write_settings(home: Path, model: Path, keep_open: bool = True) -> None:
    settings = Settings()
    settings = settings.replace(
        engine=settings.engine.replace(model=str(model), device="cpu", dtype="fp32"),
        hotkeys=settings.hotkeys.replace(hotkey=HOTKEY, backend="x11"),
        # only the burst in the recording; the microphone opened ahead, or at each press
        recording=settings.recording.replace(sounds=False, keep_mic_open=keep_open),
        output=settings.output.replace(method="paste"),  # no Space key of ours in the target window
    )
    SettingsStore(home / "config" / "settings.json").save(settings)


def _send(env: dict[str, str], command: str) -> tuple[dict, float]:
    """`command` through the real client (`dictation.ipc.send_command`), with this app's env."""
    from dictation import ipc

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the client finds the socket from DICTATION_HOME and XDG_RUNTIME_DIR
    try:
        t0 = time.monotonic()
        try:
            reply = ipc.send_command(command, timeout=10.0)
        except ipc.IpcError as exc:
            reply = {"ok": False, "message": f"client error: {exc}"}
        return reply, time.monotonic() - t0
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Keyboard:
    """Ctrl+Alt+Space through XTest on a connection opened ahead of time (xdotool would take tens
    of milliseconds to start)."""

    def __init__(self, display: str) -> None:
        from Xlib import XK
        from Xlib import display as xdisplay

        self.d = xdisplay.Display(display)
        self.codes = [self.d.keysym_to_keycode(XK.string_to_keysym(k)) for k in ("Control_L", "Alt_L", "space")]

    def _send(self, kind: int, codes: list[int]) -> None:
        from Xlib.ext import xtest

        for code in codes:
            xtest.fake_input(self.d, kind, code)
        self.d.sync()

    def press(self) -> None:
        from Xlib import X

        self._send(X.KeyPress, self.codes)

    def release(self) -> None:
        from Xlib import X

        self._send(X.KeyRelease, self.codes[::-1])

    def close(self) -> None:
        self.d.close()


def _saved_wav(log: Path, timeout: float) -> Path | None:
    """The take's file, from the app's "recording 1 saved: PATH (…)" log line."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        text = log.read_text(errors="replace") if log.exists() else ""
        for line in text.splitlines():
            if "recording 1 saved: " in line:
                return Path(line.split("recording 1 saved: ", 1)[1].rsplit(" (", 1)[0])
        time.sleep(0.05)
    return None


def cold_start(way: str, xvfb: dict, pulse, home: Path, model: Path, burst: Path) -> Run:
    """One cold start pressed at once (see the module docstring); the app is stopped afterwards."""
    from dictation.audio.wav import load_audio_16k

    write_settings(home, model)
    env = app_env(xvfb, pulse.env, home)
    path = socket_path(env)
    run = Run(way, home)
    out = open(home / "app-stdout.log", "ab")  # noqa: SIM115 - closed below
    keyboard = Keyboard(xvfb["DISPLAY"]) if way == "x11" else None
    t_launch = time.monotonic()
    app = subprocess.Popen([sys.executable, "-m", "dictation", "-v"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = t_launch + 60
        while not path.exists():
            if app.poll() is not None or time.monotonic() > deadline:
                run.notes.append(f"no socket (app exit {app.poll()})")
                return run
            time.sleep(0.002)
        run.socket_after_s = time.monotonic() - t_launch
        # the press, and the burst at the press
        if keyboard is not None:
            keyboard.press()
            player = pulse.play(burst)
        else:
            player = pulse.play(burst)
            replies: list[tuple[dict, float]] = []
            sender = threading.Thread(target=lambda: replies.append(_send(env, "start")))
            sender.start()
        player.wait(30)
        time.sleep(0.3)
        if keyboard is not None:
            keyboard.release()
        else:  # the release, as a compositor sends it: whether or not `start` was answered yet
            _send(env, "stop")
            sender.join(30)
            run.reply, run.reply_s = replies[0] if replies else ({"ok": False, "message": "no answer"}, 0.0)
        run.wav = _saved_wav(home / "log" / "dictation.log", 10)
        if run.wav is not None:
            run.found = find_burst(load_audio_16k(run.wav))
        return run
    finally:
        if app.poll() is None:
            _send(env, "quit")
            try:
                app.wait(30)
            except subprocess.TimeoutExpired:
                app.kill()
                app.wait(10)
        run.exit_code = app.returncode
        out.close()
        if keyboard is not None:
            keyboard.close()


# --- a press at a set time after the launch -----------------------------------------------------------

LATE_WARNING = re.compile(r"The recording began (\d+) ms after the press")
STARTUP_LINE = re.compile(r"start-up: .*")
GRABBED = re.compile(r"start-up: hotkeys grabbed \(\w+\) (\d+) ms after the process started")


def grab_time(log: str) -> float | None:
    """When the app's start-up line in ``log`` says the chord was grabbed, in seconds after its
    process started (None: not said)."""
    grabbed = GRABBED.search(log)
    return None if grabbed is None else int(grabbed.group(1)) / 1000


@dataclass
class TimedPress:
    """The app launched, its hotkey pressed ``delay_s`` after the launch, the burst played from the press."""

    delay_s: float
    keep_open: bool
    home: Path
    pressed_after_s: float = 0.0  # from the launch to the press, as it happened
    found: BurstFound | None = None
    leaked: int = 0  # presses of the chord's Space that reached the focused window
    warning_ms: int | None = None  # the late-start warning's amount, None: no warning
    exit_code: int | None = None
    notes: list[str] = field(default_factory=list)

    def log(self) -> str:
        return app_log(self.home)

    def grabbed_after_s(self) -> float | None:
        return grab_time(self.log())

    def line(self) -> str:
        if self.found is None:
            what = "no recording"
        elif self.found.onset_s is None:
            what = "recording without the burst"
        else:
            what = (
                f"burst at {self.found.onset_s * 1000:.0f} ms in the take, {self.found.missing_s * 1000:.0f} ms missing"
            )
        startup = STARTUP_LINE.search(self.log())
        mic = "mic kept open" if self.keep_open else "mic per take"
        return (
            f"pressed {self.pressed_after_s:.2f} s after launch ({mic}): "
            f"{what}; {self.leaked} keys leaked; warning {self.warning_ms} ms"
            f"{'; ' + startup.group(0) if startup else ''}{' ' + '; '.join(self.notes) if self.notes else ''}"
        )


def timed_press(
    delay_s: float,
    xvfb: dict,
    pulse,
    home: Path,
    model: Path,
    burst: Path,
    target,
    *,
    keep_open: bool = True,
    after_ready: bool = False,
) -> TimedPress:
    """Launch `python -m dictation`, press Ctrl+Alt+Space ``delay_s`` after, play the burst from the press,
    let go after it, and read the take, the target window's keys and the log (see TimedPress).
    ``after_ready``: press ``delay_s`` after the app logged "ready" instead of after the launch."""
    from dictation.audio.wav import load_audio_16k
    from tests.hotkeys.test_x11_backend import xdotool

    write_settings(home, model, keep_open=keep_open)
    env = app_env(xvfb, pulse.env, home)
    run = TimedPress(delay_s, keep_open, home)
    target.focus()
    keyboard = Keyboard(xvfb["DISPLAY"])
    player = Player(pulse.env, burst)
    out = open(home / "app-stdout.log", "ab")  # noqa: SIM115 - closed below
    t_launch = time.monotonic()
    app = subprocess.Popen([sys.executable, "-m", "dictation", "-v"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        if after_ready:
            if not _wait_for(home / "log" / "dictation.log", re.compile(r"dictation\.app\.main: ready"), 60):
                run.notes.append("the app never logged 'ready'")
                return run
            t_launch = time.monotonic()
        time.sleep(max(0.0, t_launch + delay_s - time.monotonic()))
        keyboard.press()
        run.pressed_after_s = time.monotonic() - t_launch
        player.play()
        time.sleep(player.seconds + 0.3)
        keyboard.release()
        wav = _saved_wav(home / "log" / "dictation.log", 30)
        if wav is not None:
            run.found = find_burst(load_audio_16k(wav))
        else:
            run.notes.append(f"no take saved (app exit {app.poll()})")
        xdotool(xvfb["DISPLAY"], "key", "z")  # the target's sentinel: every key it got before is counted
        space = [e for e in target.events_until_sentinel() if e[0] == "PRESS" and e[1] == QT_SPACE]
        run.leaked = len(space)
        match = LATE_WARNING.search(run.log())
        run.warning_ms = int(match.group(1)) if match else None
        # pressed before the model was ready: the take is transcribed once it is
        if wav is not None and not _wait_for(home / "log" / "dictation.log", TAKE_DONE, 90):
            run.notes.append("the take was not transcribed")
        return run
    finally:
        if app.poll() is None:
            _send(env, "quit")
            try:
                app.wait(30)
            except subprocess.TimeoutExpired:
                app.kill()
                app.wait(10)
        run.exit_code = app.returncode
        out.close()
        keyboard.close()
        player.close()


class Player:
    """The burst, played the moment `play` is called: a playback stream opened beforehand and fed
    through a pipe, so the sound follows the press by the stream's 10 ms and not by a player's
    start-up (paplay's is 10-60 ms under load), which would count as audio the take misses."""

    def __init__(self, env: dict[str, str], wav: Path) -> None:
        from dictation.audio.wav import load_audio_16k

        samples = load_audio_16k(wav)
        self.seconds = len(samples) / RATE
        self.pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
        self.proc = subprocess.Popen(
            ["pacat", "--playback", "--latency-msec=10", "--raw", "--format=s16le", f"--rate={RATE}"]
            + ["--channels=1", "--device=vsink"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.3)  # connected and waiting for data

    def play(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(self.pcm)
        self.proc.stdin.flush()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


QT_SPACE = 0x20
TAKE_DONE = re.compile(r"transcribed take 1:|No speech recognised")


def _wait_for(log: Path, pattern: re.Pattern, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if log.exists() and pattern.search(log.read_text(errors="replace")):
            return True
        time.sleep(0.1)
    return False
