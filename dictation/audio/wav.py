"""Reading and writing WAV files without third-party audio libraries.

Why our own RIFF parser: the stdlib `wave` module reads integer PCM only, but recorders and
editors also write 32-bit float and WAVE_FORMAT_EXTENSIBLE files, and streaming writers leave the
data chunk's length unpatched. The reader accepts integer PCM (8-bit unsigned, 16, 24, 32-bit),
IEEE float (32, 64-bit), both inside WAVE_FORMAT_EXTENSIBLE, and RF64 (WAV over 4 GiB); it
downmixes channels by their mean. Anything else is refused with an `AudioError` naming the file.

Integer samples are scaled by the full range of their type (int16 / 32768 exactly), as soundfile
and the official Qwen3-ASR toolkit (through librosa) do, so our samples match theirs bit for bit.

Only regular files are read (a FIFO would block the open for ever, a device stream without end), and
sample rates outside 4 kHz - 768 kHz are refused: a header claiming gigahertz made the resampler
design a filter of billions of taps. Odd rates above ``EXACT_RATIO_LIMIT`` whose ratio to 16 kHz
does not reduce (767999 Hz) are resampled as the nearest multiple of 100 Hz (an error under 0.1 %,
inaudible, where the exact filter took seconds and gigabytes).
"""

from __future__ import annotations

import logging
import math
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from dictation.asr import SAMPLE_RATE, AudioError
from dictation.audio.resample import resample
from dictation.files import NotRegularFile, open_regular

log = logging.getLogger(__name__)

MIN_RATE, MAX_RATE = 4_000, 768_000  # sample rates read (8 kHz telephone to 768 kHz studio converters)
EXACT_RATIO_LIMIT = 20_000  # resampled exactly while the reduced up/down factors stay below this

_PCM, _FLOAT, _EXTENSIBLE = 0x0001, 0x0003, 0xFFFE
# Sub-format GUIDs of WAVE_FORMAT_EXTENSIBLE are the format tag followed by these 14 bytes.
_GUID_TAIL = bytes.fromhex("000000001000800000aa00389b71")
_TAG_NAMES = {
    0x0002: "Microsoft ADPCM",
    0x0006: "A-law",
    0x0007: "mu-law",
    0x0011: "IMA ADPCM",
    0x0031: "GSM 6.10",
    0x0050: "MPEG",
    0x0055: "MPEG Layer 3",
    0x0161: "WMA",
}
_NO_SIZE = 0xFFFFFFFF  # RF64 data chunks (and some streaming writers) put this in the size field


@dataclass(frozen=True)
class _Format:
    """What the fmt chunk says, reduced to what decoding needs."""

    tag: int  # _PCM or _FLOAT (extensible already unwrapped)
    channels: int
    sample_rate: int
    bits: int  # container size: 8, 16, 24, 32 or 64


