"""The start cue, heard by the microphone, is kept out of the take.

The cue here is always the real packaged start.wav. It is mixed into takes where it would have been
heard (late or early against the time the player reported, as audio latencies are only estimates,
with a room reflection), then: on arrays (`CueEraser`), through the Recorder over the fake audio
layer while the take is read as it grows (streaming), and through the real sound system: the
SoundPlayer plays into the virtual PulseAudio sink whose monitor is the microphone.
"""

from __future__ import annotations

import subprocess
import time

import numpy as np
import pytest

from dictation import resources
from dictation.audio import cue_echo
from dictation.audio.capture import Recorder
from dictation.audio.cue_echo import CueEraser, locate_cue
from dictation.audio.resample import resample
from dictation.audio.sounds import SoundPlayer
from dictation.audio.trim import find_speech
from dictation.audio.wav import load_audio_16k, read_wav
from tests.audio.fakes import FakeBackend, FakeClock
from tests.waiting import wait_until

SR = 16_000
rng = np.random.default_rng(20)


def start_cue(volume: float = 0.5) -> np.ndarray:
    """The start cue as the player plays it at ``volume`` (gain = volume²), at 16 kHz."""
    samples, rate = read_wav(resources.sound_path("start"))
    return (resample(samples, rate, SR) * volume**2).astype(np.float32)


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> np.ndarray:
    """A real utterance (espeak-ng), 16 kHz, about -20 dBFS RMS while speaking."""
    path = tmp_path_factory.mktemp("speech") / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(path), "Please send the report today."], check=True, timeout=30)
    x = load_audio_16k(path)
    active = np.flatnonzero(np.abs(x) > 0.01)
    x = x[active[0] : active[-1] + 1]
    return (x * 0.1 / np.sqrt(np.mean(x**2))).astype(np.float32)


class ArrayTape:
    """The tape face CueEraser works on, over one array."""

    def __init__(self, samples: np.ndarray):
        self.samples = np.array(samples, dtype=np.float32)
        self.frames = len(self.samples)

    def read(self, start: int) -> np.ndarray:
        return self.samples[max(0, start) :].copy()

    def apply_gain(self, start: int, gains: np.ndarray) -> None:
        self.samples[start : start + len(gains)] *= gains[: max(0, self.frames - start)]

    def add(self, start: int, values: np.ndarray) -> None:
        self.samples[start : start + len(values)] += values[: max(0, self.frames - start)]


def room(seconds: float, level_dbfs: float = -62.0, gen: np.random.Generator | None = None) -> np.ndarray:
    return (10 ** (level_dbfs / 20) * (gen or rng).standard_normal(round(seconds * SR))).astype(np.float32)


def leak(take: np.ndarray, cue: np.ndarray, at: int, gain: float = 0.6) -> None:
    """The cue through a speaker into the microphone: direct sound plus a reflection 20 ms later."""
    take[at : at + len(cue)] += gain * cue
    d = round(0.02 * SR)
    take[at + d : at + d + len(cue)] += 0.3 * gain * cue


def cue_energy(x: np.ndarray, cue: np.ndarray, lo: int = 0, hi: int | None = None) -> float:
    """Energy of the best least-squares fit of the cue starting at a sample in [lo, hi] of x (a
    matched filter; limited to where the cue was, since voiced speech correlates with a chime too)."""
    hi = len(x) - len(cue) if hi is None else min(hi, len(x) - len(cue))
    x = x[max(0, lo) : hi + len(cue)].astype(np.float64)
    corr = np.correlate(x, cue.astype(np.float64), mode="valid")
    return float(np.max(corr**2) / np.dot(cue, cue)) if len(corr) else 0.0


@pytest.mark.parametrize("error_s", [-0.15, 0.0, 0.3], ids=["heard-early", "on-time", "heard-late"])
def test_a_heard_start_cue_is_muted_and_the_speech_after_it_kept(speech, error_s):
    cue = start_cue()
    expected = round(0.45 * SR)  # the reported start, 50 ms after the press (the take has 0.4 s pre-roll)
    actual = expected + round(error_s * SR)  # latencies are estimates: heard earlier or later than that
    onset = actual + len(cue) + round(cue_echo.ECHO_TAIL_S * SR) + round(0.02 * SR)  # the user speaks after it
    take = room(onset / SR + len(speech) / SR + 0.5)
    leak(take, cue, actual)
    take[onset : onset + len(speech)] += speech
    before = take.copy()

    tape = ArrayTape(take)
    eraser = CueEraser(SR)
    eraser.add(expected, cue)
    assert eraser.settle(tape, final=True) is None
    after = tape.samples

    [(start, end)] = eraser.muted
    assert start <= actual and end >= actual + len(cue) + round(0.02 * SR)  # direct sound and reflection
    assert end <= onset
    np.testing.assert_array_equal(after[onset:], before[onset:])  # the speech, sample for sample
    # What the engine would get: the trimmed take holds the whole utterance and no cue energy.
    span = find_speech(after)
    assert span.has_speech and span.start <= onset and span.end >= onset + len(speech)
    to_engine = after[span.start : span.end]
    near = (actual - span.start - 800, actual - span.start + 800)  # the direct sound and the reflection
    heard = cue_energy(before, cue, actual - 800, actual + 800)
    assert heard > 0.1 * float(np.dot(cue, cue))
    assert cue_energy(to_engine, cue, *near) < 1e-6 * heard
    assert np.all(after[actual : actual + len(cue)] == 0)


