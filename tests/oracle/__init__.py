"""Test oracle: tiny random Qwen3-ASR checkpoints and the official implementation as a reference.

``tests.oracle.checkpoints`` builds the checkpoints (needs torch, safetensors and the official ``qwen_asr``
package for its config/model classes); ``tests.oracle.official`` runs the official model on them.
Both live only in the test tree: nothing in ``dictation`` may import them.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import numpy as np

SAMPLE_RATE = 16000


class _Deferred(types.ModuleType):
    """Stands in for a module in ``sys.modules`` until one of its names is used, then imports it."""

    def __getattr__(self, name: str):  # called only for names the stand-in itself lacks
        if name.startswith("__"):
            raise AttributeError(name)
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), name)


def _defer_nagisa() -> None:
    """Makes ``import nagisa`` cheap: the real module is imported when one of its names is first used.

    The official package imports nagisa (Japanese word segmentation) at its top for its forced aligner,
    which the tests never run. Importing it took about 1 s of CPU and 200 MB in every test worker and
    every process that builds a checkpoint (they import the official config classes). Where
    something does use it, it is imported in full then (tests/oracle/test_oracle.py checks both)."""
    if "nagisa" in sys.modules:
        return
    spec = importlib.util.find_spec("nagisa")
    if spec is None:
        return
    stand_in = _Deferred("nagisa")
    stand_in.__spec__ = spec
    stand_in.__file__ = spec.origin
    sys.modules["nagisa"] = stand_in


_defer_nagisa()


def synth_audio(seconds: float, seed: int = 0) -> np.ndarray:
    """Deterministic speech-like test signal: 1-D float32 at 16 kHz, peak 0.5.

    A sum of a few voiced "syllables" (harmonic stacks on a gliding pitch, with attack/decay envelopes),
    one linear chirp and seeded white noise (-50 dB). Different seeds give clearly different log-mel
    features; the same seed always gives the same samples.
    """
    rng = np.random.default_rng(seed)
    n = int(round(seconds * SAMPLE_RATE))
    t = np.arange(n, dtype=np.float64) / SAMPLE_RATE
    x = np.zeros(n, dtype=np.float64)
    # syllables: random onsets, 120-400 ms long, pitch 90-260 Hz gliding by up to +-30 %, 3-7 harmonics
    n_syll = max(1, int(seconds * rng.uniform(2.0, 4.0)))
    for _ in range(n_syll):
        start = rng.uniform(0.0, max(seconds - 0.1, 0.0))
        length = rng.uniform(0.12, 0.4)
        f0 = rng.uniform(90.0, 260.0)
        glide = rng.uniform(-0.3, 0.3)
        # Only the samples around the syllable: the same mask and values as over the whole clip
        # (t - start is monotone in t), in time linear in the clip's length, not quadratic.
        lo = int(np.searchsorted(t, start, side="left"))
        hi = min(n, int(np.searchsorted(t, start + length, side="right")) + 2)
        local = t[lo:hi] - start
        inside = (local >= 0) & (local < length)
        if not inside.any():
            continue
        u = local[inside] / length
        env = np.sin(np.pi * u) ** rng.uniform(0.5, 2.0)
        phase = 2 * np.pi * f0 * (local[inside] + glide * local[inside] ** 2 / (2 * length))
        span = x[lo:hi]  # a view: the additions land in x
        for h in range(1, int(rng.integers(3, 8)) + 1):
            span[inside] += env * rng.uniform(0.2, 1.0) / h * np.sin(h * phase + rng.uniform(0, 2 * np.pi))
    # one chirp across the clip, from 300-1500 Hz to 1500-6000 Hz
    f_a, f_b = rng.uniform(300.0, 1500.0), rng.uniform(1500.0, 6000.0)
    dur = max(seconds, 1e-3)
    x += 0.15 * np.sin(2 * np.pi * (f_a * t + (f_b - f_a) * t**2 / (2 * dur)))
    x += 0.003 * rng.standard_normal(n)
    peak = np.abs(x).max() if n else 0.0
    if peak > 0:
        x *= 0.5 / peak
    return x.astype(np.float32)


def strip_eos(ids):
    """The generated ids without their end-of-sequence token, if they end with one."""
    from tests.oracle.checkpoints import EOS_IDS

    return ids[:-1] if ids and ids[-1] in EOS_IDS else ids
