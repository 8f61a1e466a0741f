"""Recorder behaviour over a fake sounddevice layer: the same Recorder code, blocks pushed by the test."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dictation.audio import capture
from dictation.audio.capture import LEVEL_FLOOR_DBFS, Recorder, meter_fraction
from dictation.audio.devices import AudioDeviceError, InputDevice
from tests.audio.fakes import FakeBackend, FakeClock, coded, decode

SR = 16_000
BLOCK = 320  # 20 ms


def make(**kwargs) -> tuple[Recorder, FakeBackend, FakeClock]:
    clock = FakeClock()
    backend_args = {k: kwargs.pop(k) for k in ("refuse_rates", "refuse_mono", "latency", "devices") if k in kwargs}
    backend = FakeBackend(clock=clock, **backend_args)
    kwargs.setdefault("post_roll_s", 0.0)
    recorder = Recorder(backend=backend, clock=clock, **kwargs)
    return recorder, backend, clock


def push_coded(backend: FakeBackend, start: int, seconds: float, rate: int = SR) -> int:
    """Push frame-numbered audio in 20 ms blocks; returns the next frame number."""
    n = round(seconds * rate)
    block = rate // 50
    for a in range(start, start + n, block):
        backend.stream.push(coded(a, min(block, start + n - a)))
    return start + n


def assert_frames(samples: np.ndarray, first: int, count: int) -> None:
    assert len(samples) == count
    np.testing.assert_array_equal(decode(samples), np.arange(first, first + count) % 997)


def test_pre_roll_keeps_audio_from_before_the_press():
    recorder, backend, clock = make(pre_roll_s=0.4)
    recorder.open()
    frame = push_coded(backend, 0, 1.0)
    recorder.start(clock())
    frame = push_coded(backend, frame, 0.5)
    take = recorder.stop()
    # 0.4 s before the press (frame 16000) up to the release (frame 24000), every frame in order
    assert_frames(take.samples, 16000 - 6400, 6400 + 8000)
    assert take.start_gap_s == pytest.approx(-0.4)
    assert take.device_name == "Fake Mic" and take.device_sample_rate == SR and take.sample_rate == SR
    assert take.duration_s == pytest.approx(0.9)
    assert take.error is None and not take.truncated and take.warnings == ()
    assert recorder.is_open and not recorder.is_recording


def test_late_start_still_begins_at_the_press_time_it_is_given():
    # The hotkey thread stamps the press; start() runs 0.3 s later (a busy GUI thread).
    recorder, backend, clock = make(pre_roll_s=0.3)
    recorder.open()
    frame = push_coded(backend, 0, 1.0)
    t_press = clock()
    frame = push_coded(backend, frame, 0.3)
    recorder.start(t_press)
    t_release = clock()
    frame = push_coded(backend, frame, 0.2)
    take = recorder.stop(t_release)
    assert_frames(take.samples, 16000 - 4800, 4800 + 4800)


def test_pre_roll_is_limited_to_what_the_stream_has_heard():
    recorder, backend, clock = make(pre_roll_s=0.4)
    recorder.open()
    push_coded(backend, 0, 0.1)
    recorder.start(clock())
    push_coded(backend, 1600, 0.2)
    take = recorder.stop()
    assert_frames(take.samples, 0, 1600 + 3200)
    assert take.start_gap_s == pytest.approx(-0.1)


def test_stop_waits_for_the_post_roll_after_the_release():
    recorder, backend, clock = make(pre_roll_s=0.0, post_roll_s=0.2)
    recorder.open()
    frame = push_coded(backend, 0, 0.5)
    recorder.start(clock())
    frame = push_coded(backend, frame, 0.5)
    t_release = clock()

    def feed() -> None:
        f = frame
        for _ in range(30):  # 0.6 s in 20 ms blocks, more than the tail needs
            time.sleep(0.002)
            f = push_coded(backend, f, 0.02)

    feeder = threading.Thread(target=feed)
    feeder.start()
    take = recorder.stop(t_release)
    feeder.join()
    assert_frames(take.samples, 8000, 8000 + 3200)  # exactly up to release + 200 ms
    assert take.error is None


def test_latency_shifts_the_press_onto_older_frames():
    # With 100 ms of input latency the newest frame was captured 100 ms before its callback.
    recorder, backend, clock = make(pre_roll_s=0.2, latency=0.1)
    recorder.open()
    frame = push_coded(backend, 0, 1.0)
    recorder.start(clock())
    push_coded(backend, frame, 0.5)
    take = recorder.stop(clock() - 0.1)  # released as the newest delivered frame was captured
    # The press maps to frame 17600 (not yet delivered at the press), the release to frame 24000.
    assert_frames(take.samples, 17600 - 3200, 24000 - 14400)


def test_level_follows_the_newest_block():
    recorder, backend, clock = make()
    assert recorder.level() == LEVEL_FLOOR_DBFS  # closed
    recorder.open()
    t = np.arange(BLOCK) / SR
    backend.stream.push(0.5 * np.sin(2 * np.pi * 1000 * t))
    assert recorder.level() == pytest.approx(20 * np.log10(0.5 / np.sqrt(2)), abs=0.1)
    assert meter_fraction(recorder.level()) == pytest.approx(1 - 9.03 / 60, abs=0.01)
    backend.stream.push(np.zeros(BLOCK))
    assert recorder.level() == LEVEL_FLOOR_DBFS
    assert meter_fraction(recorder.level()) == 0.0


@pytest.mark.parametrize(
    ("signal", "silent", "reason"),
    [
        ("zeros", True, "digital silence"),
        ("faint", True, "almost nothing"),
        ("room", False, None),
    ],
)
def test_silent_microphone_is_reported(signal, silent, reason):
    recorder, backend, clock = make()
    recorder.open()
    recorder.start(clock())
    rng = np.random.default_rng(0)
    amplitude = {"zeros": 0.0, "faint": 10 ** (-85 / 20), "room": 10 ** (-60 / 20)}[signal]
    for _ in range(50):
        backend.stream.push(amplitude * rng.standard_normal(BLOCK))
    take = recorder.stop()
    assert take.silent is silent
    if reason:
        assert reason in take.silence_reason and "Fake Mic" in take.silence_reason
    else:
        assert take.silence_reason is None


def test_device_lost_mid_take_returns_what_was_captured():
    recorder, backend, clock = make(pre_roll_s=0.2)
    recorder.open()
    frame = push_coded(backend, 0, 0.5)
    recorder.start(clock())
    push_coded(backend, frame, 0.3)
    backend.stream.lose_device()
    assert recorder.error is not None  # the app can poll this and end the take early
    assert recorder.level() == LEVEL_FLOOR_DBFS
    started = time.monotonic()
    take = recorder.stop(clock() + 5.0)  # the release comes long after the loss: no waiting for it
    assert time.monotonic() - started < 0.5
    assert_frames(take.samples, 8000 - 3200, 3200 + 4800)
    assert "stopped during the recording" in take.error and "Fake Mic" in take.error
    assert backend.streams[0].closed
    # The next take reopens the device.
    recorder.start(clock())
    assert len(backend.streams) == 2
    push_coded(backend, 0, 0.1)
    assert recorder.stop().error is None


def test_a_stream_that_stops_delivering_ends_the_take_with_an_error(monkeypatch):
    monkeypatch.setattr(capture, "STALL_SECONDS", 0.2)
    recorder, backend, clock = make(pre_roll_s=0.0, post_roll_s=0.1)
    recorder.open()
    recorder.start(clock())
    push_coded(backend, 0, 0.3)
    assert recorder.error is None
    clock.advance(1.5)  # the device goes quiet without the stream ending
    assert "no audio from the microphone for 1.5 s" in recorder.error
    take = recorder.stop(clock() - 1.5)  # the tail never arrives
    assert_frames(take.samples, 0, 4800)
    assert "stopped delivering audio" in take.error
    assert not recorder.is_open and backend.streams[0].closed


def test_a_warm_stream_that_went_quiet_is_reopened_at_the_press():
    recorder, backend, clock = make()
    recorder.open()
    push_coded(backend, 0, 0.5)
    clock.advance(3.0)  # the driver stopped calling back without reporting anything
    recorder.start(clock())
    assert len(backend.streams) == 2 and backend.streams[0].closed
    push_coded(backend, 0, 0.2)
    take = recorder.stop()
    assert_frames(take.samples, 0, 3200)
    assert take.error is None


def test_maximum_length_drops_later_audio_and_says_so():
    recorder, backend, clock = make(pre_roll_s=0.0, post_roll_s=0.5, max_seconds=0.5)
    recorder.open()
    recorder.start(clock())
    push_coded(backend, 0, 0.8)
    assert recorder.limit_reached
    assert recorder.elapsed_s() == pytest.approx(0.5)
    take = recorder.stop()  # does not wait for a post-roll that can never be stored
    assert_frames(take.samples, 0, 8000)
    assert take.truncated
    assert any("maximum length" in w for w in take.warnings)


def test_device_refusing_16k_is_opened_at_its_own_rate_and_resampled():
    recorder, backend, clock = make(refuse_rates=(16_000,), pre_roll_s=0.1)
    recorder.open()
    assert recorder.device_sample_rate == 48_000
    rate = 48_000
    t = np.arange(rate * 2) / rate
    tone = (0.5 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)
    for a in range(0, rate, 960):
        backend.stream.push(tone[a : a + 960])
    recorder.start(clock())
    for a in range(rate, 2 * rate, 960):
        backend.stream.push(tone[a : a + 960])
    take = recorder.stop()
    assert take.device_sample_rate == 48_000 and take.sample_rate == SR
    assert len(take.samples) == round(1.1 * SR)
    spectrum = np.abs(np.fft.rfft(take.samples * np.hanning(len(take.samples))))
    assert np.argmax(spectrum) * SR / len(take.samples) == pytest.approx(1000, abs=2)
    reference = 0.5 * np.sin(2 * np.pi * 1000 * (np.arange(len(take.samples)) / SR + 0.9))
    np.testing.assert_allclose(take.samples[200:-200], reference[200:-200], atol=2e-3)
    assert take.rms_dbfs == pytest.approx(20 * np.log10(0.5 / np.sqrt(2)), abs=0.1)


def test_device_refusing_mono_is_opened_in_stereo_and_downmixed():
    recorder, backend, clock = make(refuse_mono=True)
    recorder.open()
    assert backend.stream.channels == 2
    recorder.start(clock())
    block = np.zeros((BLOCK, 2), dtype=np.float32)
    block[:, 0] = 0.4  # signal on the left channel only
    for _ in range(10):
        backend.stream.push(block)
    take = recorder.stop()
    np.testing.assert_allclose(take.samples, 0.2)


def test_start_and_stop_are_safe_against_a_running_callback():
    """Many takes while another thread pushes audio as fast as it can: every take is gap-free."""
    recorder, backend, clock = make(pre_roll_s=0.05)
    recorder.open()
    running = True

    def feed() -> None:
        f = 0
        while running:
            f = push_coded(backend, f, 0.02)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        lengths = []
        for _ in range(200):
            recorder.start()
            time.sleep(0.0005)
            take = recorder.stop()
            lengths.append(len(take.samples))
            steps = np.diff(decode(take.samples)) % 997
            assert np.all(steps == 1), "a take lost or repeated frames"
    finally:
        running = False
        feeder.join()
    assert max(lengths) > 0


def test_cold_start_reports_the_audio_missed_after_the_press():
    recorder, backend, clock = make(pre_roll_s=0.4)
    t_press = clock()
    recorder.start(t_press)  # opens the stream now: nothing from before the press exists
    clock.advance(0.15)  # the device takes 150 ms to deliver its first block
    push_coded(backend, 0, 0.5)
    take = recorder.stop()
    assert_frames(take.samples, 0, 8000)
    assert take.start_gap_s == pytest.approx(0.15)


def test_keep_open_false_opens_per_take_and_releases_the_device():
    recorder, backend, clock = make(keep_open=False)
    for n in (1, 2):
        recorder.start(clock())
        push_coded(backend, 0, 0.1)
        recorder.stop()
        assert len(backend.streams) == n and backend.stream.closed
        assert not recorder.is_open


def test_missing_named_device_falls_back_to_the_default_with_a_warning():
    devices = [InputDevice(3, "Built-in Mic", 48000, 2, True), InputDevice(5, "Other", 44100, 1, False)]
    recorder, backend, clock = make(devices=devices, device="USB Headset")
    recorder.start(clock())
    push_coded(backend, 0, 0.1)
    take = recorder.stop()
    assert take.device_name == "Built-in Mic"
    assert any("USB Headset" in w and "Built-in Mic" in w for w in take.warnings)

    strict, _, _ = make(devices=devices, device="USB Headset", fallback_to_default=False)
    with pytest.raises(AudioDeviceError, match="no microphone named 'USB Headset'"):
        strict.open()


def test_device_chosen_by_name_or_index():
    devices = [InputDevice(3, "Built-in Mic", 48000, 2, True), InputDevice(5, "USB Headset Mic", 44100, 1, False)]
    for spec in ("usb headset", 5, "5"):
        recorder, backend, _ = make(devices=devices, device=spec)
        recorder.open()
        assert recorder.device.name == "USB Headset Mic"


def test_open_failure_rescans_once_then_raises_one_line():
    recorder, backend, clock = make()
    backend.fail_open = True
    with pytest.raises(AudioDeviceError, match="Device unavailable"):
        recorder.start(clock())
    assert backend.rescans == 1
    assert not recorder.is_recording
    backend.fail_open = False
    recorder.start(clock())
    assert recorder.is_recording


def test_cancel_and_misuse():
    recorder, backend, clock = make()
    with pytest.raises(RuntimeError, match="not recording"):
        recorder.stop()
    recorder.start(clock())
    with pytest.raises(RuntimeError, match="already recording"):
        recorder.start(clock())
    push_coded(backend, 0, 0.1)
    recorder.cancel()
    assert not recorder.is_recording and recorder.elapsed_s() == 0.0
    recorder.cancel()  # no-op
    recorder.start(clock())
    push_coded(backend, 1600, 0.1)
    assert len(recorder.stop().samples) > 0
    recorder.close()
    assert backend.stream.closed and not recorder.is_open


def test_callback_errors_and_overflows_never_escape():
    recorder, backend, clock = make()
    recorder.open()
    recorder.start(clock())
    push_coded(backend, 0, 0.1)
    backend.stream.push(coded(1600, BLOCK), status=1)  # PortAudio flagged an input overflow
    backend.stream.callback(None, BLOCK, None, 0)  # garbage from the audio layer: must not raise
    assert recorder.error is not None and "callback failed" in recorder.error
    take = recorder.stop()
    assert take.error is not None
    assert any("overflow" in w for w in take.warnings)
    assert len(take.samples) == 1600 + BLOCK


def test_overflow_warnings_belong_to_the_take_they_happened_in():
    recorder, backend, clock = make()
    recorder.open()
    backend.stream.push(coded(0, BLOCK), status=1)  # before any take
    recorder.start(clock())
    backend.stream.push(coded(BLOCK, BLOCK))
    assert recorder.stop().warnings == ()
    recorder.start(clock())
    backend.stream.push(coded(2 * BLOCK, BLOCK), status=1)
    backend.stream.push(coded(3 * BLOCK, BLOCK), status=1)
    assert recorder.stop().warnings == ("2 audio blocks were flagged by the audio system (input overflow)",)


def test_take_of_a_device_that_never_delivered_is_empty_and_silent():
    recorder, backend, clock = make()
    recorder.start(clock())
    backend.stream.lose_device()
    take = recorder.stop()
    assert len(take.samples) == 0 and take.silent and take.error is not None
    assert take.start_gap_s is None


def test_take_samples_read_during_the_take_are_exactly_the_takes_samples():
    """Read in odd steps while the take grows (across the 1 s tape chunks, pre-roll included): the
    pieces join up to the final take's samples bit for bit, and nothing is read twice or skipped."""
    recorder, backend, clock = make(pre_roll_s=0.4)
    recorder.open()
    rng = np.random.default_rng(3)
    noise = (rng.standard_normal(SR * 4) * 0.2).astype(np.float32)
    for a in range(0, SR, BLOCK):
        backend.stream.push(noise[a : a + BLOCK])
    assert len(recorder.take_samples(0)) == 0  # not recording
    recorder.start(clock())
    pieces, read = [], 0
    for a in range(SR, 3 * SR, BLOCK):
        backend.stream.push(noise[a : a + BLOCK])
        if a % 4480 == 0:  # every 0.28 s, not a multiple of the chunk size
            piece = recorder.take_samples(read)
            pieces.append(piece)
            read += len(piece)
    pieces.append(recorder.take_samples(read))
    read += len(pieces[-1])
    assert len(pieces) > 5 and read == 2 * SR + 6400  # past the first tape chunks
    assert len(recorder.take_samples(read)) == 0  # nothing new arrived
    assert len(recorder.take_samples(read + 100)) == 0  # past the end
    np.testing.assert_array_equal(recorder.take_samples(100), np.concatenate(pieces)[100:])
    take = recorder.stop()
    assert recorder.device_sample_rate == SR
    np.testing.assert_array_equal(np.concatenate(pieces), take.samples[:read])
    np.testing.assert_array_equal(take.samples, noise[SR - 6400 : 3 * SR])
    assert len(recorder.take_samples(0)) == 0  # the take is over


