"""Speech detection and trimming on synthetic speech-like signals."""

from __future__ import annotations

import numpy as np
import pytest

from dictation.audio.trim import find_speech, has_speech, transcribed_part, trim_silence

SR = 16_000
rng = np.random.default_rng(1234)


def db(level_dbfs: float) -> float:
    return 10 ** (level_dbfs / 20)


def noise(seconds: float, level_dbfs: float) -> np.ndarray:
    """White noise with the given RMS."""
    return db(level_dbfs) * rng.standard_normal(round(seconds * SR))


def fricative(seconds: float, level_dbfs: float) -> np.ndarray:
    """An "s"-like hiss: high-passed noise (first difference), scaled to the given RMS."""
    x = np.diff(rng.standard_normal(round(seconds * SR) + 1))
    return x / np.sqrt(np.mean(x**2)) * db(level_dbfs)


def vowel(seconds: float, level_dbfs: float, f0: float = 140.0) -> np.ndarray:
    """A voiced sound: harmonics of f0 with a falling spectrum, syllable-rate (4 Hz) modulation."""
    t = np.arange(round(seconds * SR)) / SR
    x = sum(np.sin(2 * np.pi * k * f0 * t + k) / k for k in range(1, 25))
    x *= 0.6 + 0.4 * np.sin(2 * np.pi * 4 * t) ** 2
    return x / np.sqrt(np.mean(x**2)) * db(level_dbfs)


def utterance(floor_dbfs: float = -70.0, speech_dbfs: float = -20.0):
    """silence | "s" fading in over 200 ms | voiced 600 ms | voiced decaying over 300 ms | silence.

    Returns the signal and the sample indices where the "s" starts and the decay ends.
    """
    lead, s_len, v_len, decay_len, tail = 0.8, 0.2, 0.6, 0.3, 0.8
    s = fricative(s_len, speech_dbfs - 10) * np.linspace(0, 1, round(s_len * SR))
    v = vowel(v_len + decay_len, speech_dbfs)
    v[round(v_len * SR) :] *= np.exp(-np.arange(round(decay_len * SR)) / SR / 0.06)  # -40 dB over 280 ms
    speech = np.concatenate([s, v])
    x = noise(lead + s_len + v_len + decay_len + tail, floor_dbfs)
    on = round(lead * SR)
    x[on : on + len(speech)] += speech
    return x.astype(np.float32), on, on + len(speech)


def test_soft_onset_and_soft_ending_are_kept_and_silence_is_cut():
    x, onset, offset = utterance()
    span = find_speech(x)
    assert span.has_speech
    assert span.start <= onset, "the fading-in 's' was cut"
    assert span.end >= offset - round(0.05 * SR), "the decaying ending was cut"
    # ... but the silence beyond the margins is gone
    assert span.start >= onset - round(0.4 * SR)
    assert span.end <= offset + round(0.45 * SR)
    assert span.noise_floor_dbfs == pytest.approx(-70, abs=2)
    trimmed = trim_silence(x)
    np.testing.assert_array_equal(trimmed, x[span.start : span.end])


