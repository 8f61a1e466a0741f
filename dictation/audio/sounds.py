"""Sound cues (start, stop, cancel, error): played in the background, never in the caller's way.

`SoundPlayer.play(kind)` only queues the cue and returns (microseconds): a worker thread opens the
default output device, plays the packaged WAV and closes the device again. Opening a device takes
10-200 ms (PulseAudio, Bluetooth), far too long for the GUI thread or the hotkey path. If cues
queue up faster than they play (a quick press and release), only the newest is played: a "start"
that would sound after its own "cancel" says the wrong thing.

Volume is perceptual: gain = (volume / 100) ** 2, so 50 % sounds about half as loud (-12 dB)
rather than barely quieter (-6 dB). Volume 0 or ``enabled=False`` plays nothing and opens nothing.

The WAVs are 44.1 kHz; when the default device refuses that rate the cue is resampled to the
device's default rate (`dictation.audio.resample`), and devices that refuse mono get the cue on
every channel. Loaded and resampled cues are cached.

The player can tell a listener (``on_cue``) when each cue starts sounding and what it plays: the
recorder uses that to keep the cue out of the take where the microphone hears the speaker
(`dictation.audio.cue_echo`).

Failures never reach the caller: with no output device (or no PortAudio) a warning is logged once
until a cue plays again; any other failure of one cue is logged with its traceback.

The output is behind `SoundOutput` so tests can use a fake; `SounddeviceOutput` is the real one.

`ClipPlayer` plays a saved recording (the history window's Play) through the same output, on its
own thread, one at a time; ``stop()`` ends it within one audio block.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from time import monotonic
from typing import Protocol

import numpy as np

from dictation import resources
from dictation.asr import AudioError
from dictation.audio.resample import resample
from dictation.audio.wav import read_wav

log = logging.getLogger(__name__)

CUES = resources.SOUNDS  # "start", "stop", "cancel", "error": the values of dictation.session.Sound
IDLE_EXIT_S = 30.0  # an idle worker ends (a player dropped without close() leaves no thread behind)
_STOP = object()


class SoundUnavailable(Exception):
    """No sound output can be used right now (no device, no PortAudio, the device refuses)."""


class SoundOutput(Protocol):
    """Where cues are played; called from the player's worker thread only."""

    def output_rate(self, preferred: int) -> int:
        """``preferred`` if the default output device takes it, else a rate the device does take.
        Raises SoundUnavailable when there is no usable output device."""
        ...

    def play(
        self,
        samples: np.ndarray,
        sample_rate: int,
        stop: threading.Event | None = None,
        *,
        on_start: Callable[[float], None] | None = None,
    ) -> None:
        """Play mono float32 ``samples`` on the default output device and return when done (or on
        a timeout, or soon after ``stop`` is set). Raises SoundUnavailable if the device cannot be
        opened. ``on_start(t)``, called on this thread once playing began, gets the `time.monotonic`
        time the first sample is expected to leave the speaker."""
        ...