def test_take_samples_may_run_past_the_release_and_the_take_is_their_prefix():
    """Audio that arrives after the release (beyond the post-roll) can be read before stop() cuts it
    off; the take is then shorter than what was read, and equal to its start."""
    recorder, backend, clock = make(pre_roll_s=0.0, post_roll_s=0.1)
    recorder.open()
    push_coded(backend, 0, 0.2)
    recorder.start(clock())
    frame = push_coded(backend, 3200, 1.0)
    t_release = clock()
    push_coded(backend, frame, 0.5)  # 0.5 s more before stop() runs
    early = recorder.take_samples(0)
    take = recorder.stop(t_release)
    assert_frames(take.samples, 3200, 16000 + 1600)  # up to the release + 100 ms
    assert len(early) == 24000
    np.testing.assert_array_equal(early[: len(take.samples)], take.samples)


# --- how far a take reaches back, known as it starts --------------------------------------------------


def test_start_gap_of_a_warm_stream_is_the_pre_roll():
    recorder, backend, clock = make(pre_roll_s=0.4)
    assert recorder.start_gap() is None  # not recording
    recorder.open()
    frame = push_coded(backend, 0, 1.0)
    recorder.start(clock())
    assert recorder.start_gap() == pytest.approx(-0.4)
    push_coded(backend, frame, 0.2)
    assert recorder.stop().start_gap_s == pytest.approx(-0.4)


