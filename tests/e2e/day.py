"""The desk for `test_day_e2e.py`: an X display with a window manager (openbox) and a tray host, a
target window that logs the keys it gets, the real app launched on one home again and again, a
keyboard that presses the real hotkey through XTest, and spoken clips for the virtual microphone.

What a dictation *is* here: one spoken clip (espeak-ng, 0.5-2 s, 16 kHz, every clip different),
played into the virtual microphone at the press (or a moment after it). The virtual microphone is a
gated one: between clips it gives digital zeros. The app's saved recording of a take is found in its
history entry; cross-correlating it with the clips says which dictation it holds and where the clip
begins in it, so a recording that began after the speech did is measured exactly (`locate_clip`).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from dictation.config import History, Settings
from dictation.config.store import SettingsStore
from tests.e2e.coldstart import _send, app_log, grab_time
from tests.output.conftest import _stop, read_lines
from tests.waiting import wait_until

RATE = 16_000
HOTKEY = "ctrl+alt+space"
TARGET_APP = Path(__file__).with_name("day_target.py")
TARGET_TITLE = "dictation-day-target"
WINDOW_MANAGER = "openbox"


# ---- spoken clips ---------------------------------------------------------------------------------

WORDS = (
    *("apple", "river", "stone", "yellow", "garden", "window", "pencil", "orange", "silver", "market"),
    *("candle", "forest", "bridge", "copper", "winter", "summer", "rocket", "planet", "marble", "velvet"),
    *("harbor", "meadow", "thunder", "lantern"),
)


@dataclass(frozen=True)
class Clip:
    index: int
    path: Path
    samples: np.ndarray  # float, 16 kHz mono, speech from its first sample to its last

    @property
    def seconds(self) -> float:
        return len(self.samples) / RATE


def speak(folder: Path, index: int, words: int) -> Clip:
    """espeak-ng saying ``words`` words picked by ``index``, resampled to 16 kHz, trimmed to the speech."""
    from dictation.audio.resample import resample
    from dictation.audio.wav import read_wav, write_wav

    text = " ".join(WORDS[(index * 7 + k * 5) % len(WORDS)] for k in range(words))
    raw = folder / f"raw-{index}.wav"
    # a different voice pitch per clip: even two clips with the same words differ in every sample
    subprocess.run(
        ["espeak-ng", "-p", str(30 + index % 40), "-s", "190", "-w", str(raw), text],
        check=True,
        capture_output=True,
        timeout=30,
    )
    samples, rate = read_wav(raw)
    x = resample(samples, rate, RATE)
    loud = np.flatnonzero(np.abs(x) > 0.01)
    x = x[loud[0] : loud[-1] + 1]
    path = folder / f"clip-{index}.wav"
    write_wav(path, x, RATE)
    return Clip(index, path, x.astype(np.float64))


def make_clips(folder: Path, n: int) -> list[Clip]:
    """``n`` different clips of 0.5 to 2 s (one to five words), in a mixed order of lengths."""
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is missing: apt-get install espeak-ng")
    folder.mkdir(parents=True, exist_ok=True)
    clips = []
    for i in range(n):
        words = 1 + (i * 3) % 5
        clip = speak(folder, i, words)
        while clip.seconds > 2.0 and words > 1:
            words -= 1
            clip = speak(folder, i, words)
        while clip.seconds < 0.5:
            words += 1
            clip = speak(folder, i, words)
        clips.append(clip)
    return clips


@dataclass(frozen=True)
class Found:
    clip: int  # index of the clip the recording holds
    start_s: float  # where the clip's first sample lies in the recording; < 0: the recording began after it
    fit: float  # normalised correlation over the part both hold (~1: the same audio)

    @property
    def clipped_s(self) -> float:
        return max(0.0, -self.start_s)


def _spectrum(x: np.ndarray, n: int) -> np.ndarray:
    return np.fft.rfft(x, n)


def locate_clip(recording: np.ndarray, clips: list[Clip], min_overlap_s: float = 0.25) -> Found | None:
    """The clip this recording holds most of, and where it begins in it (see `Found`)."""
    best: Found | None = None
    longest = max(len(c.samples) for c in clips)
    n = 1 << (len(recording) + longest).bit_length()
    spec = _spectrum(recording, n)
    for clip in clips:
        ref = clip.samples
        corr = np.fft.irfft(spec * np.conj(_spectrum(ref, n)), n)
        # lags -(len(ref) - overlap) .. len(recording) - overlap; negative lags sit at the end
        overlap = round(min_overlap_s * RATE)
        lags = np.concatenate([np.arange(-(len(ref) - overlap), 0), np.arange(0, len(recording) - overlap + 1)])
        if len(lags) == 0:
            continue
        values = np.abs(corr[lags % n])
        lag = int(lags[int(np.argmax(values))])
        seg = recording[max(0, lag) : lag + len(ref)]
        r = ref[max(0, -lag) : max(0, -lag) + len(seg)]
        norm = np.linalg.norm(seg) * np.linalg.norm(r)
        fit = float(np.dot(seg, r) / norm) if norm > 0 else 0.0
        if best is None or fit > best.fit:
            best = Found(clip.index, lag / RATE, fit)
    return best if best is not None and best.fit >= 0.5 else None


# ---- the X desk: display, window manager, tray host, target window, keyboard ----------------------


def _x(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=15, check=False)


def start_window_manager(env: dict[str, str], home: Path) -> subprocess.Popen:
    if shutil.which(WINDOW_MANAGER) is None:
        pytest.fail(f"{WINDOW_MANAGER} (a window manager for Xvfb) is missing: apt-get install {WINDOW_MANAGER}")
    home.mkdir(parents=True, exist_ok=True)
    log = home / f"{WINDOW_MANAGER}.log"
    tries = []

    def start() -> subprocess.Popen:
        with open(log, "ab") as out:
            return subprocess.Popen(
                [WINDOW_MANAGER, "--sm-disable"],
                env={**env, "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"), "XDG_CACHE_HOME": str(home)},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    tries.append(start())

    def managing() -> bool:
        proc = tries[-1]
        if proc.poll() is not None:
            # one more start: once in a full run openbox exited with 1 at start-up (and ran the next
            # time); a second exit is a failure, with what it said
            if len(tries) < 2:
                tries.append(start())
                return False
            said = log.read_text(errors="replace")[-2000:]
            pytest.fail(f"{WINDOW_MANAGER} exited with {proc.returncode} twice: {said}")
        return "window id" in _x(env, "xprop", "-root", "_NET_SUPPORTING_WM_CHECK").stdout

    wait_until(managing, 15, what=f"{WINDOW_MANAGER} to manage the display")
    return tries[-1]


def start_tray_host(env: dict[str, str]) -> subprocess.Popen:
    if shutil.which("trayer") is None:
        pytest.fail("trayer (a system tray host for Xvfb) is missing: apt-get install trayer")
    proc = subprocess.Popen(
        ["trayer", "--edge", "top", "--align", "right", "--widthtype", "request", "--height", "24"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(lambda: _x(env, "xdotool", "search", "--class", "trayer").returncode == 0, 15, what="trayer")
    return proc


@dataclass(frozen=True)
class KeyEvent:
    t: float  # time.time() in the target process
    key: str  # Qt's name, e.g. Key_Space
    modifiers: int
    autorepeat: bool


class DayTarget:
    """The target window (`day_target.py`): what arrived in it, and every key press it got."""

    def __init__(self, env: dict[str, str], folder: Path):
        self.env = env
        self.out = folder / "target.txt"
        self.keys = folder / "target-keys.log"
        self.proc = subprocess.Popen(
            [sys.executable, str(TARGET_APP), str(self.out), str(self.keys)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            encoding="utf-8",
        )
        self._pending = bytearray()
        self._expect("READY", 30)
        found = wait_until(self._search, 15, what="the target window")
        self.window = found.split()[0]
        self.focus()

    def _search(self) -> str:
        result = _x(self.env, "xdotool", "search", "--name", f"^{TARGET_TITLE}$")
        return result.stdout.strip() if result.returncode == 0 else ""

    def _expect(self, line: str, timeout: float) -> None:
        seen = []
        for got in read_lines(self.proc.stdout, timeout, self._pending):
            seen.append(got)
            if got.strip() == line:
                return
        pytest.fail(f"the target window did not answer {line!r}; output: {''.join(seen)[-2000:]}")

    def focused(self) -> bool:
        return _x(self.env, "xdotool", "getwindowfocus").stdout.strip() == self.window

    def focus(self) -> None:
        if not self.focused():
            _x(self.env, "xdotool", "windowactivate", "--sync", self.window)
        wait_until(self.focused, 10, what="focus on the target window")

    def text(self) -> str:
        try:
            return self.out.read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""

    def key_events(self) -> list[KeyEvent]:
        try:
            lines = self.keys.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        events = []
        for line in lines:
            t, key, mods, repeat = line.split()
            events.append(KeyEvent(float(t), key, int(mods), repeat == "1"))
        return events

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        _stop(self.proc)
        self.proc.stdout.close()


class Keyboard:
    """The hotkey (Ctrl+Alt+Space) and Esc through XTest, on a connection opened ahead of time, so a
    press lands within a millisecond of the call (xdotool would take tens of milliseconds)."""

    def __init__(self, display: str) -> None:
        from Xlib import XK
        from Xlib import display as xdisplay

        self.d = xdisplay.Display(display)
        code = self.d.keysym_to_keycode
        self.chord = [code(XK.string_to_keysym(k)) for k in ("Control_L", "Alt_L", "space")]
        self.esc = code(XK.string_to_keysym("Escape"))
        self.held: list[int] = []

    def _send(self, kind: int, codes: list[int]) -> None:
        from Xlib.ext import xtest

        for code in codes:
            xtest.fake_input(self.d, kind, code)
        self.d.sync()

    def press(self) -> float:
        """Ctrl, Alt and Space down; returns the wall-clock time of the press."""
        from Xlib import X

        self._send(X.KeyPress, self.chord)
        self.held = list(self.chord)
        return time.time()

    def release(self) -> float:
        from Xlib import X

        self._send(X.KeyRelease, self.chord[::-1])
        self.held = []
        return time.time()

    def tap(self) -> tuple[float, float]:
        """A short press and release of the chord (toggle, a hybrid tap): 80 ms down."""
        down = self.press()
        time.sleep(0.08)
        return down, self.release()

    def escape(self) -> None:
        from Xlib import X

        self._send(X.KeyPress, [self.esc])
        self._send(X.KeyRelease, [self.esc])

    def let_go(self) -> None:
        """Release whatever is still held (a test that failed half way must not leave keys down)."""
        from Xlib import X

        if self.held:
            self._send(X.KeyRelease, self.held[::-1])
            self.held = []

    def close(self) -> None:
        self.let_go()
        self.d.close()


# ---- the app, launched (again) on one home ------------------------------------------------------------


def write_settings(home: Path, model: Path, mode: str) -> None:
    settings = Settings()
    settings = settings.replace(
        engine=settings.engine.replace(model=str(model), device="cpu", dtype="fp32"),
        hotkeys=settings.hotkeys.replace(hotkey=HOTKEY, backend="x11", mode=mode, cancel_key="esc"),
        # no cues: only the clips in the recordings; the virtual microphone hears the speaker
        recording=settings.recording.replace(sounds=False, trim_silence=True),
        output=settings.output.replace(backend="xdotool", method="paste", restore_delay_ms=300),
        # every recording stays, so each dictation's can be checked
        general=settings.general.replace(keep_recordings=1000),
    )
    SettingsStore(home / "config" / "settings.json").save(settings)


class DayApp:
    """One run of `python -m dictation -v` on ``home``; ``launched`` is its wall-clock start."""

    def __init__(self, env: dict[str, str], home: Path):
        self.env = env
        self.home = home
        self.stdout = home / "app-stdout.log"
        home.mkdir(parents=True, exist_ok=True)
        with open(self.stdout, "ab") as out:  # appended: every run of the day in one file
            self._stdout_from = out.tell()  # where this run's lines begin
            self.launched = time.time()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dictation", "-v"], env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def send(self, command: str) -> dict:
        return _send(self.env, command)[0]

    def status(self) -> dict:
        reply = self.send("status")
        return reply if reply.get("ok") else {}

    def log(self) -> str:
        return app_log(self.home)

    def history(self) -> list:
        """Every entry, oldest first."""
        path = self.home / "data" / "history.sqlite3"
        if not path.exists():
            return []
        with History(path) as history:
            return history.recent(10_000)[::-1]

    def settled(self) -> str | None:
        """None once the app is idle with the model ready and no entry pending; else what it is doing."""
        if self.proc.poll() is not None:
            return f"exited with {self.proc.returncode}"
        status = self.status()
        if status.get("status") != "idle" or status.get("model_state") != "ready":
            return f"status {status.get('status')!r}, model {status.get('model_state')!r}"
        pending = [e.id for e in self.history() if e.outcome == "pending"]
        return f"history entries {pending} pending" if pending else None

    def wait_settled(self, timeout: float) -> str | None:
        """Waits until `settled`; returns what it was still doing after ``timeout`` s (None: settled)."""
        end = time.monotonic() + timeout
        while (doing := self.settled()) is not None and time.monotonic() < end:
            time.sleep(0.1)
        return doing

    def grabbed_after_s(self) -> float | None:
        """When this run's start-up line says the chord was grabbed, in seconds after the process
        started (None: not said)."""
        with open(self.stdout, "rb") as f:
            f.seek(self._stdout_from)
            return grab_time(f.read().decode(errors="replace"))

    def quit(self) -> int:
        if self.proc.poll() is None:
            self.send("quit")
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                return -999
        return self.proc.returncode

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def app_env(display_env: dict[str, str], pulse_env: dict[str, str], home: Path) -> dict[str, str]:
    return {
        **display_env,
        **{k: pulse_env[k] for k in ("PULSE_SERVER", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME")},
        "DICTATION_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "PYNPUT_BACKEND": "xorg",
    }
