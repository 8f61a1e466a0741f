"""Stand-ins for the hardware behind the controller's workers (same interfaces as the real parts).

- `FakeRecorder`: the Recorder face (open/start/stop/cancel/close/level/error/limit_reached); each
  take returns the samples queued with `next_samples`.
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
    def __init__(self, config) -> None:
        self.config = config
        self.samples = np.zeros(0, np.float32)
        self.opened = False
        self.recording = False
        self.error: str | None = None
        self.limit_reached = False
        self.device = InputDevice(0, "Fake Mic", 16000, 1, True)
        self.fail_start: str | None = None

    def open(self) -> None:
        self.opened = True

    def close(self) -> None:
        self.opened = False

    def start(self, t_press=None) -> None:
        if self.fail_start:
            from dictation.audio.devices import AudioDeviceError

            raise AudioDeviceError(self.fail_start)
        self.recording = True

    def stop(self, t_release=None) -> Take:
        self.recording = False
        samples = self.samples.astype(np.float32)
        peak = float(np.max(np.abs(samples))) if len(samples) else 0.0
        silent = peak < 1e-4
        return Take(
            samples=samples,
            device_name="Fake Mic",
            device_sample_rate=16000,
            started_at=time.time(),
            peak_dbfs=-100.0 if silent else 20 * np.log10(peak),
            rms_dbfs=-100.0 if silent else -20.0,
            silent=silent,
            start_gap_s=0.0,
            truncated=False,
        )

    def cancel(self) -> None:
        self.recording = False

    def level(self) -> float:
        return -12.0 if self.recording else -90.0


class RecorderFactory:
    """Builds FakeRecorders and remembers the latest, so tests can queue its next take."""

    def __init__(self) -> None:
        self.recorders: list[FakeRecorder] = []
        self.samples = np.zeros(0, np.float32)

    def __call__(self, config) -> FakeRecorder:
        recorder = FakeRecorder(config)
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

    def flush(self):
        self.flushed += 1

    def describe(self) -> str:
        return "output: fake session; backend fake"


class FakeHotkeys(HotkeyBackend):
    name = "fake"

    def is_available(self):
        return True, "a fake for tests"

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

    def __call__(self, settings):
        return self

    def play(self, kind: str) -> None:
        self.played.append(kind)
