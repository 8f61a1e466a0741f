"""A fake sounddevice layer for Recorder tests: the test pushes blocks, a fake clock follows them."""

from __future__ import annotations

import threading

import numpy as np

from dictation.audio.devices import AudioDeviceError, InputDevice


class FakeClock:
    """Monotonic seconds that move only when audio is pushed (or the test moves them)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.t += seconds


class FakeStream:
    """Stands in for a running sounddevice.InputStream."""

    def __init__(self, backend, device, samplerate, channels, blocksize, callback, finished_callback):
        self.backend = backend
        self.device = device
        self.samplerate = samplerate
        self.channels = channels
        self.blocksize = blocksize
        self.callback = callback
        self.finished_callback = finished_callback
        self.latency = backend.latency
        self.closed = False
        self.dead = False

    def push(self, block: np.ndarray, status: int = 0) -> None:
        """Deliver one block as PortAudio would: [frames] (mono) or [frames, channels] float32."""
        block = np.asarray(block, dtype=np.float32)
        if block.ndim == 1:
            block = np.repeat(block[:, None], self.channels, axis=1)
        assert block.shape[1] == self.channels
        if self.closed or self.dead:
            return
        if self.backend.clock is not None:
            self.backend.clock.advance(len(block) / self.samplerate)
        self.callback(block, len(block), None, status)

    def lose_device(self) -> None:
        """The device disappears: PortAudio stops calling back and reports the stream finished."""
        self.dead = True
        self.finished_callback()

    def close(self) -> None:
        if not self.closed and not self.dead:
            self.finished_callback()  # PortAudio calls it on a requested close too
        self.closed = True


class FakeBackend:
    def __init__(
        self,
        devices: list[InputDevice] | None = None,
        *,
        refuse_rates: tuple[int, ...] = (),
        refuse_mono: bool = False,
        latency: float = 0.0,
        clock: FakeClock | None = None,
    ) -> None:
        self.devices = devices if devices is not None else [InputDevice(0, "Fake Mic", 48000, 2, True, "Fake API")]
        self.refuse_rates = set(refuse_rates)
        self.refuse_mono = refuse_mono
        self.latency = latency
        self.clock = clock
        self.streams: list[FakeStream] = []
        self.rescans = 0
        self.fail_open = False

    @property
    def stream(self) -> FakeStream:
        return self.streams[-1]

    def list_devices(self) -> list[InputDevice]:
        return list(self.devices)

    def open_stream(self, device, samplerate, channels, blocksize, callback, finished_callback):
        if self.fail_open:
            raise AudioDeviceError(f"cannot open microphone {device.name!r}: Device unavailable")
        if samplerate in self.refuse_rates:
            raise AudioDeviceError(f"cannot open microphone {device.name!r} at {samplerate} Hz: Invalid sample rate")
        if channels == 1 and self.refuse_mono:
            raise AudioDeviceError(f"cannot open microphone {device.name!r}: Invalid number of channels")
        stream = FakeStream(self, device, samplerate, channels, blocksize, callback, finished_callback)
        self.streams.append(stream)
        return stream

    def rescan(self) -> None:
        self.rescans += 1


def coded(start: int, n: int, period: int = 997) -> np.ndarray:
    """Samples that encode their own frame number (mod ``period``), to check continuity exactly."""
    return ((np.arange(start, start + n) % period) / period * 0.5 + 0.1).astype(np.float32)


def decode(x: np.ndarray, period: int = 997) -> np.ndarray:
    return np.round((np.asarray(x, dtype=np.float64) - 0.1) / 0.5 * period).astype(np.int64) % period


def use_fake_portaudio(monkeypatch, module) -> None:
    """Every way the app reaches PortAudio answers with ``module``: sounddevice's import and the
    direct path the microphone opened at launch takes (`dictation.audio.portaudio`)."""
    from dictation.audio import devices

    monkeypatch.setattr(devices, "import_sounddevice", lambda: module)
    monkeypatch.setattr(devices, "import_early_portaudio", lambda: module)