def test_speech_that_begins_in_the_cues_echo_tail_is_kept_whole(speech):
    """The user starts talking 40 ms after the chime ended, before the echo tail is over: the cue and
    its reflection are muted, the voice is kept sample for sample (it was cut by 60 ms before)."""
    cue = start_cue()
    expected = round(0.45 * SR)
    onset = expected + len(cue) + round(0.04 * SR)
    take = room(onset / SR + len(speech) / SR + 0.5, gen=np.random.default_rng(7))
    leak(take, cue, expected)
    take[onset : onset + len(speech)] += speech
    before = take.copy()

    tape = ArrayTape(take)
    eraser = CueEraser(SR)
    eraser.add(expected, cue)
    eraser.settle(tape, final=True)
    after = tape.samples

    [(start, end)] = eraser.muted
    assert start <= expected and expected + len(cue) <= end <= onset
    np.testing.assert_array_equal(after[onset:], before[onset:])
    assert np.all(after[expected : expected + len(cue) + round(0.02 * SR)] == 0)  # direct sound and reflection


def test_the_cues_reverberation_is_muted_for_the_whole_echo_tail():
    """A room's reverberation after the chime only decays (here 60 dB in 0.4 s, from just under the
    cue's end): it is muted to ECHO_TAIL_S, not taken for the voice's onset."""
    cue = start_cue()
    expected = round(0.45 * SR)
    gen = np.random.default_rng(8)
    take = room(1.5, gen=gen)
    leak(take, cue, expected)
    end = expected + len(cue)
    t = np.arange(round(0.3 * SR)) / SR
    level = np.sqrt(np.mean(take[end - 800 : end] ** 2))
    take[end : end + len(t)] += (level * 10 ** (-60 * t / 0.4 / 20) * gen.standard_normal(len(t))).astype(np.float32)

    tape = ArrayTape(take)
    eraser = CueEraser(SR)
    eraser.add(expected, cue)
    eraser.settle(tape, final=True)
    [(_, muted_to)] = eraser.muted
    assert muted_to >= end + round(cue_echo.ECHO_TAIL_S * SR)
    assert cue_echo.echo_tail_end(take, end, SR) == end + round(cue_echo.ECHO_TAIL_S * SR)


def test_a_cue_talked_over_is_subtracted_and_the_first_word_kept(speech):
    """People start talking as they press: the cue sounds over their first word. Muting it would cut
    the word, so the cue as heard is estimated and subtracted; the voice stays."""
    cue = start_cue()
    expected = round(0.45 * SR)
    actual = expected + round(0.08 * SR)
    onset = round(0.35 * SR)  # speaking from just before the press on
    take = room(onset / SR + len(speech) / SR + 0.5)
    take[onset : onset + len(speech)] += speech
    voice = take.copy()
    leak(take, cue, actual, gain=1.0)  # about as loud as the voice there
    near = (actual - 800, actual + 800)
    heard = cue_energy(take, cue, *near)

    tape = ArrayTape(take)
    eraser = CueEraser(SR)
    eraser.add(expected, cue)
    eraser.settle(tape, final=True)
    after = tape.samples
    assert eraser.muted == [] and len(eraser.subtracted) == 1
    a, b = eraser.subtracted[0]
    assert a <= actual and b >= actual + len(cue) + round(0.02 * SR)  # the reflection is in the estimate
    np.testing.assert_array_equal(after[:a], take[:a])  # untouched around it
    np.testing.assert_array_equal(after[b:], take[b:])
    assert cue_energy(after, cue, *near) < 0.01 * heard  # at least 20 dB of the cue gone
    span = slice(actual, actual + len(cue))
    left = after[span] - voice[span]  # what is not the voice, where the cue was
    assert np.sum(left.astype(np.float64) ** 2) < 0.05 * np.sum((take[span] - voice[span]).astype(np.float64) ** 2)
    assert np.corrcoef(after[span], voice[span])[0, 1] > 0.97  # the first word is still there


