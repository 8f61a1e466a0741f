"""The microphone opened in the app's first moment, before numpy, so that what is
said in the first second after launch is kept (`dictation.launch`).

Importing numpy takes 0.1-1 s, and what is said meanwhile would be lost, so the stream is opened raw
(float32 bytes, no numpy; PortAudio called directly through `dictation.audio.portaudio`, so no
sounddevice import either) and its blocks are held as they come, each with the time it arrived. The
`Recorder` then takes the stream over through `EarlyInputBackend`, an `InputBackend` whose
`open_stream` hands it this stream when it asks for the same device and format: the held blocks go
through the recorder's callback first, with their own arrival times (so its clock and pre-roll ring
are as if it had been open all along), and every later block goes straight on. Anything else it asks
for (another device or format, a reopen after a lost device, a rescan) is the ordinary
`SoundDeviceBackend`'s.

Until the hand-over, at most `HOLD_SECONDS` of audio is held; older blocks are dropped and only
counted, so frame numbers stay true.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from dictation.audio.devices import AudioDeviceError, InputDevice, find_input_device, list_input_devices

log = logging.getLogger(__name__)

BLOCK_SECONDS = 0.02  # the same blocks as the Recorder's (dictation.audio.capture.BLOCK_SECONDS)
HOLD_SECONDS = 30.0
SAMPLE_RATE = 16_000


def stream_formats(device: InputDevice, rate: int = SAMPLE_RATE) -> list[tuple[int, int]]:
    """(rate, channels) to try in order: ``rate`` mono first (no resampling), then the device's own."""
    rates = [rate] + ([device.default_samplerate] if device.default_samplerate != rate else [])
    channel_options = [1] + [c for c in (2, device.channels) if 1 < c <= device.channels]
    formats = []
    for channels in dict.fromkeys(channel_options):
        formats += [(r, channels) for r in rates if r > 0]
    return formats


