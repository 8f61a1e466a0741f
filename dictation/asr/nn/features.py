"""Log-mel frontend (docs/model.md §4): Whisper-style features without the 30-s padding.

One clip at a time, in float32 on the engine's device. This reproduces the official
single-clip features exactly: periodic Hann(400), hop 160, centred reflect padding, the
last STFT frame dropped (``T = N // 160``), slaney mel 0-8 kHz, and a floor of
``max - 8`` taken over the whole clip.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import torch

from dictation.asr.config import SAMPLE_RATE

N_FFT = 400
HOP_LENGTH = 160
# Reflect padding needs more than half a window, and one frame needs a hop.
MIN_SAMPLES = N_FFT // 2 + 1
# The mel projection runs on blocks of this many frames (aligned to frame 0): a matmul's rounding
# can depend on its width, and fixed blocks let a clip's frames be computed piece by piece
# (dictation.asr.decode.streaming, one block per 8-s encoder window) with bitwise the same result.
MEL_BLOCK_FRAMES = 800


def _hz_to_slaney_mel(f: np.ndarray) -> np.ndarray:
    f = np.asarray(f, dtype=np.float64)
    mel = 3.0 * f / 200.0
    log_region = f >= 1000.0
    mel[log_region] = 15.0 + np.log(f[log_region] / 1000.0) * 27.0 / math.log(6.4)
    return mel


def _slaney_mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    f = 200.0 * m / 3.0
    log_region = m >= 15.0
    f[log_region] = 1000.0 * np.exp(math.log(6.4) * (m[log_region] - 15.0) / 27.0)
    return f


@functools.lru_cache(maxsize=4)
def mel_filters(n_mels: int = 128, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Slaney-normalised triangular filters, ``[n_fft // 2 + 1, n_mels]`` float64."""
    n_freqs = n_fft // 2 + 1
    fft_freqs = np.linspace(0.0, sample_rate / 2, n_freqs)
    mel_points = np.linspace(
        _hz_to_slaney_mel(np.array([0.0]))[0], _hz_to_slaney_mel(np.array([sample_rate / 2]))[0], n_mels + 2
    )
    hz = _slaney_mel_to_hz(mel_points)
    widths = np.diff(hz)  # [n_mels + 1]
    slopes = hz[None, :] - fft_freqs[:, None]  # [n_freqs, n_mels + 2]
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    filters *= (2.0 / (hz[2:] - hz[:-2]))[None, :]
    return filters


def n_frames(n_samples: int) -> int:
    """Mel frames of a clip of ``n_samples`` (the last STFT frame is dropped)."""
    return n_samples // HOP_LENGTH


def conv_out_len(length: int) -> int:
    """Length after the encoder's three k3/s2/p1 convolutions (docs/model.md §5.2)."""
    for _ in range(3):
        length = (length - 1) // 2 + 1
    return length


def n_audio_tokens(frames: int, chunk_frames: int = 100) -> int:
    """Audio tokens the encoder emits for ``frames`` mel frames (docs/model.md §5.3): 13 per full second."""
    full, tail = divmod(frames, chunk_frames)
    return full * conv_out_len(chunk_frames) + (conv_out_len(tail) if tail else 0)


class LogMel:
    """Computes features on one device; filters and window are cached per device."""

    def __init__(self, n_mels: int = 128, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.n_mels = n_mels
        self.filters = torch.from_numpy(mel_filters(n_mels)).to(torch.float32).T.contiguous().to(self.device)
        self.window = torch.hann_window(N_FFT, periodic=True, dtype=torch.float32, device=self.device)

    def __call__(self, samples: np.ndarray | torch.Tensor) -> torch.Tensor:
        """16 kHz mono float32 samples → ``[n_mels, N // 160]`` float32 log-mel."""
        x = torch.as_tensor(samples, dtype=torch.float32).to(self.device).reshape(-1)
        if x.numel() < MIN_SAMPLES:
            raise ValueError(f"need at least {MIN_SAMPLES} samples for one mel frame, got {x.numel()}")
        frames = n_frames(x.numel())
        spec = torch.stft(
            x, N_FFT, HOP_LENGTH, window=self.window, center=True, pad_mode="reflect", return_complex=True
        )
        power = spec[:, :frames].abs() ** 2  # [201, T]
        log_spec = self._log_mel(power, 0)  # [n_mels, T]
        if log_spec.numel():
            log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
        return (log_spec + 4.0) / 4.0

    def log_spec_frames(self, samples: np.ndarray | torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Frames ``start .. stop-1`` of the clip ``samples`` as ``log10`` mel, BEFORE the clip-level floor.

        Frame ``t`` is the 400-sample window centred on sample ``160 t``, with the clip reflected at
        either end exactly as the centred STFT of ``__call__`` pads it. So the result is the same
        (bitwise, on CPU) as those columns of the whole clip's features, and for a clip still being
        recorded it is final once ``160 (stop - 1) + 200 <= len(samples)`` (no reflected end sample).
        Only the samples those frames need are read. :meth:`floor` turns it into features.
        """
        n = len(samples)
        if not 0 <= start < stop <= n_frames(n):
            raise ValueError(f"frames {start}..{stop} outside a clip of {n_frames(n)} frames")
        half = N_FFT // 2
        lo, hi = start * HOP_LENGTH - half, (stop - 1) * HOP_LENGTH + half
        if lo >= 0 and hi <= n:
            part = samples[lo:hi]
        else:  # reflect at the clip's ends as the centred STFT does (x[-k] = x[k], x[n-1+k] = x[n-1-k])
            idx = np.abs(np.arange(lo, hi))
            part = samples[np.where(idx > n - 1, 2 * (n - 1) - idx, idx)]
        x = torch.as_tensor(part, dtype=torch.float32).to(self.device).reshape(-1)
        spec = torch.stft(x, N_FFT, HOP_LENGTH, window=self.window, center=False, return_complex=True)
        return self._log_mel(spec.abs() ** 2, start)

    def _log_mel(self, power: torch.Tensor, first_frame: int) -> torch.Tensor:
        """Power ``[201, n]`` of frames ``first_frame ..`` → ``log10`` mel, projected per aligned block."""
        n = power.shape[1]
        edges = [0, *range(-first_frame % MEL_BLOCK_FRAMES or MEL_BLOCK_FRAMES, n, MEL_BLOCK_FRAMES), n]
        blocks = [self.filters @ power[:, a:b].contiguous() for a, b in itertools.pairwise(edges) if b > a]
        mel = torch.cat(blocks, dim=1) if len(blocks) > 1 else blocks[0]
        return torch.clamp(mel, min=1e-10).log10()

    @staticmethod
    def floor(log_spec: torch.Tensor, clip_max: torch.Tensor) -> torch.Tensor:
        """``log_spec_frames`` output → features, floored at ``clip_max - 8`` (the whole clip's max)."""
        return (torch.maximum(log_spec, clip_max - 8.0) + 4.0) / 4.0