def test_a_take_of_only_the_cue_has_no_speech_left():
    """The user pressed and said nothing: before, the chime was 'speech' and the model wrote words."""
    cue = start_cue()
    take = room(1.5)
    leak(take, cue, round(0.5 * SR))
    assert find_speech(take).has_speech  # what reached the model before
    tape = ArrayTape(take)
    eraser = CueEraser(SR)
    eraser.add(round(0.45 * SR), cue)
    eraser.settle(tape, final=True)
    assert not find_speech(tape.samples).has_speech


def test_nothing_is_muted_where_the_cue_was_not_heard(speech):
    """Headphones: the cue was reported, the user talks right at the press; not a sample changes."""
    take = room(0.4 + len(speech) / SR + 0.5)
    take[round(0.4 * SR) : round(0.4 * SR) + len(speech)] += speech
    tape = ArrayTape(take)
    eraser = CueEraser(SR)
    eraser.add(round(0.45 * SR), start_cue())
    eraser.settle(tape, final=True)
    assert eraser.muted == []
    np.testing.assert_array_equal(tape.samples, take)
    # a faint leak, below what the trim could ever count as speech, is left alone too
    quiet = room(1.5, -90)
    leak(quiet, start_cue(), round(0.5 * SR), gain=0.0004)  # its loudest 20 ms about -70 dBFS
    tape = ArrayTape(quiet)
    eraser = CueEraser(SR)
    eraser.add(round(0.45 * SR), start_cue())
    eraser.settle(tape, final=True)
    assert eraser.muted == [] and not find_speech(quiet).has_speech


def test_a_cue_played_with_a_glitch_is_muted_in_both_pieces():
    """An output underrun put 70 ms of silence into the cue: it reaches the take in two pieces."""
    cue = start_cue()
    split = round(0.04 * SR)
    heard = np.concatenate([cue[:split], np.zeros(round(0.07 * SR), np.float32), cue[split:]])
    take = room(1.5)
    at = round(0.5 * SR)
    take[at : at + len(heard)] += 0.6 * heard
    tape = ArrayTape(take)
    eraser = CueEraser(SR)
    eraser.add(round(0.45 * SR), cue)
    eraser.settle(tape, final=True)
    assert np.all(tape.samples[at : at + len(heard)] == 0)
    assert not find_speech(tape.samples).has_speech


def test_the_toeplitz_solver_agrees_with_a_dense_solve():
    from dictation.audio.cue_echo import solve_toeplitz

    cue = start_cue().astype(np.float64)
    column = np.correlate(cue, cue, "full")[len(cue) - 1 :][:300]
    column[0] *= 1.001
    rhs = np.random.default_rng(3).standard_normal(300)
    dense = column[np.abs(np.arange(300)[:, None] - np.arange(300)[None, :])]
    np.testing.assert_allclose(solve_toeplitz(column, rhs), np.linalg.solve(dense, rhs), rtol=1e-6, atol=1e-9)


def test_a_cue_cut_off_by_the_end_of_the_take_is_found_from_its_start():
    cue = start_cue()
    take = room(1.0)
    at = len(take) - len(cue) // 2  # the stop cue, half of it inside the post-roll
    take[at:] += 0.6 * cue[: len(take) - at]
    match = locate_cue(take, cue, at - 2000, at + 2000, SR)
    assert match is not None and match.start == at and match.fit > 0.9


# --- the Recorder: read while it grows, and at the end ----------------------------------------------


