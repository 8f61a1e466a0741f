"""The resampler against ideal signals and against scipy.signal.resample_poly (test-only oracle)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from dictation.audio import resample as resample_module
from dictation.audio.resample import resample

EDGE = 400  # output samples at each end where the filter sees the zero padding


def scipy_signal():
    """scipy.signal, imported by the tests that use it (seconds of collection otherwise)."""
    import scipy.signal

    return scipy.signal


def sine(freq: float, sample_rate: int, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(sample_rate * seconds)) / sample_rate
    return np.sin(2 * np.pi * freq * t)


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def band_limited_noise(sample_rate: int, seconds: float, cutoff_hz: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(int(sample_rate * seconds))
    sos = scipy_signal().butter(12, cutoff_hz, fs=sample_rate, output="sos")
    return scipy_signal().sosfiltfilt(sos, noise)


@pytest.mark.parametrize("orig_sr", [48_000, 44_100, 22_050, 8_000])
def test_sine_matches_the_ideal_sine(orig_sr: int) -> None:
    y = resample(sine(1000, orig_sr), orig_sr, 16_000)
    ideal = sine(1000, 16_000)
    assert y.dtype == np.float32
    assert len(y) == len(ideal)
    assert rms(y[EDGE:-EDGE] - ideal[EDGE:-EDGE]) < 1e-3


@pytest.mark.parametrize(("orig_sr", "tone_hz"), [(48_000, 10_000), (44_100, 10_000), (48_000, 8_600)])
def test_tone_above_the_new_nyquist_is_removed(orig_sr: int, tone_hz: int) -> None:
    y = resample(sine(tone_hz, orig_sr), orig_sr, 16_000)
    attenuation_db = 20 * math.log10(rms(y[EDGE:-EDGE]) / rms(sine(tone_hz, orig_sr)))
    assert attenuation_db < -80


def test_passband_is_flat_up_to_7_khz() -> None:
    for freq in (100, 3000, 6000, 7000):
        y = resample(sine(freq, 48_000), 48_000, 16_000)
        gain_db = 20 * math.log10(rms(y[EDGE:-EDGE]) / rms(sine(freq, 16_000)))
        assert abs(gain_db) < 0.01, freq


@pytest.mark.parametrize(
    ("orig_sr", "target_sr"),
    [(48_000, 16_000), (44_100, 16_000), (22_050, 16_000), (11_025, 16_000), (8_000, 16_000), (16_000, 44_100)],
)
def test_agrees_with_scipy_resample_poly_on_speech_band_audio(orig_sr: int, target_sr: int) -> None:
    # Content well below both Nyquist frequencies, where both filters pass the signal and differ
    # only in their ripple (scipy's Kaiser(5.0) window ripples by ~0.2 %).
    x = band_limited_noise(orig_sr, 1.0, 0.35 * min(orig_sr, target_sr))
    ours = resample(x, orig_sr, target_sr)
    theirs = scipy_signal().resample_poly(x, target_sr, orig_sr)
    assert ours.shape == theirs.shape
    inner = slice(EDGE, -EDGE)
    assert rms(ours[inner] - theirs[inner]) < 3e-3 * rms(theirs[inner])


@pytest.mark.parametrize(
    ("orig_sr", "target_sr"),
    [(48_000, 16_000), (44_100, 16_000), (8_000, 16_000), (16_000, 48_000), (16_001, 16_000), (24_000, 16_000)],
)
def test_polyphase_arithmetic_equals_scipy_with_the_same_filter(orig_sr: int, target_sr: int) -> None:
    # resample_poly accepts an explicit filter (and multiplies it by `up` itself): with ours, the
    # two must agree to float32 precision everywhere, edges included. This checks alignment,
    # padding and length, and covers the gather path (16001 -> 16000 has no small polyphase matrix).
    g = math.gcd(orig_sr, target_sr)
    up, down = target_sr // g, orig_sr // g
    h, _ = resample_module._lowpass(up, down)
    x = np.random.default_rng(1).standard_normal(orig_sr // 4 + 7)
    ours = resample(x, orig_sr, target_sr)
    theirs = scipy_signal().resample_poly(x, up, down, window=h / up)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=0)


def test_matrix_and_gather_paths_agree() -> None:
    x = np.random.default_rng(2).standard_normal(20_000).astype(np.float32)
    up, down = 160, 441
    h, half_len = resample_module._lowpass(up, down)
    via_matrix = resample(x, 44_100, 16_000)
    via_gather = resample_module._resample_gather(x, up, down, h, half_len, len(via_matrix))
    np.testing.assert_allclose(via_matrix, via_gather, atol=1e-5, rtol=0)


def test_upsampling_8k_to_16k_keeps_the_tone_and_adds_no_image() -> None:
    y = resample(sine(1000, 8_000), 8_000, 16_000)
    assert len(y) == 16_000
    assert rms(y[EDGE:-EDGE] - sine(1000, 16_000)[EDGE:-EDGE]) < 1e-3
    # Zero-stuffing creates an image at 8000 - 1000 = 7 kHz; the filter must remove it.
    spectrum = np.abs(np.fft.rfft(y[EDGE:-EDGE] * np.hanning(len(y) - 2 * EDGE)))
    freqs = np.fft.rfftfreq(len(y) - 2 * EDGE, 1 / 16_000)
    image = spectrum[np.abs(freqs - 7000) < 50].max()
    assert image < 1e-4 * spectrum.max()


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 47, 48, 49, 441, 1000, 44_101])
@pytest.mark.parametrize(("orig_sr", "target_sr"), [(48_000, 16_000), (44_100, 16_000), (8_000, 16_000)])
def test_output_length_is_ceil_like_resample_poly(n: int, orig_sr: int, target_sr: int) -> None:
    x = np.ones(n)
    expected = math.ceil(n * target_sr / orig_sr)
    assert len(resample(x, orig_sr, target_sr)) == expected
    if n:
        assert len(scipy_signal().resample_poly(x, target_sr, orig_sr)) == expected


def test_equal_rates_return_a_float32_copy() -> None:
    x = np.linspace(-1, 1, 101)
    y = resample(x, 16_000, 16_000)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, x.astype(np.float32))
    x32 = x.astype(np.float32)
    assert resample(x32, 16_000, 16_000) is not x32


def test_dc_level_is_preserved() -> None:
    y = resample(np.full(48_000, 0.5), 48_000, 16_000)
    np.testing.assert_allclose(y[EDGE:-EDGE], 0.5, atol=1e-5)


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="1-D"):
        resample(np.zeros((2, 100)), 48_000, 16_000)
    with pytest.raises(ValueError, match="positive"):
        resample(np.zeros(100), 0, 16_000)
    with pytest.raises(ValueError, match="positive"):
        resample(np.zeros(100), 44_100.5, 16_000)


def test_twenty_minutes_of_48k_audio_takes_seconds_not_minutes() -> None:
    x = np.random.default_rng(3).random(48_000 * 60 * 20, dtype=np.float32) - 0.5
    start = time.perf_counter()
    y = resample(x, 48_000, 16_000)
    elapsed = time.perf_counter() - start
    assert len(y) == 16_000 * 60 * 20
    assert elapsed < 5.0, f"{elapsed:.2f} s"