def test_start_gap_of_a_press_before_the_stream_opened_is_the_audio_missed():
    # A press stamped 0.3 s ago (while the app started), the microphone opened only now.
    recorder, backend, clock = make(pre_roll_s=0.4)
    t_press = clock() - 0.3
    recorder.open()
    frame = push_coded(backend, 0, 0.1)
    recorder.start(t_press)
    gap = recorder.start_gap()
    push_coded(backend, frame, 0.2)
    take = recorder.stop()
    assert gap == pytest.approx(0.3) and take.start_gap_s == pytest.approx(0.3)
    assert_frames(take.samples, 0, 4800)  # from the open on: all there is


def test_start_gap_of_a_press_older_than_the_ring_is_the_audio_missed():
    recorder, backend, clock = make(pre_roll_s=0.4)
    recorder.open()
    t_press = clock()
    ring = round((0.4 + capture.RING_EXTRA_SECONDS) * SR)
    frame = push_coded(backend, 0, capture.RING_EXTRA_SECONDS + 1.0)  # the GUI thread was stuck that long
    recorder.start(t_press)
    assert recorder.start_gap() == pytest.approx(capture.RING_EXTRA_SECONDS + 1.0 - (0.4 + capture.RING_EXTRA_SECONDS))
    push_coded(backend, frame, 0.1)
    assert len(recorder.stop().samples) == ring + 1600


