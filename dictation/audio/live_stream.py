"""One open input stream as the `capture.Recorder` keeps it (`LiveStream`: the ring of recent audio its
callback writes, the level, and the stream's clock against the system's) and the take being recorded
from it (`Tape`: fixed-size chunks at the device rate)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from dictation.audio.cue_echo import CueEraser
from dictation.audio.devices import InputDevice
from dictation.audio.input_stream import InputStreamLike

# The stream's clock is estimated over this long (see `LiveStream.anchor`): long enough to include a
# block delivered on time, short enough to follow the sound card's drift against the system clock.
ANCHOR_WINDOW_SECONDS = 10.0


class Tape:
    """The take's audio at the device rate: fixed-size chunks, capped at ``max_frames``."""

    def __init__(self, max_frames: int, chunk_frames: int) -> None:
        self.max_frames = max_frames
        self.chunk_frames = chunk_frames
        self.cues = CueEraser(chunk_frames)  # the app's sound cues heard in it; Recorder.start sets the rate
        self.chunks: list[np.ndarray] = []
        self.pos = chunk_frames  # write position in the last chunk; full = allocate on next write
        self.frames = 0
        self.truncated = False

    def write(self, x: np.ndarray) -> None:
        room = self.max_frames - self.frames
        if len(x) > room:
            x = x[:room]
            self.truncated = True
        while len(x):
            if self.pos == self.chunk_frames:
                self.chunks.append(np.empty(self.chunk_frames, dtype=np.float32))
                self.pos = 0
            k = min(len(x), self.chunk_frames - self.pos)
            self.chunks[-1][self.pos : self.pos + k] = x[:k]
            self.pos += k
            self.frames += k
            x = x[k:]

    def array(self) -> np.ndarray:
        if not self.chunks:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(self.chunks)[: self.frames]

    def apply_gain(self, start: int, gains: np.ndarray) -> None:
        """Multiply frames from ``start`` on by ``gains`` in place (as far as they exist)."""
        for view, part in self._views(start, gains):
            view *= part

    def add(self, start: int, values: np.ndarray) -> None:
        """Add ``values`` to the frames from ``start`` on in place (as far as they exist)."""
        for view, part in self._views(start, values):
            view += part

    def _views(self, start: int, values: np.ndarray):
        """(view of the tape, matching slice of ``values``) pairs, chunk by chunk."""
        start = max(0, start)
        end = min(self.frames, start + len(values))
        pos = start
        while pos < end:
            chunk, offset = divmod(pos, self.chunk_frames)
            k = min(end - pos, self.chunk_frames - offset)
            yield self.chunks[chunk][offset : offset + k], values[pos - start : pos - start + k]
            pos += k

    def read(self, start: int) -> np.ndarray:
        """A copy of frames ``[start, frames)`` (empty when ``start`` is at or past the end)."""
        start = max(0, start)
        if start >= self.frames:
            return np.zeros(0, dtype=np.float32)
        first = start // self.chunk_frames
        parts = self.chunks[first:]
        parts[0] = parts[0][start - first * self.chunk_frames :]
        return np.concatenate(parts)[: self.frames - start]


