"""The microphone opened before numpy: its blocks wait, with their arrival times, and
the Recorder that takes the stream over later has them in its ring as if it had been open all along."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from dictation.audio import early_stream
from dictation.audio.capture import Recorder
from dictation.audio.early_stream import EarlyInputBackend, EarlyStream
from tests.audio.fakes import FakeBackend, FakeClock, coded, decode, use_fake_portaudio

SR = 16_000
BLOCK = 320


class FakeRawStream:
    """sounddevice.RawInputStream: the test delivers float32 bytes to its callback."""

    def __init__(self, sd, **kwargs) -> None:
        if kwargs["samplerate"] in sd.refuse_rates:
            raise sd.PortAudioError("Invalid sample rate")
        self.sd, self.kwargs = sd, kwargs
        self.latency = 0.0
        self.started = self.closed = False
        sd.streams.append(self)

    def start(self) -> None:
        self.started = True

    def close(self) -> None:
        self.closed = True
        self.kwargs["finished_callback"]()

    def push(self, x: np.ndarray) -> None:
        if not self.closed:
            self.sd.clock.advance(len(x) / self.kwargs["samplerate"])
            data = np.asarray(x, np.float32).tobytes()
            self.kwargs["callback"](memoryview(data), len(x), None, 0)


def fake_sounddevice(clock: FakeClock, refuse_rates=()) -> types.SimpleNamespace:
    sd = types.SimpleNamespace(clock=clock, streams=[], refuse_rates=set(refuse_rates))
    sd.PortAudioError = type("PortAudioError", (Exception,), {})
    sd.RawInputStream = lambda **kwargs: FakeRawStream(sd, **kwargs)
    mics = [
        {"index": 0, "name": "Fake Mic", "default_samplerate": 48000.0, "max_input_channels": 2, "hostapi": 0},
        {"index": 1, "name": "Other Mic", "default_samplerate": 16000.0, "max_input_channels": 1, "hostapi": 0},
    ]

    def query_devices(kind=None):
        return mics[0] if kind == "input" else mics

    sd.query_devices = query_devices
    sd.query_hostapis = lambda: [{"name": "Fake API"}]
    return sd


@pytest.fixture
def sd(monkeypatch):
    clock = FakeClock()
    module = fake_sounddevice(clock)
    use_fake_portaudio(monkeypatch, module)
    return module


def push_coded(stream: FakeRawStream, start: int, seconds: float) -> int:
    n = round(seconds * SR)
    for a in range(start, start + n, BLOCK):
        stream.push(coded(a, min(BLOCK, start + n - a)))
    return start + n


def test_opening_it_does_not_import_numpy():
    # Run in a fresh interpreter: numpy is what the early stream avoids (0.1-1 s at start-up).
    import subprocess

    code = "import sys, dictation.audio.early_stream; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_the_recorder_that_takes_it_over_has_what_was_said_before_it_existed(sd):
    clock = sd.clock
    stream = EarlyStream(clock=clock)
    stream.open(None)
    raw = sd.streams[-1]
    assert raw.kwargs["samplerate"] == SR and raw.kwargs["channels"] == 1 and raw.kwargs["dtype"] == "float32"
    frame = push_coded(raw, 0, 1.0)
    t_press = clock()  # pressed 1 s after the microphone opened, long before the app had a Recorder
    frame = push_coded(raw, frame, 0.5)

    recorder = Recorder(None, pre_roll_s=0.4, post_roll_s=0.0, backend=EarlyInputBackend(stream), clock=clock)
    recorder.open()
    assert len(sd.streams) == 1  # the same stream, not a second one
    assert recorder.frames_delivered == frame
    recorder.start(t_press)
    assert recorder.start_gap() == pytest.approx(-0.4)
    push_coded(raw, frame, 0.3)
    take = recorder.stop(t_press + 0.7)
    assert len(take.samples) == round(1.1 * SR)
    np.testing.assert_array_equal(decode(take.samples), np.arange(16000 - 6400, 16000 + 11200) % 997)


def test_blocks_that_came_late_before_the_hand_over_keep_their_own_arrival_times(sd):
    # The times that matter are when each block came, not when the Recorder got it (seconds later).
    clock = sd.clock
    stream = EarlyStream(clock=clock)
    stream.open(None)
    raw = sd.streams[-1]
    frame = push_coded(raw, 0, 0.5)
    t_press = clock() - 0.2
    clock.advance(3.0)  # the app took 3 s more to build its Recorder
    recorder = Recorder(None, pre_roll_s=0.1, post_roll_s=0.0, backend=EarlyInputBackend(stream), clock=clock)
    recorder.open()
    frame = push_coded(raw, frame, 0.1)  # the stream went on all along: these frames are 3 s later
    recorder.start(t_press)
    take = recorder.stop(t_press + 0.2)
    np.testing.assert_array_equal(decode(take.samples), np.arange(4800 - 1600, 4800 + 3200) % 997)


def test_a_recorder_for_another_microphone_closes_it_and_opens_its_own(sd):
    stream = EarlyStream(clock=sd.clock)
    stream.open(None)
    fallback = FakeBackend(clock=sd.clock)
    recorder = Recorder("Other Mic", backend=EarlyInputBackend(stream, fallback=fallback), clock=sd.clock)
    recorder.open()
    assert sd.streams[0].closed and len(fallback.streams) == 1
    assert recorder.device.name == "Other Mic"


def test_it_opens_the_microphone_as_the_recorder_would_first_try_it(sd):
    sd.refuse_rates = {SR}
    stream = EarlyStream(clock=sd.clock)
    stream.open(None)
    assert (stream.device.name, stream.rate, stream.channels) == ("Fake Mic", 48000, 1)
    recorder = Recorder(None, backend=EarlyInputBackend(stream), clock=sd.clock)
    recorder.open()  # 16 kHz refused for the Recorder too: it asks for 48 kHz mono and gets this stream
    assert len(sd.streams) == 1 and not sd.streams[0].closed and recorder.device_sample_rate == 48000


def test_what_is_held_is_bounded_and_frame_numbers_stay_true(sd, monkeypatch):
    monkeypatch.setattr(early_stream, "HOLD_SECONDS", 1.0)
    clock = sd.clock
    stream = EarlyStream(clock=clock)
    stream.open(None)
    raw = sd.streams[-1]
    frame = push_coded(raw, 0, 3.0)  # 2 s more than is held
    assert stream.dropped_frames == 2 * SR
    recorder = Recorder(None, pre_roll_s=0.0, post_roll_s=0.0, backend=EarlyInputBackend(stream), clock=clock)
    recorder.open()
    t_press = clock() - 0.5
    recorder.start(t_press)
    push_coded(raw, frame, 0.1)
    take = recorder.stop(t_press + 0.3)
    np.testing.assert_array_equal(decode(take.samples), np.arange(40000, 40000 + 4800) % 997)


def test_a_stream_that_ended_before_the_hand_over_is_reopened_at_the_press(sd):
    stream = EarlyStream(clock=sd.clock)
    stream.open(None)
    sd.streams[0].kwargs["finished_callback"]()  # the device went away
    fallback = FakeBackend(clock=sd.clock)
    recorder = Recorder(None, backend=EarlyInputBackend(stream, fallback=fallback), clock=sd.clock)
    recorder.open()
    assert recorder.error is not None  # lost: the next start reopens it
    recorder.start(sd.clock())
    assert len(fallback.streams) == 1
    recorder.cancel()