def test_a_start_handled_seconds_after_its_press_still_gets_the_whole_pre_roll():
    # A press during start-up is handled once the event loop runs, seconds later.
    recorder, backend, clock = make(pre_roll_s=0.4)
    recorder.open()
    frame = push_coded(backend, 0, 1.0)
    t_press = clock()
    frame = push_coded(backend, frame, 3.0)
    recorder.start(t_press)
    assert recorder.start_gap() == pytest.approx(-0.4)
    push_coded(backend, frame, 0.1)
    assert_frames(recorder.stop().samples, 16000 - 6400, 6400 + 3.1 * SR)


def test_start_gap_waits_for_the_first_block_of_a_stream_opened_at_the_press():
    recorder, backend, clock = make(pre_roll_s=0.4)
    t_press = clock()
    recorder.start(t_press)  # opens the stream: it has delivered nothing yet

    def first_block_later() -> None:
        time.sleep(0.1)
        clock.advance(0.15)  # the device takes 150 ms to deliver its first block
        push_coded(backend, 0, 0.02)

    feeder = threading.Thread(target=first_block_later)
    feeder.start()
    gap = recorder.start_gap(timeout=5.0)
    feeder.join()
    assert gap == pytest.approx(0.15)
    assert recorder.stop().start_gap_s == pytest.approx(0.15)