def read_wav(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """Read a WAV file as float32 mono samples (channels averaged) and its sample rate."""
    fmt, data = _read_chunks(path)
    frame_bytes = fmt.channels * fmt.bits // 8
    n_frames = len(data) // frame_bytes  # a truncated last frame is dropped
    if n_frames == 0:
        raise AudioError(f"{os.fspath(path)}: contains no audio samples")
    samples = _decode(data[: n_frames * frame_bytes], fmt)
    if fmt.tag == _FLOAT and not np.isfinite(samples).all():
        raise AudioError(f"{os.fspath(path)}: contains NaN or infinite samples")
    if fmt.channels > 1:
        samples = samples.reshape(n_frames, fmt.channels).mean(axis=1, dtype=np.float32)
    return samples, fmt.sample_rate


def load_audio_16k(path: str | os.PathLike) -> np.ndarray:
    """Read a WAV file as the engine wants it: mono float32 at 16 kHz within [-1, 1].

    Like the official toolkit, audio whose peak exceeds 1 (float WAVs can) is scaled down by its
    peak rather than clipped, and the result is then clipped to [-1, 1] (the resampler can
    overshoot slightly).
    """
    samples, sample_rate = read_wav(path)
    if sample_rate != SAMPLE_RATE:
        rate = resampling_rate(sample_rate)
        if rate != sample_rate:
            log.info("%s: %d Hz resampled as %d Hz (%.4f %% apart)", os.fspath(path), sample_rate, rate,
                     100 * abs(rate - sample_rate) / sample_rate)  # fmt: skip
        samples = resample(samples, rate, SAMPLE_RATE)
    peak = float(np.max(np.abs(samples)))
    if peak > 1.0:
        samples = samples / np.float32(peak)
    return np.clip(samples, -1.0, 1.0).astype(np.float32, copy=False)


def resampling_rate(sample_rate: int) -> int:
    """The rate to resample from: ``sample_rate`` itself, unless its ratio to 16 kHz reduces to factors
    over EXACT_RATIO_LIMIT (the filter then has 64 x that many taps); then the nearest multiple of
    100 Hz, whose ratio reduces to factors of at most 7680."""
    g = math.gcd(sample_rate, SAMPLE_RATE)
    if max(sample_rate // g, SAMPLE_RATE // g) <= EXACT_RATIO_LIMIT:
        return sample_rate
    return max(100, round(sample_rate / 100) * 100)


def write_wav(path: str | os.PathLike, samples: np.ndarray, sample_rate: int) -> None:
    """Write float samples in [-1, 1] as 16-bit PCM, atomically (a temp file, then os.replace).

    ``samples`` is [frames] or [frames, channels]. Values are scaled by 32768 (the reader's
    inverse), rounded and clipped, so 16-bit audio survives a read/write round trip unchanged.
    The file is fsynced before it replaces ``path``: a recording on disk is complete or absent.
    Like every tempfile.mkstemp file it is readable by its owner only (mode 0600): recordings are
    private.
    """
    samples = np.asarray(samples, dtype=np.float32)
    if samples.ndim == 1:
        samples = samples[:, None]
    if samples.ndim != 2 or samples.shape[1] == 0:
        raise ValueError(f"write_wav expects [frames] or [frames, channels], got shape {samples.shape}")
    if not np.isfinite(samples).all():
        raise ValueError("write_wav: samples contain NaN or infinity")
    if int(sample_rate) != sample_rate or sample_rate <= 0:
        raise ValueError(f"write_wav: sample rate must be a positive integer, got {sample_rate}")
    channels = samples.shape[1]
    pcm = np.clip(np.round(samples * 32768.0), -32768, 32767).astype("<i2")
    data_bytes = pcm.nbytes
    if data_bytes > 0xFFFFFFFF - 36:
        raise ValueError("write_wav: too much audio for one WAV file (over 4 GiB)")
    header = b"".join(
        [
            b"RIFF",
            struct.pack("<I", 36 + data_bytes),
            b"WAVE",
            b"fmt ",
            struct.pack(
                "<IHHIIHH", 16, _PCM, channels, int(sample_rate), int(sample_rate) * channels * 2, channels * 2, 16
            ),
            b"data",
            struct.pack("<I", data_bytes),
        ]
    )
    target = Path(path)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            f.write(pcm.tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _read_chunks(path: str | os.PathLike) -> tuple[_Format, bytes]:
    """The parsed fmt chunk and the raw bytes of the data chunk; OS errors name the file."""
    name = os.fspath(path)
    try:
        with open_regular(path) as f:  # a FIFO or a device is refused at once instead of blocking
            return _walk_chunks(name, f)
    except FileNotFoundError:
        raise AudioError(f"{name}: no such file") from None
    except (IsADirectoryError, NotRegularFile) as e:
        what = "is a directory" if isinstance(e, IsADirectoryError) else e.strerror.removesuffix(", not a regular file")
        raise AudioError(f"{name}: {what}, not a WAV file") from None
    except OSError as e:
        raise AudioError(f"{name}: cannot read ({e.strerror or e})") from None


def _walk_chunks(name: str, f: BinaryIO) -> tuple[_Format, bytes]:
    """Walk the RIFF chunks, tolerating what real-world writers get wrong but not garbage."""
    file_size = os.fstat(f.fileno()).st_size
    header = f.read(12)
    if len(header) < 12 or header[:4] not in (b"RIFF", b"RF64") or header[8:12] != b"WAVE":
        raise AudioError(f"{name}: not a WAV file (expected RIFF/WAVE header)")
    fmt: _Format | None = None
    data_span: tuple[int, int] | None = None
    rf64_data_size: int | None = None
    pos, prev_size = 12, 0
    while pos + 8 <= file_size:
        f.seek(pos)
        chunk_id, size = struct.unpack("<4sI", f.read(8))
        if not _is_chunk_id(chunk_id) and prev_size % 2 == 1:
            # Some writers omit the pad byte after an odd-sized chunk: look one byte earlier.
            f.seek(pos - 1)
            unpadded_id, unpadded_size = struct.unpack("<4sI", f.read(8))
            if _is_chunk_id(unpadded_id):
                chunk_id, size, pos = unpadded_id, unpadded_size, pos - 1
        if not _is_chunk_id(chunk_id):
            if fmt is not None and data_span is not None:
                break  # junk after the audio (trailing zeros, tags from broken tools): ignore it
            raise AudioError(f"{name}: corrupt WAV file (unreadable chunk header at byte {pos})")
        body = pos + 8
        if chunk_id == b"ds64" and size >= 16 and body + 16 <= file_size:
            _riff_size, rf64_data_size = struct.unpack("<QQ", f.read(16))
        elif chunk_id == b"fmt ":
            fmt = _parse_fmt(name, f.read(min(size, file_size - body)))
        elif chunk_id == b"data":
            if size == _NO_SIZE and rf64_data_size is not None:
                size = rf64_data_size
            # A streaming writer that could not seek back leaves the size too large (or
            # 0xFFFFFFFF): the data runs to the end of the file.
            size = min(size, file_size - body)
            data_span = (body, size)
        pos, prev_size = body + size + size % 2, size
    if fmt is None:
        raise AudioError(f"{name}: not a complete WAV file (no fmt chunk)")
    if data_span is None:
        raise AudioError(f"{name}: not a complete WAV file (no data chunk)")
    f.seek(data_span[0])
    return fmt, f.read(data_span[1])


def _is_chunk_id(chunk_id: bytes) -> bool:
    """RIFF chunk ids are four printable ASCII characters ("fmt ", "data", "LIST", ...)."""
    return all(0x20 <= c <= 0x7E for c in chunk_id)


def _parse_fmt(name: str, body: bytes) -> _Format:
    """Decode a fmt chunk, unwrapping WAVE_FORMAT_EXTENSIBLE; refuse encodings we cannot decode."""
    if len(body) < 16:
        raise AudioError(f"{name}: corrupt WAV file (fmt chunk is {len(body)} bytes, expected 16 or more)")
    tag, channels, sample_rate, _byte_rate, block_align, bits = struct.unpack("<HHIIHH", body[:16])
    if tag == _EXTENSIBLE:
        if len(body) < 40:
            raise AudioError(f"{name}: corrupt WAV file (extensible fmt chunk is {len(body)} bytes)")
        sub_format = body[24:40]
        if sub_format[2:] != _GUID_TAIL:
            raise AudioError(f"{name}: unsupported WAV encoding (extensible sub-format {sub_format.hex()})")
        tag = struct.unpack("<H", sub_format[:2])[0]
    supported = (tag == _PCM and bits in (8, 16, 24, 32)) or (tag == _FLOAT and bits in (32, 64))
    if not supported:
        what = f"format tag 0x{tag:04X}" + (f" {_TAG_NAMES[tag]}" if tag in _TAG_NAMES else "")
        raise AudioError(
            f"{name}: unsupported WAV encoding ({what}, {bits}-bit); convert it to 16-bit PCM or 32-bit float WAV"
        )
    if channels == 0 or sample_rate == 0:
        raise AudioError(f"{name}: corrupt WAV file ({channels} channels at {sample_rate} Hz)")
    if not MIN_RATE <= sample_rate <= MAX_RATE:
        raise AudioError(
            f"{name}: unsupported sample rate {sample_rate} Hz (a WAV file holds {MIN_RATE} to {MAX_RATE} Hz; "
            "a damaged header?)"
        )
    if block_align != channels * bits // 8:
        raise AudioError(f"{name}: corrupt WAV file (block align {block_align} for {channels} channels of {bits} bits)")
    return _Format(tag=tag, channels=channels, sample_rate=sample_rate, bits=bits)


def _decode(data: bytes, fmt: _Format) -> np.ndarray:
    """Interleaved little-endian samples -> float32, integers scaled by their type's full range."""
    if fmt.tag == _FLOAT:
        return np.frombuffer(data, dtype="<f4" if fmt.bits == 32 else "<f8").astype(np.float32)
    if fmt.bits == 8:  # 8-bit WAV is unsigned, centred on 128
        return (np.frombuffer(data, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    if fmt.bits == 24:
        # Place each 3-byte sample in the top of an int32 and shift back down: sign-extends for free.
        wide = np.zeros((len(data) // 3, 4), dtype=np.uint8)
        wide[:, 1:] = np.frombuffer(data, dtype=np.uint8).reshape(-1, 3)
        return (wide.view("<i4")[:, 0] >> 8).astype(np.float32) / np.float32(2**23)
    dtype = "<i2" if fmt.bits == 16 else "<i4"
    return np.frombuffer(data, dtype=dtype).astype(np.float32) / np.float32(2 ** (fmt.bits - 1))