class SounddeviceOutput:
    """The default output device through sounddevice (PortAudio): one short-lived stream per cue."""

    def __init__(self) -> None:
        self._channels = 1

    def _sd(self):
        from dictation.audio.devices import AudioDeviceError, import_sounddevice

        try:
            return import_sounddevice()
        except AudioDeviceError as exc:
            raise SoundUnavailable(str(exc)) from None

    def output_rate(self, preferred: int) -> int:
        sd = self._sd()
        try:
            device = sd.query_devices(kind="output")
        except (sd.PortAudioError, ValueError) as exc:
            raise SoundUnavailable(f"no sound output device ({exc})") from None
        fallback = int(round(device["default_samplerate"]))
        max_channels = max(1, int(device["max_output_channels"]))
        for rate in dict.fromkeys((preferred, fallback)):
            for channels in dict.fromkeys((1, min(2, max_channels))):
                try:
                    sd.check_output_settings(samplerate=rate, channels=channels, dtype="float32")
                except (sd.PortAudioError, ValueError):
                    continue
                self._channels = channels
                return rate
        raise SoundUnavailable(f"the sound output {device['name']!r} accepts neither {preferred} nor {fallback} Hz")

    def play(
        self,
        samples: np.ndarray,
        sample_rate: int,
        stop: threading.Event | None = None,
        *,
        on_start: Callable[[float], None] | None = None,
    ) -> None:
        sd = self._sd()
        done = threading.Event()
        began = threading.Event()
        first_block: list[float] = []  # monotonic time of the first callback, its delay to the speaker
        position = 0

        def callback(outdata, frames, time, status) -> None:
            nonlocal position
            if not first_block:
                first_block[:] = [monotonic(), _dac_delay(time)]
                began.set()
            if stop is not None and stop.is_set():
                outdata[:] = 0
                raise sd.CallbackStop
            chunk = samples[position : position + frames]
            outdata[: len(chunk)] = chunk[:, None]
            outdata[len(chunk) :] = 0
            position += frames
            if position >= len(samples):
                raise sd.CallbackStop

        try:
            stream = sd.OutputStream(
                samplerate=sample_rate,
                channels=self._channels,
                dtype="float32",
                callback=callback,
                finished_callback=done.set,
            )
        except (sd.PortAudioError, ValueError) as exc:
            raise SoundUnavailable(f"cannot open the sound output: {exc}") from None
        try:
            stream.start()
            if on_start is not None and began.wait(1.0):
                now, delay = first_block
                if delay is None:  # the host API gave no timing: its reported output latency
                    latency = getattr(stream, "latency", 0.0)
                    delay = float(latency) if isinstance(latency, (int, float)) else 0.0
                on_start(now + delay)
            # The callback ends the stream after the last sample; the timeout guards a stalled device.
            done.wait(len(samples) / sample_rate + 2.0)
        except sd.PortAudioError as exc:
            raise SoundUnavailable(f"cannot start the sound output: {exc}") from None
        finally:
            stream.close(ignore_errors=True)


def _dac_delay(time_info) -> float | None:
    """Seconds from this callback until its first sample reaches the converter, when the host API
    says (PortAudio's outputBufferDacTime - currentTime; ALSA without timestamps reports zeros)."""
    try:
        delay = float(time_info.outputBufferDacTime - time_info.currentTime)
    except (AttributeError, TypeError):
        return None
    return delay if 0.0 < delay < 1.0 else None


