"""Microphone capture for push-to-talk: a warm input stream, a pre-roll ring, takes at 16 kHz mono.

Why a warm stream and a ring: opening a microphone takes from tens of milliseconds to seconds
(PulseAudio, Bluetooth headsets switching profile), and users start speaking as they press the
key, so a stream opened at the press loses the first word. The `Recorder` keeps its stream running
(`open` once, or on first use when ``keep_open`` is set) and its callback always writes into a ring
of the last few seconds; `start` copies the audio from ``pre_roll_s`` before the press out of that
ring and keeps appending, `stop` waits until the audio up to ``post_roll_s`` after the release has
arrived (the last syllable is often still being spoken at the release) and returns a `Take`.

For Bluetooth headsets an always-open microphone keeps the headset in its low-quality call profile
(music sounds worse while the app runs): ``keep_open=False`` opens the stream at the press and
closes it after the take. Such takes have no pre-roll, and `Take.start_gap_s` says how much audio
after the press was missed.

Threading: the PortAudio callback runs on its own thread and does only bounded work: one copy of
the block into the ring, one into the take's preallocated chunk (a new 1 s chunk is allocated once
per second of audio), a dot product for the level meter, no logging, nothing that can block except
one short lock shared with `start`/`stop`. The stream is never stopped or closed while that lock is
held (PortAudio waits for a running callback to return). The public methods may be called from any
thread; they are serialised by a second lock, except `take_samples` (the take so far, read while it
grows so the app can transcribe during speech), which takes only the first, so a `stop` waiting for
its tail never holds it up. Times (``t_press``, ``t_release``) are
`time.monotonic` values unless another ``clock`` is injected.

Errors: opening raises `AudioDeviceError` (one line for the user). A device lost mid-take (the
stream finishes without being asked to, or delivers nothing for a second) never raises: `stop`
returns what was captured with `Take.error` set, and the next `start` reopens the device.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dictation.asr import SAMPLE_RATE
from dictation.audio.cue_echo import CueEraser
from dictation.audio.devices import (
    AudioDeviceError,
    InputDevice,
    find_input_device,
)
from dictation.audio.early_stream import stream_formats
from dictation.audio.input_stream import InputBackend, SoundDeviceBackend
from dictation.audio.live_stream import LiveStream, Tape
from dictation.audio.resample import resample

log = logging.getLogger(__name__)

BLOCK_SECONDS = 0.02  # callback block: 20 ms (PortAudio's "low" latency alone gives 2-frame blocks)
# ring = pre-roll + this: a start() up to 10 s after the press still gets it all (a press while the app
# starts up, or while its GUI thread is busy, is handled late but stamped with its own time)
RING_EXTRA_SECONDS = 10.0
STALL_SECONDS = 1.0  # no audio for this long while waiting for the tail = device gone
LEVEL_FLOOR_DBFS = -100.0  # level() of digital silence (16-bit quantisation noise is about -101)
# A working microphone's own noise peaks well above this over any take; only a muted or dead input
# (digital zeros, or a switched-off capture path) stays below it.
SILENT_PEAK_DBFS = -70.0


@dataclass(frozen=True)
class Take:
    """One recording: 16 kHz mono float32 samples plus what the app needs to judge them."""

    samples: np.ndarray
    device_name: str
    device_sample_rate: int  # the rate the device was opened at (resampled to 16 kHz if different)
    started_at: float  # wall-clock time (time.time()) of the press, for file names and history
    peak_dbfs: float
    rms_dbfs: float
    silent: bool  # the microphone delivered (nearly) nothing: muted, or a dead input
    start_gap_s: float | None  # first sample minus the press: <= 0 means nothing after the press was missed
    truncated: bool  # the maximum length was reached and later audio dropped
    error: str | None = None  # the device failed during the take; samples hold what came before
    warnings: tuple[str, ...] = ()
    sample_rate: int = SAMPLE_RATE

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate

    @property
    def silence_reason(self) -> str | None:
        """A sentence for the user when the take is silent, else None."""
        if not self.silent:
            return None
        if self.peak_dbfs <= LEVEL_FLOOR_DBFS:
            return (
                f"The microphone {self.device_name!r} recorded only digital silence: is it muted, "
                "or is microphone access blocked in the system's privacy settings?"
            )
        return (
            f"The microphone {self.device_name!r} recorded almost nothing (peak {self.peak_dbfs:.0f} dBFS): "
            "is it muted or is its input volume at zero?"
        )


def dbfs(mean_square: float) -> float:
    """Level in dB relative to a full-scale signal, floored at LEVEL_FLOOR_DBFS."""
    if mean_square <= 0.0:
        return LEVEL_FLOOR_DBFS
    return max(LEVEL_FLOOR_DBFS, 10.0 * math.log10(mean_square))


def meter_fraction(level_dbfs: float, floor_dbfs: float = -60.0) -> float:
    """Map a dBFS level onto 0..1 for a level meter (floor_dbfs and below = 0, full scale = 1)."""
    return min(1.0, max(0.0, (level_dbfs - floor_dbfs) / -floor_dbfs))


@dataclass
class _Pending:
    """The take being recorded, from the API side."""

    live: LiveStream
    tape: Tape
    t_press: float
    wall_time: float
    start_frame: int
    status_events_at_start: int
    warnings: list[str]


class Recorder:
    """Push-to-talk recorder over one input device (None = the system default, an index, or a name).

    ``open()`` starts the stream ahead of the first press (recommended; otherwise `start` opens it).
    ``start(t_press)`` / ``stop(t_release) -> Take`` record one take; ``cancel()`` drops it;
    ``close()`` releases the device. ``level()`` is the newest block's RMS in dBFS for a meter.
    """

    def __init__(
        self,
        device: int | str | None = None,
        *,
        pre_roll_s: float = 0.4,
        post_roll_s: float = 0.2,
        max_seconds: float = 300.0,
        keep_open: bool = True,
        fallback_to_default: bool = True,
        backend: InputBackend | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if pre_roll_s < 0 or post_roll_s < 0 or max_seconds <= 0:
            raise ValueError("pre_roll_s and post_roll_s must be >= 0 and max_seconds > 0")
        self.device_spec = device
        self.pre_roll_s = pre_roll_s
        self.post_roll_s = post_roll_s
        self.max_seconds = max_seconds
        self.keep_open = keep_open
        self.fallback_to_default = fallback_to_default
        self._backend: InputBackend = backend if backend is not None else SoundDeviceBackend()
        self._clock = clock
        self._api = threading.RLock()
        self._live: LiveStream | None = None
        self._pending: _Pending | None = None
        self._open_warnings: list[str] = []

    # -- state ---------------------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        live = self._live
        return live is not None and not live.lost.is_set()

    @property
    def is_recording(self) -> bool:
        return self._pending is not None

    @property
    def device(self) -> InputDevice | None:
        live = self._live
        return live.device if live is not None else None

    @property
    def device_sample_rate(self) -> int | None:
        live = self._live
        return live.rate if live is not None else None

    @property
    def frames_delivered(self) -> int:
        """Frames the open stream has delivered so far (0 when closed): readiness for tests and UIs."""
        live = self._live
        return live.total if live is not None else 0

    @property
    def error(self) -> str | None:
        """Why the open stream died or went quiet, else None: poll it to end a take early."""
        live = self._live
        if live is None:
            return None
        if live.lost.is_set():
            return live.failure
        last = live.last_time
        if last is not None and self._clock() - last > STALL_SECONDS:
            return f"no audio from the microphone for {self._clock() - last:.1f} s (disconnected?)"
        return None

    @property
    def limit_reached(self) -> bool:
        pending = self._pending
        return pending is not None and pending.tape.truncated

    def elapsed_s(self) -> float:
        """Seconds of audio in the current take so far, pre-roll included (0 when not recording)."""
        pending = self._pending
        return pending.tape.frames / pending.live.rate if pending is not None else 0.0

    def take_samples(self, start: int = 0) -> np.ndarray:
        """The current take's audio from frame ``start`` on, as captured so far: a copy, at
        `device_sample_rate`, mono float32. Empty when not recording. Thread-safe and never blocks
        for long (one short lock shared with the audio callback), so it can be polled during a take.

        Frame ``k`` here is frame ``k`` of the take's tape, so at 16 kHz these are exactly the values
        the finished `Take.samples` holds at the same positions (`stop` cuts the tape at the release
        plus its post-roll and uses it as is); at other rates the take is the resampled tape. While a
        sound cue reported by `mark_cue` may still be muted, the frames from its search window on are
        held back (a few hundred ms), so they are read only once final.
        """
        pending = self._pending
        if pending is None:
            return np.zeros(0, dtype=np.float32)
        live, tape = pending.live, pending.tape
        cues = tape.cues  # a sound cue heard in the take is removed before its frames are read (mark_cue)
        with cues.lock:
            with live.cond:
                work = cues.collect(tape)
            edits = [edit for job in work for edit in cues.plan(*job)]  # outside the callback's lock
            with live.cond:
                cues.apply(tape, edits)
                return cues.readable(tape, start)

    def level(self) -> float:
        """RMS of the newest audio block in dBFS (LEVEL_FLOOR_DBFS when closed or failed); thread-safe."""
        live = self._live
        if live is None or live.lost.is_set():
            return LEVEL_FLOOR_DBFS
        return dbfs(live.mean_square)

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self) -> None:
        """Open and start the stream now, so the first take gets its pre-roll. Idempotent."""
        with self._api:
            self._ensure_open()

    def close(self) -> None:
        """Drop any take in progress and release the device."""
        with self._api:
            if self._pending is not None:
                self.cancel()
            self._drop_live()

    def __enter__(self) -> Recorder:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, t_press: float | None = None) -> None:
        """Begin a take with the audio from ``pre_roll_s`` before ``t_press`` (default: now).

        Raises `AudioDeviceError` when the device cannot be opened, RuntimeError if already recording.
        """
        with self._api:
            if self._pending is not None:
                raise RuntimeError("Recorder.start: already recording")
            if t_press is None:
                t_press = self._clock()
            wall_time = time.time() - max(0.0, self._clock() - t_press)
            live = self._ensure_open()
            tape = Tape(max(1, round(self.max_seconds * live.rate)), chunk_frames=live.rate)
            tape.cues = CueEraser(live.rate)
            with live.cond:
                oldest = max(0, live.total - len(live.ring))
                start = live.frame_at(t_press) - round(self.pre_roll_s * live.rate)
                start = min(max(start, oldest), live.total)
                live.copy_ring(start, tape)
                live.tape = tape
                events = live.status_events
            self._pending = _Pending(live, tape, t_press, wall_time, start, events, list(self._open_warnings))

    def start_gap(self, timeout: float = 0.0) -> float | None:
        """The current take's first sample minus its press, in seconds, as `Take.start_gap_s` will
        say: <= 0 when the take reaches back to the press, > 0 when audio after the press is missing
        (the stream opened after the press, or the press is older than the ring). A stream opened
        by `start` has not delivered yet: this waits up to ``timeout`` seconds for its first block.
        None when not recording or still unknown."""
        with self._api:
            pending = self._pending
            if pending is None:
                return None
            live = pending.live
            deadline = time.monotonic() + timeout
            with live.cond:
                live.waiting = True
                try:
                    while live.total <= pending.start_frame and not live.lost.is_set():
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            return None
                        live.cond.wait(min(remaining, 0.05))
                finally:
                    live.waiting = False
                first_time = live.time_of(pending.start_frame)
            return None if first_time is None else first_time - pending.t_press

    def stop(self, t_release: float | None = None) -> Take:
        """End the take: wait for the audio up to ``post_roll_s`` after ``t_release`` (default: now).

        This blocks for about post_roll_s plus the input latency (0.25 s), so call it off the GUI
        thread. It never raises for device trouble: a lost device gives the audio captured so far
        and `Take.error`.
        """
        with self._api:
            pending = self._pending
            if pending is None:
                raise RuntimeError("Recorder.stop: not recording")
            if t_release is None:
                t_release = self._clock()
            live, tape = pending.live, pending.tape
            deadline = time.monotonic() + self.post_roll_s + live.latency + STALL_SECONDS
            stalled = False
            with live.cond:
                end = live.frame_at(t_release) + round(self.post_roll_s * live.rate)
                live.waiting = True
                while live.total < end and not live.lost.is_set() and not tape.truncated:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        stalled = True
                        break
                    live.cond.wait(min(remaining, 0.05))
                live.waiting = False
                live.tape = None
                first_time = live.time_of(pending.start_frame) if live.total > pending.start_frame else None
                status_events = live.status_events - pending.status_events_at_start
            self._pending = None
            tape.cues.settle(tape, final=True)  # the callback no longer writes to it

            error = None
            if live.lost.is_set():
                error = f"microphone {live.device.name!r} stopped during the recording: {live.failure}"
            elif stalled:
                live.failure = f"no audio for {STALL_SECONDS:.0f} s (device disconnected?)"
                live.lost.set()
                error = f"microphone {live.device.name!r} stopped delivering audio (disconnected?)"
            if error or not self.keep_open:
                self._drop_live()
            if error:
                log.warning("%s; keeping the %.1f s recorded before that", error, tape.frames / live.rate)

            native = tape.array()[: max(0, end - pending.start_frame)]
            warnings = pending.warnings
            if status_events:
                warnings.append(f"{status_events} audio blocks were flagged by the audio system (input overflow)")
            return _make_take(native, live, pending, first_time, tape.truncated, error, warnings)

    def cancel(self) -> None:
        """Discard the take in progress (no-op when not recording)."""
        with self._api:
            pending = self._pending
            if pending is None:
                return
            with pending.live.cond:
                pending.live.tape = None
            self._pending = None
            if not self.keep_open:
                self._drop_live()

    def mark_cue(self, t_start: float, samples: np.ndarray, sample_rate: int) -> None:
        """The app's sound cue ``samples`` (mono, ``sample_rate``) started sounding at ``t_start`` (this
        recorder's clock). Where the microphone picked it up, it is muted in the take in progress
        (`dictation.audio.cue_echo`); ignored when not recording. Thread-safe, never blocks for long."""
        pending, live = self._pending, self._live
        if pending is None or live is None or len(samples) == 0:
            return
        reference = samples if sample_rate == live.rate else resample(samples, sample_rate, live.rate)
        with live.cond:
            if live.tape is not pending.tape:  # that take ended meanwhile
                return
            pending.tape.cues.add(live.frame_at(t_start) - pending.start_frame, reference)

    # -- opening -------------------------------------------------------------------------------
    def _ensure_open(self) -> LiveStream:
        live = self._live
        if live is not None and not live.lost.is_set():
            last = live.last_time
            if last is None or self._clock() - last <= STALL_SECONDS:
                return live
            # Some drivers just stop calling back when a device goes away (Bluetooth, USB).
            live.failure = f"no audio for {self._clock() - last:.1f} s"
            live.lost.set()
        if live is not None:
            log.info("reopening microphone %r after: %s", live.device.name, live.failure)
            self._drop_live()
        try:
            live = self._open_live()
        except AudioDeviceError as first:
            # PortAudio enumerates devices once; a replugged microphone or a restarted sound server
            # is only seen after re-initialising it (which is safe: no stream of ours is open).
            log.info("cannot open the microphone (%s); rescanning devices", first)
            try:
                self._backend.rescan()
                live = self._open_live()
            except AudioDeviceError:
                raise first from None
        self._live = live
        return live

    def _open_live(self) -> LiveStream:
        devices = self._backend.list_devices()
        self._open_warnings = []
        try:
            device = find_input_device(self.device_spec, devices)
        except AudioDeviceError as exc:
            if self.device_spec is None or not self.fallback_to_default:
                raise
            device = find_input_device(None, devices)
            self._open_warnings.append(f"{exc}; using the default microphone {device.name!r} instead")
            log.warning("%s", self._open_warnings[-1])
        errors = []
        for rate, channels in _stream_formats(device):
            ring_frames = round((self.pre_roll_s + RING_EXTRA_SECONDS) * rate)
            live = LiveStream(device, rate, channels, ring_frames, self._clock)
            try:
                live.stream = self._backend.open_stream(
                    device, rate, channels, max(1, round(rate * BLOCK_SECONDS)), live.callback, live.finished
                )
            except AudioDeviceError as exc:
                errors.append(str(exc))
                continue
            latency = getattr(live.stream, "latency", 0.0)
            live.latency = float(latency) if isinstance(latency, (int, float)) else 0.0
            log.info(
                "microphone %r open at %d Hz, %d channel(s), latency %.0f ms",
                device.name,
                rate,
                channels,
                live.latency * 1000,
            )
            return live
        # The first attempt (16 kHz mono) names the cause most plainly; the fallbacks only confirm it.
        raise AudioDeviceError(errors[0] if errors else f"cannot open microphone {device.name!r}")

    def _drop_live(self) -> None:
        live, self._live = self._live, None
        if live is None or live.stream is None:
            return
        live.closing = True
        try:
            live.stream.close()  # never with live.cond held: PortAudio waits for the callback
        except Exception as exc:  # a vanished device may fail to close; the stream is gone either way
            log.warning("closing microphone %r: %s", live.device.name, exc)


def _stream_formats(device: InputDevice) -> list[tuple[int, int]]:
    """(rate, channels) to try in order: 16 kHz mono first (no resampling), then the device's own."""
    return stream_formats(device, SAMPLE_RATE)


def _make_take(
    native: np.ndarray,
    live: LiveStream,
    pending: _Pending,
    first_time: float | None,
    truncated: bool,
    error: str | None,
    warnings: list[str],
) -> Take:
    if live.rate != SAMPLE_RATE and len(native):
        samples = np.clip(resample(native, live.rate, SAMPLE_RATE), -1.0, 1.0)
    else:
        samples = native.astype(np.float32, copy=False)
    if len(samples):
        peak = float(np.max(np.abs(samples)))
        mean_square = float(np.dot(samples, samples)) / len(samples)
    else:
        peak = mean_square = 0.0
    peak_dbfs = dbfs(peak * peak)
    if truncated:
        warnings.append(f"the recording reached its maximum length of {len(samples) / SAMPLE_RATE:.0f} s")
    return Take(
        samples=samples,
        device_name=live.device.name,
        device_sample_rate=live.rate,
        started_at=pending.wall_time,
        peak_dbfs=peak_dbfs,
        rms_dbfs=dbfs(mean_square),
        silent=peak_dbfs < SILENT_PEAK_DBFS,
        start_gap_s=None if first_time is None else first_time - pending.t_press,
        truncated=truncated,
        error=error,
        warnings=tuple(warnings),
    )