def test_a_quiet_start_on_digital_silence_is_kept():
    """A noise gate or a digital source: zeros around the voice, so the floor comes from the speech
    itself. A 0.4-s quiet start (15 dB under the voice, with a dip) before the loud part is kept."""
    quiet = np.concatenate([fricative(0.15, -35), fricative(0.1, -45), fricative(0.15, -35)])
    loud = vowel(0.8, -20)
    x = np.concatenate([np.zeros(SR // 2), quiet, loud, fricative(0.3, -40), np.zeros(SR // 2)]).astype(np.float32)
    onset, offset = SR // 2, SR // 2 + len(quiet) + len(loud) + round(0.3 * SR)
    span = find_speech(x)
    assert span.has_speech
    assert span.start <= onset and span.end >= offset
    # Room noise to the take's edges: the span is not grown through it.
    y = x + noise(len(x) / SR, -70).astype(np.float32)
    assert find_speech(y).start > 0


def test_margins_are_kept_around_loud_speech_with_sharp_edges():
    x = noise(2.0, -65)
    x[SR // 2 : SR] += vowel(0.5, -15)
    span = find_speech(x)
    assert span.has_speech
    assert SR // 2 - span.start >= round(0.2 * SR)
    assert span.end - SR >= round(0.25 * SR)


def test_speech_over_background_noise():
    x, onset, offset = utterance(floor_dbfs=-45, speech_dbfs=-20)
    span = find_speech(x)
    assert span.has_speech
    assert span.start <= onset + round(0.1 * SR)  # the start of the hiss is under the noise anyway
    assert span.end >= offset - round(0.2 * SR)
    assert span.noise_floor_dbfs == pytest.approx(-45, abs=2)


def test_quiet_speaker_in_a_quiet_room():
    x, _, _ = utterance(floor_dbfs=-75, speech_dbfs=-42)
    assert has_speech(x)


def test_speech_from_the_first_to_the_last_sample():
    # Talking through the whole take: no pause, only the dips between syllables (about -25 dB).
    t = np.arange(round(1.5 * SR)) / SR
    x = vowel(1.5, -20) * (0.05 + 0.95 * np.abs(np.sin(np.pi * 4 * t)) ** 1.5) + noise(1.5, -60)
    span = find_speech(x)
    assert span.has_speech and span.start == 0 and span.end == len(x)


@pytest.mark.parametrize(
    "name",
    ["digital zeros", "near-zero dither", "room noise", "loud fan noise", "mains hum", "zeros then noise", "empty"],
)
def test_no_speech(name):
    t = np.arange(2 * SR) / SR
    if name == "digital zeros":
        x = np.zeros(2 * SR)
    elif name == "near-zero dither":
        x = noise(2.0, -95)
    elif name == "room noise":
        x = noise(2.0, -65)
    elif name == "loud fan noise":
        x = noise(2.0, -35)
    elif name == "mains hum":  # 50 Hz and harmonics at -40 dBFS over faint noise
        x = sum(db(-40 - 6 * k) * np.sin(2 * np.pi * 50 * (k + 1) * t) for k in range(4)) + noise(2.0, -75)
    elif name == "zeros then noise":  # a Bluetooth microphone waking up: the zeros must not set the floor
        x = np.concatenate([np.zeros(SR // 2), noise(1.5, -50)])
    else:
        x = np.zeros(0)
    span = find_speech(np.asarray(x, dtype=np.float32))
    assert not span.has_speech
    assert not has_speech(x)
    assert (span.start, span.end) == (0, len(x))
    assert len(trim_silence(x)) == len(x)  # nothing trimmed when nothing was found


def test_clicks_are_not_speech():
    x = noise(2.0, -65)
    for at in (0.3, 0.9, 1.5):  # keyboard clicks: 10 ms bursts
        i = round(at * SR)
        x[i : i + 160] += fricative(0.01, -15)
    assert not has_speech(x)


def test_other_sample_rates():
    x, onset, _ = utterance()
    x48 = np.repeat(x, 3)  # crude, but the energy envelope is what matters
    span = find_speech(x48, 48_000)
    assert span.has_speech and span.start <= 3 * onset


# The absolute floor and the trigger margin: without them a faint sound in a very quiet room, or a
# step in the background noise, counts as speech and reaches the model, which then invents text.


def test_a_faint_burst_over_a_very_quiet_room_is_not_speech():
    # a distant voice at -66 dBFS: 24 dB over the room, far more than the trigger margin, but under
    # the -60 dBFS absolute floor
    room = noise(2.0, -90)
    x = room.copy()
    x[SR // 2 : SR] += vowel(0.5, -66)
    span = find_speech(x)
    assert span.noise_floor_dbfs == pytest.approx(-90, abs=2)
    burst = x[SR // 2 : SR]
    assert 20 * np.log10(np.sqrt(np.mean(burst**2))) > span.noise_floor_dbfs + 20  # the burst's RMS
    assert not span.has_speech and (span.start, span.end) == (0, len(x))
    # the same sound 10 dB louder, above the floor, is speech: the floor is where it is documented
    x = room.copy()
    x[SR // 2 : SR] += vowel(0.5, -56)
    assert has_speech(x)


def test_a_step_in_the_background_noise_is_not_speech():
    # a fan or a passing car: the noise rises by 9 dB and stays there, less than the 12 dB trigger
    x = np.concatenate([noise(1.0, -50), noise(1.0, -41)])
    span = find_speech(x)
    assert span.noise_floor_dbfs == pytest.approx(-50, abs=1)
    assert not span.has_speech and (span.start, span.end) == (0, len(x))
    # speech 16 dB over the same noise is found (a trigger margin raised past that would miss it)
    y = noise(2.0, -50)
    y[SR // 2 : SR] += vowel(0.5, -34)
    assert has_speech(y)


def test_the_trim_rule_keeps_a_streamed_takes_start_and_cuts_both_ends_of_any_other():
    x, _, _ = utterance()
    span = find_speech(x)
    assert span.has_speech and 0 < span.start < span.end < len(x)
    assert transcribed_part(span, streamed=False) == (span.start, span.end)
    assert transcribed_part(span, streamed=True) == (0, span.end)  # its start went to the engine already