class SoundPlayer:
    """Plays the packaged cues in the background (see the module docstring). Thread-safe.

    ``volume`` and ``enabled`` are plain attributes: change them when the settings change. The
    worker thread starts with the first cue and ends after `IDLE_EXIT_S` without one, or on close().
    ``on_cue(kind, t_start, samples, sample_rate)``, when set, is told from the worker thread when a
    cue starts sounding (`time.monotonic` time) and what exactly is played, so the recorder can keep
    the cue out of the take (`Recorder.mark_cue`).
    """

    def __init__(self, volume: int = 50, enabled: bool = True, backend: SoundOutput | None = None) -> None:
        self.volume = volume
        self.enabled = enabled
        self._backend = backend if backend is not None else SounddeviceOutput()
        self._queue: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0  # cues queued or playing
        self._warned = False
        self._cues: dict[tuple[str, int], np.ndarray] = {}
        self._wavs: dict[str, tuple[np.ndarray, int]] = {}
        self.on_cue: Callable[[str, float, np.ndarray, int], None] | None = None

    @property
    def volume(self) -> int:
        return self._volume

    @volume.setter
    def volume(self, value: int) -> None:
        self._volume = min(100, max(0, int(value)))

    @property
    def gain(self) -> float:
        return (self._volume / 100) ** 2

    def play(self, kind: str) -> None:
        """Queue cue ``kind`` ("start", "stop", "cancel", "error" or a `Sound`) and return at once."""
        kind = getattr(kind, "value", kind)
        if kind not in CUES:
            log.warning("unknown sound cue %r (known: %s)", kind, ", ".join(CUES))
            return
        gain = self.gain
        if not self.enabled or gain == 0.0:
            return
        with self._lock:  # held while queuing, so an idle worker cannot exit past this cue
            self._pending += 1
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._run, name="sound cues", daemon=True)
                self._worker.start()
            self._queue.put((kind, gain))

    def drain(self, timeout: float = 2.0) -> bool:
        """Wait until every queued cue has played (or been skipped); False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float = 1.0) -> None:
        """Stop the worker after the cue it is playing (call on quit)."""
        with self._lock:
            worker = self._worker
            self._worker = None
        if worker is not None:
            self._queue.put(_STOP)
            worker.join(timeout)

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty() and self._worker is threading.current_thread():
                        self._worker = None  # the next play() starts a new worker
                        return
                continue
            skipped = 0
            while item is not _STOP:  # only the newest of the queued cues is worth playing
                try:
                    newer = self._queue.get_nowait()
                except queue.Empty:
                    break
                if newer is _STOP:
                    self._queue.put(_STOP)  # play this one, then stop
                    break
                item, skipped = newer, skipped + 1
            if item is _STOP:
                return
            kind, gain = item
            try:
                self._play_now(kind, gain)
            finally:
                with self._idle:
                    self._pending -= 1 + skipped
                    self._idle.notify_all()

    def _play_now(self, kind: str, gain: float) -> None:
        try:
            samples, rate = self._wav(kind)
            out_rate = self._backend.output_rate(rate)
            cue = self._cues.get((kind, out_rate))
            if cue is None:
                cue = samples if out_rate == rate else resample(samples, rate, out_rate)
                self._cues[(kind, out_rate)] = cue
            played = (cue * np.float32(gain)).astype(np.float32, copy=False)
            listener = self.on_cue
            self._backend.play(
                played,
                out_rate,
                on_start=None if listener is None else lambda t: self._tell(listener, kind, t, played, out_rate),
            )
        except SoundUnavailable as exc:
            if not self._warned:
                log.warning("sound cues are silent: %s", exc)
                self._warned = True
            return
        except Exception as exc:  # one broken cue must not end the worker; logged with its traceback
            log.warning("could not play the %s sound: %s", kind, exc, exc_info=True)
            return
        self._warned = False  # a later outage is worth a new warning

    @staticmethod
    def _tell(listener: Callable, kind: str, t_start: float, samples: np.ndarray, rate: int) -> None:
        try:
            listener(kind, t_start, samples, rate)
        except Exception:  # the cue still plays
            log.warning("the %s sound's listener failed", kind, exc_info=True)

    def _wav(self, kind: str) -> tuple[np.ndarray, int]:
        if kind not in self._wavs:
            self._wavs[kind] = read_wav(resources.sound_path(kind))
        return self._wavs[kind]


class ClipPlayer:
    """Plays one recording at a time in the background (the history window's Play button).

    ``play(path, on_done)`` returns at once; a thread reads the WAV, resamples it to a rate the
    device takes and plays it at its own level. ``on_done(error)`` is called from that thread when
    it ends: ``""`` after the last sample or a ``stop()``, else one sentence saying why nothing (or
    not all) could be heard. Starting another clip stops the one playing.
    """

    def __init__(self, backend: SoundOutput | None = None) -> None:
        self._backend = backend if backend is not None else SounddeviceOutput()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def playing(self) -> bool:
        with self._lock:
            return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def play(self, path: str | Path, on_done: Callable[[str], None] | None = None) -> None:
        self.stop()
        with self._lock:
            self._stop = stop = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(Path(path), stop, on_done), name="clip player", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """End the clip playing now (if any); returns without waiting for the device."""
        with self._lock:
            self._stop.set()

    def close(self, timeout: float = 1.0) -> None:
        self.stop()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self, path: Path, stop: threading.Event, on_done: Callable[[str], None] | None) -> None:
        error = ""
        try:
            samples, rate = read_wav(path)
            out_rate = self._backend.output_rate(rate)
            if out_rate != rate:
                samples = resample(samples, rate, out_rate)
            if not stop.is_set():
                self._backend.play(np.clip(samples, -1.0, 1.0).astype(np.float32, copy=False), out_rate, stop)
        except (SoundUnavailable, AudioError) as exc:  # no device; a missing or damaged file (named)
            error = f"Cannot play the recording: {exc}"
        except OSError as exc:
            error = f"Cannot read the recording {path}: {exc.strerror or exc}"
        except Exception as exc:  # a damaged file (AudioError) or a device failure: said, never raised
            log.warning("playing %s failed", path, exc_info=True)
            error = f"Cannot play the recording: {exc}"
        if on_done is not None:
            on_done(error)
