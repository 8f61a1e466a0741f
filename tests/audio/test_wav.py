"""WAV reading/writing, cross-checked against independent writers and readers (stdlib wave, soundfile)."""

from __future__ import annotations

import os
import struct
import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile

from dictation.asr.errors import AudioError
from dictation.audio import wav as wav_module
from dictation.audio.wav import load_audio_16k, read_wav, write_wav


def sine(freq: float, sample_rate: int, seconds: float = 1.0, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(sample_rate * seconds)) / sample_rate
    return amplitude * np.sin(2 * np.pi * freq * t)


def write_with_stdlib(path: Path, ints: np.ndarray, sample_width: int, sample_rate: int = 16_000) -> None:
    """Integer PCM through the stdlib writer. ``ints`` is [frames, channels] of the stored values."""
    if sample_width == 1:
        raw = ints.astype(np.uint8).tobytes()
    elif sample_width == 3:
        as_int32 = ints.astype("<i4").reshape(-1, 1).view(np.uint8)  # [n, 4] little-endian bytes
        raw = as_int32[:, :3].tobytes()
    else:
        raw = ints.astype(f"<i{sample_width}").tobytes()
    with wave.open(str(path), "wb") as w:
        w.setnchannels(ints.shape[1])
        w.setsampwidth(sample_width)
        w.setframerate(sample_rate)
        w.writeframes(raw)


def fmt_chunk(tag: int, channels: int, sample_rate: int, bits: int) -> bytes:
    block = channels * bits // 8
    return struct.pack("<HHIIHH", tag, channels, sample_rate, sample_rate * block, block, bits)


def riff(*chunks: tuple[bytes, bytes], pad: bool = True, form: bytes = b"WAVE") -> bytes:
    body = b""
    for chunk_id, data in chunks:
        body += chunk_id + struct.pack("<I", len(data)) + data
        if pad and len(data) % 2:
            body += b"\0"
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + form + body


# --- integer PCM, written by the stdlib -------------------------------------------------------------


@pytest.mark.parametrize(
    ("sample_width", "stored", "expected"),
    [
        (1, [0, 1, 128, 192, 255], [-1.0, -127 / 128, 0.0, 0.5, 127 / 128]),
        (2, [-32768, -1, 0, 1, 16384, 32767], [-1.0, -1 / 32768, 0.0, 1 / 32768, 0.5, 32767 / 32768]),
        (3, [-(2**23), -1, 0, 1, 2**22, 2**23 - 1], [-1.0, -(2.0**-23), 0.0, 2.0**-23, 0.5, 1 - 2.0**-23]),
        (4, [-(2**31), 0, 2**30, 2**31 - 1], [-1.0, 0.0, 0.5, 1.0]),
    ],
)
def test_integer_pcm_is_scaled_by_the_full_range(tmp_path: Path, sample_width: int, stored, expected) -> None:
    path = tmp_path / "pcm.wav"
    write_with_stdlib(path, np.array(stored)[:, None], sample_width, sample_rate=22_050)
    samples, sample_rate = read_wav(path)
    assert sample_rate == 22_050
    assert samples.dtype == np.float32
    np.testing.assert_array_equal(samples, np.array(expected, dtype=np.float32))


def test_pcm16_round_trip_is_exact_for_every_value(tmp_path: Path) -> None:
    every_int16 = np.arange(-32768, 32768)
    path = tmp_path / "all.wav"
    write_with_stdlib(path, every_int16[:, None], 2)
    samples, _ = read_wav(path)
    np.testing.assert_array_equal(samples, (every_int16 / 32768).astype(np.float32))


