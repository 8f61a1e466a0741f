"""Stand-ins for the hardware behind the controller's workers (same interfaces as the real parts).

- `FakeRecorder`: the Recorder face (open/start/start_gap/stop/cancel/close/level/error/limit_reached,
  take_samples/device_sample_rate); each take returns the samples queued with `next_samples`, and
  remembers the press and release times it was given; `gap` is what `start_gap` says (a gate
  holds it back, as a microphone slow to deliver its first block does).
  While it records, `take_samples` hands out the take as it "arrives": all at once, or
  ``arrive_per_read`` more samples at each read (audio arriving over time, without waiting for it).
- `FakeChain`: the OutputChain face; records what it was asked to deliver.
- `FakeHotkeys`: a HotkeyBackend the test presses from its own thread, as a real listener would.
- `SoundLog`: records which cues were played.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from dictation.audio.capture import Take
from dictation.audio.devices import InputDevice
from dictation.hotkeys.base import HotkeyBackend
from dictation.hotkeys.choose import BackendChoice, Environment
from dictation.output import DeliveryResult


class FakeRecorder:
    def __init__(self, config, rate: int = 16000, arrive_per_read: int | None = None) -> None:
        self.config = config
        self.device_sample_rate = rate
        self.arrive_per_read = arrive_per_read  # None: the whole take has arrived at the first read
        self.arrived = 0
        self.reads: list[tuple[int, int]] = []  # (start, samples returned) of each take_samples call
        self.fail_reads = False
        self.take_frames: int | None = None  # the take ends here (earlier audio than take_samples read)
        self.samples = np.zeros(0, np.float32)
        self.opened = False
        self.recording = False
        self.error: str | None = None
        self.limit_reached = False
        self.device = InputDevice(0, "Fake Mic", 16000, 1, True)
        self.fail_start: str | None = None
        self.cues: list[tuple[float, int, int]] = []  # what mark_cue was told
        self.t_press: float | None = None
        self.t_release: float | None = None
        self.gap: float | None = None  # what start_gap says: the take's first sample minus the press
        self.gap_gate: threading.Event | None = None  # start_gap waits for it (a slow first block)

    def open(self) -> None:
        self.opened = True

    def close(self) -> None:
        self.opened = False

    def start(self, t_press=None) -> None:
        if self.fail_start:
            from dictation.audio.devices import AudioDeviceError

            raise AudioDeviceError(self.fail_start)
        self.recording = True
        self.arrived = 0
        self.t_press = t_press

    def start_gap(self, timeout: float = 0.0) -> float | None:
        if self.gap_gate is not None:
            self.gap_gate.wait(30)
        return self.gap

    def take_samples(self, start: int = 0) -> np.ndarray:
        if not self.recording:
            return np.zeros(0, np.float32)
        if self.fail_reads:
            raise OSError("the fake tape broke")
        step = len(self.samples) if self.arrive_per_read is None else self.arrive_per_read
        self.arrived = min(len(self.samples), self.arrived + step)
        out = self.samples[start : self.arrived].astype(np.float32)  # a copy, as the Recorder's
        self.reads.append((start, len(out)))
        return out

    def stop(self, t_release=None) -> Take:
        self.recording = False
        self.t_release = t_release
        samples = self.samples[: self.take_frames].astype(np.float32)
        peak = float(np.max(np.abs(samples))) if len(samples) else 0.0
        silent = peak < 1e-4
        return Take(
            samples=samples,
            device_name="Fake Mic",
            device_sample_rate=self.device_sample_rate,
            started_at=time.time(),
            peak_dbfs=-100.0 if silent else 20 * np.log10(peak),
            rms_dbfs=-100.0 if silent else -20.0,
            silent=silent,
            start_gap_s=self.gap if self.gap is not None else -0.4,
            truncated=False,
        )

    def cancel(self) -> None:
        self.recording = False

    def mark_cue(self, t_start, samples, sample_rate) -> None:
        self.cues.append((t_start, len(samples), sample_rate))

    def level(self) -> float:
        return -12.0 if self.recording else -90.0


class RecorderFactory:
    """Builds FakeRecorders and remembers the latest, so tests can queue its next take."""

    def __init__(self, rate: int = 16000, arrive_per_read: int | None = None) -> None:
        self.recorders: list[FakeRecorder] = []
        self.samples = np.zeros(0, np.float32)
        self.rate = rate
        self.arrive_per_read = arrive_per_read

    @property
    def recorder(self) -> FakeRecorder:
        return self.recorders[-1]

    def __call__(self, config) -> FakeRecorder:
        recorder = FakeRecorder(config, self.rate, self.arrive_per_read)
        recorder.samples = self.samples
        self.recorders.append(recorder)
        return recorder

    def next_samples(self, samples: np.ndarray) -> None:
        self.samples = samples
        for recorder in self.recorders:
            recorder.samples = samples


class FakeChain:
    name = "fake"

    def __init__(self, options=None, *, ok: bool = True, method: str = "xdotool-paste") -> None:
        self.options = options
        self.ok = ok
        self.method = method
        self.delivered: list[str] = []
        self.flushed = 0

    def deliver(self, text: str) -> DeliveryResult:
        self.delivered.append(text)
        if self.ok:
            return DeliveryResult(self.method, True, "pasted")
        return DeliveryResult(self.method, False, "not delivered: no paste tool", on_clipboard=True)

    def perform(self, steps) -> DeliveryResult:
        """A plan with keys or "scratch that" (output.steps): recorded as one entry."""
        self.delivered.append(tuple(steps))
        return DeliveryResult(self.method, self.ok, "performed")

    def flush(self):
        self.flushed += 1

    def describe(self) -> str:
        return "output: fake session; backend fake"


class FakeHotkeys(HotkeyBackend):
    name = "fake"

    def __init__(self) -> None:
        super().__init__()
        self.enabled_changes: list[tuple[str, bool]] = []  # what set_enabled changed, in order
        self.problems: list[str] = []

    def is_available(self):
        return True, "a fake for tests"

    def _enabled_changed(self, name: str, enabled: bool) -> None:
        self.enabled_changes.append((name, enabled))

    def _start(self) -> None:
        self._ready.set()

    def _stop(self) -> None:
        pass

    def press(self, name: str = "dictate") -> None:
        """Press from another thread, like a listener thread does."""
        self._from_thread([(name, True)])

    def release(self, name: str = "dictate") -> None:
        self._from_thread([(name, False)])

    def _from_thread(self, events) -> None:
        thread = threading.Thread(target=self._emit, args=(events,))
        thread.start()
        thread.join()


def hotkey_chooser(backend: FakeHotkeys):
    def choose(preference: str) -> BackendChoice:
        return BackendChoice(backend, Environment("linux", "x11"), preference, (("fake", "a fake for tests"),))

    return choose


class SoundLog:
    def __init__(self) -> None:
        self.played: list[str] = []
        self.on_cue = None  # the controller connects it to the recorder, as for the real SoundPlayer

    def __call__(self, settings):
        return self

    def play(self, kind: str) -> None:
        self.played.append(kind)