class EarlyStream:
    """A running raw input stream whose blocks wait for a taker (`attach`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.device: InputDevice | None = None
        self.devices: list[InputDevice] = []
        self.rate = 0
        self.channels = 0
        self.latency = 0.0
        self.opened_at: float | None = None  # clock() once it was started
        self._stream: Any = None
        self._lock = threading.Lock()
        self._held: collections.deque[tuple[bytes, int, Any, float]] = collections.deque()
        self._held_frames = 0
        self.dropped_frames = 0  # held too long before a taker came
        self._callback: Callable[..., None] | None = None
        self._finished: Callable[[], None] | None = None
        self._ended = False  # the stream finished before anyone took it
        self._closing = False
        self.refused: dict[tuple[int, int], str] = {}  # (rate, channels) the device refused: why

    @property
    def is_open(self) -> bool:
        return self._stream is not None

    def open(self, spec: int | str | None) -> None:
        """Open and start the device ``spec`` names (None: the default) as the Recorder would first
        try it. Raises `AudioDeviceError`."""
        from dictation.audio.devices import import_early_portaudio

        sd = import_early_portaudio()
        self.devices = list_input_devices(sd)
        device = find_input_device(spec, self.devices)
        errors = []
        for rate, channels in stream_formats(device):
            try:
                stream = sd.RawInputStream(
                    device=device.index,
                    samplerate=rate,
                    channels=channels,
                    dtype="float32",
                    blocksize=max(1, round(rate * BLOCK_SECONDS)),
                    latency="low",
                    callback=self._on_block,
                    finished_callback=self._on_finished,
                )
                stream.start()
            except (sd.PortAudioError, ValueError) as exc:
                errors.append(f"cannot open microphone {device.name!r} at {rate} Hz, {channels} channel(s): {exc}")
                self.refused[(rate, channels)] = errors[-1]
                continue
            self._stream, self.device, self.rate, self.channels = stream, device, rate, channels
            self.opened_at = self.clock()
            latency = getattr(stream, "latency", 0.0)
            self.latency = float(latency) if isinstance(latency, (int, float)) else 0.0
            return
        raise AudioDeviceError(errors[0] if errors else f"cannot open microphone {device.name!r}")

    def matches(self, device: InputDevice, rate: int, channels: int) -> bool:
        return (
            self._stream is not None
            and self._callback is None
            and (self.device, self.rate, self.channels)
            == (
                device,
                rate,
                channels,
            )
        )

    def attach(self, callback: Callable[..., None], finished: Callable[[], None]) -> None:
        """From now on the stream's blocks go to ``callback(indata, frames, time_info, status)``
        (indata: a float32 numpy array [frames, channels]); the held ones first, each with
        ``arrived=`` its arrival time. ``finished`` is called when the stream ends unasked."""
        import numpy as np

        shape = self.channels

        def forward(data: Any, frames: int, time_info: Any, status: Any, arrived: float | None = None) -> None:
            block = np.frombuffer(data, dtype=np.float32, count=frames * shape).reshape(frames, shape)
            callback(block, frames, time_info, status, arrived=arrived)

        with self._lock:
            if self.dropped_frames:  # counted as silence, so later frames keep their numbers
                skipped = self.dropped_frames
                while skipped:
                    n = min(skipped, self.rate)
                    forward(bytes(4 * n * shape), n, None, 0)
                    skipped -= n
            for data, frames, status, arrived in self._held:
                forward(data, frames, None, status, arrived=arrived)
            self._held.clear()
            self._held_frames = 0
            self._callback, self._finished = forward, finished
            ended = self._ended
        if ended:
            finished()

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is None:
            return
        self._closing = True
        try:
            stream.close()
        except Exception as exc:  # a vanished device may fail to close; the stream is gone either way
            log.warning("closing the microphone opened at start: %s", exc)

    # -- PortAudio's thread ------------------------------------------------------------------------
    def _on_block(self, data: Any, frames: int, time_info: Any, status: Any) -> None:
        now = self.clock()
        try:
            with self._lock:
                if self._callback is not None:
                    self._callback(data, frames, time_info, status)
                    return
                self._held.append((bytes(data), frames, status, now))
                self._held_frames += frames
                while self._held_frames > HOLD_SECONDS * self.rate and len(self._held) > 1:
                    old = self._held.popleft()
                    self._held_frames -= old[1]
                    self.dropped_frames += old[1]
        except Exception:  # never into PortAudio's thread
            log.exception("the microphone's callback failed")

    def _on_finished(self) -> None:
        if self._closing:
            return
        with self._lock:
            finished = self._finished
            if finished is None:
                self._ended = True
        if finished is not None:
            finished()


class EarlyInputBackend:
    """An `InputBackend` that hands the Recorder ``early`` (once), and opens the rest as usual."""

    def __init__(self, early: EarlyStream, fallback: Any = None) -> None:
        self.early: EarlyStream | None = early
        if fallback is None:
            from dictation.audio.input_stream import SoundDeviceBackend

            fallback = SoundDeviceBackend()
        self.fallback = fallback

    def list_devices(self) -> list[InputDevice]:
        early = self.early
        if early is not None and early.is_open and early.devices:
            return list(early.devices)  # PortAudio's list when it opened; a rescan would close its stream
        return self.fallback.list_devices()

    def open_stream(self, device, samplerate, channels, blocksize, callback, finished_callback) -> Any:
        early = self.early
        if early is not None and early.device == device and (samplerate, channels) in early.refused:
            raise AudioDeviceError(early.refused[(samplerate, channels)])  # as it did a moment ago
        self.early = None
        if early is not None and early.matches(device, samplerate, channels):
            early.attach(callback, finished_callback)
            return early
        if early is not None:
            early.close()
        return self.fallback.open_stream(device, samplerate, channels, blocksize, callback, finished_callback)

    def rescan(self) -> None:
        early, self.early = self.early, None
        if early is not None:
            early.close()
        self.fallback.rescan()