def test_the_recorder_mutes_the_cue_in_what_it_hands_out_while_recording_and_at_the_end(speech):
    clock = FakeClock()
    backend = FakeBackend(clock=clock, devices=None)
    backend.devices[0] = backend.devices[0].__class__(0, "Fake Mic", SR, 1, True, "Fake API")
    recorder = Recorder(backend=backend, clock=clock, pre_roll_s=0.4, post_roll_s=0.0)
    recorder.open()
    cue = start_cue()
    signal = room(4.0)
    t_press_frame = round(1.0 * SR)
    heard = t_press_frame + round(0.12 * SR)  # heard 70 ms after the reported 50 ms
    leak(signal, cue, heard)
    onset = heard + len(cue) + round(0.2 * SR)
    signal[onset : onset + len(speech)] += speech
    block = SR // 50
    pushed = 0

    def push_until(frame: int) -> None:
        nonlocal pushed
        while pushed < frame:
            backend.stream.push(signal[pushed : pushed + block])
            pushed += block

    push_until(t_press_frame)
    recorder.start(clock())
    recorder.mark_cue(clock() + 0.05, cue, SR)  # what the player reports
    first = t_press_frame - round(0.4 * SR)  # the take's frame 0
    read = []
    while pushed < onset + len(speech) + SR // 4:
        push_until(pushed + SR // 4)
        read.append(recorder.take_samples(sum(map(len, read))))
    # streaming never got a sample of the cue's search window before the cue was dealt with
    streamed = np.concatenate(read)
    assert len(streamed) > onset + len(speech) - first
    take = recorder.stop()
    np.testing.assert_array_equal(take.samples[: len(streamed)], streamed)  # the final take agrees
    assert np.all(take.samples[heard - first : heard - first + len(cue)] == 0)
    np.testing.assert_array_equal(take.samples[onset - first :], signal[onset : first + len(take.samples)])
    near = (heard - first - 800, heard - first + 800)
    assert cue_energy(take.samples, cue, *near) < 1e-6 * cue_energy(signal[first:], cue, *near)
    recorder.mark_cue(clock(), cue, SR)  # after the take: ignored, nothing raises
    recorder.close()


# --- the real sound system: the player into the virtual sink, its monitor is the microphone ---------


def test_the_real_start_cue_through_the_sound_system_is_kept_out_of_the_take(virtual_mic, speech, tmp_path):
    from dictation.audio.wav import write_wav

    wav = tmp_path / "speech.wav"
    write_wav(wav, speech, SR)
    recorder = Recorder(None, pre_roll_s=0.4, post_roll_s=0.2)
    player = SoundPlayer(volume=60)
    reported = []

    def on_cue(kind, t, samples, rate):
        reported.append((kind, t, resample(samples, rate, SR)))
        recorder.mark_cue(t, samples, rate)

    player.on_cue = on_cue
    takes = []
    try:
        recorder.open()
        wait_until(lambda: recorder.frames_delivered > 0.6 * SR, 10, "the microphone stream to deliver 0.6 s")
        for case in ("silent", "speaking"):
            recorder.start(time.monotonic())
            player.play("start")  # as the app does once the microphone is live
            assert player.drain(5)
            if case == "speaking":
                time.sleep(0.3)  # drain() returns when the last block is handed over, not heard
                virtual_mic.play(wav).wait(20)  # the user speaks after the cue
            time.sleep(0.4)
            takes.append(recorder.stop(time.monotonic()).samples)
    finally:
        player.close()
        recorder.close()

    assert [kind for kind, _, _ in reported] == ["start", "start"]
    cue = reported[0][2]
    silent, speaking = takes
    # The monitor copies the sink digitally, so the whole cue was heard; nothing of it is left,
    # and a take with only the cue holds no speech.
    assert float(np.max(np.abs(silent))) == 0.0  # the monitor is digital: nothing but the cue was there
    assert not find_speech(silent).has_speech
    # The speech after it is all there, sample for sample, however soon after the cue it began (on
    # a loaded machine the sound server can deliver it within the cue's echo tail).
    exact, corr, at, to_engine = _speech_kept_exactly(speaking, speech)
    assert exact, f"the speech after the cue was changed or cut (correlation {corr:.4f})"
    assert cue_energy(to_engine, cue, 0, at - len(cue)) < 1e-6 * float(np.dot(cue, cue))  # before the speech


def _speech_kept_exactly(take: np.ndarray, speech: np.ndarray) -> tuple[bool, float, int, np.ndarray]:
    """Find the played speech in the take by correlation and compare it sample for sample (16-bit WAV):
    (kept exactly, correlation coefficient, where it starts in the trimmed take, the trimmed take)."""
    span = find_speech(take)
    to_engine = take[span.start : span.end].astype(np.float64)
    ref = np.round(speech.astype(np.float64) * 32767) / 32767
    if not span.has_speech or len(to_engine) < len(ref):
        return False, 0.0, 0, to_engine  # the speech was cut by the trim
    corr = np.correlate(to_engine, ref, mode="valid")
    at = int(np.argmax(corr))
    coefficient = float(np.corrcoef(to_engine[at : at + len(ref)], ref)[0, 1])
    return coefficient > 0.999, coefficient, at, to_engine


def test_the_player_reports_each_cue_once_with_what_it_played():
    class Output:
        def output_rate(self, preferred):
            return 48_000

        def play(self, samples, sample_rate, *, on_start=None):
            on_start(123.5)

    player = SoundPlayer(volume=50, backend=Output())
    heard = []
    player.on_cue = lambda kind, t, samples, rate: heard.append((kind, t, len(samples), rate, float(np.max(samples))))
    try:
        player.play("start")
        assert player.drain(5)
    finally:
        player.close()
    samples, rate = read_wav(resources.sound_path("start"))
    [(kind, t, n, out_rate, peak)] = heard
    assert (kind, t, out_rate) == ("start", 123.5, 48_000)
    assert n == len(resample(samples, rate, 48_000))
    assert peak == pytest.approx(float(np.max(resample(samples, rate, 48_000))) * 0.25, rel=1e-5)