@pytest.mark.parametrize("sample_width", [1, 2, 3, 4])
def test_stereo_is_downmixed_by_the_mean(tmp_path: Path, sample_width: int) -> None:
    full = {1: 127, 2: 2**15, 3: 2**23, 4: 2**31}[sample_width]
    offset = 128 if sample_width == 1 else 0
    left = np.array([full // 2, 0, -full // 4])
    right = np.array([-full // 4, full // 2, -full // 4])
    path = tmp_path / "stereo.wav"
    write_with_stdlib(path, np.stack([left, right], axis=1) + offset, sample_width)
    samples, _ = read_wav(path)
    scale = 128 if sample_width == 1 else full
    np.testing.assert_allclose(samples, (left + right) / 2 / scale, atol=1e-7)


# --- soundfile (libsndfile) as an independent writer and reader ---------------------------------------


@pytest.mark.parametrize(
    ("container", "subtype", "channels"),
    [
        ("WAV", "PCM_U8", 1),
        ("WAV", "PCM_16", 1),
        ("WAV", "PCM_24", 2),
        ("WAV", "PCM_32", 1),
        ("WAV", "FLOAT", 1),
        ("WAV", "FLOAT", 2),
        ("WAV", "DOUBLE", 1),
        ("WAVEX", "PCM_16", 2),
        ("WAVEX", "PCM_24", 4),
        ("WAVEX", "PCM_32", 1),
        ("WAVEX", "FLOAT", 6),
        ("RF64", "PCM_16", 1),
        ("RF64", "FLOAT", 2),
    ],
)
def test_reads_what_libsndfile_writes(tmp_path: Path, container: str, subtype: str, channels: int) -> None:
    rng = np.random.default_rng(0)
    audio = rng.uniform(-0.9, 0.9, size=(4_410, channels))
    path = tmp_path / f"{container}-{subtype}.wav"
    soundfile.write(path, audio, 44_100, format=container, subtype=subtype)
    samples, sample_rate = read_wav(path)
    reference, reference_rate = soundfile.read(path, dtype="float64", always_2d=True)
    assert sample_rate == reference_rate == 44_100
    # libsndfile scales integers by the full range too; the float32 mean is the only difference.
    np.testing.assert_allclose(samples, reference.mean(axis=1), atol=1e-6, rtol=0)


def test_float_wav_keeps_values_beyond_full_scale(tmp_path: Path) -> None:
    path = tmp_path / "loud.wav"
    soundfile.write(path, np.array([0.5, -2.0, 1.5]), 16_000, subtype="FLOAT")
    samples, _ = read_wav(path)
    np.testing.assert_array_equal(samples, np.array([0.5, -2.0, 1.5], dtype=np.float32))


# --- load_audio_16k --------------------------------------------------------------------------------


@pytest.mark.parametrize("sample_rate", [44_100, 48_000, 8_000, 16_000])
def test_load_audio_16k_resamples_to_16k(tmp_path: Path, sample_rate: int) -> None:
    path = tmp_path / "tone.wav"
    soundfile.write(path, sine(440, sample_rate), sample_rate, subtype="FLOAT")
    samples = load_audio_16k(path)
    ideal = sine(440, 16_000)
    assert samples.dtype == np.float32
    assert len(samples) == len(ideal)
    inner = slice(400, -400)
    assert np.sqrt(np.mean((samples[inner] - ideal[inner]) ** 2)) < 1e-3


def test_load_audio_16k_downmixes_stereo(tmp_path: Path) -> None:
    path = tmp_path / "stereo.wav"
    left = sine(300, 16_000)
    soundfile.write(path, np.stack([left, np.zeros_like(left)], axis=1), 16_000, subtype="FLOAT")
    np.testing.assert_allclose(load_audio_16k(path), left / 2, atol=1e-7)


def test_load_audio_16k_scales_down_by_the_peak_like_the_official_toolkit(tmp_path: Path) -> None:
    path = tmp_path / "hot.wav"
    audio = np.array([0.5, -4.0, 2.0, 0.25] * 100)
    soundfile.write(path, audio, 16_000, subtype="FLOAT")
    samples = load_audio_16k(path)
    np.testing.assert_allclose(samples, audio / 4.0, atol=1e-7)  # scaled, not clipped
    quiet = tmp_path / "quiet.wav"
    soundfile.write(quiet, audio / 8, 16_000, subtype="FLOAT")
    np.testing.assert_allclose(load_audio_16k(quiet), audio / 8, atol=1e-7)  # left alone


# --- odd but valid files ---------------------------------------------------------------------------


def test_unknown_and_odd_sized_chunks_are_skipped(tmp_path: Path) -> None:
    pcm = np.array([1000, -1000, 32767], dtype="<i2").tobytes()
    for pad in (True, False):  # some writers forget the pad byte after an odd-sized chunk
        path = tmp_path / f"chunks-{pad}.wav"
        path.write_bytes(
            riff(
                (b"JUNK", b"\0" * 5),
                (b"fmt ", fmt_chunk(1, 1, 16_000, 16)),
                (b"LIST", b"INFOISFT\x03\0\0\0ab\0"),
                (b"data", pcm),
                (b"id3 ", b"tag"),
                pad=pad,
            )
        )
        samples, _ = read_wav(path)
        np.testing.assert_array_equal(samples, np.array([1000, -1000, 32767], dtype=np.float32) / 32768)


@pytest.mark.parametrize("declared", [0xFFFFFFFF, 0x7FFFF000, 2 * 1000 + 2])
def test_data_chunk_longer_than_the_file_reads_to_the_end(tmp_path: Path, declared: int) -> None:
    # What a streaming writer leaves when it cannot seek back to patch the sizes (or was killed).
    audio = np.arange(1000, dtype="<i2")
    path = tmp_path / "stream.wav"
    blob = bytearray(riff((b"fmt ", fmt_chunk(1, 1, 16_000, 16)), (b"data", audio.tobytes())))
    data_size_at = blob.index(b"data") + 4
    blob[data_size_at : data_size_at + 4] = struct.pack("<I", declared)
    blob[4:8] = struct.pack("<I", 0xFFFFFFFF)
    path.write_bytes(bytes(blob) + b"\x07")  # plus half a sample: dropped
    samples, _ = read_wav(path)
    np.testing.assert_array_equal(samples, audio.astype(np.float32) / 32768)


def test_trailing_garbage_after_the_data_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "trailing.wav"
    wav_bytes = riff((b"fmt ", fmt_chunk(1, 1, 16_000, 16)), (b"data", np.ones(4, "<i2").tobytes()))
    path.write_bytes(wav_bytes + b"\0\0\0\0\xff\xff\x00\x01\x02")
    samples, _ = read_wav(path)
    assert len(samples) == 4


# --- errors ----------------------------------------------------------------------------------------


def read_error(path: Path) -> str:
    with pytest.raises(AudioError) as excinfo:
        read_wav(path)
    message = str(excinfo.value)
    assert message.startswith(str(path)), message
    assert "\n" not in message
    return message


def test_missing_file(tmp_path: Path) -> None:
    assert "no such file" in read_error(tmp_path / "nope.wav")
    with pytest.raises(AudioError, match="nope.wav: no such file"):
        load_audio_16k(tmp_path / "nope.wav")


def test_directory(tmp_path: Path) -> None:
    assert "directory" in read_error(tmp_path)


@pytest.mark.parametrize(
    "content",
    [b"", b"RIFF", b"hello, this is text\n" * 10, b"RIFF\x10\0\0\0AVI LIST" + b"\0" * 20],
)
def test_not_a_wav_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "other.wav"
    path.write_bytes(content)
    assert read_error(path) == f"{path}: not a WAV file (expected RIFF/WAVE header)"


def test_flac_named_wav_is_not_a_wav_file(tmp_path: Path) -> None:
    path = tmp_path / "really.wav"
    soundfile.write(path, sine(440, 16_000, 0.1), 16_000, format="FLAC")
    assert "not a WAV file" in read_error(path)


@pytest.mark.parametrize(
    ("subtype", "named"),
    [("ULAW", "0x0007 mu-law"), ("ALAW", "0x0006 A-law"), ("MS_ADPCM", "0x0002 Microsoft ADPCM")],
)
def test_unsupported_encoding_names_the_format_tag(tmp_path: Path, subtype: str, named: str) -> None:
    path = tmp_path / f"{subtype}.wav"
    soundfile.write(path, sine(440, 8_000, 0.1), 8_000, subtype=subtype)
    message = read_error(path)
    assert "unsupported WAV encoding" in message
    assert named in message


def test_unsupported_bit_depth(tmp_path: Path) -> None:
    path = tmp_path / "pcm12.wav"
    path.write_bytes(riff((b"fmt ", fmt_chunk(3, 1, 16_000, 16)), (b"data", b"\0" * 8)))
    assert "format tag 0x0003, 16-bit" in read_error(path)


def test_no_data_chunk(tmp_path: Path) -> None:
    path = tmp_path / "header-only.wav"
    path.write_bytes(riff((b"fmt ", fmt_chunk(1, 1, 16_000, 16)), (b"LIST", b"INFO")))
    assert "no data chunk" in read_error(path)


def test_no_fmt_chunk(tmp_path: Path) -> None:
    path = tmp_path / "headless.wav"
    path.write_bytes(riff((b"data", b"\0" * 8)))
    assert "no fmt chunk" in read_error(path)


def test_zero_samples(tmp_path: Path) -> None:
    path = tmp_path / "empty.wav"
    write_wav(path, np.zeros(0, dtype=np.float32), 16_000)
    assert read_error(path) == f"{path}: contains no audio samples"


def test_garbage_after_the_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "garbage.wav"
    garbage = np.random.default_rng(5).integers(0, 32, 4000, dtype=np.uint8).tobytes()  # control bytes
    path.write_bytes(b"RIFF\0\0\0\0WAVE" + garbage)
    assert "corrupt WAV file" in read_error(path)


def test_nan_in_float_wav_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nan.wav"
    path.write_bytes(riff((b"fmt ", fmt_chunk(3, 1, 16_000, 32)), (b"data", np.array([0.1, np.nan], "<f4").tobytes())))
    assert "NaN" in read_error(path)


# --- write_wav -------------------------------------------------------------------------------------


def test_write_wav_is_readable_by_the_stdlib_and_libsndfile(tmp_path: Path) -> None:
    path = tmp_path / "out.wav"
    audio = sine(440, 16_000, 0.5).astype(np.float32)
    write_wav(path, audio, 16_000)
    with wave.open(str(path), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 16_000, 8000)
    reference, sample_rate = soundfile.read(path, dtype="float32")
    assert sample_rate == 16_000
    np.testing.assert_allclose(reference, audio, atol=1 / 32768)
    ours, _ = read_wav(path)
    np.testing.assert_array_equal(ours, reference)


def test_write_wav_round_trips_16_bit_values_exactly_and_clips(tmp_path: Path) -> None:
    path = tmp_path / "grid.wav"
    grid = np.arange(-32768, 32768, 7, dtype=np.float32) / 32768
    write_wav(path, grid, 8_000)
    samples, sample_rate = read_wav(path)
    assert sample_rate == 8_000
    np.testing.assert_array_equal(samples, grid)
    write_wav(path, np.array([1.0, 1.5, -1.0, -3.0], dtype=np.float32), 8_000)
    samples, _ = read_wav(path)
    np.testing.assert_array_equal(samples, np.array([32767, 32767, -32768, -32768], dtype=np.float32) / 32768)


def test_write_wav_stereo(tmp_path: Path) -> None:
    path = tmp_path / "stereo.wav"
    write_wav(path, np.array([[0.5, -0.5], [0.25, 0.25]]), 48_000)
    reference, _ = soundfile.read(path, dtype="float32", always_2d=True)
    np.testing.assert_array_equal(reference, np.array([[0.5, -0.5], [0.25, 0.25]], dtype=np.float32))


def test_write_wav_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "recording.wav"
    write_wav(path, np.full(100, 0.25), 16_000)
    before = path.read_bytes()

    def failing_replace(src: str, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wav_module.os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space"):
        write_wav(path, np.full(200, -0.25), 16_000)
    assert path.read_bytes() == before  # the old file is untouched
    assert os.listdir(tmp_path) == ["recording.wav"]  # and no temp file is left behind


def test_write_wav_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="NaN"):
        write_wav(tmp_path / "x.wav", np.array([0.0, np.nan]), 16_000)
    with pytest.raises(ValueError, match="shape"):
        write_wav(tmp_path / "x.wav", np.zeros((2, 2, 2)), 16_000)
    with pytest.raises(ValueError, match="sample rate"):
        write_wav(tmp_path / "x.wav", np.zeros(4), 0)
    assert not list(tmp_path.iterdir())


# --- special files and absurd rates -----------------------------------------------------------------------


def _on_a_thread(fn, seconds: float = 30.0):
    """fn() must finish within ``seconds``: a blocked open() fails the test instead of hanging it."""
    import threading

    result: list = []

    def run():
        try:
            result.append(("value", fn()))
        except BaseException as exc:
            result.append(("error", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert result, f"still blocked after {seconds} s"
    return result[0]


def test_a_fifo_is_refused_at_once_instead_of_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "take.wav"
    os.mkfifo(fifo)
    kind, value = _on_a_thread(lambda: load_audio_16k(fifo))
    assert kind == "error" and isinstance(value, AudioError)
    assert str(value) == f"{fifo}: is a FIFO (named pipe), not a WAV file"


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero (a character device)")
def test_a_device_is_refused_instead_of_read_without_end() -> None:
    kind, value = _on_a_thread(lambda: read_wav("/dev/zero"))
    assert kind == "error" and str(value) == "/dev/zero: is a character device, not a WAV file"


@pytest.mark.parametrize("rate", [2_000_000_000, 4_294_967_295, 3_999])
def test_a_header_claiming_gigahertz_is_refused_in_a_moment(tmp_path: Path, rate: int) -> None:
    """3 GHz took 48 s and 1.5 GB in the resampler's filter design."""
    import time

    path = tmp_path / "ghz.wav"
    pcm = (sine(440, 16_000) * 32767).astype("<i2").tobytes()
    path.write_bytes(riff((b"fmt ", struct.pack("<HHIIHH", 1, 1, rate, 0, 2, 16)), (b"data", pcm)))
    t0 = time.monotonic()
    with pytest.raises(AudioError) as info:
        load_audio_16k(path)
    assert time.monotonic() - t0 < 1.0
    assert str(info.value) == (
        f"{path}: unsupported sample rate {rate} Hz (a WAV file holds 4000 to 768000 Hz; a damaged header?)"
    )


def test_an_odd_rate_far_from_16k_is_resampled_in_about_a_second(tmp_path: Path) -> None:
    """767999 Hz does not reduce against 16 kHz: the exact filter had 49M taps (10 s, 4 GB). It is read
    as 768 kHz (1.3 ppm apart), and a 440 Hz tone stays a 440 Hz tone."""
    import time

    rate = 767_999
    path = tmp_path / "odd.wav"
    soundfile.write(path, sine(440, rate, seconds=2.0), rate, subtype="FLOAT")
    t0 = time.process_time()
    samples = load_audio_16k(path)
    assert time.process_time() - t0 < 2.0
    assert len(samples) == 32_000
    spectrum = np.abs(np.fft.rfft(samples))
    assert abs(np.argmax(spectrum) * 16_000 / len(samples) - 440) <= 1
    assert wav_module.resampling_rate(16_001) == 16_001  # near rates stay exact
    assert wav_module.resampling_rate(44_101) == 44_100


def test_the_cli_refuses_a_fifo_given_as_audio(tmp_path: Path) -> None:
    import subprocess
    import sys

    fifo = tmp_path / "take.wav"
    os.mkfifo(fifo)
    proc = subprocess.run(
        [sys.executable, "-m", "dictation", "transcribe", str(fifo), "--model", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"dictation: error: {fifo}: is a FIFO (named pipe), not a WAV file"