class LiveStream:
    """One open stream and everything its callback writes; ``cond`` guards all of it."""

    def __init__(self, device: InputDevice, rate: int, channels: int, ring_frames: int, clock: Callable[[], float]):
        self.device = device
        self.rate = rate
        self.channels = channels
        self.clock = clock
        self.cond = threading.Condition(threading.Lock())
        self.ring = np.zeros(ring_frames, dtype=np.float32)
        self.mix = np.zeros(rate, dtype=np.float32)  # downmix scratch for multi-channel devices
        self.total = 0  # frames delivered since the stream opened
        self.last_time: float | None = None  # clock() when the newest block arrived
        # min over recent blocks of (arrival - frames delivered / rate), in two buckets (see `anchor`)
        self._anchors: list[float] = []
        self._bucket_start = 0.0
        self.mean_square = 0.0  # of the newest block, for the level meter
        self.status_events = 0  # blocks flagged by PortAudio (input overflow: audio was dropped)
        self.tape: Tape | None = None
        self.waiting = False  # stop() is waiting for the tail
        self.closing = False  # we asked the stream to end, so its finish is not a loss
        self.lost = threading.Event()
        self.failure: str | None = None
        self.stream: InputStreamLike | None = None
        self.latency = 0.0

    # -- callback thread -------------------------------------------------------------------
    def callback(
        self, indata: np.ndarray, frames: int, time_info: Any, status: Any, arrived: float | None = None
    ) -> None:
        """PortAudio's callback; ``arrived``: when the block came, for blocks held before this stream
        was ours (`dictation.audio.early_stream`)."""
        now = self.clock() if arrived is None else arrived
        try:
            if self.channels == 1:
                x = indata[:frames, 0]
            elif frames <= len(self.mix):
                x = np.mean(indata[:frames], axis=1, out=self.mix[:frames])
            else:
                x = indata[:frames].mean(axis=1)
            mean_square = float(np.dot(x, x)) / frames if frames else 0.0
            with self.cond:
                self._write_ring(x)
                if self.tape is not None:
                    self.tape.write(x)
                self.total += frames
                self.last_time = now
                self._note_arrival(now, bool(getattr(status, "input_overflow", status)))
                self.mean_square = mean_square
                if status:
                    self.status_events += 1
                if self.waiting:
                    self.cond.notify_all()
        except Exception as exc:  # never let an exception escape into PortAudio's thread
            self.failure = f"audio callback failed: {type(exc).__name__}: {exc}"
            self.lost.set()

    def finished(self) -> None:
        """PortAudio's finished callback: unrequested, it means the device went away."""
        if not self.closing:
            self.failure = self.failure or "the audio stream ended unexpectedly"
            self.lost.set()

    def _note_arrival(self, now: float, overflow: bool) -> None:
        """Each block arriving at ``now`` says the stream's frame 0 was captured no later than
        ``now - total / rate``: a block is never delivered before it was captured, but often after
        (the callback thread waits for Python's GIL while the app imports Qt or torch, PulseAudio
        hands over several blocks at once). The earliest such bound over the last
        `ANCHOR_WINDOW_SECONDS` is the stream's clock. Audio dropped in an overflow shifts the frame
        count against time, so the estimate starts again there."""
        bound = now - self.total / self.rate
        if not self._anchors or overflow:
            self._anchors, self._bucket_start = [bound, bound], now
        elif now - self._bucket_start > ANCHOR_WINDOW_SECONDS / 2:
            self._anchors, self._bucket_start = [self._anchors[1], bound], now
        else:
            self._anchors[1] = min(self._anchors[1], bound)

    @property
    def anchor(self) -> float | None:
        """When (clock()) the stream's frame 0 was delivered at the earliest; None before any audio."""
        return min(self._anchors) if self._anchors else None

    def _write_ring(self, x: np.ndarray) -> None:
        size = len(self.ring)
        first_frame = self.total
        if len(x) > size:
            first_frame += len(x) - size
            x = x[-size:]
        pos = first_frame % size
        first = min(len(x), size - pos)
        self.ring[pos : pos + first] = x[:first]
        self.ring[: len(x) - first] = x[first:]

    # -- called with cond held -------------------------------------------------------------
    def frame_at(self, t: float) -> int:
        """The frame (counted from the stream's start) that the microphone captured at time ``t``."""
        anchor = self.anchor
        if anchor is None:
            return self.total
        return round((t + self.latency - anchor) * self.rate)

    def time_of(self, frame: int) -> float | None:
        """When the microphone captured ``frame`` (the inverse of `frame_at`); None before any audio."""
        anchor = self.anchor
        if anchor is None:
            return None
        return anchor - self.latency + frame / self.rate

    def copy_ring(self, start: int, tape: Tape) -> None:
        """Append ring frames [start, total) to the tape; ``start`` must be within the ring."""
        if start >= self.total:
            return
        size = len(self.ring)
        a, b = start % size, self.total % size
        if a < b:
            tape.write(self.ring[a:b])
        else:
            tape.write(self.ring[a:])
            tape.write(self.ring[:b])