def test_start_gap_is_none_when_the_first_block_does_not_come_in_time():
    recorder, backend, clock = make(pre_roll_s=0.4)
    recorder.start(clock())
    t0 = time.monotonic()
    assert recorder.start_gap(timeout=0.1) is None
    assert 0.1 <= time.monotonic() - t0 < 2.0
    recorder.cancel()


# --- blocks delivered late: the callback thread waits for the GIL while the app imports
# Qt and torch, so a block can arrive long after it was captured. Where a press lands in the stream
# and how much after it is missing follow the stream's own clock, not the newest block's arrival.


def push_late(backend: FakeBackend, clock: FakeClock, start: int, seconds: float, late: float) -> int:
    """Frame-numbered audio captured over ``seconds`` but delivered ``late`` seconds after that."""
    clock.advance(late)
    frame = push_coded(backend, start, seconds)
    clock.advance(-late)
    return frame


def test_a_press_lands_on_its_own_frame_although_the_newest_blocks_came_late():
    recorder, backend, clock = make(pre_roll_s=0.4)
    recorder.open()
    frame = push_coded(backend, 0, 1.0)
    t_press = clock() + 0.1  # pressed 100 ms into audio that reaches us only 0.6 s late
    clock.advance(0.6)
    frame = push_coded(backend, frame, 0.2)  # frames 1.0-1.2 s, each arriving 0.6 s after its capture
    recorder.start(t_press)
    assert recorder.start_gap() == pytest.approx(-0.4)
    push_coded(backend, frame, 0.3)
    take = recorder.stop(t_press + 0.3)
    assert_frames(take.samples, 17600 - 6400, 6400 + 4800)  # the press is frame 1.1 s, not 0.5 s


def test_a_press_after_the_stream_opened_loses_nothing_although_its_blocks_came_late():
    # The stream opened 0.1 s before the press; the block the press is in came 0.9 s late. Nothing
    # said after the press is missing, so nothing may be reported missing (was "800 ms lost").
    recorder, backend, clock = make(pre_roll_s=0.4)
    recorder.open()
    frame = push_coded(backend, 0, 0.2)
    t_press = clock() - 0.1
    frame = push_late(backend, clock, frame, 0.02, late=0.9)
    recorder.start(t_press)
    assert recorder.start_gap() == pytest.approx(-0.1)
    push_coded(backend, frame, 0.2)
    take = recorder.stop(t_press + 0.3)
    assert take.start_gap_s == pytest.approx(-0.1)
    assert_frames(take.samples, 0, 6400)


def test_an_overflow_starts_the_stream_clock_again():
    # Audio dropped in an overflow: frames counted after it are later than their count says.
    recorder, backend, clock = make(pre_roll_s=0.0)
    recorder.open()
    frame = push_coded(backend, 0, 1.0)
    clock.advance(0.5)  # 0.5 s of audio lost by the audio system
    backend.stream.push(coded(frame, 320), status=1)
    frame = push_coded(backend, frame + 320, 0.5)
    t_press = clock() - 0.2
    recorder.start(t_press)
    push_coded(backend, frame, 0.3)
    take = recorder.stop(t_press + 0.1)
    assert_frames(take.samples, frame - 3200, 1600)
